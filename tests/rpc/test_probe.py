"""The RPC source's probe asks the job's own resource: ``getEvents`` with the job's filters, not
only ``getLatestLedger`` (a server that answers the latter but fails the former is failing for the
job, docs/FAILOVER.md "Liveness")."""

from __future__ import annotations

import json

import trio

from ingestion.rpc.protocol import EventFilter
from ingestion.rpc.source import RpcSource
from ingestion.simulator import SimulatorConfig, open_simulator

CONFIG = SimulatorConfig(ledger_interval=None, history_ledgers=20, ops_per_ledger=5, rpc_port=0)


async def serve_rpc(get_events_fails: bool, seen: list[dict[str, object]], nursery: trio.Nursery) -> str:
    """A loopback JSON-RPC server: ``getLatestLedger`` answers; ``getEvents`` answers an empty
    page, or -32603 (an internal error) when ``get_events_fails``."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))  # fmt: skip
            while len(body) < length:
                body += await stream.receive_some(65536)
            request = json.loads(body)
            seen.append(request)
            if request["method"] == "getLatestLedger":
                answer = {"result": {"id": "x", "protocolVersion": 22, "sequence": 1234}}
            elif get_events_fails:
                answer = {"error": {"code": -32603, "message": "internal error"}}
            else:
                answer = {"result": {"events": [], "cursor": "0000005299989889024-0000000000",
                                     "latestLedger": 1234}}  # fmt: skip
            payload = json.dumps({"jsonrpc": "2.0", "id": request["id"], **answer}).encode()
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
            )

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def test_a_server_answering_latest_ledger_but_failing_get_events_fails_the_probe() -> None:
    contract = EventFilter.from_json({"type": "contract"})
    for fails in (True, False):
        seen: list[dict[str, object]] = []
        async with trio.open_nursery() as nursery:
            url = await serve_rpc(fails, seen, nursery)
            with trio.fail_after(10):
                answered = await RpcSource((url,), filters=(contract,), request_timeout=2).probe()
            nursery.cancel_scope.cancel()
        assert answered is not fails
        assert [r["method"] for r in seen] == ["getLatestLedger", "getEvents"]
        params = seen[1]["params"]
        assert params == {"startLedger": 1234, "filters": [contract.to_json()], "pagination": {"limit": 1}}


async def test_the_probe_is_a_request_the_simulated_rpc_serves() -> None:
    async with open_simulator(CONFIG) as sim:
        with trio.fail_after(10):
            assert await RpcSource((sim.rpc_url,), request_timeout=2).probe()
