"""Overlapped catch-up (I/O): several ledger ranges of the collection paged side by side, their
records handed on strictly in order; the plan is :mod:`ingestion.horizon.catchup` (pure).
"""

from __future__ import annotations

from typing import Protocol

import httpx
import structlog
import trio

from actors.source import Batch
from ingestion.horizon.catchup import LedgerRange, ledger_of, ledgers_per_range, plan_ranges
from ingestion.horizon.exchange import Requester, failed, get_page, malformed
from ingestion.horizon.failures import Failure
from ingestion.horizon.follower import HorizonFollower, PageRequest
from ingestion.horizon.health import RootInfo
from ingestion.horizon.roots import read_root

log = structlog.get_logger()


class CatchingUp(Requester, Protocol):
    """What the overlapped catch-up needs of the source."""

    @property
    def page_limit(self) -> int: ...

    @property
    def parallel_requests(self) -> int: ...

    @property
    def pages_per_range(self) -> int: ...

    def follower(self, cursor: str) -> HorizonFollower: ...


async def overlapped(
    source: CatchingUp,
    client: httpx.AsyncClient,
    follower: HorizonFollower,
    out: trio.MemorySendChannel[Batch],
) -> HorizonFollower:
    """Catch up through ledger ranges paged side by side, their records sent strictly in
    order; returns the follower to go on with (sequential paging to the head, then the
    stream). Falls back to that follower at once when the history cannot be split (Horizon's
    root does not answer, the first page shows the job is nearly caught up)."""
    # The first page, sequentially: where we are, and how dense the history is.
    attempt = follower.next_attempt()
    request = attempt.request
    if not isinstance(request, PageRequest):
        return follower
    response, failure = await get_page(source, client, request)
    if response is None:
        failed(source, follower, failure or Failure(None, "no response"), request)
        return follower
    source.health.ok(trio.current_time())
    outcome = follower.on_page(response.content)
    if outcome.records:
        await out.send(Batch(outcome.records))
    if outcome.malformed is not None:
        malformed(follower, outcome.malformed, request)
        return follower
    if not outcome.full or follower.last_token is None:
        return follower
    first, last = ledger_of(outcome.records[0].paging_token), ledger_of(follower.last_token)
    span = max(1, last - first + 1)
    roots: dict[str, RootInfo | None] = {}
    await read_root(source, client, follower.base_url, roots)
    root = roots[follower.base_url]
    if root is None:
        return follower
    oldest, latest = root.history_elder_ledger, root.history_latest_ledger
    per_range = ledgers_per_range(len(outcome.records) / span, source.pages_per_range, source.page_limit)
    plan = plan_ranges(follower.last_token, oldest, latest, per_range)
    if len(plan) < 2:
        return follower
    log.info(
        "horizon-catch-up-overlapped", ranges=len(plan), ledgers_per_range=per_range,
        parallel=source.parallel_requests, cursor=follower.last_token, latest_ledger=latest,
    )  # fmt: skip
    cursor = follower.last_token
    limiter = trio.Semaphore(source.parallel_requests)
    window = 2 * source.parallel_requests  # ranges fetched ahead of the one being handed on
    async with trio.open_nursery() as nursery:
        pending: dict[int, trio.MemoryReceiveChannel[Batch]] = {}
        started = 0
        for index in range(len(plan)):
            while started < len(plan) and started < index + window:
                send, receive = trio.open_memory_channel[Batch](source.pages_per_range + 2)
                pending[started] = receive
                nursery.start_soon(page_range, source, client, plan[started], send, limiter)
                started += 1
            with pending.pop(index) as receive:
                async for batch in receive:
                    await out.send(batch)
                    cursor = batch.cursor
    log.info("horizon-catch-up-ranges-done", cursor=cursor)
    return source.follower(cursor)

async def page_range(
    source: CatchingUp,
    client: httpx.AsyncClient,
    rng: LedgerRange,
    out: trio.MemorySendChannel[Batch],
    limiter: trio.Semaphore,
) -> None:
    """Page one ledger range in order into ``out`` (retrying like the sequential path)."""
    follower = source.follower(rng.after)
    with out:
        while True:
            attempt = follower.next_attempt()
            if attempt.delay > 0:
                await trio.sleep(attempt.delay)
            request = attempt.request
            if not isinstance(request, PageRequest):
                return  # the range reached Horizon's head
            async with limiter:
                response, failure = await get_page(source, client, request)
            if response is None:
                failed(source, follower, failure or Failure(None, "no response"), request)
                continue
            source.health.ok(trio.current_time())
            outcome = follower.on_page(response.content)
            kept = rng.kept(outcome.records)
            if kept:
                await out.send(Batch(kept))
            if len(kept) < len(outcome.records):
                return  # past the range's last ledger
            if outcome.malformed is not None:
                malformed(follower, outcome.malformed, request)
            elif not outcome.full:
                return
