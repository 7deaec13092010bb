"""What the lease store's calls return, and how they fail.

Every call either answers with one of these frozen values or raises :class:`RedisUnavailable`,
whose outcome the caller must treat as unknown (the command may have been applied).
"""

from __future__ import annotations

import enum

import attrs


class Renewal(enum.IntEnum):
    """A renewal's answer (true when the lease was extended)."""

    LOST = 0  # the lease is not (or no longer) this holder's
    RENEWED = 1
    HAND_OVER = 2  # renewed, and an operator asked this term to hand over (ingestion handover, the console)


class RedisUnavailable(Exception):
    """A Redis call failed or timed out. Its effect is unknown: it may have been applied."""


class ReplicationUnconfirmed(RedisUnavailable):
    """The primary applied the write but fewer replicas than asked acknowledged it in time
    (``WAIT``): a failover may still lose it, so its outcome is as unknown as a timed-out call's.
    ``token``: the fencing token of a lease grant so applied (the node logs it: the audit names it)."""

    def __init__(self, message: str, acked: int, wanted: int, token: int | None = None) -> None:
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted
        self.token = token


@attrs.frozen
class HealthReport:
    """A node's source health as ``report_health`` takes it, carried by a standby's campaign
    (:meth:`LeaseStore.acquire`) so that an idle standby spends one round trip per TTL, not two."""

    age_ms: int | None  # since the source's last success (None: it never answered)
    window_ms: int  # a node whose source answered within this long counts as able
    failing_ms: int | None = None  # how long it has been failing (None: it is not)


@attrs.frozen
class Acquired:
    """This node now holds the lease under ``token``."""

    token: int
    previous_node: str | None
    previous_token: int | None
    takeover_ms: int | None  # how long the job was leaderless (None: first leader ever)
    cursor: str | None  # the last committed paging token
    # Redis's token counter when it was below the caller's known token (Redis went back in time,
    # e.g. a failover to a replica that missed writes); None when it was not.
    rolled_back_from: int | None = None
    # The primary's replication id (changes when a replica is promoted); not part of equality.
    replid: str | None = attrs.field(default=None, eq=False)
    # With a carried :class:`HealthReport`: the nodes able to lead the job (as report_health lists
    # them); None without one. Not part of equality.
    able: tuple[str, ...] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Held:
    """Someone holds the lease; it has ``ttl_left_ms`` to live unless renewed."""

    holder: str
    token: int
    ttl_left_ms: int
    committed: bool = False  # the job has a committed cursor (it has committed at least once)
    replid: str | None = attrs.field(default=None, eq=False)
    # With a carried :class:`HealthReport`: the nodes able to lead the job (as report_health lists
    # them); None without one. Not part of equality.
    able: tuple[str, ...] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class StateLost:
    """Redis's token counter is below a token the caller has seen *and* the job's cursor is gone
    although the caller saw the job commit: Redis lost the job's state (restarted empty, an empty
    replica promoted). Nothing was issued:
    leading would restart the job from its start cursor, which is an operator's decision."""

    counter: int
    cursor: str | None
    replid: str | None = attrs.field(default=None, eq=False)
    # With a carried :class:`HealthReport`: the nodes able to lead the job (as report_health lists
    # them); None without one. Not part of equality.
    able: tuple[str, ...] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Committed:
    token: int
    cursor: str
    count: int
    trimmed: int = 0  # events-stream entries the commit's retention trim removed (events_max_len)
    # The job's completeness watermark after the commit (None: none committed yet), why it is
    # held at a known gap ('' when it is not), and whether this commit is the one that held it.
    complete_through: int | None = None
    held: str = ""
    newly_held: bool = False


@attrs.frozen
class CommitRejected:
    """Redis refused the commit and changed nothing.

    ``reason`` is one of ``stale-token``, ``lease-lost``, ``cursor-moved``, ``not-after-cursor``,
    ``bad-paging-token``; ``current_token`` is the job's token counter when Redis checked.
    """

    token: int
    reason: str
    current_token: int
    stored_cursor: str | None


@attrs.frozen
class LeaderInfo:
    node: str | None
    token: int | None
    lease_ttl_ms_left: int | None
    committed: bool = False  # the job has a committed cursor (as :class:`Held` says)


@attrs.frozen
class JobState:
    """A job's state read now (:mod:`actors.lease_store.state`, ``LeaseStore.state``): for
    ``inspect``, the console, the testing kit and the tests."""

    job: str
    leader: str | None  # the lease's holder (None: no lease)
    token: int  # the fencing-token counter (0: never elected)
    lease_ttl_ms_left: int | None
    cursor: str | None
    cursor_token: int | None
    events: int  # the events stream's length
    audit: list[dict[str, str]]  # the newest audit entries asked for, oldest first, each with its ``id``
    complete_through: int | None = None  # the completeness watermark (a ledger), None: none yet
    complete_held: str = ""  # why a known gap holds it there for good ('' when none does)
    lease_token: int | None = None  # the holder's token (the lease's; None: no lease)
    # the cursor hash whole: the commit's fields above, and whatever the application keeps there
    cursor_fields: dict[str, str] = attrs.field(factory=dict, repr=False)


@attrs.frozen
class GroupInfo:
    """One consumer group on the events stream."""

    name: str
    consumers: int
    pending: int  # delivered to a consumer, not yet acknowledged
    lag: int | None  # entries not yet delivered to the group (None: Redis cannot tell)
    last_delivered_id: str

    @property
    def unacknowledged(self) -> int | None:
        """Entries the group has still to acknowledge: pending plus undelivered."""
        return None if self.lag is None else self.pending + self.lag


@attrs.frozen
class StreamInfo:
    """The events stream as its readers see it (for metrics, ``inspect`` and the tests)."""

    length: int
    entries_added: int  # every entry ever appended, trimmed ones included
    first_id: str | None
    last_id: str | None
    groups: tuple[GroupInfo, ...]

    @property
    def trimmed(self) -> int:
        """Entries removed by retention (the stream is only ever trimmed from its head)."""
        return self.entries_added - self.length

