"""HorizonSource against a scripted HTTP server: wire details and failures the simulator lacks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import structlog
import trio

from actors.source import Record, SourceFatalError
from ingestion.common.paging import toid
from ingestion.horizon.source import HorizonSource
from tests.support.scripted_horizon import Reply, Request, page_reply, problem, serve_script, sse_frame


def tok(i: int) -> str:
    return str(toid(i, 1, 1))


def rec(i: int) -> dict[str, object]:
    return {"id": tok(i), "paging_token": tok(i), "type": "payment", "memo": "caf\u00e9 & <b>"}


def data(i: int) -> str:
    return json.dumps(rec(i), separators=(",", ":"), ensure_ascii=False)


def fast(url: str | list[str], **settings: object) -> HorizonSource:
    defaults: dict[str, object] = {
        "connect_timeout": 2.0,
        "read_timeout": 2.0,
        "stream_idle_timeout": 2.0,
        "retry_base": 0.01,
        "retry_cap": 0.05,
        "page_limit": 3,
    }
    defaults.update(settings)
    return HorizonSource(url, **defaults)  # type: ignore[arg-type]


async def collect(source: HorizonSource, cursor: str, count: int) -> list[Record]:
    got: list[Record] = []
    with trio.fail_after(10):
        async with source.stream(cursor) as batches:
            async for batch in batches:
                got.extend(batch.records)
                if len(got) >= count:
                    break
    return got


def stream_of(*frames: bytes, hold: float = 0.0) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame
        if hold:
            await trio.sleep(hold)

    return gen()


HELLO = b'retry: 1000\nevent: open\ndata: "hello"\n\n'
BYEBYE = b'event: close\ndata: "byebye"\n\n'


async def test_catch_up_pages_then_streams_with_last_event_id_and_identical_bodies() -> None:
    seen: list[Request] = []

    async def handler(request: Request) -> Reply | AsyncIterator[bytes]:
        seen.append(request)
        if request.headers.get("accept") == "text/event-stream":
            start = int(request.query["cursor"]) >> 32
            frames = [sse_frame(data(i), id=tok(i)) for i in range(start + 1, start + 3)]
            return stream_of(HELLO, *frames, BYEBYE)
        cursor = request.query["cursor"]
        first = 1 if cursor == "0" else (int(cursor) >> 32) + 1
        last = min(first + 3, 6)  # records 1..5 exist: pages of 3, then a short page
        return page_reply([rec(i) for i in range(first, last)])

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        got = await collect(fast(url), "0", 9)
        nursery.cancel_scope.cancel()
    assert [r.paging_token for r in got] == [tok(i) for i in range(1, 10)]
    assert [r.body for r in got] == [data(i) for i in range(1, 10)]  # paged == streamed bytes
    pages = [r for r in seen if r.headers.get("accept") != "text/event-stream"]
    assert [p.query for p in pages] == [
        {"order": "asc", "limit": "3", "cursor": c} for c in ("0", tok(3))
    ]
    streams = [r for r in seen if r.headers.get("accept") == "text/event-stream"]
    assert streams[0].query["cursor"] == tok(5)
    assert streams[0].headers["last-event-id"] == tok(5)
    assert streams[1].headers["last-event-id"] == tok(7)


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (
            problem(404, "Resource Missing", "The resource at the url requested was not found."),
            ["404", "was not found", "/ledgers/5/payments", "--resource"],
        ),
        (
            problem(
                400,
                "Bad Request",
                "The request you sent was invalid in some way.",
                invalid_field="cursor",
                reason="cursor: invalid value",
            ),
            ["400", "invalid_field=cursor", "cursor=99", "start cursor"],
        ),
    ],
)
async def test_unfixable_4xx_raises_source_fatal_error_naming_url_and_detail(
    reply: Reply, words: list[str]
) -> None:
    calls = 0

    async def handler(request: Request) -> Reply:
        nonlocal calls
        calls += 1
        return reply

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        # Not account-scoped: a 404 is a wrong path, not an account Horizon has yet to ingest.
        source = fast(url, resource="/ledgers/5/payments")
        with trio.fail_after(5), pytest.raises(SourceFatalError) as info:
            async with source.stream("99") as batches:
                async for _ in batches:
                    pass
        nursery.cancel_scope.cancel()
    for word in words:
        assert word in str(info.value)
    assert calls == 1  # no retry loop


async def test_persistent_malformed_page_gives_up_after_bounded_refetches() -> None:
    calls = 0

    async def handler(request: Request) -> Reply:
        nonlocal calls
        calls += 1
        return page_reply([rec(1), {"id": "no-token"}])

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        got: list[Record] = []
        with (
            structlog.testing.capture_logs() as logs,
            trio.fail_after(5),
            pytest.raises(SourceFatalError, match="malformed"),
        ):
            async with fast(url, malformed_retries=2).stream("0") as batches:
                async for batch in batches:
                    got.extend(batch.records)
        nursery.cancel_scope.cancel()
    assert [r.paging_token for r in got] == [tok(1)]  # yielded once, nothing after the bad one
    assert calls == 3
    bad = [e for e in logs if e["event"] == "horizon-malformed-record"]
    assert bad and bad[0]["reason"] == "missing-paging-token" and "no-token" in bad[0]["value"]


async def test_error_event_and_idle_stream_reconnect_from_the_last_token() -> None:
    streams: list[Request] = []

    async def handler(request: Request) -> Reply | AsyncIterator[bytes]:
        if request.headers.get("accept") != "text/event-stream":
            return page_reply([])
        streams.append(request)
        n = len(streams)
        if n == 1:  # one record, then Horizon reports an error
            return stream_of(
                HELLO, sse_frame(data(1), id=tok(1)), sse_frame("problem", event="error")
            )
        if n == 2:  # one record, then silence longer than the idle timeout
            return stream_of(HELLO, sse_frame(data(2), id=tok(2)), hold=30)
        return stream_of(HELLO, sse_frame(data(3), id=tok(3)), BYEBYE)

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        with structlog.testing.capture_logs() as logs:
            got = await collect(fast(url, stream_idle_timeout=0.3), "now", 3)
        nursery.cancel_scope.cancel()
    assert [r.paging_token for r in got] == [tok(1), tok(2), tok(3)]
    assert streams[0].query["cursor"] == "now" and "last-event-id" not in streams[0].headers
    assert [s.headers["last-event-id"] for s in streams[1:3]] == [tok(1), tok(2)]
    events = [e["event"] for e in logs]
    assert "horizon-retry" in events
    assert any(e["event"] == "horizon-stream-reconnect" and e["reason"] == "idle" for e in logs)


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ValueError, match="http"):
        HorizonSource(["ftp://x"])
    with pytest.raises(ValueError, match="collection path"):
        HorizonSource(["http://x"], resource="/nope")
    with pytest.raises(ValueError, match="read_timeout"):
        HorizonSource(["http://x"], read_timeout=0)
    with pytest.raises(ValueError, match="at least one"):
        HorizonSource([])
    assert HorizonSource("http://x").urls == ("http://x",)


async def test_next_pages_are_fetched_while_the_consumer_holds_a_batch() -> None:
    cursors: list[str] = []

    async def handler(request: Request) -> Reply:
        cursors.append(request.query["cursor"])
        first = 1 if request.query["cursor"] == "0" else (int(request.query["cursor"]) >> 32) + 1
        return page_reply([rec(i) for i in range(first, first + 3)])

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        with trio.fail_after(5):
            async with fast(url, prefetch=2).stream("0") as batches:
                first = await batches.receive()
                await trio.sleep(0.3)
                # page 1 taken, pages 2 and 3 buffered, page 4 fetched and waiting: no further
                assert len(cursors) == 4
                second = await batches.receive()
        nursery.cancel_scope.cancel()
    assert first.cursor == tok(3) and second.records[0].paging_token == tok(4)


async def test_a_page_request_that_never_answers_is_timed_out_and_retried() -> None:
    calls = 0

    async def handler(request: Request) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:
            await trio.sleep_forever()  # accepted, never answered
        return page_reply([rec(1)])

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_script, handler)
        source = fast(url, connect_timeout=0.2, read_timeout=0.2)
        with structlog.testing.capture_logs() as logs:
            got = await collect(source, "0", 1)
        nursery.cancel_scope.cancel()
    assert [r.paging_token for r in got] == [tok(1)]
    (retry,) = [e for e in logs if e["event"] == "horizon-retry"]
    assert retry["status"] is None and "Timeout" in retry["error"]
