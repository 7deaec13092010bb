"""Retention under failover, with real processes: nodes run with ``--events-max-len`` while a
``tail --group`` consumer reads; leaders are SIGKILLed and SIGTERMed mid-ingest.

The stream that is left must be exactly the source's records after the trimmed ones, and the
consumer group, which trimming must wait for, must have seen every record exactly once, in order.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import trio

from ingestion.common.paging import token_key
from ingestion.testing.cluster import open_cluster
from ingestion.testing.wait import child_env, wait_until
from ingestion.verify import fetch_source

pytestmark = pytest.mark.slow

TTL_MS = 1500
MAX_LEN = 300
NODE_SLACK = 100 + 200  # an approximate trim keeps up to a stream node more; plus one batch


async def test_trimming_through_failovers_keeps_every_untrimmed_record_exactly_once(job: str) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        key = c.keys["events"]
        # The group exists before the first record, so trimming must wait for it from the start.
        c.client.xgroup_create(key, "reader", id="0", mkstream=True)
        reader = await trio.lowlevel.open_process(
            [sys.executable, "-m", "ingestion", "tail", "--redis", c.redis_url, "--job", job,
             "--group", "reader"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(),
        )  # fmt: skip
        printed = bytearray()

        async def read_output() -> None:
            assert reader.stdout is not None
            while chunk := await reader.stdout.receive_some():
                printed.extend(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_output)
            extra = ("--events-max-len", str(MAX_LEN))
            await c.start_node("n1", extra=extra)
            await c.log.wait_for("became-leader", "n1")
            await c.start_node("n2", extra=extra)
            await c.start_node("n3", extra=extra)
            await c.wait_for_events(MAX_LEN * 3)
            assert c.client.xlen(key) <= MAX_LEN + NODE_SLACK, "not trimmed while the group kept up"

            killed = await c.kill("n1")
            taken = await c.log.wait_for("became-leader", since=killed, within=5)
            await c.wait_for_progress(MAX_LEN)
            asked = c.signal(taken.node, signal.SIGTERM)
            await c.log.wait_for("became-leader", since=asked, within=5)
            assert await c.exited(taken.node) == 0
            await c.wait_for_progress(MAX_LEN)
            for name in ("n2", "n3"):
                if c.children[name].alive:
                    assert await c.terminate(name) == 0

            # The reader catches up with everything committed, then stops.
            def caught_up() -> bool:
                group = c.client.xinfo_groups(key)[0]
                return bool(group["lag"] == 0 and group["pending"] == 0)

            await wait_until(caught_up, 20, what="the reader caught up (no lag, none pending)", every=0.1)
            # It flushes each line before acknowledging it; read_output reads the pipe to its end.
            reader.send_signal(signal.SIGINT)
            with trio.fail_after(10):
                assert await reader.wait() == 0

        result = await c.verify()
        print(f"\nverification: {result.summary()}")
        assert result.ok, result.summary()
        assert result.trimmed > 0 and result.count <= MAX_LEN + NODE_SLACK, result.summary()

        tokens = [json.loads(line)["paging_token"] for line in printed.decode().splitlines()]
        assert result.last is not None
        source = await fetch_source(c.horizon, "/operations", "0", through=result.last)
        expected = [r.paging_token for r in source if token_key(r.paging_token) <= token_key(result.last)]
        assert tokens == expected, "the group missed or repeated a record"
        assert len(tokens) == result.trimmed + result.count
