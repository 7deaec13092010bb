"""What a node knows about itself, for metrics, the status endpoint and tests.

The actors report into one :class:`NodeObserver`; readers take :meth:`NodeObserver.snapshot` or
subscribe to the stream of election events. Pure bookkeeping: no I/O, no trio.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class NodeStatus:
    node: str
    job: str
    role: str
    token: int | None
    leader: str | None
    ingest_deadline: float | None  # trio time; None unless leading
    cursor: str | None
    events_ingested: int
    commits: int
    fencing_rejections: int
    elections: int
    losses: dict[str, int]


@attrs.define
class NodeObserver:
    node: str
    job: str
    role: str = "starting"
    token: int | None = None
    leader: str | None = None
    ingest_deadline: float | None = None
    cursor: str | None = None
    events_ingested: int = 0
    commits: int = 0
    fencing_rejections: int = 0
    elections: int = 0
    losses: dict[str, int] = attrs.Factory(dict)
    recent_commit_latencies: deque[float] = attrs.Factory(lambda: deque(maxlen=1024))
    listeners: list[Callable[[str, dict[str, Any]], None]] = attrs.Factory(list)

    def election_event(self, event: str, **fields: Any) -> None:
        """Record an election event (``became-leader``, ``lost-leadership``, ``standby``, ...)."""
        if event == "became-leader":
            self.role, self.token, self.leader = "leader", fields.get("token"), self.node
            self.elections += 1
        elif event == "lost-leadership":
            self.role, self.ingest_deadline = "standby", None
            reason = str(fields.get("reason"))
            self.losses[reason] = self.losses.get(reason, 0) + 1
        elif event == "standby":
            self.role, self.leader, self.token = "standby", fields.get("leader"), fields.get("token")
        elif event == "stopped":
            self.role = "stopped"
        for listener in list(self.listeners):
            listener(event, fields)

    def deadline(self, ingest_deadline: float | None) -> None:
        self.ingest_deadline = ingest_deadline

    def committed(self, count: int, cursor: str, latency: float) -> None:
        self.events_ingested += count
        self.commits += 1
        self.cursor = cursor
        self.recent_commit_latencies.append(latency)
        for listener in list(self.listeners):
            listener("committed", {"count": count, "cursor": cursor, "latency": latency})

    def fencing_rejected(self) -> None:
        self.fencing_rejections += 1

    def snapshot(self) -> NodeStatus:
        return NodeStatus(
            node=self.node,
            job=self.job,
            role=self.role,
            token=self.token,
            leader=self.leader,
            ingest_deadline=self.ingest_deadline,
            cursor=self.cursor,
            events_ingested=self.events_ingested,
            commits=self.commits,
            fencing_rejections=self.fencing_rejections,
            elections=self.elections,
            losses=dict(self.losses),
        )
