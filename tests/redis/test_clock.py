"""The Redis host's clock. Lease expiry in Redis follows the Redis host's wall clock (a key's expiry
is an absolute time; Redis 7 replicates SET PX as PXAT), so a step of that clock moves every lease
that was set or renewed before it:

- forward: leases expire early. A standby may take over while the old leader still believes it
  leads; the old leader's next renew or commit finds the lease gone or someone else's and is
  refused in Redis. No stale write lands.
- backward: leases expire late, by the step: a leader that dies right then is replaced only after
  TTL + step. The remedy is operational: slew-only NTP on Redis hosts (chrony ``makestep 0 0`` or
  ``maxslewrate``), never stepping.

redis-server runs with a wall-clock shim (tests/support/native/clockshift.c; libfaketime 0.9.10 cannot start
Debian's jemalloc-linked redis-server) whose shift the test rewrites mid-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ingestion.testing.cluster import TTL_MS, assert_verified, figure, open_cluster
from tests.support.native import clockshift_env, clockshift_library

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(clockshift_library() is None, reason="no C compiler for the clock shim"),
]


async def redis_time(c) -> float:  # type: ignore[no-untyped-def]
    seconds, micros = await trio.to_thread.run_sync(c.client.time)
    return float(seconds) + micros / 1e6


async def test_redis_clock_stepping_forward_expires_leases_early_but_no_stale_write_lands(
    job: str, tmp_path: Path
) -> None:
    clock = tmp_path / "redis-clock"
    async with open_cluster(job, ttl_ms=TTL_MS, redis_env=clockshift_env(clock)) as c:
        await c.start_node("n1")
        await c.log.wait_for("became-leader", "n1")
        await c.start_node("n2")
        await c.wait_for_events(200)
        before = await redis_time(c)
        stepped_at = trio.current_time()
        clock.write_text("10000\n")
        await trio.sleep(0.2)  # the shim re-reads its file every 100 ms
        assert await redis_time(c) - before > 9
        # Every lease set before the step has expired in Redis: the term ends (renew refused, or
        # a commit fenced) and a new term starts under a higher token.
        ended = await c.log.wait_for("lost-leadership", since=stepped_at, within=5)
        assert ended.fields["reason"] in ("renew-rejected", "fenced", "lease-expired"), ended.fields
        new = await c.log.wait_for("became-leader", since=stepped_at, within=5)
        first = c.log.of("became-leader")[0]
        assert new.fields["token"] > first.fields["token"]
        figure("redis-clock-forward", term_end_after_step_ms=(ended.at - stepped_at) * 1000,
               new_leader=new.node, reason=ended.fields["reason"])  # fmt: skip
        await c.wait_for_progress(100)
        await assert_verified(c, 300)


async def test_redis_clock_stepping_backward_delays_failover_by_the_step(
    job: str, tmp_path: Path
) -> None:
    clock = tmp_path / "redis-clock"
    step = 10
    async with open_cluster(job, ttl_ms=TTL_MS, redis_env=clockshift_env(clock)) as c:
        await c.start_node("n1")
        await c.log.wait_for("became-leader", "n1")
        await c.start_node("n2")
        await c.wait_for_events(200)
        killed_at = await c.kill("n1")
        clock.write_text(f"{-step * 1000}\n")  # right after n1's last renewal
        taken = await c.log.wait_for("became-leader", "n2", since=killed_at, within=step + 10)
        took = taken.at - killed_at
        figure("redis-clock-backward", takeover_ms=took * 1000, step_s=step, ttl_ms=TTL_MS)
        # The lease n1 last renewed expires `step` seconds late; nothing else slows the takeover.
        assert step - 1 < took < step + TTL_MS / 1000 + 3, took
        await c.wait_for_progress(100)
        await assert_verified(c, 300)
