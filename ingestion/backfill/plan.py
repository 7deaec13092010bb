"""A backfill's plan and progress, pure: no I/O.

``ingestion backfill JOB --from A --to B --ranges K`` splits the ledgers ``A..B`` into ``K``
consecutive ranges. Each range is a job of its own, named ``JOB~FIRST-LAST``: its own lease,
token, cursor and audit, elected and fenced like any job, started at ledger ``FIRST`` and done
once its cursor has scanned through ledger ``LAST`` (its leader then records ``done`` in the
range's backfill hash, fenced by its token). The name carries the bounds, so a plan made again
with the same span and ``K`` resumes every range from its committed cursor, and another span
never mixes with it.

Redis keys (each under its job's hash tag):

- ``ingestion:{JOB}:backfill``, the plan: ``first``, ``last``, ``ranges``, ``state``
  (``running``, ``done`` once every range is done, or ``cancelled``), ``created_at``,
  ``created_by`` (and ``finished_at``, ``cancelled_at``, ``resumed_at``, ``resumed_by`` when so).
  Written by ``lua/plan.lua`` and moved by ``lua/settle.lua``, each one atomic step.
- ``ingestion:{JOB~FIRST-LAST}:backfill``, a range's end: ``done`` (its final cursor),
  ``node``, ``at``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

RANGE_MARK = "~"
STATES = ("running", "done", "cancelled")


def range_name(job: str, first: int, last: int) -> str:
    return f"{job}{RANGE_MARK}{first}-{last}"


def split(first: int, last: int, ranges: int) -> list[tuple[int, int]]:
    """``first..last`` (ledgers, both included) as ``ranges`` consecutive ranges of sizes that
    differ by one at most (fewer when the span has fewer ledgers).

    Raises:
        ValueError: an empty span or no range.
    """
    if last < first:
        raise ValueError(f"--to {last} is below --from {first}")
    if ranges < 1:
        raise ValueError(f"--ranges must be at least 1, got {ranges}")
    span = last - first + 1
    ranges = min(ranges, span)
    size, extra = divmod(span, ranges)
    out: list[tuple[int, int]] = []
    start = first
    for i in range(ranges):
        end = start + size + (1 if i < extra else 0) - 1
        out.append((start, end))
        start = end + 1
    return out


@attrs.frozen
class Plan:
    """A backfill of ``job``: ledgers ``first..last`` in ``ranges`` ranges."""

    job: str
    first: int
    last: int
    ranges: int
    state: str = "running"
    created_at: str = ""
    created_by: str = ""

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return split(self.first, self.last, self.ranges)

    @property
    def names(self) -> list[str]:
        return [range_name(self.job, a, b) for a, b in self.bounds]

    def to_hash(self) -> dict[str, str]:
        return {
            "first": str(self.first), "last": str(self.last), "ranges": str(self.ranges),
            "state": self.state, "created_at": self.created_at, "created_by": self.created_by,
        }  # fmt: skip

    @classmethod
    def from_hash(cls, job: str, fields: Mapping[str, str]) -> Plan | None:
        """The plan a hash holds, or None when it holds none (absent or not one of ours)."""
        try:
            first, last, ranges = int(fields["first"]), int(fields["last"]), int(fields["ranges"])
        except (KeyError, ValueError):
            return None
        state = fields.get("state", "running")
        if state not in STATES or last < first or ranges < 1:
            return None
        at, by = fields.get("created_at", ""), fields.get("created_by", "")
        return cls(job, first, last, ranges, state, at, by)

    def same_work(self, other: Plan) -> bool:
        """Whether ``other`` names the same ranges (made again: it resumes this one)."""
        return (self.first, self.last, self.ranges) == (other.first, other.last, other.ranges)


@attrs.frozen
class RangeState:
    """Where one range stands: ``reached`` the last ledger its committed cursor has scanned
    through (``first - 1``: nothing yet), ``done`` once its leader recorded the end, ``leader``
    the node leading it now ("" when none)."""

    name: str
    first: int
    last: int
    reached: int
    done: bool = False
    leader: str = ""

    @property
    def ledgers(self) -> int:
        return self.last - self.first + 1

    @property
    def ledgers_done(self) -> int:
        if self.done:
            return self.ledgers
        return max(0, min(self.reached, self.last) - self.first + 1)


@attrs.frozen
class Progress:
    """A plan's progress from its ranges' states."""

    plan: Plan
    ranges: tuple[RangeState, ...]

    @property
    def total(self) -> int:
        return self.plan.last - self.plan.first + 1

    @property
    def ledgers_done(self) -> int:
        return sum(r.ledgers_done for r in self.ranges)

    @property
    def finished(self) -> bool:
        return all(r.done for r in self.ranges)

    @property
    def running(self) -> int:
        return sum(1 for r in self.ranges if not r.done and r.leader)

    @property
    def complete_through(self) -> int:
        """The last ledger through which the span is complete with no hole (``first - 1``: not
        even its first ledger): every range before it done, and the next range's own progress.
        What a reader of the records may treat as a complete prefix."""
        through = self.plan.first - 1
        for r in self.ranges:
            if r.done:
                through = r.last
                continue
            return max(through, min(r.reached, r.last))
        return through

    def by_node(self) -> dict[str, int]:
        """How many ranges each node leads now."""
        out: dict[str, int] = {}
        for r in self.ranges:
            if r.leader and not r.done:
                out[r.leader] = out.get(r.leader, 0) + 1
        return out


def ledger_of_cursor(cursor: str | None) -> int | None:
    """The last ledger a committed cursor has scanned through: the ledger of a scanned-through
    cursor, the one before for an event id inside a ledger (its ledger is not complete yet), a
    plain ledger number as the ledger before it (a start cursor: nothing of it read). None: no
    cursor."""
    from ingestion.rpc.protocol import Cursor, InvalidCursor  # lazy: start-up (rpc.protocol, ~5 ms)

    if not cursor or cursor == "0" or cursor == "now":
        return None
    if cursor.isdigit() and "-" not in cursor:
        return int(cursor) - 1
    try:
        c = Cursor.parse(cursor)
    except InvalidCursor:
        return None
    return c.ledger if c == Cursor.through(c.ledger) else c.ledger - 1


def range_states(
    plan: Plan, cursors: Sequence[str | None], done: Sequence[bool], leaders: Sequence[str]
) -> Progress:
    """The plan's progress from each range's committed cursor, end and leader (in order)."""
    states = []
    for (first, last), name, cursor, is_done, leader in zip(
        plan.bounds, plan.names, cursors, done, leaders, strict=True
    ):
        reached = ledger_of_cursor(cursor)
        reached = first - 1 if reached is None else reached
        states.append(RangeState(name, first, last, reached, is_done, leader))
    return Progress(plan, tuple(states))
