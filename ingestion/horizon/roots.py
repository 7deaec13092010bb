"""Watching the Horizons' roots: reading a Horizon's ``/``, the staleness watcher that has the
pump move off a Horizon whose ingestion stalled (I/O; the decision is
:func:`~ingestion.horizon.health.assess_staleness`, pure), and what each Horizon says of its
network (:func:`network_looks`: its root's passphrase and latest ledger, a ledger's hash), and
the completeness look that moves a quiet job's watermark with Horizon's ledgers
(:func:`look_for_quiet`; the rule is :mod:`ingestion.horizon.completeness`'s, pure).
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Protocol

import attrs
import httpx
import structlog
import trio

from actors.source import Batch
from ingestion.common.http import ssl_context
from ingestion.common.network import SourceLook
from ingestion.horizon.completeness import Completeness
from ingestion.horizon.exchange import Requester, answered, get_page, pace
from ingestion.horizon.follower import HorizonFollower, Mode
from ingestion.horizon.health import RootInfo, assess_staleness

log = structlog.get_logger()


class Watched(Requester, Protocol):
    """What the staleness watcher needs of the source."""

    @property
    def stale_check_interval(self) -> float: ...

    @property
    def stale_after_ledgers(self) -> int: ...


async def watch_staleness(
    source: Watched, client: httpx.AsyncClient, follower: HorizonFollower, switch: Switch
) -> None:
    """Every ``stale_check_interval``, read every URL's ``/``; when the URL in use is stale,
    log ``horizon-stale`` and have the pump move to the freshest URL."""
    while True:
        await trio.sleep(source.stale_check_interval)
        current = follower.base_url
        roots: dict[str, RootInfo | None] = {}
        async with trio.open_nursery() as nursery:
            for url in follower.urls:
                nursery.start_soon(read_root, source, client, url, roots)
        if follower.base_url != current or switch.to is not None:
            continue  # moved meanwhile: judge the new one next time
        stale = assess_staleness(current, roots, source.stale_after_ledgers)
        if stale is None:
            continue
        log.warning(
            "horizon-stale",
            horizon=current,
            history_latest_ledger=stale.history_latest_ledger,
            core_latest_ledger=stale.core_latest_ledger,
            freshest=stale.freshest,
            freshest_ledger=stale.freshest_ledger,
            to_url=stale.switch_to,
            cursor=follower.cursor,
        )
        if stale.switch_to is not None:
            switch.request(stale.switch_to)


async def look_for_quiet(
    source: Requester,
    client: httpx.AsyncClient,
    follower: HorizonFollower,
    completeness: Completeness,
    out: trio.MemorySendChannel[Batch],
    interval: float,
) -> None:
    """Every ``interval`` while the follower streams and has handed nothing on since the last
    look (a quiet collection): read the root of the URL in use, then one record after the
    position; when none is pending and the root is past the position, hand on a batch without
    records that reads through the root's ``history_latest_ledger`` (the page's ``Latest-Ledger``
    header instead when it has one) and moves the watermark with it.
    A look that fails says nothing (the pump's own requests report Horizon's health)."""
    seen = follower.cursor
    while True:
        await trio.sleep(interval)
        cursor, base = follower.cursor, follower.base_url
        if follower.mode is not Mode.STREAMING or cursor != seen or cursor != completeness.received:
            seen = cursor  # records came (their batches carry the watermark) or are on their way
            continue
        roots: dict[str, RootInfo | None] = {}
        await read_root(source, client, base, roots)
        root = roots[base]
        if root is None:
            continue
        completeness.latest = max(completeness.latest or 0, root.history_latest_ledger)
        if completeness.quiet(cursor, root.history_latest_ledger) is None:
            continue
        response, _failure = await get_page(source, client, follower.look_request())
        try:
            pending = response is None or bool(json.loads(response.content)["_embedded"]["records"])
        except (ValueError, LookupError, TypeError):
            pending = True
        moved = (follower.cursor, follower.base_url) != (cursor, base) or cursor != completeness.received
        if pending or moved:
            continue  # something to read (the stream brings it), or the position moved meanwhile
        # Behind a load balancer the page may come from another server than the root: its own
        # Latest-Ledger header (Horizon's) then says how far its answer reaches.
        latest = _latest_ledger_header(response, root.history_latest_ledger)
        through = completeness.quiet(cursor, latest)
        if through is not None:  # (no checkpoint since the check: nothing can be handed on before it)
            completeness.latest = max(completeness.latest or 0, latest)
            completeness.looked_through(latest)
            await out.send(Batch((), through=through))


def _latest_ledger_header(response: httpx.Response | None, default: int) -> int:
    value = None if response is None else response.headers.get("latest-ledger")
    return int(value) if value is not None and value.isdigit() else default


async def read_root(
    source: Requester, client: httpx.AsyncClient, base: str, out: dict[str, RootInfo | None]
) -> None:
    """``/`` of ``base`` parsed into ``out[base]`` (None when it cannot be read)."""
    out[base] = None
    pacer = await pace(source, base)
    response = None
    try:
        with trio.move_on_after(source.connect_timeout + 2 * source.read_timeout):
            response = await client.get(base + "/")
            if response.status_code == 200:
                out[base] = RootInfo.parse(response.content)
    except (httpx.HTTPError, ValueError):
        pass
    finally:
        answered(pacer, response)


@attrs.define(eq=False)
class Switch:
    """The staleness watcher's request to the pump: move to ``to``. ``scope`` is the wait for a
    stream's next event, the only thing the watcher may cut short (None while a record is being
    handed on)."""

    to: str | None = None
    scope: trio.CancelScope | None = None

    def request(self, url: str) -> None:
        self.to = url
        if self.scope is not None:
            self.scope.cancel("the Horizon in use is stale")


async def network_looks(source: Requester, urls: tuple[str, ...], ledger: int | None) -> list[SourceLook]:
    """What each Horizon says of its network: its root's ``network_passphrase`` and
    ``history_latest_ledger`` (and ``history_latest_ledger_closed_at``) and, for ``ledger`` (when
    it holds it), ``/ledgers/N``'s ``hash`` and ``closed_at``; a Horizon that does not answer says
    nothing (None). Each request bounded by the connect and
    read timeouts, paced as the job's own."""
    looks = []
    timeout = httpx.Timeout(source.read_timeout, connect=source.connect_timeout)
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=True, verify=ssl_context()) as client:
        for url in urls:
            base = url.rstrip("/")
            root = await _json(source, client, base, base + "/")
            passphrase = root.get("network_passphrase") if root else None
            latest = root.get("history_latest_ledger") if root else None
            if not isinstance(passphrase, str) or not isinstance(latest, int):
                looks.append(SourceLook(url, passphrase if isinstance(passphrase, str) else None))
                continue
            held, closed_at = None, None
            if ledger is not None and ledger <= latest:
                page = await _json(source, client, base, f"{base}/ledgers/{ledger}")
                held = page.get("hash") if page and isinstance(page.get("hash"), str) else None
                closed_at = _epoch(page.get("closed_at")) if page else None
            top_closed_at = _epoch(root.get("history_latest_ledger_closed_at")) if root else None
            looks.append(SourceLook(url, passphrase, latest, held, top_closed_at, closed_at))
    return looks


def _epoch(value: Any) -> int | None:
    """Horizon's ``2026-12-06T15:04:05Z`` as Unix seconds (None: absent or not a time)."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(when.timestamp()) if when.tzinfo is not None else None


async def _json(source: Requester, client: httpx.AsyncClient, base: str, url: str) -> dict[str, Any] | None:
    """A JSON object from ``url`` (None: no 200 answer, or not an object), bounded, paced."""
    pacer = await pace(source, base)
    response = None
    try:
        with trio.move_on_after(source.connect_timeout + 2 * source.read_timeout):
            response = await client.get(url)
            if response.status_code == 200:
                doc = response.json()
                return doc if isinstance(doc, dict) else None
    except (httpx.HTTPError, ValueError):
        pass
    finally:
        answered(pacer, response)
    return None
