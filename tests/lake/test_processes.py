"""Real processes following a data lake: redis-server and nodes run with ``--source lake`` on a
lake of real ledger metadata (a standalone network's v23 ledger of 1,000 contract events, written
again under later ledger numbers), through SIGKILL and SIGTERM, with the lake growing meanwhile.
A killed node's decode worker leaves by itself; a node asked to stop exits, whatever its decode
worker was doing. The stream must hold every event of the lake exactly once, in id order."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from ingestion.lake.decoding import PARENT_WATCH
from ingestion.lake.events import ledger_events
from ingestion.rpc.protocol import Cursor
from ingestion.testing.cluster import open_cluster
from ingestion.testing.wait import alive, children, wait_until
from tests.support.lakes import ledger_seq, resequenced, standalone_ledgers, write_lake

pytestmark = pytest.mark.slow

TTL_MS = 1500


async def test_two_nodes_follow_a_lake_through_sigkill_and_sigterm(job: str, tmp_path: Path) -> None:
    real = {ledger_seq(m): m for m in standalone_ledgers()}
    metas = [real[84], real[85], *(resequenced(real[85], seq) for seq in range(86, 88))]
    later = [resequenced(real[85], seq) for seq in range(88, 90)]
    expected = [e.id for m in metas + later for e in ledger_events(m).events]
    lake = tmp_path / "lake"
    write_lake(lake, metas)
    args = ["--source", "lake", "--lake", f"file://{lake}", "--topic", "**"]
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        await c.start_node("n1", extra=args)
        await c.log.wait_for("became-leader", "n1")
        await c.start_node("n2", extra=args)
        await c.wait_for_events(1000)
        worker_pid = c.children["n1"].worker_pid
        assert worker_pid is not None
        decoders = children(worker_pid, "multiprocessing.spawn")
        assert decoders, "the leader decodes in a worker process"
        killed_at = await c.kill("n1")
        at_death = c.state()
        taken = await c.log.wait_for("became-leader", since=killed_at, within=TTL_MS / 1000 + 3)
        # resumed at the committed cursor (a commit in flight at the kill may still have landed)
        assert taken.node == "n2" and Cursor.parse(taken.fields["cursor"]) >= Cursor.parse(at_death["cursor"])

        # the dead node's decode worker leaves by itself (idle here: its pipe closed; a worker
        # orphaned mid-decode watches its parent: tests/lake/test_lake.py)
        def gone() -> bool:
            return not any(alive(pid) for pid in decoders)

        await wait_until(gone, PARENT_WATCH + 3, what="the decode worker to exit")

        write_lake(lake, later)  # the lake grows: the leader polls for the next object
        await c.start_node("n1", extra=args)
        await c.wait_for_events(4000, within=60)
        asked_at = trio.current_time()
        c.signal("n2", signal.SIGTERM)
        handed = await c.log.wait_for("became-leader", since=asked_at, within=5)
        assert handed.node == "n1" and await c.exited("n2") == 0
        await c.wait_for_events(len(expected), within=60)
        await trio.sleep(0.5)
        entries = c.client.xrange(c.keys["events"])
        ids = [fields.get("paging_token") or fields.get("id") for _, fields in entries]
        assert ids == expected
        assert c.state()["cursor"] == str(Cursor.through(89))

