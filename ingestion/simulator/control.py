"""The control endpoint on the Horizon port: the simulator's fault knobs and ledger clock over HTTP.

JSON in and out; not part of Horizon. :class:`~ingestion.simulator.app.HorizonApp` hands it every
request under ``/_simulator/``:

- ``GET /_simulator/faults``: the armed faults (:meth:`Faults.snapshot`).
- ``POST /_simulator/faults`` with any of
  ``{"fail": {"status": 429|500|502|503|504, "count": N | "seconds": T, "retry_after": S},
  "close_stream_after": {"events": N, "streams": M}, "malformed": {"kind": "broken_json" |
  "missing_paging_token" | "token_regression" | "duplicate"}, "stall": {"seconds": T},
  "freeze": {"seconds": T} (ingestion stalls: stellar-core's ledgers go on, history does not),
  "down": {"seconds": T}}``: arm them (``down`` stops listening right after answering and listens
  again, same port and chain, ``T`` seconds later). Answers 200 with the snapshot, or a 400 problem.
- ``DELETE /_simulator/faults``: disarm everything.
- ``POST /_simulator/ledgers`` with optional ``{"count": N}``: close N ledgers now; answers
  ``{"latest_ledger": seq}``. ``GET /_simulator/ledgers`` answers the same without closing.
- ``POST /_simulator/reset`` with optional ``{"seed": N}``: a network reset (as testnet's): the
  chain starts again at ledger 1 with new hashes (the seed, default the current one + 1) and the
  same passphrase; answers ``{"latest_ledger": 1, "seed": N}``.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import ingestion.simulator.render as render
from ingestion.common.asgi import Disconnected, Receive, Scope, Send, read_body, respond
from ingestion.simulator.chain import Chain
from ingestion.simulator.faults import Faults, MalformedKind, check_known, duration_of
from ingestion.simulator.render import Problem


class ControlHost(Protocol):
    """What the control endpoint needs of the simulator (the server's ``Simulator``)."""

    @property
    def chain(self) -> Chain: ...
    @property
    def faults(self) -> Faults: ...
    def close_ledger(self) -> int: ...
    def reset_network(self, seed: int | None = None) -> int: ...
    def schedule_down(self, seconds: float) -> None: ...


async def serve_control(sim: ControlHost, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one request to the control endpoint.

    Raises:
        Problem: 404 for an unknown path or method, 400 for a bad body (the app answers with it).
    """
    try:
        body = await read_body(receive)
    except Disconnected:
        return  # the client left mid-request: nobody to answer
    method, path, faults = scope["method"], scope["path"], sim.faults
    try:
        data = json.loads(body) if body.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        if path == "/_simulator/faults" and method == "GET":
            result: dict[str, Any] = faults.snapshot()
        elif path == "/_simulator/faults" and method == "DELETE":
            faults.clear()
            result = faults.snapshot()
        elif path == "/_simulator/faults" and method == "POST":
            down = _arm(sim, data)
            result = faults.snapshot()
            if down is not None:
                result["down"] = {"seconds": down}
                await _json(send, 200, result)
                sim.schedule_down(down)
                return
        elif path == "/_simulator/ledgers" and method in ("GET", "POST"):
            for _ in range(int(data.get("count", 1)) if method == "POST" else 0):
                sim.close_ledger()
            result = {"latest_ledger": sim.chain.latest}
        elif path == "/_simulator/reset" and method == "POST":
            check_known(data, {"seed"})
            seed = data.get("seed")
            latest = sim.reset_network(None if seed is None else int(seed))
            result = {"latest_ledger": latest, "seed": sim.chain.spec.seed}
        else:
            raise Problem(404, render.not_found())
    except (ValueError, TypeError, KeyError) as exc:
        raise Problem(400, render.bad_request("body", str(exc))) from exc
    await _json(send, 200, result)


def _arm(sim: ControlHost, data: dict[str, Any]) -> float | None:
    check_known(data, {"fail", "close_stream_after", "malformed", "stall", "freeze", "down"})
    faults = sim.faults
    if "fail" in data:
        spec = data["fail"]
        faults.fail_requests(
            int(spec.get("status", 429)),
            **duration_of(spec),
            retry_after=int(spec.get("retry_after", 1)),
        )
    if "close_stream_after" in data:
        spec = data["close_stream_after"]
        faults.close_streams_after(int(spec["events"]), streams=int(spec.get("streams", 1)))
    if "malformed" in data:
        faults.send_malformed(MalformedKind(data["malformed"]["kind"]))
    if "stall" in data:
        faults.stall_streams(float(data["stall"]["seconds"]))
    if "freeze" in data:
        faults.freeze_ingestion(float(data["freeze"]["seconds"]))
    if "down" in data:
        return float(data["down"]["seconds"])
    return None


async def _json(send: Send, status: int, value: Any) -> None:
    await respond(send, status, b"application/json", json.dumps(value).encode())
