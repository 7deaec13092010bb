"""The campaign's polls: every ``POLL`` seconds each job's lease holder and committed cursor
(a :class:`~chaos.check.Sample`), from Redis's primary and PostgreSQL; what the campaign waits on
between fault rounds and what the judge reads liveness from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from actors.lease_store import read_states
from chaos import check
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.redis_ha import SentinelGroup

POLL = 0.2  # seconds between polls of every job's lease and cursor


class Polls:
    """The samples of one run, and waiting on them (``run`` polls until cancelled)."""

    def __init__(
        self, redis: SentinelGroup, pg: LocalPostgres | None, jobs: Sequence[str], now: Callable[[], float],
        pg_job: str,
    ) -> None:  # fmt: skip
        self.redis = redis
        self.pg = pg
        self.jobs = list(jobs)
        self.now = now
        self.pg_job = pg_job
        self.samples: list[check.Sample] = []
        self._polled = trio.Event()  # set after each poll, then replaced

    async def polled(self) -> None:
        """Until the next poll is done."""
        await self._polled.wait()

    def leader_of(self, job: str) -> str | None:
        """The holder of ``job``'s lease at the last poll."""
        for s in reversed(self.samples):
            if s.job == job:
                return s.holder
        return None

    async def run(self) -> None:
        """Every ``POLL`` seconds, each job's lease holder and committed cursor, read from the
        primary the sentinels name now (a client that follows failovers by itself could read a
        restarted old primary before the sentinels have made it a replica)."""
        clients: dict[int, Any] = {}
        pg_conn: Any = None
        redis_jobs = [j for j in self.jobs if j != self.pg_job]

        def primary_client() -> Any:
            port = self.redis.primary_port()
            if port not in clients:
                clients[port] = self.redis.client(self.redis.server(port), timeout=0.5)
            return clients[port]

        def once(at: float) -> list[check.Sample]:
            nonlocal pg_conn
            out: list[check.Sample] = []
            try:
                states = {s.job: s for s in read_states(primary_client(), self.jobs)}
            except Exception:
                return out
            holders = {job: states[job].leader for job in self.jobs}
            for job in redis_jobs:
                out.append(check.Sample(at, job, holders[job], states[job].cursor))
            if self.pg is not None:
                try:
                    if pg_conn is None:
                        import psycopg

                        pg_conn = psycopg.connect(self.pg.url, autocommit=True, connect_timeout=1,
                                                  options="-c statement_timeout=500")  # fmt: skip
                    row = pg_conn.execute(
                        "SELECT cursor FROM ingestion.cursors WHERE job = %s", (self.pg_job,)
                    ).fetchone()
                    out.append(check.Sample(at, self.pg_job, holders[self.pg_job], row[0] if row else None))
                except Exception:
                    if pg_conn is not None:
                        pg_conn.close()
                    pg_conn = None
            return out

        try:
            while True:
                self.samples += await trio.to_thread.run_sync(once, self.now(), abandon_on_cancel=True)
                self._polled.set()
                self._polled = trio.Event()
                await trio.sleep(POLL)
        finally:
            for c in clients.values():
                c.close()

    def committed_since(self, job: str, since: float) -> bool:
        last = None
        for s in self.samples:
            if s.job != job:
                continue
            if s.at >= since and last is not None and s.cursor is not None and s.cursor != last:
                return True
            if s.cursor is not None:
                last = s.cursor
        return False

    async def until(self, condition: Callable[[], bool], within: float) -> None:
        """Until ``condition`` holds, checked after each poll (at most ``within`` seconds)."""
        with trio.move_on_after(within):
            while not condition():
                await self._polled.wait()
