"""The audit's expectation from Stellar RPC instead of the lake, inside the RPC's window.

:func:`rpc_expectation` pages ``getEvents`` from ``first`` with the job's filters (a deliberately
plain client, like ``verify``'s: not the node's follower, though its calls are the RPC package's
own, :class:`~ingestion.rpc.source.RpcReader`) until the RPC has scanned through
``last``, and turns each event into the job's record as the node does: its JSON as the RPC source
commits it (``ingestion/rpc/follower.py``), then the job's rule (decoding, the addresses for its watch
list). Ledgers outside the RPC's window (older than it keeps, or past its latest) cannot be
audited from it: :class:`~ingestion.audit.runner.AuditError` says so (the lake can).
"""

from __future__ import annotations

from typing import Any

import orjson

from ingestion.audit.expect import Expected, Rules
from ingestion.audit.runner import AuditError
from ingestion.common.http import SourceUnreadable
from ingestion.rpc.protocol import Cursor
from ingestion.rpc.source import RpcReader

PAGE = 10_000  # events a getEvents page asks for (RPC's own maximum)
TIMEOUT = 30.0  # seconds, each call


async def rpc_expectation(url: str, rules: Rules, first: int, last: int) -> list[Expected]:
    """The events of ledgers ``first..last`` the job keeps before its watch list, from the
    Stellar RPC at ``url``.

    Raises:
        AuditError: the RPC cannot be read, answers an error, or does not hold every one of
            those ledgers.
    """
    if rules.decode or rules.names:
        # lazy: only rules that decode or name addresses use the decoder
        from ingestion.decode.decoded import decode_event_text
    filters = [f.to_json() for f in rules.filters]
    out: list[Expected] = []
    scanned: Cursor | None = None
    params: dict[str, Any] = {"startLedger": first, "filters": filters, "pagination": {"limit": PAGE}}
    try:
        reader = RpcReader(url, request_timeout=TIMEOUT)
    except ValueError as exc:
        raise AuditError(str(exc)) from exc
    async with reader.client() as http:
        while True:
            try:
                result = await reader.call(http, "getEvents", params)
            except SourceUnreadable as exc:
                raise AuditError(f"the RPC {url}: {exc}") from exc  # (no answer, or an error one)
            oldest, latest = int(result.get("oldestLedger", 0)), int(result["latestLedger"])
            if first < oldest or last > latest:
                raise AuditError(
                    f"the RPC {url} keeps ledgers {oldest}..{latest}: ledgers {first}..{last} are not all "
                    "in its window (audit them against the lake: --lake)"
                )
            for event in result["events"]:
                position = Cursor.parse(str(event["id"]))
                if position.ledger > last:
                    return out
                body = orjson.dumps(event).decode()
                if rules.decode or rules.names:
                    text, names = decode_event_text(body)
                    out.append((str(event["id"]), text if rules.decode else body, names))
                else:
                    out.append((str(event["id"]), body, ()))
            cursor = Cursor.parse(str(result["cursor"]))
            if cursor.ledger >= last and len(result["events"]) < PAGE:
                return out
            if scanned is not None and cursor <= scanned:
                raise AuditError(f"the RPC {url} did not move on from its cursor {cursor}")
            scanned = cursor
            params = {"filters": filters, "pagination": {"cursor": result["cursor"], "limit": PAGE}}
