"""The Elector: campaigns for the lease, owns the lease machine, and starts and ends terms.

While standby it sleeps until the current lease would expire (the remaining TTL from the acquire
answer) or until a release notice arrives, whichever is first, plus a small jitter: never a busy
poll. While leading it feeds renewals, commit rejections and term endings to the pure
:class:`~actors.lease.LeaseMachine` and carries out what it decides. Every election event is
logged here and only here.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from actors.balance import CampaignGate
from actors.health import SourceWatch
from actors.lease import Extended, LeaseMachine, LeaseTiming, Lost, LostReason, standby_wait
from actors.lease_store import (
    Acquired,
    Held,
    LeaseStore,
    RedisUnavailable,
    ReplicationUnconfirmed,
    StateLost,
)
from actors.liveness import ADOPT_AFTER_TTLS
from actors.messages import (
    CampaignNow,
    ElectorInput,
    FencingTokenRejected,
    HandBack,
    HeartbeatInput,
    IngestorInput,
    LeaseExtended,
    LeaseGranted,
    LeaseRevoked,
    RenewFailed,
    RenewRejected,
    RenewSucceeded,
    ShutdownRequested,
    StartRenewing,
    StopRenewing,
    TermEnded,
    TermResumed,
)
from actors.observe import NodeObserver
from actors.token_memory import TokenMemory

RELEASE_CLEANUP_TIMEOUT = 1.0  # seconds: bounded, shielded lease release at the end of a term
# TTLs a lease counts as free once its holder stood aside (a hand-over, a node exiting): adopted at once
HANDED_OVER_FREE_FOR = ADOPT_AFTER_TTLS
# A term that raised (``term-failed``): the node stands aside a TTL, doubled for each such term in
# a row, at most this many seconds, so that a job that fails at once does not spin a token a term.
TERM_FAILED_BACKOFF_CAP = 60.0

# Why the Ingestor ended a term, mapped to the reason the node reports for losing leadership.
_TERM_REASONS = {
    "fenced": LostReason.FENCED,
    "commit-unknown": LostReason.REDIS_UNAVAILABLE,
    "commit-refused": LostReason.RELEASED,
    "source-fatal": LostReason.RELEASED,
    "source-held-off": LostReason.RELEASED,
    "sink-refused": LostReason.RELEASED,
    "term-failed": LostReason.TERM_FAILED,
}
# Term endings that retrying cannot fix: the job stops on this node (``IngestionFatal``).
_FATAL_REASONS = frozenset({"source-fatal", "sink-refused"})


@attrs.frozen
class ReleaseNoticed:
    """A standby heard that ``holder`` released the lease (from the release listener)."""

    holder: str
    # The releasing node stands aside (an operator asked for the release, or the node is going
    # away: its worker died): take over at once, even at the share.
    handed_over: bool = False


class IngestionFatal(Exception):
    """The source failed in a way retrying cannot fix; the node stops with exit status 1."""


@attrs.define
class Elector:
    store: LeaseStore
    node: str
    ttl_ms: int
    timing: LeaseTiming
    jitter: float  # seconds, the upper bound of the random standby jitter
    start_cursor: str
    inbox: trio.MemoryReceiveChannel[ElectorInput | ReleaseNoticed]
    heartbeat: trio.MemorySendChannel[HeartbeatInput]
    ingestor: trio.MemorySendChannel[IngestorInput]
    log: Any
    observer: NodeObserver
    retry_cap: float = 2.0
    _stopping: bool = False
    _last_standby: tuple[str, int] | None = None
    # The highest fencing token this node has seen (granted, held by anyone, or named by a
    # rejection), durable when ``memory`` has a state directory. Every campaign sends it: Redis
    # floors the next token above it, so no token this node has seen is ever issued again, even
    # by a Redis that went back in time.
    known_token: int = 0
    # Whether this node has seen the job commit (a cursor in an answer, or its own commit, which
    # the CursorWriter records in ``memory``): only then is an empty Redis a lost job.
    known_committed: bool = False
    memory: TokenMemory | None = None
    _replid: str | None = None  # the primary's replication id at the last answer
    # A lease under this node's id may be ours (not a duplicate node's) only on the first campaign
    # after start (a leftover of an earlier life) or after an acquire whose outcome is unknown.
    _own_lease_possible: bool = True
    _duplicate_seen: tuple[str, int] | None = None
    # Asked before every campaign when several jobs share the nodes (the balancer): it may hold
    # the campaign back (this node leads its share) or delay it (another node is better placed).
    gate: CampaignGate | None = None
    # Asked first: whether this node's source answers (a node that cannot reach it holds off
    # while another can, and campaigns late, as a last resort, when nobody can).
    source_watch: SourceWatch | None = None
    # Asked before everything: whether the job may be followed from this node's source at all
    # (None) or not (reason, one line: another network, a reset chain): held off, looked at again
    # after a TTL.
    hold_check: Callable[[], Awaitable[tuple[str, str] | None]] | None = None
    _hold_reason: str | None = None  # the reason hold_check gave last (None: it allowed)
    # Asked before that: whether the sink that keeps the job's data answers (PostgreSQL; None:
    # not), and its fence's token, which the campaign then floors above. A term that cannot
    # commit ends commit-unknown, having used up a token: hold off while it fails.
    sink_probe: Callable[[], Awaitable[int | None]] | None = None
    sink_error: Callable[[], str | None] = lambda: None  # why the sink's last probe failed
    # The sink keeps the job's cursor (PostgreSQL): a term resumes from the cursor read when it
    # opens there, not the grant's (Redis has none), so ``became-leader`` waits for that.
    sink_keeps_cursor: bool = False
    _unannounced: dict[str, Any] | None = None  # this term's became-leader, until it resumes
    _held_off: set[str] = attrs.Factory(set)  # why campaigns are held off now (logged once each)
    # (reason, cause) said at info since this node last led the job: a node at its share looks at
    # each held lease every few seconds, and each look ends a stretch; said again, it is debug
    _said_held_off: set[tuple[str, str]] = attrs.Factory(set)
    _woken: bool = False  # the last standby wait ended on a release notice or a wake-up
    _woken_at: float | None = None  # when that notice or wake-up arrived
    _noticed: bool = False  # it was a release notice (the lease is known free: no need to look)
    _unknown_terms: int = 0  # short terms in a row that ended commit-unknown
    _failed_terms: int = 0  # terms in a row that ended term-failed (a failure nobody foresaw)
    _term_failed: bool = False  # the term just ended term-failed: its release says so
    _fenced_by_sink: bool = False  # this term was refused by the sink's fence, not by Redis
    _handed_over: bool = False  # the term just ended because an operator asked
    # What this node knows of the lease while standby (for the balancer's placement and for
    # adoption, actors/liveness.py): its holder, when it would expire, since when it is free.
    seen_holder: str | None = None
    _known_expiry: float | None = None
    _free_since: float | None = None

    async def _see(self, token: int) -> None:
        if token <= self.known_token:
            return
        self.known_token = token
        if self.memory is not None:
            await self._remember(functools.partial(self.memory.raise_to, token), token)

    async def _see_commit(self) -> None:
        if self.known_committed:
            return
        self.known_committed = True
        if self.memory is not None:
            await self._remember(self.memory.saw_commit, self.known_token)

    async def _remember(self, write: Callable[[], bool], token: int) -> None:
        """Write to the token memory, bounded. A failure or a timeout is logged and the node goes
        on: what it saw is kept in ``known_token``/``known_committed`` for this process's life,
        and the fencing check in Redis, not the memory, is what makes a stale write impossible."""
        assert self.memory is not None
        if self.memory.path is None:
            write()
            return
        try:
            await self.memory.bounded(write)
        except (OSError, ValueError) as exc:
            self.log.warning("token-memory-failed", token=token, error=str(exc))

    def _check_primary(self, replid: str | None, rolled_back_from: int | None, cursor: str | None) -> None:
        """Log ``redis-failover-detected`` when the primary changed (its replication id) or Redis
        went back in time (a counter below the known token)."""
        previous, self._replid = self._replid, replid or self._replid
        changed = replid is not None and previous is not None and replid != previous
        if not changed and rolled_back_from is None:
            return
        fields = {
            "previous_replid": previous,
            "replid": replid,
            "rolled_back": rolled_back_from is not None,
            "redis_token": rolled_back_from,
            "known_token": self.known_token,
            "cursor": cursor,
        }
        if rolled_back_from is not None:
            self.log.warning("redis-failover-detected", **fields)
        else:
            self.log.info("redis-failover-detected", **fields)
        self.observer.election_event("redis-failover-detected", **fields)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        machine = LeaseMachine(self.timing)
        if self.memory is not None:
            self.known_token = max(self.known_token, self.memory.value)
            self.known_committed = self.known_committed or self.memory.committed
        with self.inbox, self.heartbeat, self.ingestor:
            task_status.started()
            failures = 0
            while not self._stopping:
                if self.hold_check is not None and not await self._check_allows(self.hold_check):
                    continue
                if self.sink_probe is not None and not await self._sink_allows(self.sink_probe):
                    continue
                if self.source_watch is not None and not await self._source_allows(self.source_watch):
                    continue
                if self.gate is not None and not await self._gate_allows(self.gate):
                    continue
                sent_at = trio.current_time()
                try:
                    if self.memory is not None and self.memory.committed:
                        self.known_committed = True  # the CursorWriter saw this node commit
                    # An idle standby's source-health report rides on its campaign.
                    watch = self.source_watch
                    health = watch.report() if watch is not None else None
                    answer = await self.store.acquire(
                        self.node, self.ttl_ms, self.known_token, self.known_committed, health
                    )
                    if watch is not None:
                        watch.carried(answer.able)
                except RedisUnavailable as exc:
                    if self.gate is not None:
                        self.gate.campaign_done()
                    self._own_lease_possible = True  # it may have been granted all the same
                    failures += 1
                    delay = min(self.retry_cap, 0.1 * 2 ** min(failures, 10))
                    # a grant no replica confirmed names its token: the audit stream holds it
                    granted = exc.token if isinstance(exc, ReplicationUnconfirmed) else None
                    self.log.warning(
                        "redis-unavailable", error=str(exc), attempt=failures, retry_in=delay,
                        **({"token": granted} if granted is not None else {}),
                    )
                    self.observer.election_event("redis-unavailable", error=str(exc))
                    await self._standby_until(trio.current_time() + delay * random.uniform(0.5, 1))
                    continue
                if self.gate is not None and not isinstance(answer, Acquired):
                    self.gate.campaign_done()  # (a won lease: once the observer shows it)
                if not (isinstance(answer, Held) and answer.holder == self.node):
                    # Our own lease is what an ambiguous acquire leaves behind (e.g. one no
                    # replica confirmed): releasing it is not a success, so the backoff keeps
                    # growing and a primary without replicas does not burn a token per retry.
                    failures = 0
                if isinstance(answer, StateLost):
                    self._own_lease_possible = False
                    await self._state_lost(answer.counter, answer.cursor, holder=None)
                elif isinstance(answer, Held):
                    # A holder below the known token is legitimate after a rollback (it was
                    # granted by the current primary); fencing keeps an older holder harmless.
                    self._check_primary(answer.replid, None, None)
                    await self._see(answer.token)
                    if answer.committed:
                        await self._see_commit()
                    if answer.holder != self.node:
                        self._own_lease_possible = False
                    self._saw_holder(answer.holder, answer.ttl_left_ms)
                    await self._stand_by(answer)
                else:
                    self._own_lease_possible = False
                    self._check_primary(answer.replid, answer.rolled_back_from, answer.cursor)
                    await self._see(answer.token)
                    if answer.cursor is not None:
                        await self._see_commit()
                    await self._lead(machine, answer, sent_at)
            if self._own_lease_possible:
                await self._release_if_ours()
            self.observer.election_event("stopped")

    async def _sink_allows(self, probe: Callable[[], Awaitable[int | None]]) -> bool:
        # Held off (said once per stretch), it looks again after a TTL or on a release notice.
        fence = await probe()
        if fence is not None:
            await self._see(fence)  # so Redis issues a token above the sink's fence
        return await self._wait_for_turn(
            0.0 if fence is not None else None, self.ttl_ms / 1000, "sink-unreachable",
            error=self.sink_error() if fence is None else None,
        )  # fmt: skip

    async def _check_allows(self, check: Callable[[], Awaitable[tuple[str, str] | None]]) -> bool:
        held = await check()
        if held is None:
            if self._hold_reason is not None:
                self._held_off.discard(self._hold_reason)  # said again when it comes back
                self._hold_reason = None
            return True
        reason, error = held
        if self._hold_reason not in (None, reason):
            self._held_off.discard(self._hold_reason)
        self._hold_reason = reason
        return await self._wait_for_turn(None, self.ttl_ms / 1000, reason, error=error)

    async def _source_allows(self, watch: SourceWatch) -> bool:
        return await self._wait_for_turn(watch.campaign_delay(), watch.ttl, "source-unreachable")

    async def _gate_allows(self, gate: CampaignGate) -> bool:
        # Woken by a release notice or the balancer: the balancer's view may be a tick old (a node
        # that just left still counted), so it decides on a view read since the wake-up.
        if "share-reached" in self._held_off and not (self._woken and self._noticed):
            await self._look_at_lease()  # held off at the share: is the lease free, and how long?
        now = trio.current_time()
        free_for = None if self._free_since is None else now - self._free_since
        fresh_since = self._woken_at if self._woken else None
        delay = await gate.campaign_delay(fresh_since=fresh_since, free_for=free_for)
        self._woken = False
        if delay is not None and delay > 0:
            # A rendezvous delay (another node is better placed, or this is a standby's look at
            # a held lease): a release notice meanwhile changes the picture, so ask again on a
            # fresh view rather than wait the delay out (the placement may now say "at once").
            self._held_off.discard("share-reached")
            await self._standby_until(trio.current_time() + delay, wake_on_campaign=False)
            if self._woken:
                gate.campaign_done()  # this campaign is abandoned: not in flight any more
                return False
            return not self._stopping
        return await self._wait_for_turn(delay, gate.recheck, "share-reached")

    def _saw_holder(self, holder: str | None, ttl_left_ms: int | None) -> None:
        now = trio.current_time()
        if holder is not None:
            self.seen_holder, self._free_since = holder, None
            if ttl_left_ms is not None:
                self._known_expiry = now + ttl_left_ms / 1000
            return
        self.seen_holder = None
        if self._free_since is None:
            # Free at the latest since the expiry this node was last told of.
            expiry = self._known_expiry
            self._free_since = min(now, expiry) if expiry is not None else now

    async def _look_at_lease(self) -> None:
        """One bounded read of the lease (who holds it, for how long); nothing on failure."""
        try:
            info = await self.store.leader()
        except RedisUnavailable:
            return
        self._saw_holder(info.node, info.lease_ttl_ms_left)
        # What a campaign's Held answer would teach (a node held off never campaigns): the
        # holder's token, and that the job committed (then a Redis that loses it stops it here).
        if info.token is not None:
            await self._see(info.token)
        if info.committed:
            await self._see_commit()

    async def _wait_for_turn(
        self, delay: float | None, recheck: float, reason: str, *, error: str | None = None
    ) -> bool:
        """Whether to campaign now: after ``delay``, or (None: held off for ``reason``, said once
        per stretch, with its cause when known) not before ``recheck`` seconds or a wake-up."""
        if delay is None:
            if reason not in self._held_off:
                self._held_off.add(reason)
                cause = {"error": error} if error else {}
                said = (reason, error or "")
                if said in self._said_held_off:
                    self.log.debug("campaign-held-off", reason=reason, **cause)
                else:
                    self._said_held_off.add(said)
                    self.log.info("campaign-held-off", reason=reason, **cause)
                self.observer.election_event("campaign-held-off", reason=reason, **cause)
            await self._standby_until(trio.current_time() + recheck)
            return False
        self._held_off.discard(reason)
        if delay > 0:
            await self._standby_until(trio.current_time() + delay, wake_on_release=False)
        return not self._stopping

    async def _release_if_ours(self) -> None:
        """Exiting after an acquire with an unknown outcome: if it was granted, hand it back now
        rather than leave it orphaned for a TTL (bounded and shielded: this is cleanup)."""
        with trio.move_on_after(RELEASE_CLEANUP_TIMEOUT, shield=True):
            try:
                info = await self.store.leader()
                if info.node == self.node and info.token is not None:
                    self.log.info("releasing-orphaned-lease", token=info.token)
                    await self.store.release(self.node, info.token)
            except RedisUnavailable as exc:
                self.log.warning("release-failed", token=None, error=str(exc))

    async def _state_lost(self, counter: int, cursor: str | None, holder: str | None) -> None:
        """Redis's token counter went backwards *and* the job's cursor is gone although this node
        saw the job commit: Redis lost the job.
        Leading now would restart it from the start cursor, so stay standby (and say so, loudly)
        until an operator restores Redis or accepts the loss (restarts the nodes without their
        token memory). A rollback that kept a cursor is not this: see ``_check_primary``."""
        self.log.error(
            "redis-state-lost",
            redis_token=counter,
            known_token=self.known_token,
            cursor=cursor,
            holder=holder,
        )
        self.observer.election_event("redis-state-lost", redis_token=counter)
        wait = self.ttl_ms / 1000 + random.uniform(0, self.jitter)
        await self._standby_until(trio.current_time() + wait)

    async def _stand_by(self, held: Held) -> None:
        if held.holder == self.node and self._own_lease_possible:
            # Our own lease from an earlier life (a restart under the same node id), or from an
            # acquire whose answer we never got: no term of ours is running, so free it now
            # rather than wait out its TTL.
            self._own_lease_possible = False
            self.log.info("releasing-orphaned-lease", token=held.token)
            try:
                await self.store.release(self.node, held.token)
            except RedisUnavailable:
                pass
            return
        if held.holder == self.node:
            # Not ours: another process runs under the same node id. Releasing its lease would
            # start a livelock of terms; stand by and say so.
            if self._duplicate_seen != (held.holder, held.token):
                self._duplicate_seen = (held.holder, held.token)
                self.log.warning("duplicate-node-id", node_id=self.node, token=held.token)
                self.observer.election_event("duplicate-node-id", token=held.token)
        if self._last_standby != (held.holder, held.token):
            self._last_standby = (held.holder, held.token)
            self.log.info("standby", leader=held.holder, token=held.token)
            self.observer.election_event("standby", leader=held.holder, token=held.token)
        wait = standby_wait(held.ttl_left_ms, self.ttl_ms, random.uniform(0, self.jitter))
        if self.source_watch is not None:
            self.source_watch.campaign_at(trio.current_time() + wait)  # it looks just before
        await self._standby_until(trio.current_time() + wait)

    async def _standby_until(
        self, deadline: float, *, wake_on_release: bool = True, wake_on_campaign: bool | None = None
    ) -> None:
        """Wait until ``deadline``, a shutdown request or (unless told not to) a release notice or
        a balancer's wake-up (``CampaignNow``; by default as for release notices);
        ``self._woken`` says whether one of those ended it."""
        if wake_on_campaign is None:
            wake_on_campaign = wake_on_release
        self._woken = self._noticed = False
        while not self._stopping:
            with trio.move_on_at(deadline):
                msg = await self.inbox.receive()
                if isinstance(msg, ShutdownRequested):
                    self._stopping = True
                elif isinstance(msg, ReleaseNoticed) and msg.holder != self.node:
                    self._known_expiry = None
                    self._saw_holder(None, None)  # free from now
                    if msg.handed_over:
                        # Its leader was asked to hand it over, or is going away: a standby held
                        # off at its share adopts it at once instead of waiting for its rightful
                        # node (the one that just stood aside, or died).
                        self._free_since = trio.current_time() - HANDED_OVER_FREE_FOR * self.ttl_ms / 1000
                    if not wake_on_release:
                        continue
                    self._woken = self._noticed = True
                    self._woken_at = trio.current_time()
                    await trio.sleep(random.uniform(0, self.jitter / 4))
                    return
                elif wake_on_campaign and isinstance(msg, CampaignNow):
                    self._woken, self._woken_at = True, trio.current_time()
                    return
                continue  # a late message about a finished term
            return

    async def _lead(self, machine: LeaseMachine, grant: Acquired, sent_at: float) -> None:
        term = machine.granted(grant.token, sent_at)
        self._last_standby = None
        self._said_held_off.clear()  # held off after this term: said at info again
        self.seen_holder, self._free_since, self._known_expiry = self.node, None, None
        cursor = grant.cursor or self.start_cursor
        fields = {
            "token": grant.token,
            "lease_ttl_ms": self.ttl_ms,
            "cursor": cursor,
            "previous_node": grant.previous_node,
            "previous_token": grant.previous_token,
            "takeover_ms": grant.takeover_ms,
        }
        if self.sink_keeps_cursor:
            self._unannounced = fields  # announced once the term resumes (TermResumed)
        else:
            self._announce(fields)
        self.observer.deadline(term.ingest_deadline)
        released = False
        try:
            term_ended = await self._run_term(machine, grant, sent_at, cursor)
            released = True
        finally:
            if not released:
                # Cancelled from outside (the node is being torn down): still hand the lease back,
                # so a standby need not wait out the TTL. Ingestion is being cancelled with us, and a
                # commit still in flight in Redis is rejected once the lease is gone.
                await self._release(grant.token)
        # This node ended the term: as far as it knows the lease is free from now.
        self.seen_holder, self._free_since, self._known_expiry = None, trio.current_time(), None
        if term_ended is not None and term_ended.reason in _FATAL_REASONS:
            raise IngestionFatal(term_ended.detail)
        if self._handed_over:
            # An operator asked that another node lead: stand aside one lease lifetime (a release
            # notice from here does not wake this node). Should nobody take the job, it leads
            # again after that.
            self._handed_over = False
            await self._standby_until(trio.current_time() + self.ttl_ms / 1000, wake_on_release=False)
        failed = term_ended is not None and term_ended.reason == "term-failed"
        self._failed_terms = self._failed_terms + 1 if failed else 0
        if failed:
            # The term raised (a bug, or input nobody foresaw): the node and its other jobs go
            # on; this job waits, longer each time in a row, and another node may lead it.
            wait = min(TERM_FAILED_BACKOFF_CAP, self.ttl_ms / 1000 * 2 ** (self._failed_terms - 1))
            cause = {"error": term_ended.detail if term_ended is not None else ""}
            self.log.info("campaign-held-off", reason="term-failed", terms=self._failed_terms,
                          for_s=round(wait, 3), **cause)  # fmt: skip
            self.observer.election_event("campaign-held-off", reason="term-failed", **cause)
            await self._standby_until(trio.current_time() + wait, wake_on_release=False)
        short = trio.current_time() - sent_at < self.ttl_ms / 1000
        unknown = term_ended is not None and term_ended.reason == "commit-unknown"
        self._unknown_terms = self._unknown_terms + 1 if unknown and short else 0
        if self._unknown_terms >= 2:
            # Terms keep ending commit-unknown at once (the sink or Redis answers the campaign
            # but not the commits): one term per lease lifetime, not one per call bound. Said,
            # since it delays a takeover by up to a TTL (release notices do not wake it).
            self.log.info("campaign-held-off", reason="terms-ending-unknown", terms=self._unknown_terms)
            await self._standby_until(
                trio.current_time() + self.ttl_ms / 1000, wake_on_release=False
            )
        if (
            term_ended is not None
            and term_ended.reason == "commit-refused"
            and term_ended.detail != "cursor-moved"
        ):
            # The same batch would be refused again at once: let a lease lifetime pass (another
            # node may do better) instead of spinning through elections, a token each. Not for
            # cursor-moved: Redis's cursor is not where this term believed (Redis went back in
            # time), and a new term starts from the cursor Redis has.
            await self._standby_until(
                trio.current_time() + self.ttl_ms / 1000, wake_on_release=False
            )

    def _announce(self, fields: dict[str, Any]) -> None:
        """Log ``became-leader``: the term's token and the cursor it resumes from."""
        self._unannounced = None
        self.log.info("became-leader", **fields)
        self.observer.election_event("became-leader", **fields)
        if self.gate is not None:
            self.gate.campaign_done()  # the balancer now sees the lease through the observer

    def _announce_resumed(self, cursor: str | None) -> None:
        """A term whose sink keeps the cursor: announced with the sink's (None: the term ended
        before it opened there)."""
        if self._unannounced is not None:
            self._announce({**self._unannounced, "cursor": cursor})

    async def _run_term(
        self, machine: LeaseMachine, grant: Acquired, sent_at: float, cursor: str
    ) -> TermEnded | None:
        term = machine.term
        assert term is not None
        await self.heartbeat.send(StartRenewing(grant.token, sent_at))
        await self.ingestor.send(
            LeaseGranted(grant.token, term.ingest_deadline, cursor, grant.cursor)
        )
        term_ended: TermEnded | None = None
        lost: Lost | None = None
        self._fenced_by_sink = False
        while lost is None:
            deadline = machine.term.ingest_deadline if machine.term else trio.current_time()
            with trio.move_on_at(deadline):
                msg = await self.inbox.receive()
                lost, term_ended = await self._on_leader_input(machine, grant.token, msg)
                continue
            lost = machine.deadline_passed(grant.token, trio.current_time())
        self._announce_resumed(None)
        self._handed_over = lost.reason is LostReason.HANDED_OVER
        self._term_failed = lost.reason is LostReason.TERM_FAILED
        self.log.info("lost-leadership", token=lost.token, reason=lost.reason.value)
        self.observer.election_event("lost-leadership", token=lost.token, reason=lost.reason.value)
        await self.heartbeat.send(StopRenewing(grant.token))
        if term_ended is None:
            graceful = lost.reason in (
                LostReason.SHUTDOWN, LostReason.REBALANCED, LostReason.SOURCE_UNAVAILABLE,
                LostReason.HANDED_OVER,
            )  # fmt: skip
            await self.ingestor.send(LeaseRevoked(grant.token, lost.reason.value, graceful))
            term_ended = await self._await_term_end(grant.token)
        # A rejection by Redis took the lease already; one by the sink's own fence did not: free
        # it (the release script frees it only if still ours), or this node's next campaign
        # would find it held under its own id.
        if lost.reason not in (LostReason.FENCED, LostReason.RENEW_REJECTED) or (
            lost.reason is LostReason.FENCED and self._fenced_by_sink
        ):
            await self._release(grant.token)
        return term_ended

    async def _on_leader_input(
        self, machine: LeaseMachine, token: int, msg: ElectorInput | ReleaseNoticed
    ) -> tuple[Lost | None, TermEnded | None]:
        now = trio.current_time()
        if isinstance(msg, RenewSucceeded):
            effect = machine.renewed(msg.token, msg.sent_at, now)
            if isinstance(effect, Extended):
                self.observer.deadline(effect.ingest_deadline)
                await self.ingestor.send(LeaseExtended(effect.token, effect.ingest_deadline))
                return None, None
            return effect, None
        if isinstance(msg, RenewFailed):
            return machine.renew_failed(msg.token, now), None
        if isinstance(msg, RenewRejected):
            return machine.renew_rejected(msg.token), None
        if isinstance(msg, FencingTokenRejected):
            await self._see(msg.current_token)
            self._fenced_by_sink = self._fenced_by_sink or msg.lease_may_hold
            return machine.fenced(msg.token), None
        if isinstance(msg, ShutdownRequested):
            self._stopping = True
            return machine.shutdown(), None
        if isinstance(msg, HandBack) and msg.token == token:
            return machine.hand_back(token, LostReason(msg.reason)), None
        if isinstance(msg, TermResumed) and msg.token == token:
            self._announce_resumed(msg.cursor)
            return None, None
        if isinstance(msg, TermEnded) and msg.token == token:
            self._announce_resumed(None)  # (it ended before the sink opened it: no cursor)
            if msg.reason in _FATAL_REASONS:
                self.log.error("ingestion-fatal", token=token, error=msg.detail)
            elif msg.reason not in ("deadline", "revoked"):
                self.log.warning("term-ended", token=token, reason=msg.reason, detail=msg.detail)
            if msg.reason == "deadline":
                # The Ingestor's scope fired at the ingest deadline, on the same clock as ours;
                # a renewal may have moved our deadline just after (then the lease is valid).
                lost = machine.ingest_stopped(token, now)
                if lost is not None and lost.reason is LostReason.RELEASED:
                    self.log.warning("renewal-after-ingest-deadline", token=token)
            else:
                lost = machine.ended(token, _TERM_REASONS.get(msg.reason, LostReason.RELEASED))
            return lost, msg
        return None, None  # a release notice, or news about an older term

    async def _await_term_end(self, token: int) -> TermEnded:
        """Wait for the Ingestor to finish the term (its in-flight commit included).

        It always does, by the term's lease deadline and one bounded commit at the latest; a new
        term must not start before, so there is no giving up here, only a loud log line.
        """
        overdue = trio.current_time() + self.timing.ttl
        while True:
            with trio.move_on_at(overdue):
                msg = await self.inbox.receive()
                if isinstance(msg, TermEnded) and msg.token == token:
                    return msg
                if isinstance(msg, ShutdownRequested):
                    self._stopping = True
                continue
            self.log.error("term-not-ended", token=token, waited_s=round(self.timing.ttl, 3))
            overdue = trio.current_time() + self.timing.ttl

    async def _release(self, token: int) -> None:
        # A node that stands aside says so (an operator's hand-over; a term that raised, after
        # which this node backs off): a standby at its share then takes the lease at once.
        reason = (
            LostReason.HANDED_OVER.value if self._handed_over
            else LostReason.TERM_FAILED.value if self._term_failed else ""
        )  # fmt: skip
        with trio.move_on_after(RELEASE_CLEANUP_TIMEOUT, shield=True):
            try:
                released = await self.store.release(self.node, token, reason)
            except RedisUnavailable as exc:
                self._own_lease_possible = True  # still ours in Redis, maybe: free it next time
                self.log.warning("release-failed", token=token, error=str(exc))
            else:
                if released:
                    self.log.info("lease-released", token=token)
