"""Following the SSE stream (I/O): one connection at a time, its records validated by the follower
and gathered into batches (those that arrive within a few milliseconds, up to a page).
"""

from __future__ import annotations

import math
from contextlib import aclosing
from typing import Protocol

import httpx
import structlog
import trio
from httpx_sse import SSEError, aconnect_sse

from actors.source import Batch, Record
from ingestion.common.http import describe
from ingestion.horizon.exchange import Requester, answered, failed, failure_of, malformed, pace, read_bounded
from ingestion.horizon.failures import Failure
from ingestion.horizon.follower import HorizonFollower, StreamRequest, StreamSignal
from ingestion.horizon.health import RatePacer
from ingestion.horizon.pages import Malformed
from ingestion.horizon.roots import Switch

log = structlog.get_logger()


class Streaming(Requester, Protocol):
    """What following the stream needs of the source."""

    @property
    def stream_idle_timeout(self) -> float: ...

    @property
    def stream_batch_window(self) -> float: ...

    @property
    def page_limit(self) -> int: ...


async def follow_stream(
    source: Streaming,
    client: httpx.AsyncClient,
    follower: HorizonFollower,
    request: StreamRequest,
    out: trio.MemorySendChannel[Batch],
    switch: Switch,
) -> None:
    send, receive = trio.open_memory_channel[Record](follower.page_limit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_stream, source, client, follower, request, send, switch)
        await batch_stream(source, receive, out)

async def batch_stream(
    source: Streaming, receive: trio.MemoryReceiveChannel[Record], out: trio.MemorySendChannel[Batch]
) -> None:
    """Gather records that arrive together (within the batch window, up to a page)."""
    limit = source.page_limit
    with receive:
        while True:
            try:
                batch = [await receive.receive()]
            except trio.EndOfChannel:
                return
            with trio.move_on_after(source.stream_batch_window):
                while len(batch) < limit:
                    try:
                        batch.append(await receive.receive())
                    except trio.EndOfChannel:
                        break
            await out.send(Batch(tuple(batch)))

async def read_stream(
    source: Streaming,
    client: httpx.AsyncClient,
    follower: HorizonFollower,
    request: StreamRequest,
    records: trio.MemorySendChannel[Record],
    switch: Switch,
) -> None:
    """One SSE connection: validated records go to ``records``; the end goes to the follower.

    The staleness watcher may cut the connection short (``switch``), but never while a record
    is being handed on: only the wait for Horizon is cancelled, so no record is lost.
    """
    got = 0
    opened = False
    opened_at = 0.0
    idle = source.stream_idle_timeout
    # httpx's own read timeout is only a backstop; the idle deadline below is the real one.
    timeout = httpx.Timeout(
        connect=source.connect_timeout,
        read=idle + source.read_timeout,
        write=source.read_timeout,
        pool=source.connect_timeout,
    )
    with records:
        pacer = await pace(source, request.base_url)
        paced: RatePacer | None = pacer
        try:
            # Until the response head arrives: the connect and read timeouts.
            with (
                trio.CancelScope() as cut,
                trio.CancelScope(
                    deadline=trio.current_time() + source.connect_timeout + source.read_timeout
                ) as scope,
            ):
                switch.scope = cut
                async with aconnect_sse(
                    client,
                    "GET",
                    request.url,
                    params=request.params,
                    headers=request.headers,
                    timeout=timeout,
                ) as events_source:
                    response = events_source.response
                    paced = None
                    answered(pacer, response)
                    if response.status_code != 200:
                        body = await read_bounded(response)
                        failed(source, follower, failure_of(response, body), request)
                        return
                    follower.on_stream_open()
                    source.health.ok(trio.current_time())
                    opened, opened_at = True, trio.current_time()
                    log.debug(
                        "horizon-stream-open", url=request.base_url, cursor=request.cursor
                    )
                    scope.deadline = trio.current_time() + idle
                    async with aclosing(events_source.aiter_sse()) as events:
                        async for sse in events:
                            source.health.ok(trio.current_time())
                            result = follower.on_stream_event(sse.event, sse.id, sse.data)
                            if isinstance(result, Record):
                                got += 1
                                try:
                                    records.send_nowait(result)
                                except trio.WouldBlock:
                                    # Waiting for our own consumer is not Horizon idling.
                                    scope.deadline = math.inf
                                    switch.scope = None
                                    await records.send(result)
                                    switch.scope = cut
                                    if switch.to is not None:
                                        break
                            elif result is StreamSignal.CLOSED:
                                break
                            elif result is StreamSignal.ERROR:
                                error = f"stream error event: {sse.data[:200]}"
                                failed(source, follower, Failure(None, error), request)
                                return
                            elif isinstance(result, Malformed):
                                malformed(follower, result, request)
                                return
                            scope.deadline = trio.current_time() + idle
            if switch.to is not None:
                log.info(
                    "horizon-stream-reconnect",
                    reason="stale",
                    records=got,
                    cursor=follower.cursor,
                    delay=0,
                    url=request.base_url,
                )
                return  # the pump moves to the URL the watcher chose
            if scope.cancelled_caught and not opened:
                failed(source, follower, Failure(None, "stream request timed out"), request)
                return
            reason = "idle" if scope.cancelled_caught else "closed"
        except (httpx.HTTPError, SSEError) as exc:
            if got == 0:
                failed(source, follower, Failure(None, describe(exc)), request)
                return
            # The records so far were good: reopen from the last one, like a clean close.
            reason = f"dropped: {describe(exc)}"
        finally:
            switch.scope = None
            if paced is not None:  # no response head: the request is over all the same
                answered(paced, None)
        open_for = trio.current_time() - opened_at if opened else 0.0
        delay = follower.on_stream_end(got_records=got > 0, open_for=open_for)
        log.info(
            "horizon-stream-reconnect",
            reason=reason,
            records=got,
            cursor=follower.cursor,
            delay=round(delay, 3),
            url=request.base_url,
        )
