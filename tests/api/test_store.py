"""The events API's store: the projection of a view's committed rows (its job and its backfill
ranges, each event once) and ``getEvents`` planned over it, against a real PostgreSQL, answers
held to stellar-rpc's rules computed over the same events."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from actors.source import TermContext
from ingestion.api import store
from ingestion.api.projector import FencedProjector, projector_action, projector_job_name
from ingestion.api.query import Plan, Window, events_result, events_sql, plan
from ingestion.api.reader import StoreReader
from ingestion.api.session import Session
from ingestion.postgres.connection import connect
from ingestion.postgres.fence import FenceRejected
from ingestion.rpc.protocol import INVALID_REQUEST, Cursor, EventFilter, GetEventsRequest, RpcError
from ingestion.testing.api_events import ACCOUNTS, CONTRACTS, expected_page, make_events, segment
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.wait import wait_until

EVENTS = make_events(1, 300)


def ledger_of(event_id: str) -> int:
    return Cursor.parse(event_id).ledger


def test_a_decoding_jobs_additions_are_cut_from_the_served_record() -> None:
    text = EVENTS[0].text
    decoded = text[:-1] + ',"topicJson":[{"symbol":"x"}],"valueJson":{"i128":"5"},"transfer":{}}'
    assert store.served_record(decoded) == text
    assert store.served_record(text[:-1] + ',"decodeError":"bad"}') == text
    row = store.project_record(EVENTS[0].id, decoded)
    assert (row.id, row.record, row.topic_count) == (EVENTS[0].id, text, len(EVENTS[0].topics))
    assert row.topics[0] == EVENTS[0].topics[0]
    assert store.segment_key("A" * 300).startswith("md5:")


def test_a_view_is_complete_through_its_live_jobs_cursor() -> None:
    assert store.complete_through(str(Cursor.through(90))) == 90
    assert store.complete_through(str(Cursor(90, 2, 0, 1))) == 89  # ledger 90 may have more
    assert store.complete_through("now") is None
    progress = [("v", 5, str(Cursor.through(90))), ("v~1-50", 9, str(Cursor.through(50)))]
    assert store.view_latest("v", progress) == 90
    assert store.view_latest("v", progress[1:]) == 50
    # a range complete through its last ledger is held from its first, events or not
    assert store.view_oldest("v", progress, first_event=7) == 1
    assert store.view_oldest("v", [("v~1-50", 9, str(Cursor.through(40)))], first_event=7) == 7


def test_a_start_outside_the_window_is_refused_with_stellar_rpcs_message() -> None:
    window = Window(10, 20)
    with pytest.raises(RpcError) as refused:
        plan(GetEventsRequest(start_ledger=21), window, "ingestion", "v")
    assert refused.value.code == INVALID_REQUEST
    assert refused.value.message == "startLedger must be within the ledger range: 10 - 20"
    with pytest.raises(RpcError):
        plan(GetEventsRequest(start_ledger=9), window, "ingestion", "v")
    empty = plan(GetEventsRequest(start_ledger=15, end_ledger=15), window, "ingestion", "v")
    assert empty.sql is None
    # a scan over every ledger held: no 10,000-ledger cap
    whole = plan(GetEventsRequest(start_ledger=10), Window(10, 10_000_000), "ingestion", "v")
    assert whole.end_ledger == 10_000_001


def test_each_filter_is_an_arm_an_index_answers() -> None:
    one = EventFilter(contract_ids=(CONTRACTS[0], CONTRACTS[1]))
    sql, _ = events_sql("ingestion", "v", "a", "b", [one], 10)
    assert sql.count("contract_id = %s") == 2 and " UNION " in sql
    topic = EventFilter(topics=((segment("sym", "transfer"), "*", segment("addr", ACCOUNTS[0]), "**"),))
    sql, params = events_sql("ingestion", "v", "a", "b", [topic], 10)
    assert "topic3 = %s AND topic1 = %s" in sql and "topic_count >= 3" in sql
    assert params[3] == segment("addr", ACCOUNTS[0])
    sql, _ = events_sql("ingestion", "v", "a", "b", [one, EventFilter()], 10)
    assert " UNION " not in sql and "contract_id" not in sql  # one arm takes everything


def test_the_projection_holds_each_event_once(pg: LocalPostgres, view: str) -> None:
    with connect(pg.url, 5) as conn:
        ids = [
            r[0]
            for r in conn.execute("SELECT id FROM ingestion.api_events WHERE view = %s ORDER BY id", (view,))
        ]
    assert ids == [e.id for e in EVENTS]
    assert projector_job_name(view) == "api.apiv"


FILTERS = [
    [],
    [EventFilter(types=("system",))],
    [EventFilter(contract_ids=(CONTRACTS[2],))],
    [EventFilter(contract_ids=(CONTRACTS[0], CONTRACTS[1]), topics=((segment("sym", "burn"), "*"),))],
    [EventFilter(topics=((segment("sym", "transfer"), "*", segment("addr", ACCOUNTS[1]), "*"),))],
    [EventFilter(topics=((segment("sym", "mint"), "**"),))],
    [EventFilter(topics=(("*",),))],
    [EventFilter(types=("contract",), topics=(("*", "*"), (segment("sym", "approve"), "**")))],
    [EventFilter(contract_ids=(CONTRACTS[1],)), EventFilter(topics=((segment("sym", "burn"), "**"),))],
]


@pytest.mark.parametrize("filters", FILTERS, ids=range(len(FILTERS)))
async def test_pages_follow_stellar_rpcs_rules_across_the_whole_window(
    pg: LocalPostgres, view: str, filters: list[EventFilter]
) -> None:
    reader = StoreReader(pg.url, "ingestion", view)
    window = await reader.window()
    assert window is not None and (window.oldest, window.latest) == (1, 300)
    assert window.latest_close == 1_700_000_000 + 5 * 300 or window.latest_close > 0
    request = GetEventsRequest(start_ledger=1, filters=tuple(filters), limit=7)
    pages = 0
    while True:
        p = plan(request, window, "ingestion", view)
        rows = await reader.rows(p)
        start = request.cursor.successor() if request.cursor else Cursor(request.start_ledger)
        want_ids, want_cursor = expected_page(EVENTS, filters, start, 301, 7)
        assert [i for i, _ in rows] == want_ids
        answer = orjson.loads(events_result(p, rows, window))
        assert answer["cursor"] == want_cursor
        _, _, rendered = await reader.page(lambda _, p=p: p)  # type: ignore[misc]  # (PostgreSQL's: the same bytes)
        assert events_result(p, rendered, window) == events_result(p, rows, window)
        assert [e["id"] for e in answer["events"]] == want_ids
        pages += 1
        if len(rows) < 7:
            break
        request = GetEventsRequest(filters=tuple(filters), cursor=Cursor.parse(answer["cursor"]), limit=7)
    assert pages >= 1
    reader.close()


async def test_a_page_is_read_on_the_event_loop_with_no_thread(
    pg: LocalPostgres, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio

    reader = StoreReader(pg.url, "ingestion", view, window_ttl=0)
    assert await reader.window() is not None  # (connecting takes a thread: it is rare)
    hops: list[object] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    pages: list[Any] = []
    for fmt in ("base64", "json"):
        request = GetEventsRequest(start_ledger=1, limit=5, xdr_format=fmt)

        def planned(window: Window | None, request: GetEventsRequest = request) -> Plan:
            assert window is not None
            return plan(request, window, "ingestion", view)

        pages.append((await reader.page(planned))[2])
    assert hops == []  # the window, the plan's page: no thread hop
    assert [(page.size, page.last_id) for page in pages] == [(5, EVENTS[4].id)] * 2
    reader.close()


async def test_a_read_only_reader_cannot_write(pg: LocalPostgres, view: str) -> None:
    reader = StoreReader(pg.url, "ingestion", view)

    async def write(session: Session) -> None:
        await session.query("DELETE FROM ingestion.api_events")

    with pytest.raises(RpcError, match="read-only"):
        await reader._run(write)
    reader.close()


async def test_a_step_projects_only_whats_new(pg: LocalPostgres, view: str) -> None:
    projector = FencedProjector(pg.url, "ingestion", view)
    assert await projector.step("p", 3) == {"rows": 0, "skipped": 0, "behind": 0}
    with pytest.raises(FenceRejected):
        await projector.step("stale", 2)
    projector.close()


async def test_a_run_leaves_no_listener_behind(pg: LocalPostgres, view: str) -> None:
    """A former leader's undrained LISTEN would hold PostgreSQL's one notification queue."""
    action = projector_action(pg.url, "ingestion", view, run_seconds=2.0)
    assert (await action(3, TermContext("p", 3)))["steps"] >= 2  # (it waited for notices between)

    def listeners() -> int:
        with connect(pg.url, 5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ingestion-api-projector'"
            ).fetchone()
        return int(row[0]) if row else 0

    await wait_until(lambda: listeners() == 0, 5, what="the projector's LISTEN connection closed")


async def test_a_sparse_filter_spans_millions_of_ledgers_in_one_page(pg: LocalPostgres) -> None:
    """No 10,000-ledger scan cap: two events of one contract 3 million ledgers apart, one page."""
    import trio

    from ingestion.postgres.sink import PostgresSink
    from ingestion.testing.api_events import make_events, records

    near, far = make_events(5, 5)[:1], [e for e in make_events(3_000_005, 3_000_010) if e.contract_id][:1]
    sink = PostgresSink(pg.url, "sparse", call_timeout=5)
    await sink.open_term("a", 1)
    await sink.commit("a", 1, None, records(near + far), str(Cursor.through(3_000_020)))
    sink.close()
    await projector_action(pg.url, "ingestion", "sparse", run_seconds=0)(1, TermContext("p", 1))
    reader = StoreReader(pg.url, "ingestion", "sparse")
    window = await reader.window()
    assert window is not None and (window.oldest, window.latest) == (5, 3_000_020)
    wanted = (EventFilter(contract_ids=(far[0].contract_id,)),)
    with trio.fail_after(5):
        p = plan(GetEventsRequest(start_ledger=5, filters=wanted, limit=10), window, "ingestion", "sparse")
        rows = await reader.rows(p)
    want = [e.id for e in near + far if e.contract_id == far[0].contract_id]
    assert [i for i, _ in rows] == want and far[0].id in want
    assert orjson.loads(events_result(p, rows, window))["cursor"] == str(Cursor.through(3_000_020))
    reader.close()
