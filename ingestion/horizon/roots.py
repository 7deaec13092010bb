"""Watching the Horizons' roots: reading a Horizon's ``/``, the staleness watcher that has the
pump move off a Horizon whose ingestion stalled (I/O; the decision is
:func:`~ingestion.horizon.health.assess_staleness`, pure), and what each Horizon says of its
network (:func:`network_looks`: its root's passphrase and latest ledger, a ledger's hash).
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import httpx
import structlog
import trio

from ingestion.common.http import ssl_context
from ingestion.common.network import SourceLook
from ingestion.horizon.exchange import Requester, answered, pace
from ingestion.horizon.follower import HorizonFollower
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
    ``history_latest_ledger`` and, for ``ledger`` (when it holds it), ``/ledgers/N``'s ``hash``;
    a Horizon that does not answer says nothing (None). Each request bounded by the connect and
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
            held = None
            if ledger is not None and ledger <= latest:
                page = await _json(source, client, base, f"{base}/ledgers/{ledger}")
                held = page.get("hash") if page and isinstance(page.get("hash"), str) else None
            looks.append(SourceLook(url, passphrase, latest, held))
    return looks


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
