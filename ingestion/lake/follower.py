"""The lake follower: every decision of the lake source, with no I/O.

:class:`LakeFollower` says which ledger's object to read next (:attr:`LakeFollower.needed`), turns
an object's ledgers into a batch of the events after the position that match the job's filters
(:meth:`LakeFollower.on_ledgers`), and says what a missing object means (:meth:`LakeFollower.on_missing`).
:class:`~ingestion.lake.source.LakeSource` reads the objects and decodes them.

Position and cursors are Stellar RPC's (:class:`~ingestion.rpc.protocol.Cursor`): an event's id,
or the scanned-through cursor of a ledger (``Cursor.through(L)``: every event of L has been read).
A job can therefore move between RPC and a lake without a conversion: the same events, the same ids.

- start ``"0"``: the lake's oldest ledger (the shell finds it and calls :meth:`skip_to`);
- start ``N`` (a ledger number): events from ledger N on;
- start an event id or a scanned-through cursor: events strictly after it.

Every object read is committed with the scanned-through cursor of its last ledger (even with no
matching event), so a failover resumes at the next object, never from far behind; the job's
completeness watermark (:class:`~actors.source.Watermark`) is that ledger too.

A missing object: when the lake holds nothing at or after the needed ledger, the follower is at
the tip and polls again after ``poll_interval``; when a later ledger exists, the object in between
is missing (a hole in the lake): that is a history gap, never skipped silently.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from actors.source import Batch, Record, Watermark
from ingestion.lake.events import LedgerEvents
from ingestion.rpc.protocol import Cursor, EventFilter, matches, parse_start


@attrs.frozen
class LakeGap:
    """The object holding ``ledger`` is missing while the lake holds ledgers up to ``latest``."""

    ledger: int
    latest: int
    cursor: str


@attrs.define
class LakeFollower:
    """Follows a lake's events for ``filters`` from ``start`` (see the module docstring).

    Raises (construction):
        ValueError: ``start`` is neither ``"0"``, a ledger number nor an event id.
    """

    filters: tuple[EventFilter, ...]
    start: str
    poll_interval: float = 1.0
    position: Cursor | None = attrs.field(init=False, default=None)
    start_ledger: int = attrs.field(init=False, default=0)  # 0: the lake's oldest, not known yet

    def __attrs_post_init__(self) -> None:
        start = parse_start(self.start, "a lake")
        if isinstance(start, Cursor):
            self.position = start
        else:
            self.start_ledger = start

    @property
    def knows_start(self) -> bool:
        return self.position is not None or self.start_ledger > 0

    @property
    def needed(self) -> int:
        """The first ledger whose events are still needed (its object is read next)."""
        if self.position is None:
            return self.start_ledger
        p = self.position
        return p.ledger + 1 if p == Cursor.through(p.ledger) else p.ledger

    def describe_position(self) -> str:
        return str(self.position) if self.position is not None else str(self.start_ledger)

    def skip_to(self, ledger: int) -> None:
        """Go on from ``ledger`` (the lake's oldest, for a start at ``"0"``)."""
        self.position, self.start_ledger = None, ledger

    def on_ledgers(self, ledgers: Sequence[LedgerEvents]) -> Batch | None:
        """An object's ledgers, ascending: the events after the position that match, with the
        scanned-through cursor of the last ledger. Ledgers before the needed one (a file of
        several ledgers read from inside) are passed over.

        Raises:
            ValueError: the object does not hold the needed ledger (a broken lake: the shell
                names the object).
        """
        needed = self.needed
        held = [le for le in ledgers if le.ledger >= needed]
        if not held or held[0].ledger != needed:
            seqs = [le.ledger for le in ledgers]
            raise ValueError(f"the object should hold ledger {needed} but holds {seqs[:1]}..{seqs[-1:]}")
        for before, after in itertools.pairwise(held):
            if after.ledger != before.ledger + 1:
                raise ValueError(f"ledger {before.ledger} is followed by {after.ledger}")
        floor = self.position
        above = None if floor is None else (floor.ledger, floor.tx, floor.op, floor.event)
        records = tuple(
            Record(e.id, e.body)
            for le in held
            for e in le.events
            if (above is None or e.key > above)
            and (not self.filters or matches(self.filters, e.type, e.contract_id, e.topics))
        )
        through = Cursor.through(held[-1].ledger)
        if floor is not None and through <= floor:
            return None
        self.position = through
        return Batch(records, through=str(through), watermark=Watermark(held[-1].ledger))

    def on_missing(self, latest: int | None) -> LakeGap | None:
        """The needed ledger's object is not there; ``latest`` is the newest ledger the lake
        holds (None: an empty lake). A gap when the lake holds a later ledger, else None: the
        needed ledger is not written yet (the tip), ask again after :attr:`poll_interval`."""
        if latest is not None and latest >= self.needed:
            return LakeGap(self.needed, latest, self.describe_position())
        return None
