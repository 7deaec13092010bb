"""The chaos campaign's judge: pure rules over what a run recorded, no I/O.

A run records, on the harness's monotonic clock (seconds from the campaign's start):

- every fault it injected, as a :class:`FaultWindow`: when it began, when it ended (an instant
  fault, a SIGKILL, has ``end == start``; an outage, Horizon answering 503 for 2 s, lasts) and
  which jobs it may hold up (a Postgres restart holds up the Postgres job only; a node's crash
  every job);
- every poll of every job's lease and committed cursor (:class:`Sample`);
- each job's grants, from its audit stream (:class:`AuditGrant`, Redis's clock), and each
  ``became-leader`` line the nodes logged (:class:`LoggedGrant`).

The rules (each returns one line per violation; an empty list passes):

- :func:`liveness_problems`: **B**, the bound of docs/FAILOVER.md ("Liveness"). In every stretch of
  a job's time that no fault touching the job interrupts (a fault-free interval: it begins when
  a fault ends, and a fault that starts ends it), the job commits at least every ``bound``
  seconds, the first time within ``bound`` of the interval's start. A job whose source, sink or
  every node is down is not held to it while that fault lasts; once it ends, the clock runs.
- :func:`election_problems`: the audit and the log agree. Tokens rise with Redis's time; a token
  is granted once; every audited grant was logged by the node it names; a term that was not
  released ended only by expiring: the next grant came at least a TTL after the holder's last
  renewal (``takeover_ms``), so no two terms of one job overlapped by Redis's clock.
- The records themselves (exactly once, in order, tokens that never fall, no write under a token
  after the next was granted) are :func:`ingestion.verify.check_stream`'s; the campaign feeds it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import attrs


@attrs.frozen
class FaultWindow:
    """One injected fault: ``kind`` at ``target``, from ``start`` to ``end`` (seconds), holding up
    ``jobs``."""

    kind: str
    target: str
    start: float
    end: float
    jobs: frozenset[str]
    detail: str = ""


@attrs.frozen
class Sample:
    """One poll of one job: its lease holder (None: no lease) and committed cursor at ``at``."""

    at: float
    job: str
    holder: str | None
    cursor: str | None


@attrs.frozen
class AuditGrant:
    """A ``became-leader`` or ``released`` entry of a job's audit stream (Redis's clock, ms)."""

    at_ms: int
    event: str  # "became-leader" or "released"
    node: str
    token: int
    previous_token: int | None = None
    takeover_ms: int | None = None


@attrs.frozen
class LoggedGrant:
    """A grant a node logged (the harness's clock): ``became-leader``, or ``unconfirmed`` (a
    ``redis-unavailable`` line naming the token of a grant no replica acknowledged, which the node
    did not act on) or ``orphaned`` (``releasing-orphaned-lease``: a grant whose answer it never
    had, handed back)."""

    at: float
    node: str
    token: int
    event: str = "became-leader"


@attrs.frozen
class Stretch:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def commit_times(samples: Iterable[Sample]) -> list[float]:
    """When the job's committed cursor was seen to move (the first sample showing each new one)."""
    times: list[float] = []
    last: str | None = None
    seen = False
    for s in samples:
        if s.cursor is None and not seen:
            continue
        if seen and s.cursor is not None and s.cursor != last:
            times.append(s.at)
        if s.cursor is not None:
            last, seen = s.cursor, True
    return times


def fault_free(faults: Iterable[FaultWindow], job: str, start: float, end: float) -> list[Stretch]:
    """The stretches of ``[start, end]`` no fault touching ``job`` interrupts (an instant fault
    splits a stretch in two)."""
    windows = sorted((f.start, f.end) for f in faults if job in f.jobs and f.end >= start and f.start <= end)
    out: list[Stretch] = []
    at = start
    for a, b in windows:
        if a > at:
            out.append(Stretch(at, a))
        at = max(at, b)
    if end > at:
        out.append(Stretch(at, end))
    return out


def longest_gap(times: Sequence[float], start: float, end: float) -> Stretch | None:
    """The longest stretch of ``[start, end]`` without a time of ``times``."""
    points = [start, *(t for t in times if start < t < end), end]
    gaps = [Stretch(a, b) for a, b in itertools.pairwise(points)]
    return max(gaps, key=lambda g: g.length) if gaps else None


def liveness_problems(
    job: str, commits: Sequence[float], faults: Sequence[FaultWindow], start: float, end: float,
    bound: float,
) -> list[str]:  # fmt: skip
    """A job that went more than ``bound`` seconds of fault-free time without a commit."""
    problems = []
    for quiet in fault_free(faults, job, start, end):
        gap = longest_gap(commits, quiet.start, quiet.end)
        if gap is not None and gap.length > bound:
            cause = _last_fault_before(faults, job, gap.start)
            problems.append(
                f"liveness: {job} committed nothing for {gap.length:.1f} s "
                f"(t={gap.start:.1f}..{gap.end:.1f}) with no fault touching it, bound {bound:.1f} s"
                + (
                    f"; the last fault before: {cause.kind} {cause.target} at t={cause.start:.1f}"
                    if cause
                    else ""
                )
            )
    return problems


def _last_fault_before(faults: Sequence[FaultWindow], job: str, at: float) -> FaultWindow | None:
    before = [f for f in faults if job in f.jobs and f.start <= at]
    return max(before, key=lambda f: f.end) if before else None


def leaderless(samples: Iterable[Sample]) -> list[Stretch]:
    """The stretches during which polls saw no lease for the job (from the first sample without
    one to the next sample with one; a poll that failed, Redis down, is not a sample)."""
    out: list[Stretch] = []
    began: float | None = None
    for s in samples:
        if s.holder is None and began is None:
            began = s.at
        elif s.holder is not None and began is not None:
            out.append(Stretch(began, s.at))
            began = None
    return out


UNANSWERED_WINDOW_MS = 5000  # a Redis call's bound with its retry, and the log line's way out


def election_problems(
    job: str, audit: Sequence[AuditGrant], logged: Sequence[LoggedGrant], ttl_ms: int,
    *, rollbacks: bool = False, unanswered: Sequence[tuple[str, int]] = (),
) -> list[str]:  # fmt: skip
    """The audit stream against itself and the nodes' logs (see the module docstring).
    ``rollbacks``: a node saw Redis roll back during the run, so a grant it logged may be gone
    from the audit and its token issued again; those two checks then only count.
    ``unanswered``: (node, ms on Redis's clock) of each campaign whose answer a node never had
    (``redis-unavailable`` without a token): a grant to that node within
    :data:`UNANSWERED_WINDOW_MS` before it is one nobody could log, and is not reported."""
    problems: list[str] = []
    grants = [g for g in sorted(audit, key=lambda g: g.at_ms) if g.event == "became-leader"]
    released = {(g.token, g.node): g.at_ms for g in audit if g.event == "released"}
    by_token: dict[int, AuditGrant] = {}
    for before, after in itertools.pairwise(grants):
        if after.token <= before.token:
            problems.append(
                f"election: {job} token {after.token} granted to {after.node} at {after.at_ms} ms, "
                f"after token {before.token} ({before.node}, {before.at_ms} ms): tokens must rise"
            )
    for g in grants:
        if g.token in by_token and by_token[g.token].node != g.node:
            problems.append(
                f"election: {job} token {g.token} granted twice ({by_token[g.token].node}, {g.node})"
            )
        by_token.setdefault(g.token, g)
    previous: AuditGrant | None = None
    for g in grants:
        if previous is not None and g.previous_token == previous.token:
            ended = released.get((previous.token, previous.node))
            if (
                (ended is None or ended > g.at_ms)
                and g.takeover_ms is not None
                and g.takeover_ms < ttl_ms - 5
            ):
                problems.append(
                    f"election: {job} token {g.token} granted to {g.node} {g.takeover_ms} ms after "
                    f"{previous.node}'s last renewal of token {previous.token}, which was not "
                    f"released: its lease (TTL {ttl_ms} ms) still held, two terms overlapped"
                )
        previous = g
    seen = {(g.node, g.token) for g in logged}
    for g in grants:
        lost_answer = any(
            node == g.node and g.at_ms - 1000 <= at_ms <= g.at_ms + UNANSWERED_WINDOW_MS
            for node, at_ms in unanswered
        )
        if (g.node, g.token) not in seen and not lost_answer:
            problems.append(
                f"election: {job} audit grants token {g.token} to {g.node}, which never logged it "
                "(as became-leader, an unconfirmed grant or an orphaned lease it released)"
            )
    if not rollbacks:
        nodes_of: dict[int, set[str]] = {}
        for lg in logged:
            if lg.event == "became-leader":
                nodes_of.setdefault(lg.token, set()).add(lg.node)
        for token, nodes in sorted(nodes_of.items()):
            if len(nodes) > 1:
                problems.append(f"election: {job} token {token} logged by {sorted(nodes)}")
    return problems


def reissued_tokens(logged: Sequence[LoggedGrant]) -> int:
    """Tokens two nodes logged (only after a Redis rollback lost a grant)."""
    nodes_of: dict[int, set[str]] = {}
    for g in logged:
        if g.event == "became-leader":
            nodes_of.setdefault(g.token, set()).add(g.node)
    return sum(1 for nodes in nodes_of.values() if len(nodes) > 1)
