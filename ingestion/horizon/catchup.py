"""Overlapped catch-up: fetch several ledger ranges of a Horizon collection at once, hand their
records on strictly in order.

A client that waits for one page before asking for the next is bound by Horizon's response time
(at 100 ms a page of 200 records, 2,000 records/s however fast the machine). Paging tokens of the
dense collections are TOIDs (``ledger << 32 | tx << 12 | op``, with a ``-n`` suffix for effects
and trades), so a cursor can be made for the start of any ledger: the history between the cursor
and Horizon's latest ledger is split into ranges of a few pages each, up to ``parallel`` ranges are
paged at once, and their pages go out range after range, each range's in its own order. Every
commit therefore still continues exactly from the confirmed cursor; records of the next range only
leave once the range before is complete.

:func:`plan_ranges` is the pure core. Account-, ledger-, transaction-, operation-, liquidity-pool-
and claimable-balance-scoped collections are sparse in TOID space and are paged sequentially
(:func:`overlappable`).
"""

from __future__ import annotations

import attrs

from actors.source import Record
from ingestion.common.paging import token_key

LEDGER_SHIFT = 32
DENSE = ("/ledgers", "/transactions", "/operations", "/payments", "/effects", "/trades")


def overlappable(resource: str) -> bool:
    """Whether ``resource`` is a network-wide collection (dense in TOID space): only those are
    split into ledger ranges; scoped ones (``/accounts/G.../payments``) are paged sequentially."""
    path = resource.split("?", 1)[0].rstrip("/")
    return path in DENSE


def ledger_of(cursor: str) -> int:
    return token_key(cursor)[0] >> LEDGER_SHIFT


def ledger_start_cursor(ledger: int) -> str:
    """The cursor just before every record of ``ledger``: records strictly after it start there
    (``toid(ledger, 0, 0) - 1``; for effects and trades, after all of that operation's)."""
    return str((ledger << LEDGER_SHIFT) - 1)


@attrs.frozen
class LedgerRange:
    """Records strictly after ``after`` and before ledger ``end`` (exclusive)."""

    index: int
    after: str
    end: int  # first ledger not in the range

    def keeps(self, paging_token: str) -> bool:
        return ledger_of(paging_token) < self.end

    def kept(self, records: tuple[Record, ...]) -> tuple[Record, ...]:
        """The records this range keeps, of a page's records in ascending order (as
        ``HorizonFollower.on_page`` hands them on): all of them when it keeps the last one (no
        earlier record is in a later ledger), the ones it keeps otherwise (the page that crosses
        the range's end, once a range). One check a page instead of one a record."""
        if not records or self.keeps(records[-1].paging_token):
            return records
        return tuple(r for r in records if self.keeps(r.paging_token))


def plan_ranges(cursor: str, oldest: int, latest: int, ledgers_per_range: int) -> list[LedgerRange]:
    """Split the history after ``cursor`` up to and including ledger ``latest`` into ranges of
    ``ledgers_per_range`` ledgers. ``oldest``: the oldest ledger Horizon still has (cursor "0"
    starts there). Empty when there is nothing to split, or when the cursor is older than
    ``oldest``: records are missing there, which is for the sequential path (and its history-gap
    check) to report, never for ranges to skip."""
    if ledgers_per_range < 1:
        raise ValueError("ledgers_per_range must be at least 1")
    if cursor == "0":
        start_ledger, after = oldest, ledger_start_cursor(oldest)
    else:
        start_ledger, after = ledger_of(cursor), cursor
        if start_ledger < oldest:
            return []
    ranges: list[LedgerRange] = []
    ledger = start_ledger
    while ledger <= latest:
        end = min(latest + 1, ledger + ledgers_per_range)
        ranges.append(LedgerRange(len(ranges), after, end))
        after = ledger_start_cursor(end)
        ledger = end
    return ranges


def ledgers_per_range(records_per_ledger: float, pages_per_range: int, page_limit: int) -> int:
    """How many ledgers make a range of about ``pages_per_range`` full pages."""
    if records_per_ledger <= 0:
        return 64
    return max(1, round(pages_per_range * page_limit / records_per_ledger))
