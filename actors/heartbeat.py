"""The Heartbeat: renews the lease every ``renew_interval`` while the node leads.

Renewals are scheduled with ``trio.sleep_until(granted_at + k * interval)`` so they never drift;
a renewal that overran its slot skips to the next future one. Each outcome goes to the Elector,
which owns the deadline arithmetic; failures are simply retried at the next tick until the Elector
(or the Ingestor's own cancel scope) decides the term is over.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import trio

from actors.lease import LostReason
from actors.lease_store import LeaseStore, RedisUnavailable, Renewal
from actors.messages import (
    ElectorInput,
    HandBack,
    HeartbeatInput,
    RenewFailed,
    RenewRejected,
    RenewSucceeded,
    StartRenewing,
    StopRenewing,
)


@attrs.define
class Heartbeat:
    store: LeaseStore
    node: str
    ttl_ms: int
    interval: float
    control: trio.MemoryReceiveChannel[HeartbeatInput]
    elector: trio.MemorySendChannel[ElectorInput]
    log: Any

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The control loop never sends to the Elector, so the Elector can always reach it.
        with self.control, self.elector:
            async with trio.open_nursery() as nursery:
                task_status.started()
                current: tuple[int, trio.CancelScope] | None = None
                async for msg in self.control:
                    if isinstance(msg, StartRenewing):
                        if current is not None:
                            current[1].cancel()
                        scope = trio.CancelScope()
                        current = (msg.token, scope)
                        nursery.start_soon(self._renew_loop, msg, scope)
                    elif isinstance(msg, StopRenewing) and current and current[0] == msg.token:
                        current[1].cancel()
                        current = None
                nursery.cancel_scope.cancel()

    async def _handed_over(self, token: int, by: str) -> None:
        """An operator asked this term to hand over: say who in the job's audit (fenced: the term
        still holds the lease), then end the term gracefully."""
        self.log.info("handover-requested", token=token, by=by)
        try:
            await self.store.fenced_audit(self.node, token, "handover-requested", {"by": by})
        except RedisUnavailable as exc:
            self.log.warning("handover-unaudited", token=token, by=by, error=str(exc))
        await self.elector.send(HandBack(token, LostReason.HANDED_OVER.value))

    async def _renew_loop(self, start: StartRenewing, scope: trio.CancelScope) -> None:
        with scope:
            tick = 1
            handed_over = False  # (the request stays while the term lasts: act on it once)
            while True:
                await trio.sleep_until(start.granted_at + tick * self.interval)
                sent_at = trio.current_time()
                try:
                    ok = await self.store.renew(self.node, start.token, self.ttl_ms)
                except RedisUnavailable as exc:
                    self.log.warning("renew-failed", token=start.token, error=str(exc))
                    await self.elector.send(RenewFailed(start.token, str(exc)))
                else:
                    if not ok:
                        await self.elector.send(RenewRejected(start.token))
                        return
                    await self.elector.send(RenewSucceeded(start.token, sent_at))
                    if ok is Renewal.HAND_OVER and not handed_over:
                        handed_over = True
                        await self._handed_over(start.token, self.store.last_handover_by)
                elapsed = trio.current_time() - start.granted_at
                tick = max(tick + 1, math.floor(elapsed / self.interval) + 1)
