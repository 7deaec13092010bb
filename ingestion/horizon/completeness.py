"""How far a Horizon job's data is complete: its completeness watermark (issue 49), pure.

Horizon ingests a ledger at a time and its collections are ordered by TOID, the ledger in the top
bits (``ingestion/horizon/health.py``). So a record handed on at paging token ``P`` says that
every record of the collection in the ledgers before ``P``'s has been handed on before it: the job
is complete through the ledger before ``P``'s (through ``P``'s own for ``/ledgers``, one record a
ledger; and through ``L`` for ``P = toid(L + 1) - 1``, the last position of ``L``). A quiet
collection (a scoped one, or a watch list that keeps nothing of a busy one) hands on no record for
a long time: there the source looks (``ingestion/horizon/roots.py``, :func:`look_for_quiet`): it
reads the root's ``history_latest_ledger`` ``H``, then asks for one record after its position; an
empty answer says that Horizon, holding at least ``H`` by then, has nothing after the position in
ledgers up to ``H``, and the source hands on a batch without records whose cursor is
:func:`through_cursor` ``(H)`` (the last position of ``H``) with the watermark ``H``.

A skipped history gap (``horizon.on_history_gap = "skip"``) holds the watermark: every batch past
the gap carries the ledger before it and why, and the committed watermark stops there for good.
"""

from __future__ import annotations

import attrs

from actors.source import Watermark
from ingestion.common.paging import TOID_LEDGER_SHIFT, InvalidPagingToken, token_key


def complete_ledger(cursor: str, resource: str) -> int | None:
    """The last ledger all of whose records in ``resource`` lie at or before ``cursor`` (None:
    not a position in history, ``"now"`` or ``"0"``, or ledger 0)."""
    if cursor in ("now", "0"):
        return None
    try:
        position = token_key(cursor)[0]
    except InvalidPagingToken:
        return None
    if resource.partition("?")[0].rstrip("/").endswith("/ledgers"):
        ledger = position >> TOID_LEDGER_SHIFT  # one record a ledger: its own is read
    else:
        ledger = ((position + 1) >> TOID_LEDGER_SHIFT) - 1
    return ledger if ledger > 0 else None


def through_cursor(ledger: int) -> str:
    """The last position of ``ledger``: every record of the ledgers up to it sorts at or before
    it, every later one after it (a bare TOID: after all of an operation's effects and trades)."""
    return str(((ledger + 1) << TOID_LEDGER_SHIFT) - 1)


@attrs.define
class Completeness:
    """The watermark of the batches one term's source hands on, in order (see the module
    docstring). ``resource``: the job's collection."""

    resource: str
    received: str = ""  # the last record's paging token the consumer took (or the start cursor)
    latest: int | None = None  # Horizon's latest ledger as the last look read it
    given: int = 0  # the highest watermark handed on
    looked: int = 0  # the latest ledger a look's batch read through
    held: str = ""  # a skipped gap holds the watermark at ``held_at`` (why)
    held_at: int = 0
    held_after: str = ""  # the position the source resumed from past the gap

    def hold(self, cursor: str, resume: str, why: str) -> None:
        """A history gap after ``cursor`` was skipped; the source resumes after ``resume``."""
        if self.held:
            return
        self.held_at = max(self.given, complete_ledger(cursor, self.resource) or 0)
        self.held, self.held_after = why, resume

    def mark(self, cursor: str) -> Watermark | None:
        """The watermark once a batch ending at ``cursor`` is committed (None: none to say)."""
        if self.held and token_key(cursor) > token_key(self.held_after):
            return Watermark(self.held_at, self.held, source_latest=self.latest)
        ledger = complete_ledger(cursor, self.resource)
        if ledger is None:
            return None
        self.given = max(self.given, ledger)
        return Watermark(ledger, source_latest=self.latest)

    def quiet(self, cursor: str, latest: int) -> str | None:
        """The read-through cursor a look may hand on when the position ``cursor`` has nothing
        after it in ledgers up to ``latest`` (None: it would not move the watermark)."""
        if cursor == "now":
            return None  # no position yet
        ledger = complete_ledger(cursor, self.resource) or 0
        if latest <= max(ledger, self.given, self.looked):
            return None
        return through_cursor(latest)

    def looked_through(self, latest: int) -> None:
        """A look's batch reading through ``latest`` was handed on."""
        self.looked = max(self.looked, latest)
