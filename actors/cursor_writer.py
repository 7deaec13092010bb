"""The CursorWriter: the only actor that writes to Redis on the data path.

Every commit reaches it as a :class:`CommitCursor` message carrying the fencing token. It refuses
locally a token it already knows to be stale, then runs the fenced commit script, and answers on the
message's reply channel. When Redis rejects a token it logs ``fencing-token-rejected`` and tells the
Elector, which steps the node down.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from actors.lease_store import Committed, LeaseStore, RedisUnavailable
from actors.messages import (
    CommitCursor,
    CommitOutcome,
    CommitRefused,
    CommitUnknown,
    CursorCommitted,
    ElectorInput,
    FencingTokenRejected,
)
from actors.observe import NodeObserver
from actors.token_memory import TokenMemory

# Rejections that mean "this writer is no longer the leader", as opposed to a bad batch.
FENCING_REASONS = frozenset({"stale-token", "lease-lost"})


@attrs.define
class CursorWriter:
    store: LeaseStore
    node: str
    inbox: trio.MemoryReceiveChannel[CommitCursor]
    elector: trio.MemorySendChannel[ElectorInput]
    log: Any
    observer: NodeObserver
    highest_token_seen: int = 0
    # The node's memory of the job (shared with the Elector): the first commit is recorded there,
    # so that a Redis that later forgets the job is known to have lost something.
    memory: TokenMemory | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.inbox, self.elector:
            task_status.started()
            async for msg in self.inbox:
                outcome = await self._commit(msg)
                try:
                    msg.reply.send_nowait(outcome)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                    pass  # the term that asked is already over; its successor re-reads Redis

    async def _commit(self, msg: CommitCursor) -> CommitOutcome:
        if msg.token < self.highest_token_seen:
            return await self._fenced(msg, "stale-token", self.highest_token_seen, local=True)
        started = trio.current_time()
        try:
            result = await self.store.commit(
                self.node, msg.token, msg.previous_cursor, msg.records, anchor=msg.anchor
            )
        except RedisUnavailable as exc:
            self.log.warning(
                "commit-outcome-unknown", token=msg.token, cursor=msg.cursor, error=str(exc)
            )
            return CommitUnknown(msg.token, str(exc))
        except ValueError as exc:
            # A malformed or out-of-order batch, found before anything was sent: a source bug
            # must end the term, never the node.
            self.log.error("commit-rejected", token=msg.token, reason="bad-batch", error=str(exc))
            return CommitRefused(msg.token, "bad-batch", self.highest_token_seen)
        if isinstance(result, Committed):
            self.highest_token_seen = max(self.highest_token_seen, msg.token)
            if self.memory is not None and not self.memory.committed:
                await self._remember_commit(self.memory, msg.token)
            if not msg.records:
                if msg.previous_cursor is None:
                    self.log.info("cursor-anchored", token=msg.token, cursor=msg.anchor)
                else:
                    self.observer.committed(0, msg.cursor, trio.current_time() - started)
                return CursorCommitted(msg.token, result.cursor, 0)
            self.observer.committed(
                len(msg.records), msg.cursor, trio.current_time() - started,
                newest_record=msg.records[-1].body,
            )
            return CursorCommitted(msg.token, result.cursor, result.count)
        self.highest_token_seen = max(self.highest_token_seen, result.current_token)
        if result.reason in FENCING_REASONS:
            return await self._fenced(msg, result.reason, result.current_token, local=False)
        self.log.error(
            "commit-rejected",
            token=msg.token,
            reason=result.reason,
            cursor=msg.cursor,
            previous_cursor=msg.previous_cursor,
            stored_cursor=result.stored_cursor,
        )
        return CommitRefused(msg.token, result.reason, result.current_token)

    async def _remember_commit(self, memory: TokenMemory, token: int) -> None:
        try:
            await trio.to_thread.run_sync(memory.saw_commit)
        except (OSError, ValueError) as exc:
            self.log.warning("token-memory-failed", token=token, error=str(exc))

    async def _fenced(
        self, msg: CommitCursor, reason: str, current: int, *, local: bool
    ) -> CommitRefused:
        fields = {
            "token": msg.token,
            "current_token": current,
            "cursor": msg.cursor,
            "rejection": reason,
            "checked_by": "writer" if local else "redis",
        }
        self.log.warning("fencing-token-rejected", **fields)
        self.observer.fencing_rejected(**fields)
        await self.elector.send(FencingTokenRejected(msg.token, current, msg.cursor))
        return CommitRefused(msg.token, reason, current)
