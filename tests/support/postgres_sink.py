"""What the PostgreSQL sink's tests share: synthetic records, a node committing into a sink, and
a look at the sessions waiting on a fence row's lock."""

from __future__ import annotations

import functools
from typing import Any

import structlog
import trio

from actors.lease_store import LeaseStore
from actors.source import Record, SyntheticSource
from actors.supervisor import NodeSpec, run_node
from ingestion.postgres.connection import connect
from ingestion.postgres.sink import PostgresSink
from tests.support.nodes import FAST_TIMING

SRC = SyntheticSource(total=None)


def recs(first: int, last: int) -> list[Record]:
    return [SRC.record(i) for i in range(first, last + 1)]


def waiting_on_a_lock(url: str, application: str) -> int:
    """How many sessions of ``application`` wait for a lock (a fence row's)."""
    with connect(url, 5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'", (application,),
        ).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


def node_spec(node: str, job: str) -> NodeSpec:
    return NodeSpec(node, job, 1500, FAST_TIMING, 0.01, "0")


async def start_on(nursery: trio.Nursery, store: LeaseStore, job: str, sink: PostgresSink) -> None:
    """Node "a" of ``job`` on a synthetic source, committing into ``sink``."""
    await nursery.start(functools.partial(
        run_node, store, SyntheticSource(total=None), node_spec("a", job), structlog.get_logger(),
        sink=sink,
    ))  # fmt: skip


def events_of(logs: list[Any], name: str) -> list[Any]:
    return [e for e in logs if e["event"] == name]
