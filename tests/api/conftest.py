"""The events API's tests share a view: 300 ledgers of synthetic events, committed by a live job
and an overlapping backfill range, projected."""

from __future__ import annotations

import pytest
import trio

from actors.lease_store import Committed
from actors.source import TermContext
from ingestion.api.projector import projector_action
from ingestion.postgres.fence import FenceRejected
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.testing.api_events import make_events, records
from ingestion.testing.local_postgres import LocalPostgres

EVENTS = make_events(1, 300)


def ledger_of(event_id: str) -> int:
    return Cursor.parse(event_id).ledger


async def build_view(url: str, view: str) -> None:
    """Commit the events as a live job ``view`` (ledgers 120-300, through 300) and a backfill
    range ``view~1-150`` (overlapping 120-150), then project them."""
    live = PostgresSink(url, view, call_timeout=5)
    await live.open_term("a", 1)
    late = records([e for e in EVENTS if ledger_of(e.id) >= 120])
    done = await live.commit("a", 1, None, late, str(Cursor.through(300)))
    assert isinstance(done, Committed)
    backfill = PostgresSink(url, f"{view}~1-150", call_timeout=5)
    await backfill.open_term("a", 1)
    early = records([e for e in EVENTS if ledger_of(e.id) <= 150])
    done = await backfill.commit("a", 1, None, early, str(Cursor.through(150)))
    assert isinstance(done, Committed)
    action = projector_action(url, "ingestion", view, run_seconds=0)
    result = await action(1, TermContext("p", 3))
    assert result["rows"] == len(late) + len(early)  # (the overlap inserted once)
    with pytest.raises(FenceRejected):
        await action(2, TermContext("stale", 2))  # a stale leader projects nothing
    assert (await action(2, TermContext("p", 3)))["rows"] == 0  # nothing new
    live.close()
    backfill.close()


@pytest.fixture(scope="module")
def view(pg: LocalPostgres) -> str:
    """The view ``apiv`` of :func:`build_view` on the module's server."""
    trio.run(build_view, pg.url, "apiv")
    return "apiv"
