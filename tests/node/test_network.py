"""A job pinned to its network (ingestion/node/network.py), with real nodes, a real Redis and the
simulator's RPC over real sockets: a source on another network is never followed (the node says
why in one line and commits nothing), a network reset under a running job is detected within a
ledger close and nothing after it is committed, and ``ingestion cursor reset`` moves the job on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
import trio

from actors.lease_store import job_keys
from ingestion.cli.audit import main as audit_main
from ingestion.cli.cursor import main as cursor_main
from ingestion.cli.usage import UsageError
from ingestion.common.network import NETWORKS
from ingestion.horizon.source import HorizonSource
from ingestion.node.network import NetworkGuard
from ingestion.rpc.protocol import Cursor
from ingestion.rpc.source import RpcSource
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.simulator.records import NETWORK_PASSPHRASE
from ingestion.testing.http_fault_proxy import HttpFaultProxy
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.nodes import FAST_TIMING, Recorder, lease_store, start_node

CONFIG = SimulatorConfig(
    ledger_interval=None, history_ledgers=10, first_ledger=2, ops_per_ledger=5, rpc_port=0
)
CHECK, RESET_AFTER = 0.1, 0.3  # seconds: network.check_ms, network.reset_after_ms
DEFAULT_RESET_AFTER = 60.0  # seconds: network.reset_after_ms's default
LEDGER_CLOSE = 2.0  # seconds: a fast network's ledger close (pubnet's: 5 to 6 s)
SLOW_ROOT = 2.0  # seconds a slow Horizon takes to answer its root
HANDED_OVER = 1.0  # seconds: a graceful hand-over's bound (docs/FAILOVER.md)


def guarded(
    url: str, store: Any, job: str, network: str = "", reset_after: float = RESET_AFTER
) -> NetworkGuard:
    rpc = RpcSource((url,), retry_base=0.02, retry_cap=0.2, request_timeout=5)
    return NetworkGuard(rpc, store, job, network, check_interval=CHECK, reset_after=reset_after)


def horizon_guard(url: str, store: Any, job: str, network: str = "", look_ttl: float = 30.0) -> NetworkGuard:
    horizon = HorizonSource((url,), retry_base=0.02, retry_cap=0.2)
    return NetworkGuard(
        horizon, store, job, network, check_interval=CHECK, reset_after=RESET_AFTER, look_ttl=look_ttl
    )


def fields(client: redis.Redis, job: str) -> dict[str, str]:
    return dict(client.hgetall(job_keys(job)["cursor"]))


def ids(client: redis.Redis, job: str) -> list[str]:
    return [f["paging_token"] for _id, f in client.xrange(job_keys(job)["events"])]


async def test_a_source_on_another_network_is_never_followed_and_the_node_says_why_in_one_line(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    other = attrs.evolve(CONFIG, network_passphrase="Other Network ; December 2026")
    rec = Recorder()
    async with open_simulator(other) as sim, trio.open_nursery() as nursery:
        with lease_store(redis_server.url, job) as store:
            pinned = guarded(sim.rpc_url, store, job, NETWORKS["testnet"])
            a = await start_node(nursery, rec, redis_server.url, job, "a", pinned, store=store)
            held = await rec.wait_for("campaign-held-off", "a", within=10)
            await a.shutdown()
    assert held.fields["reason"] == "wrong-network"
    line = held.fields["error"]
    assert NETWORKS["testnet"] in line and "Other Network ; December 2026" in line and sim.rpc_url in line
    assert not rec.of("became-leader"), "a term began on another network"
    assert fields(redis_client, job) == {} and ids(redis_client, job) == []


async def test_the_network_recorded_by_the_first_term_pins_the_job(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    rec = Recorder()
    async with open_simulator(CONFIG) as sim, trio.open_nursery() as nursery:
        with lease_store(redis_server.url, job) as store:
            source = guarded(sim.rpc_url, store, job)
            a = await start_node(nursery, rec, redis_server.url, job, "a", source, store=store)
            through = str(Cursor.through(sim.chain.latest))
            await wait_until(lambda: fields(redis_client, job).get("cursor") == through, 15, what="caught up")
            await a.shutdown()
    assert fields(redis_client, job)["network"] == NETWORK_PASSPHRASE
    committed = ids(redis_client, job)
    rec = Recorder()
    other = attrs.evolve(CONFIG, network_passphrase="Other Network ; December 2026")
    async with open_simulator(other) as sim, trio.open_nursery() as nursery:
        with lease_store(redis_server.url, job) as store:
            source = guarded(sim.rpc_url, store, job)
            b = await start_node(nursery, rec, redis_server.url, job, "b", source, store=store)
            held = await rec.wait_for("campaign-held-off", "b", within=10)
            await b.shutdown()
    assert held.fields["reason"] == "wrong-network" and "recorded by its first term" in held.fields["error"]
    assert NETWORK_PASSPHRASE in held.fields["error"] and not rec.of("became-leader")
    assert ids(redis_client, job) == committed


async def test_a_takeover_never_waits_for_a_slow_root_once_the_source_was_found_right(
    redis_server: LocalRedis, job: str
) -> None:
    """A standby asks its source's network only before its first campaign: a look at a root that
    answers in 2 s, due at every campaign here (``look_ttl`` 0), runs between campaigns, and a
    graceful hand-over to that standby takes what it takes without one (CI once saw 1,001 ms
    against the 1 s bound when the look was due)."""
    rec = Recorder()
    async with open_simulator(CONFIG) as sim, trio.open_nursery() as nursery:
        proxy: HttpFaultProxy = await nursery.start(HttpFaultProxy(sim.url).serve)
        proxy.root_delay = SLOW_ROOT
        with lease_store(redis_server.url, job) as store_a, lease_store(redis_server.url, job) as store_b:
            source_a = horizon_guard(sim.url, store_a, job, NETWORK_PASSPHRASE)
            slow = f"http://127.0.0.1:{proxy.port}"
            source_b = horizon_guard(slow, store_b, job, NETWORK_PASSPHRASE, look_ttl=0.0)
            a = await start_node(nursery, rec, redis_server.url, job, "a", source_a, store=store_a)
            await rec.wait_for("became-leader", "a")
            b = await start_node(nursery, rec, redis_server.url, job, "b", source_b, store=store_b)
            await rec.wait_for("standby", "b", within=SLOW_ROOT + 5)  # its first look: waited for
            looked = proxy.roots
            # b's next campaign asks for a look: the hand-over comes while it is under way
            await wait_until(lambda: proxy.roots > looked, 2 * FAST_TIMING.ttl + 5, what="b's next look")
            await a.shutdown()
            stopped = await rec.wait_for("stopped", "a", within=5)
            taken = await rec.wait_for("became-leader", "b", within=SLOW_ROOT + 5)
            took = taken.at - stopped.at
            print(f"\nhand-over beside a slow root: {took * 1000:.0f} ms")
            await b.shutdown()
            await rec.wait_for("stopped", "b", within=SLOW_ROOT + 5)
        nursery.cancel_scope.cancel()
    assert took < HANDED_OVER, f"the takeover waited {took:.3f} s for the source's root"


async def test_a_look_between_campaigns_that_finds_another_network_holds_the_standby_off(
    redis_server: LocalRedis, job: str
) -> None:
    """The look no campaign waits for still guards: a standby that found its source right, whose
    source then answers on another network, holds the job off at its next campaign
    (``wrong-network``) and does not take it over when the leader leaves."""
    other = attrs.evolve(CONFIG, network_passphrase="Other Network ; December 2026")
    rec = Recorder()
    async with (
        open_simulator(CONFIG) as sim,
        open_simulator(other) as elsewhere,
        trio.open_nursery() as nursery,
    ):
        proxy: HttpFaultProxy = await nursery.start(HttpFaultProxy(sim.url).serve)
        # (b's calls may wait a second: a Redis call of b's that timed out would let it campaign)
        with (
            lease_store(redis_server.url, job) as store_a,
            lease_store(redis_server.url, job, timeout=1.0) as store_b,
        ):
            source_a = horizon_guard(sim.url, store_a, job)
            source_b = horizon_guard(f"http://127.0.0.1:{proxy.port}", store_b, job, look_ttl=0.0)
            a = await start_node(nursery, rec, redis_server.url, job, "a", source_a, store=store_a)
            await rec.wait_for("became-leader", "a")
            b = await start_node(nursery, rec, redis_server.url, job, "b", source_b, store=store_b)
            await rec.wait_for("standby", "b")
            proxy.upstream = elsewhere.url  # b's source is on another network from now on
            held = await rec.wait_for("campaign-held-off", "b", within=3 * FAST_TIMING.ttl + 5,
                                      reason="wrong-network")  # fmt: skip
            await a.shutdown()
            await rec.wait_for("stopped", "a", within=5)
            looked = proxy.roots  # b's look after a has gone: answered, and b still held off
            await wait_until(lambda: proxy.roots >= looked + 2, 3 * FAST_TIMING.ttl + 5, what="b's looks")
            await b.shutdown()
            await rec.wait_for("stopped", "b", within=5)
        nursery.cancel_scope.cancel()
    assert "Other Network ; December 2026" in held.fields["error"]
    assert not rec.of("became-leader", "b"), "a term began on another network"


async def test_a_reset_is_detected_within_a_ledger_close_and_the_cursor_command_moves_the_job_on(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    rec = Recorder()
    async with open_simulator(CONFIG) as sim, trio.open_nursery() as nursery:
        with lease_store(redis_server.url, job) as store:
            # the default bound: the reset is told from the new chain's ledgers, which closed
            # after the job's last one, not from how long the source stays below it
            source = guarded(sim.rpc_url, store, job, reset_after=DEFAULT_RESET_AFTER)
            a = await start_node(nursery, rec, redis_server.url, job, "a", source, store=store)
            old_tip = sim.chain.latest
            await wait_until(lambda: fields(redis_client, job).get("network_ledger") == str(old_tip), 15,
                             what="the tip's hash kept beside the cursor")  # fmt: skip
            old = [e["id"] for e in sim.rpc_events()]
            assert ids(redis_client, job) == old
            kept = fields(redis_client, job)["network_ledger_hash"]
            assert fields(redis_client, job)["network_ledger_closed_at"] == str(sim.chain.closed_at(old_tip))
            reset_at = trio.current_time()
            sim.reset_network()
            await wait_until(lambda: fields(redis_client, job).get("network_reset"), LEDGER_CLOSE,
                             what="the reset detected within a ledger close")  # fmt: skip
            print(f"\nreset detected in {trio.current_time() - reset_at:.2f} s")
            await rec.wait_for("campaign-held-off", "a", within=5 * FAST_TIMING.ttl)
            # The new chain passes the old tip: a job that did not know would follow it from there.
            for _ in range(old_tip + 5):
                sim.close_ledger()
            assert ids(redis_client, job) == old, "a record of the new chain was committed"
            reset = fields(redis_client, job)
            assert reset["cursor"] == str(Cursor.through(old_tip)) and reset["network_ledger_hash"] == kept
            held = rec.of("campaign-held-off", "a")[-1].fields
            assert held["reason"] == "network-reset" and f"ingestion cursor reset {job}" in held["error"]
            code = await trio.to_thread.run_sync(
                cursor_main, ["reset", job, "--to", "start", "--redis", redis_server.url]
            )
            assert code == 0
            new_tip = sim.chain.latest
            await wait_until(lambda: fields(redis_client, job).get("cursor") == str(Cursor.through(new_tip)),
                             5 * FAST_TIMING.ttl + 15, what="the job on the new chain's tip")  # fmt: skip
            new = [e["id"] for e in sim.rpc_events()]
            await a.shutdown()
            # the audit across the reset names its seam: the old chain's rows are not findings
            config = tmp_path / "config.toml"
            config.write_text(
                f'[node]\nid = "n1"\nsource = "rpc"\n\n[redis]\nurl = "{redis_server.url}"\n\n'
                f'[rpc]\nurls = ["{sim.rpc_url}"]\n\n[jobs."{job}"]\nkind = "rpc"\nstart_cursor = "0"\n'
                'decode = false\n'  # (the node above commits the RPC's events as sent)
            )
            capsys.readouterr()
            code = await trio.to_thread.run_sync(audit_main, [
                job, "--config", str(config), "--from", "1", "--to", str(new_tip), "--rpc", sim.rpc_url,
            ])  # fmt: skip
            out = capsys.readouterr().out
    assert ids(redis_client, job) == old + new  # the seam: the old chain's, then the new one's
    assert code == 0 and ": equal" in out, out
    assert "seam: cursor reset" in out and f"{len(old)} rows committed before it" in out, out
    after = fields(redis_client, job)
    assert "network_reset" not in after and after["network"] == NETWORK_PASSPHRASE
    audit = [f for _id, f in redis_client.xrange(job_keys(job)["audit"])]
    detected = next(f for f in audit if f["event"] == "network-reset")
    moved = next(f for f in audit if f["event"] == "cursor-reset")
    assert detected["hash"] == kept
    assert moved["from"] == str(Cursor.through(old_tip)) and moved["to"] == ""
    assert moved["by"].startswith("cli ") and int(moved["token"]) > 1
    last_old = redis_client.xrange(job_keys(job)["events"])[len(old) - 1][0]
    assert moved["seam"] == f"entry {last_old}"  # where the old chain's rows end


def test_the_cursor_command_is_refused_while_the_job_is_led_or_its_cursor_moved(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    keys = job_keys(job)
    redis_client.hset(keys["cursor"], mapping={"cursor": "100", "network_reset": "reset"})
    redis_client.set(keys["token"], 7)
    redis_client.set(keys["lease"], "7|a", px=60_000)
    flags = ["reset", job, "--to", "200", "--redis", redis_server.url]
    assert cursor_main(flags) == 1  # led: no reset was detected
    redis_client.delete(keys["lease"])
    assert cursor_main([*flags, "--from", "99"]) == 1  # not the cursor the operator saw
    assert fields(redis_client, job) == {"cursor": "100", "network_reset": "reset"}
    assert redis_client.get(keys["token"]) == "7" and not redis_client.exists(keys["audit"])
    assert cursor_main([*flags, "--from", "100"]) == 0
    assert fields(redis_client, job) == {"cursor": "200"} and redis_client.get(keys["token"]) == "8"
    redis_client.hset(keys["cursor"], "sink", "postgres database d schema s")
    with pytest.raises(UsageError, match="give --sink URL"):  # its cursor is in PostgreSQL: where?
        cursor_main(flags)


def test_the_cursor_command_clears_the_completeness_watermark_of_the_ledgers_it_leaves(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    # the watermark only rises: kept across a move to a new chain, it would call the new chain's
    # first ledgers complete before a record of theirs is committed
    keys = job_keys(job)
    redis_client.hset(keys["cursor"], mapping={
        "cursor": "100", "network_reset": "reset", "network": NETWORK_PASSPHRASE,
        "complete_through": "40", "complete_held": "a gap",
    })  # fmt: skip
    assert cursor_main(["reset", job, "--to", "start", "--redis", redis_server.url]) == 0
    assert fields(redis_client, job) == {"network": NETWORK_PASSPHRASE}
