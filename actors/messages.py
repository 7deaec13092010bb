"""The messages the actors exchange: frozen values, a closed set.

Elector -> Heartbeat:     StartRenewing, StopRenewing
Elector -> Ingestor:      LeaseGranted, LeaseExtended, LeaseRevoked
Heartbeat -> Elector:     RenewSucceeded, RenewFailed, RenewRejected
Ingestor -> CursorWriter: OpenTerm (a sink that keeps its own cursor), CommitCursor (carrying the
                          fencing token and a reply channel)
CursorWriter -> Ingestor: SinkOpened, SinkRefused, CursorCommitted, CommitRefused, CommitUnknown
                          (on the reply channel)
CursorWriter -> Elector:  FencingTokenRejected
Ingestor -> Elector:      TermResumed (a sink that keeps its own cursor), TermEnded
supervisor -> Elector:    ShutdownRequested
"""

from __future__ import annotations

import attrs
import trio

from actors.source import Record, Watermark

# --- Elector -> Heartbeat ---


@attrs.frozen
class StartRenewing:
    token: int
    granted_at: float  # monotonic time the acquire request was sent


@attrs.frozen
class StopRenewing:
    token: int


# --- Elector -> Ingestor ---


@attrs.frozen
class LeaseGranted:
    token: int
    ingest_deadline: float  # absolute trio time; ingestion must be over by then
    cursor: str  # where ingestion resumes: the committed cursor, else the job's start cursor
    committed_cursor: str | None  # the cursor in Redis (None before the first commit)


@attrs.frozen
class LeaseExtended:
    token: int
    ingest_deadline: float


@attrs.frozen
class LeaseRevoked:
    token: int
    reason: str
    graceful: bool  # True: let the in-flight commit finish; False: cancel at once


# --- to the Elector ---


@attrs.frozen
class RenewSucceeded:
    token: int
    sent_at: float


@attrs.frozen
class RenewFailed:
    token: int
    error: str


@attrs.frozen
class RenewRejected:
    token: int


@attrs.frozen
class FencingTokenRejected:
    token: int
    current_token: int
    cursor: str
    # Refused by a sink that keeps a fence of its own (PostgreSQL), not by Redis: this node's
    # Redis lease may still be held, and the Elector releases it (only if still ours).
    lease_may_hold: bool = False


@attrs.frozen
class TermEnded:
    """The Ingestor's term is over. ``reason``: ``deadline`` (the lease scope fired), ``revoked``,
    ``fenced``, ``commit-unknown`` (Redis did not answer a commit), ``commit-refused`` (a batch
    that does not follow the cursor), ``source-fatal``, ``sink-refused`` (the sink refuses this
    node's terms for good: :class:`SinkRefused`), ``term-failed`` (the term raised an exception
    nobody foresaw; ``detail`` names it)."""

    token: int
    reason: str
    detail: str = ""


@attrs.frozen
class TermResumed:
    """Term ``token`` opened in a sink that keeps the job's cursor: it resumes from ``cursor``
    (the sink's committed cursor, else the job's start cursor). The Elector announces the term
    (``became-leader``) with it."""

    token: int
    cursor: str


@attrs.frozen
class ShutdownRequested:
    signal: str


@attrs.frozen
class CampaignNow:
    """The balancer tells a held-off standby that the picture changed (a node left, this node
    leads fewer jobs): ask the gate again now rather than at the next recheck."""


@attrs.frozen
class HandBack:
    """End term ``token`` gracefully so that another node leads: the balancer's (this node
    holds more than its share, ``rebalanced``) or the source watch's (``source-unavailable``).
    The sender decided on that term; if it has ended meanwhile (another term, or none, now),
    the hand-back changes nothing."""

    token: int
    reason: str = "rebalanced"


ElectorInput = (
    RenewSucceeded
    | RenewFailed
    | RenewRejected
    | FencingTokenRejected
    | TermResumed
    | TermEnded
    | ShutdownRequested
    | HandBack
    | CampaignNow
)
HeartbeatInput = StartRenewing | StopRenewing
IngestorInput = LeaseGranted | LeaseExtended | LeaseRevoked

# --- Ingestor <-> CursorWriter ---


@attrs.frozen
class CursorCommitted:
    token: int
    cursor: str
    count: int


@attrs.frozen
class CommitRefused:
    """Nothing was written: a stale token, a lost lease, or records that do not follow the cursor."""

    token: int
    reason: str
    current_token: int


@attrs.frozen
class CommitUnknown:
    """Redis did not answer; the commit may or may not have been applied."""

    token: int
    error: str


CommitOutcome = CursorCommitted | CommitRefused | CommitUnknown


@attrs.frozen
class SinkOpened:
    """The sink accepted term ``token`` (its fence raised to it) and keeps the job's cursor:
    ``cursor`` is the one committed there (None: nothing yet)."""

    token: int
    cursor: str | None


@attrs.frozen
class SinkRefused:
    """The sink refuses term ``token`` for good, whatever the token: another election domain
    owns the job there (``actors.sink.TermRefused``). ``problem`` says what to do; the job stops
    on this node."""

    token: int
    problem: str


@attrs.frozen
class OpenTerm:
    """A new term's first step where the sink keeps its own cursor (``actors/sink.py``): raise
    the sink's fence to ``token`` and read the committed cursor there. Answered with
    :class:`SinkOpened`, :class:`SinkRefused`, or :class:`CommitRefused` /
    :class:`CommitUnknown` (the term ends)."""

    token: int
    reply: trio.MemorySendChannel[WriterOutcome] = attrs.field(eq=False, repr=False)


WriterOutcome = CommitOutcome | SinkOpened | SinkRefused


@attrs.frozen
class CommitCursor:
    """Commit ``records`` (strictly after ``previous_cursor``) under fencing ``token``, then move
    the cursor on to ``anchor`` when given (after the last record): with no records, pinning
    where a job that starts at "now" begins, or a source's "read through here" position.
    ``watermark``: the job's completeness watermark, committed with the cursor when given."""

    token: int
    previous_cursor: str | None
    records: tuple[Record, ...]
    reply: trio.MemorySendChannel[WriterOutcome] = attrs.field(eq=False, repr=False)
    anchor: str | None = None
    watermark: Watermark | None = None

    @property
    def cursor(self) -> str:
        return self.anchor if self.anchor is not None else self.records[-1].paging_token


WriterInput = CommitCursor | OpenTerm
