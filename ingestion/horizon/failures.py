"""What a failed Horizon request means: its problem detail, whether another try can fix it, and
what to tell the operator when it cannot (pure).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs


def is_entity_scoped(resource: str) -> bool:
    """True for ``/accounts/G.../...``, ``/liquidity_pools/{id}/...`` and
    ``/claimable_balances/{id}/...``: Horizon answers 404 for an account, pool or balance it has
    not ingested yet (a new one, a lagging mirror), which another URL or a later try can fix."""
    return resource.startswith(("/accounts/", "/liquidity_pools/", "/claimable_balances/"))


class NotFoundTracker:
    """When to give up on 404s for an account-scoped collection: only once every URL has been
    answering 404 (and nothing else since) for ``give_up`` seconds. Time is passed in."""

    def __init__(self, urls: Sequence[str], give_up: float) -> None:
        self.urls = frozenset(u.rstrip("/") for u in urls)
        self.give_up = give_up
        self._since: dict[str, float] = {}

    def not_found(self, url: str, now: float) -> bool:
        """``url`` answered 404 at ``now``; True when it is time to give up."""
        self._since.setdefault(url.rstrip("/"), now)
        if set(self._since) < self.urls:
            return False
        return now - min(self._since.values()) >= self.give_up

    def found(self) -> None:
        """Some URL answered with the collection: the account exists."""
        self._since.clear()



@attrs.frozen
class Failure:
    """A request that did not produce records: the HTTP status (None for a transport error),
    a short description, and for 429 the parsed Retry-After."""

    status: int | None
    error: str
    retry_after: float | None = None


def problem_detail(content: bytes) -> str:
    """The useful part of a Horizon problem+json body: ``detail`` and the ``extras`` reason."""
    try:
        doc = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return content[:200].decode("utf-8", "replace").strip()
    if not isinstance(doc, dict):
        return str(doc)[:200]
    parts = [str(doc.get("title") or ""), str(doc.get("detail") or "")]
    extras = doc.get("extras")
    if isinstance(extras, dict):
        for key in ("invalid_field", "reason"):
            if extras.get(key):
                parts.append(f"{key}={extras[key]}")
    return " ".join(p for p in parts if p) or str(doc)[:200]


def is_retryable_status(status: int) -> bool:
    """True for statuses that another try can fix: 5xx, 408, 425, 429 (and anything odd < 400)."""
    return status >= 500 or status in (408, 425, 429) or status < 400


def fatal_message(status: int, url: str, detail: str) -> str:
    """What to tell the operator when Horizon rejects a request for good."""
    if status == 400:
        fix = "check the start cursor / committed cursor and the resource path"
    elif status == 404:
        fix = (
            "check --resource (unknown path, or the account/ledger does not exist on this "
            "network) and the Horizon URL"
        )
    elif status in (401, 403):
        fix = "check access to this Horizon (API key, IP allow-list)"
    elif status == 410:
        fix = "the cursor is older than this Horizon's retained history; choose a newer cursor"
    else:
        fix = "check the resource path and Horizon URL"
    return f"Horizon rejected {url} with HTTP {status}: {detail or '(no detail)'}; {fix}"
