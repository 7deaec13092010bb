"""The Horizon resources a job can follow: collection paths, their query parameters, cursors and limits.

Pure: :func:`check_resource` and :func:`check_cursor` say whether a configured resource or cursor is
one Horizon serves; :func:`split_resource` splits a resource into its path and query parameters.
"""

from __future__ import annotations

import re

from actors.source import SourceFatalError
from ingestion.common.paging import InvalidPagingToken, token_key

#: Horizon's largest page.
MAX_PAGE_LIMIT = 200
#: ``limit`` sent on every stream request. Horizon closes a stream (``byebye``) after ``limit``
#: events and defaults it to the page default, 10: without it a busy collection would be
#: reconnected every 10 records, each reconnect costing a request of the rate limit.
STREAM_LIMIT = 200

_COLLECTIONS = ("ledgers", "transactions", "operations", "payments", "effects", "trades")
_RESOURCE = re.compile(r"/(?:[A-Za-z_]+/[A-Za-z0-9_-]+/)?(?:" + "|".join(_COLLECTIONS) + r")")


# Query parameters that change what a collection returns, and the collections that take them.
_QUERY_PARAMS = {
    "include_failed": (("true", "false"), ("transactions", "operations", "payments")),
    "join": (("transactions",), ("operations", "payments")),
}


def split_resource(resource: str) -> tuple[str, dict[str, str]]:
    """``/operations?join=transactions`` as (``/operations``, ``{"join": "transactions"}``)."""
    path, _, query = resource.partition("?")
    params = dict(part.partition("=")[::2] for part in query.split("&") if part)
    return path, params


def check_resource(resource: str) -> str:
    """Return ``resource`` if it is a Horizon collection path we can follow, with optional
    query parameters that change what it returns (``include_failed``, ``join=transactions``).

    Raises:
        ValueError: not ``/ledgers``, ``/transactions``, ``/operations``, ``/payments``,
            ``/effects`` or a scoped one such as ``/accounts/G.../payments``, or a query
            parameter this collection does not take.
    """
    path, params = split_resource(resource)
    if not _RESOURCE.fullmatch(path):
        raise ValueError(
            f"resource {resource!r} is not a Horizon collection path: use one of "
            + ", ".join("/" + c for c in _COLLECTIONS)
            + " or a scoped one such as /accounts/G.../payments, /liquidity_pools/{id}/trades, "
            "/claimable_balances/{id}/operations or /offers/{id}/trades"
        )
    collection = path.rsplit("/", 1)[1]
    for name, value in params.items():
        values, collections = _QUERY_PARAMS.get(name, ((), ()))
        if collection not in collections or value not in values:
            raise ValueError(
                f"resource {resource!r}: {name}={value} is not a parameter {path} takes; allowed: "
                "include_failed=true|false (transactions, operations, payments) and "
                "join=transactions (operations, payments)"
            )
    return resource


def check_cursor(cursor: str) -> str:
    """Return ``cursor`` if it is ``"now"`` or a paging token, else raise SourceFatalError."""
    if cursor != "now":
        try:
            token_key(cursor)
        except InvalidPagingToken:
            raise SourceFatalError(
                f"cursor {cursor!r} is neither 'now' nor a Horizon paging token; "
                "fix the start cursor (or the committed cursor)"
            ) from None
    return cursor
