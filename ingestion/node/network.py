"""A job pinned to its network, and a network reset told from ledger identity (issue 49; the
rules are :mod:`ingestion.common.network`'s, pure; each source reads what its URLs say).

:class:`NetworkGuard` wraps a following job's source (Horizon, RPC, lake). What it keeps is in the
job's cursor hash (``ingestion:{JOB}:cursor``), beside the cursor, each write fenced by the term's
token (``fenced_hset``, as the source and sink identities of :mod:`ingestion.node.identity`):

- ``network``: the job's passphrase: its ``network`` setting, else the first answering URL's,
  recorded by the job's first term before its first commit.
- ``network_ledger``, ``network_ledger_hash``, ``network_ledger_closed_at``: the job's last
  committed ledger as the guard last saw it, that ledger's hash at the source and its close time
  (Unix seconds, when the source says it).
- ``network_reset``: one line, set when a reset was detected; while it is set no node leads the
  job. ``ingestion cursor reset JOB --to ...`` clears it (and the ledger fields) and moves the
  cursor, fenced and audited (docs/OPERATIONS.md, "A network reset").

Before each campaign (:meth:`NetworkGuard.hold_off`, asked by the Elector) the node holds the job
off while the reset mark is set (``campaign-held-off reason=network-reset``) or while a URL
answers with another passphrase (``reason=wrong-network``, the line naming both). The URLs are
asked before a campaign only until a look finds them on the job's network; from then on a
campaign never waits for them: a look at most every :data:`HOLD_LOOK_TTL` runs between campaigns
(:meth:`NetworkGuard.look_between_campaigns`), and only a wrong answer it finds holds the next
one off (a graceful hand-over waited for a slow root: 1,001 ms against its 1 s bound). On connect (the
start of each term, before anything is written) the guard asks again, records the passphrase
when none is, and compares the kept hash with the source's; then, while the term runs, every
``network.check_ms``: a URL on another network ends the term (the next campaign holds off); a
reset (the kept ledger's hash differs, a URL's latest ledger lies below the kept one but closed
after it, or every URL's latest ledger stays below the committed one for
``network.reset_after_ms``: :class:`~ingestion.common.network.ResetJudge`) is marked, logged
(``network-reset``, with what to do) and ends the term: nothing after it is committed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import structlog
import trio

from actors.lease_store import LeaseStore, RedisUnavailable, job_keys
from actors.source import Batch, Source, SourceHeldOff, TermContext, TermFenced, current_term
from ingestion.common.network import (
    ResetJudge,
    SourceLook,
    Verdict,
    first_passphrase,
    ledger_of,
    wrong_network,
)

# The cursor hash's fields the guard keeps (and ``ingestion cursor reset`` clears, but ``network``).
FIELDS = ("network", "network_reset", "network_ledger", "network_ledger_hash", "network_ledger_closed_at")
# How long a look that found the source on the job's network stands before campaigns ask for another.
HOLD_LOOK_TTL = 30.0

log = structlog.get_logger()


def what_to_do(job: str) -> str:
    return (
        f"the job commits nothing until an operator moves it on: `ingestion cursor reset {job} "
        "--to start` (the job's start_cursor on the new chain) or `--to CURSOR` (docs/OPERATIONS.md)"
    )


class NetworkGuard:
    """``inner`` (a source with ``network_looks``) checked against the job's network; everything
    else is the inner source's. See the module docstring."""

    def __init__(
        self, inner: Any, store: LeaseStore, job: str, network: str, *, check_interval: float,
        reset_after: float, look_ttl: float = HOLD_LOOK_TTL,
    ) -> None:  # fmt: skip
        self.inner = inner
        self.store = store
        self.job = job
        self.network = network  # the job's setting ("": the recorded one)
        self.check_interval = check_interval
        self.reset_after = reset_after
        self.look_ttl = look_ttl
        self._key = job_keys(job)["cursor"]
        self._connected: int | None = None  # the token of the term that connected last
        # The newest look's (expected passphrase, when it began, its verdict: None, right)
        self._found: tuple[str, float, Verdict | None] | None = None
        self._look_wanted = trio.Event()  # set: look_between_campaigns looks (then a new one)
        self._expected = ""  # the passphrase this term follows
        self._ledger: int | None = None  # the kept ledger, its hash and close time (this term's view)
        self._hash: str | None = None
        self._closed_at: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _fields(self) -> dict[str, str | None]:
        values: Any = await self.store.run(self.store.client.hmget, self._key, list(FIELDS))
        return {
            name: (v.decode() if isinstance(v, bytes) else v) for name, v in zip(FIELDS, values, strict=True)
        }

    async def _looks(self, ledger: int | None) -> list[SourceLook]:
        looks: list[SourceLook] = await self.inner.network_looks(ledger)
        return looks

    def _wrong(self, expected: str, looks: list[SourceLook]) -> Verdict | None:
        return wrong_network(self.job, expected, looks, configured=bool(self.network))

    async def hold_off(self) -> tuple[str, str] | None:
        """For the Elector, before each campaign (see :class:`actors.source.HeldOffSource`).
        Once a look found the source right, the campaign goes at once: a stale look is asked of
        :meth:`look_between_campaigns`, not waited for."""
        try:
            fields = await self._fields()
        except RedisUnavailable:
            return None  # the campaign finds out on its own
        if fields["network_reset"]:
            return "network-reset", f"{fields['network_reset']}; {what_to_do(self.job)}"
        expected = self.network or fields["network"] or ""
        if not expected:
            return None
        found = self._found
        if found is not None and found[0] == expected and found[2] is None:
            if trio.current_time() >= found[1] + self.look_ttl:
                self._look_wanted.set()
            return None
        verdict = await self._look(expected)  # none found right yet: this campaign waits for it
        return None if verdict is None else (verdict.reason, verdict.detail)

    async def look_between_campaigns(self) -> None:
        """Beside the Elector, for the node's life: the looks :meth:`hold_off` asks for once the
        source has been found right; a wrong answer holds off the next campaign."""
        while True:
            await self._look_wanted.wait()
            if self._found is not None:
                await self._look(self._found[0])
            self._look_wanted = trio.Event()  # (asked again while it looked: that look was fresh)

    async def _look(self, expected: str) -> Verdict | None:
        began = trio.current_time()
        verdict = self._wrong(expected, await self._looks(None))
        self._judged(expected, began, verdict)
        return verdict

    def _judged(self, expected: str, began: float, verdict: Verdict | None) -> None:
        """Keep a look's verdict unless a look that began later has given one already."""
        if self._found is None or began >= self._found[1]:
            self._found = (expected, began, verdict)

    async def resolve_start(self, cursor: str) -> str:
        await self._connect()
        resolved: str = await self.inner.resolve_start(cursor)
        return resolved

    @asynccontextmanager
    async def stream(self, cursor: str) -> AsyncIterator[trio.abc.ReceiveChannel[Batch]]:
        await self._connect()
        judge = ResetJudge(self.reset_after)
        handed: deque[tuple[int | None, trio.Event]] = deque()  # batches given on, oldest first
        send, receive = trio.open_memory_channel[Batch](0)
        async with self.inner.stream(cursor) as batches, trio.open_nursery() as nursery:
            nursery.start_soon(self._forward, batches, send, handed)
            nursery.start_soon(self._watch, current_term.get(), judge, handed, ledger_of(cursor))
            try:
                yield receive
            finally:  # (the forwarder stopped before the channel closes: never a BrokenResourceError)
                nursery.cancel_scope.cancel()
                receive.close()

    async def _connect(self) -> None:
        """On connect (each term, once): the reset mark, the passphrases, the kept hash."""
        term = current_term.get()
        if self._connected == term.token:
            return
        fields = await self._fields()
        if fields["network_reset"]:
            raise SourceHeldOff(f"network-reset: {fields['network_reset']}")
        ledger_text = fields["network_ledger"]
        self._ledger = int(ledger_text) if ledger_text and ledger_text.isdigit() else None
        self._hash = fields["network_ledger_hash"] or None
        closed_text = fields["network_ledger_closed_at"]
        self._closed_at = int(closed_text) if closed_text and closed_text.isdigit() else None
        began = trio.current_time()
        looks = await self._looks(self._ledger)
        self._expected = self.network or fields["network"] or first_passphrase(looks) or ""
        verdict = self._wrong(self._expected, looks)
        self._judged(self._expected, began, verdict)
        if verdict is not None:
            raise SourceHeldOff(f"wrong-network: {verdict.detail}")
        if self._expected and not fields["network"]:
            await self._write(term.node, term.token, {"network": self._expected})
        reset = ResetJudge(self.reset_after).judge(
            trio.current_time(), self._ledger, self._hash, looks, self._closed_at
        )
        if reset is not None:  # (the hash and close-time rules: the bound has not run yet)
            await self._mark_reset(reset, term)
        self._connected = term.token

    async def _forward(
        self, batches: trio.abc.ReceiveChannel[Batch], send: trio.MemorySendChannel[Batch],
        handed: deque[tuple[int | None, trio.Event]],
    ) -> None:  # fmt: skip
        with send:
            async for batch in batches:
                if batch.committed is None:
                    batch = attrs.evolve(batch, committed=trio.Event())
                assert batch.committed is not None
                handed.append((ledger_of(batch.cursor), batch.committed))
                try:
                    await send.send(batch)
                except trio.BrokenResourceError:
                    return  # the term's reader has gone (its term is ending): nothing to forward to

    async def _watch(
        self, term: TermContext, judge: ResetJudge, handed: deque[tuple[int | None, trio.Event]],
        committed: int | None,
    ) -> None:  # fmt: skip
        """Every ``check_interval``: the passphrases, then the committed ledger's identity."""
        while True:
            await trio.sleep(self.check_interval)
            while handed and handed[0][1].is_set():
                committed = handed.popleft()[0] or committed
            moved = committed is not None and committed != self._ledger
            began = trio.current_time()
            looks = await self._looks(committed if moved else self._ledger)
            verdict = self._wrong(self._expected, looks)
            self._judged(self._expected, began, verdict)
            if verdict is not None:
                raise SourceHeldOff(f"wrong-network: {verdict.detail}")
            if moved:
                ledger, kept, closed = committed, None, None
            else:
                ledger, kept, closed = self._ledger, self._hash, self._closed_at
            reset = judge.judge(trio.current_time(), ledger, kept, looks, closed)
            if reset is not None:
                await self._mark_reset(reset, term)
            holder = next((look for look in looks if look.hash_at), None) if moved else None
            if moved and holder is not None and holder.hash_at is not None:
                at = holder.closed_at
                await self._write(term.node, term.token, {
                    "network_ledger": str(committed), "network_ledger_hash": holder.hash_at,
                    "network_ledger_closed_at": "" if at is None else str(at),
                })  # fmt: skip
                self._ledger, self._hash, self._closed_at = committed, holder.hash_at, at

    async def _mark_reset(self, reset: Verdict, term: TermContext) -> None:
        """Keep the reset in the cursor hash and the job's audit (fenced), say it, end the term."""
        await self._write(term.node, term.token, {"network_reset": reset.detail})
        refused = await self.store.fenced_audit(
            term.node, term.token, "network-reset",
            {"detail": reset.detail, "ledger": str(self._ledger or ""), "hash": self._hash or ""},
        )  # fmt: skip
        if refused is not None:
            raise TermFenced(refused.reason)
        log.error("network-reset", job=self.job, error=reset.detail, todo=what_to_do(self.job))
        raise SourceHeldOff(f"network-reset: {reset.detail}")

    async def _write(self, node: str, token: int, fields: dict[str, str]) -> None:
        refused = await self.store.fenced_hset(node, token, self._key, fields)
        if refused is not None:
            raise TermFenced(refused.reason)  # a newer term holds the job: this one is over


def guarded(
    source: Source, store: LeaseStore, job: Any, *, check_interval: float, reset_after: float
) -> Source:
    """``source`` behind :class:`NetworkGuard` when it can say what network it is on (Horizon,
    RPC, lake: ``network_looks``); as it is otherwise."""
    if job.kind not in ("horizon", "rpc", "lake") or not hasattr(source, "network_looks"):
        return source
    guard: Source = NetworkGuard(
        source, store, job.name, job.network, check_interval=check_interval, reset_after=reset_after
    )
    return guard
