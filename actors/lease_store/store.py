"""The lease store: one job's lease, fencing-token and cursor operations, each atomic in Redis.

It runs the scripts in ``lua/`` and bridges trio to redis-py's synchronous client (a worker thread
per call, with ``abandon_on_cancel`` so a cancelled caller never waits on a socket).

Every call is bounded by the client's socket and connect timeouts, which the configuration keeps well
below the lease safety margin, and redis-py's own retries are switched off: a retry would stretch a
call past the margin. A call that fails or times out raises :class:`RedisUnavailable`, and the caller
must treat it as *ambiguous*: the command may or may not have been applied.

The fencing rule lives in Redis: a commit is applied only if its token equals the job's token
counter *and* the lease still holds exactly this holder and token, *and* its records follow the
stored cursor strictly. Local checks elsewhere are an optimisation; this one is the guarantee.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import trio
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from actors.cursor_order import ascending_after, token_key
from actors.lease_store import scripts
from actors.lease_store.connect import (
    ClusterTarget,
    SentinelTarget,
    client_kwargs,
    describe_redis_error,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
    redacted_endpoint,
)
from actors.lease_store.keys import AUDIT_MAXLEN, DEPLOYMENT_KEY, NODE_FORGET_MS, job_keys, parse_lease_value
from actors.lease_store.lease_path import lease_limiter, renewals
from actors.lease_store.notices import ReleaseNotices
from actors.lease_store.results import (
    Acquired,
    CommitRejected,
    Committed,
    GroupInfo,
    HealthReport,
    Held,
    JobState,
    LeaderInfo,
    RedisUnavailable,
    Renewal,
    ReplicationUnconfirmed,
    StateLost,
    StreamInfo,
)
from actors.lease_store.state import StateQuery
from actors.source import Record, Watermark

T = TypeVar("T")


def handover_request(token: int, by: str) -> dict[str, str]:
    """The fields of the job's leader hash that ask term ``token`` to hand over (``by``: who
    asks), as the renew script reads them (``lua/renew.lua``)."""
    return {"handover_token": str(token), "handover_by": by[:200]}


def _optional_ms(ms: int | None) -> str | int:
    """A report_health duration argument: '' for none, never negative."""
    return "" if ms is None else max(0, ms)


FOLLOW_PRIMARY_EVERY = 0.5  # seconds: how stale the Sentinel-named primary may be (follow_primary)
REJECTIONS_KEPT = 100  # fencing rejections kept per job (approximately) for the console


def deployment_name(client: redis.Redis) -> str:
    """Which Redis deployment ``client`` talks to, without credentials and stable across nodes
    that list the same servers in another order: ``redis:H:P/DB``, ``unix:PATH/DB``,
    ``sentinel:H:P,H:P/SERVICE/DB`` or ``cluster:H:P,H:P`` (addresses sorted)."""
    ctarget: ClusterTarget | None = getattr(client, "cluster_target", None)
    if ctarget is not None:
        return "cluster:" + ",".join(sorted(f"{h}:{p}" for h, p in ctarget.nodes))
    target: SentinelTarget | None = getattr(client, "sentinel_target", None)
    if target is not None:
        sentinels = ",".join(sorted(f"{h}:{p}" for h, p in target.sentinels))
        return f"sentinel:{sentinels}/{target.service}/{target.db}"
    return _plain_deployment(client.connection_pool.connection_kwargs)


def _plain_deployment(kw: dict[str, Any]) -> str:
    if "path" in kw:
        return f"unix:{kw['path']}/{kw.get('db', 0)}"
    return f"redis:{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"


def deployment_of_url(url: str) -> str:
    """:func:`deployment_name` of the client ``connect(url)`` gives, without making one (a
    cluster client reads the slot map when made): for checks before the node starts.

    Raises:
        BadRedisUrl, ValueError: the URL cannot be parsed.
    """
    if is_cluster_url(url):
        return "cluster:" + ",".join(sorted(f"{h}:{p}" for h, p in parse_cluster_url(url).nodes))
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        sentinels = ",".join(sorted(f"{h}:{p}" for h, p in target.sentinels))
        return f"sentinel:{sentinels}/{target.service}/{target.db}"
    return _plain_deployment(redis.ConnectionPool.from_url(url).connection_kwargs)


class LeaseStore:
    """Lease, fencing-token and cursor operations for one job, each one atomic in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        job: str,
        call_timeout: float | None = None,
        *,
        min_replicas_acked: int = 0,
        replication_wait: float | None = None,
        events_max_len: int = 0,
        limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.client = client
        # The threads its calls run on (None: trio's default 40, which the node's renewals and
        # commits use): a reader of its own (the console) keeps off them.
        self.limiter = limiter
        self.job = job
        # Every call, whole, is bounded by this (default: the client's socket timeout).
        self.call_timeout = call_timeout or client_kwargs(client).get("socket_timeout") or 1.0
        # After each acquire and commit, wait (WAIT, same connection) for this many replicas to
        # acknowledge it, at most ``replication_wait`` seconds (default: half the call bound, so
        # the script and the WAIT fit in one bounded call).
        self.min_replicas_acked = min_replicas_acked
        self.replication_wait_ms = max(
            1, round(1000 * (replication_wait if replication_wait is not None else self.call_timeout / 2))
        )
        # Keep about this many entries in the events stream (0: all), never one that a consumer
        # group still needs: trimmed inside the commit script, under the same fencing check.
        self.events_max_len = events_max_len
        self.keys = job_keys(job)
        self.deployment = deployment_name(client)  # names the node's token memory file
        self._stale_topology = False
        self._where, self._secret = redacted_endpoint(client)
        self._acquire = client.register_script(scripts.ACQUIRE)
        self._renew = client.register_script(scripts.RENEW)
        self._release = client.register_script(scripts.RELEASE)
        self._commit = client.register_script(scripts.COMMIT)
        self._fenced_hset = client.register_script(scripts.FENCED_HSET)
        self._report_health = client.register_script(scripts.REPORT_HEALTH)
        self._deployment_id = client.register_script(scripts.DEPLOYMENT_ID)
        self._fenced_audit = client.register_script(scripts.FENCED_AUDIT)
        # Told ("acquired" | "released", job, token, node) as soon as Redis granted or released
        # this job's lease: a node process's parent learns from it which leases to release
        # should the process die (ingestion/node/parent.py). Never told of an unknown outcome.
        self.on_lease: Callable[[str, str, int, str], None] | None = None
        self.last_handover_by = ""  # who asked for the hand-over the last renewal took

    async def follow_primary(self, every: float = FOLLOW_PRIMARY_EVERY) -> None:
        """With Sentinel, ask where the primary is every ``every`` seconds, until cancelled.

        redis-py asks the sentinels only when it opens a connection, and drops idle connections
        to a former primary only then; a pooled connection to an old primary that was not told
        to step down (a planned failover leaves it a writable primary for seconds) would keep
        taking our writes there. Asking often makes the pool drop them within ``every``. This
        runs beside the calls, never in their path: sentinels that are slow or gone must not
        delay or fail a call to a primary that works. Errors are left to the calls to report.
        """
        pool = getattr(self.client, "connection_pool", None)
        if not isinstance(pool, SentinelConnectionPool):
            return
        while True:
            with trio.move_on_after(max(every, 4 * self.call_timeout)):
                try:
                    # disconnects idle connections when the primary moved
                    await trio.to_thread.run_sync(pool.get_master_address, abandon_on_cancel=True)
                except (redis.RedisError, OSError):
                    pass
            await trio.sleep(every)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._call_on(self.limiter, fn, *args, **kwargs)

    async def _lease_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A call of the lease path (acquire, renew, release, commit): on threads of its own."""
        return await self._call_on(self.limiter or lease_limiter(), fn, *args, **kwargs)

    async def _call_on(
        self, limiter: trio.CapacityLimiter | None, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        # The socket timeouts bound each read, write and connect, not the whole call (a fresh
        # connection may handshake, and a script may need loading); this bounds the whole call.
        # An abandoned worker finishes on its own; its connection is not reused before it does.
        call = functools.partial(self._fresh_then, fn, *args, **kwargs)
        return await self._bounded(
            functools.partial(trio.to_thread.run_sync, call, abandon_on_cancel=True, limiter=limiter)
        )

    async def _bounded(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, bounded by the call bound; its failure or timeout as ``RedisUnavailable``."""
        try:
            with trio.fail_after(self.call_timeout):
                return await call()
        except trio.TooSlowError as exc:
            self._stale_topology = True
            raise RedisUnavailable(
                f"{self._where}: timed out: no answer within {self.call_timeout * 1000:.0f} ms"
            ) from exc
        except (redis.RedisError, OSError) as exc:
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError):
                self._stale_topology = True  # (a cluster re-reads its slot map before the next call)
            raise RedisUnavailable(describe_redis_error(exc, where=self._where, secret=self._secret)) from exc

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking redis-py call of the caller's, bounded and reported like every store call.

        Raises:
            RedisUnavailable: it failed or timed out (its effect is unknown).
        """
        return await self._call(fn, *args)

    def _script_then_wait(
        self, script: Any, keys: list[str], args: list[Any], *, replid: bool = False
    ) -> tuple[Any, int | None, str | None]:
        """Run ``script`` and, on the same connection right after it, ``WAIT`` for the replicas
        (when asked for): one round trip, in a worker thread. Returns (the script's answer,
        replicas that acknowledged or None, the replid: with ``replid``, the script's answer ends
        with the server's replication id, which the script reads itself, so that a standby's
        acquire is one command, not a script and an ``INFO``).

        On a cluster, ``MOVED`` (the slot is served elsewhere now) re-reads the slot map and runs
        it again once; ``ASK`` (the slot is being migrated and its keys are on the target already)
        runs it on the target after ``ASKING``, on one connection, without touching the slot map,
        which names the source until the migration ends. Both mean nothing ran where they came
        from, as does ``NOSCRIPT`` (the script is loaded and run again, once per server). The
        replid is None after an ASK (the target is another shard's master)."""
        ask: tuple[str, int] | None = None
        loaded = moved = False
        while True:
            conn = self._connection_for(keys[0]) if ask is None else self._node_at(*ask)
            pipe = conn.pipeline(transaction=False)
            if ask is not None:
                pipe.execute_command("ASKING")  # lets the next command in on the importing node
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if self.min_replicas_acked:
                pipe.execute_command("WAIT", self.min_replicas_acked, self.replication_wait_ms)
            out = pipe.execute(raise_on_error=False)
            if ask is not None:
                out = out[1:]
            if isinstance(out[0], redis.exceptions.NoScriptError) and not loaded:
                # A primary that never saw the script (a fresh or newly promoted one, a migration
                # target): nothing ran, so loading it and running again is safe.
                loaded = True
                conn.script_load(script.script)
                continue
            if isinstance(out[0], redis.exceptions.AskError) and ask is None:
                # Another server: it may lack the script although the source had it loaded.
                ask, loaded = (out[0].host, out[0].port), False
                continue
            if isinstance(out[0], redis.exceptions.AskError | redis.exceptions.MovedError):
                # The slot is served elsewhere now (a failover, the end of a migration): re-read
                # the slot map, and run again once.
                self._stale_topology = True
                if not moved:
                    moved, ask, loaded = True, None, False
                    continue
            for item in out:
                if isinstance(item, Exception):
                    raise item
            acked = int(out[1]) if self.min_replicas_acked else None
            # An ASK target is another shard's master (a slot migration, not a failover): its
            # replid says nothing of the job's primary, so none is reported.
            said = out[0][-1] if replid and ask is None else None
            return out[0], acked, (said or None) if isinstance(said, str) else None

    def _node_at(self, host: str, port: int) -> redis.Redis:
        """The cluster's client for the master at ``host:port`` (an ``ASK`` target)."""
        assert isinstance(self.client, RedisCluster)
        node = self.client.get_node(host=host, port=port)
        if node is None:  # a master the slot map does not know yet
            self.client.nodes_manager.initialize()
            node = self.client.get_node(host=host, port=port)
        if node is None:
            raise redis.exceptions.ClusterError(f"ASK names {host}:{port}, not in the cluster")
        conn: redis.Redis = self.client.get_redis_connection(node)
        return conn

    def _fresh_then(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn``; on a cluster whose slot map may be stale (a failed call), re-read it first."""
        if self._stale_topology and isinstance(self.client, RedisCluster):
            self._stale_topology = False
            self.client.nodes_manager.initialize()
        return fn(*args, **kwargs)

    def _connection_for(self, key: str) -> redis.Redis:
        """The client that talks to the server holding ``key``: on a cluster, the master of the
        key's slot (so that a script, ``WAIT`` and ``INFO`` share one connection)."""
        if not isinstance(self.client, RedisCluster):
            return self.client
        if self._stale_topology:
            self._stale_topology = False
            self.client.nodes_manager.initialize()
        node = self.client.get_node_from_key(key)
        conn: redis.Redis = self.client.get_redis_connection(node)
        return conn

    def _check_acked(self, what: str, acked: int | None, token: int | None = None) -> None:
        if acked is not None and acked < self.min_replicas_acked:
            raise ReplicationUnconfirmed(
                f"{self._where}: {what} applied by the primary but acknowledged by {acked} of the "
                f"{self.min_replicas_acked} replicas asked for within {self.replication_wait_ms} ms "
                "(redis.min_replicas_acked): a failover may lose it",
                acked,
                self.min_replicas_acked,
                token,
            )

    async def acquire(
        self,
        node: str,
        ttl_ms: int,
        known_token: int = 0,
        known_committed: bool = False,
        health: HealthReport | None = None,
    ) -> Acquired | Held | StateLost:
        """Take the lease if it is free. ``known_token``: the highest fencing token the caller has
        seen. If Redis's counter is below it (Redis went back in time) the new token is floored
        above it and ``rolled_back_from`` says so; if the job's cursor is gone as well and the
        caller has seen the job commit (``known_committed``), Redis lost the job and nothing is
        issued (:class:`StateLost`). :class:`Held` says whether the job has committed.
        ``health``: the caller's source health, recorded in the same script as
        :meth:`report_health` would (an idle standby's one round trip per TTL); the answer's
        ``able`` then lists the nodes able to lead the job.

        Raises:
            RedisUnavailable: the outcome is unknown (a lease may have been granted);
                :class:`ReplicationUnconfirmed` when granted but not replicated as asked.
        """
        k = self.keys
        keys = [k["lease"], k["token"], k["leader"], k["audit"], k["cursor"]]
        args: list[str | int] = [node, ttl_ms, AUDIT_MAXLEN, known_token, 1 if known_committed else 0]
        if health is not None:
            keys.append(k["health"])
            args += [
                _optional_ms(health.age_ms), health.window_ms, _optional_ms(health.failing_ms),
                NODE_FORGET_MS,
            ]  # fmt: skip
        res, acked, replid = await self._lease_call(
            self._script_then_wait, self._acquire, keys, args, replid=True
        )
        able = tuple(res[-2]) if health is not None else None
        if int(res[0]) == 2:
            return StateLost(counter=int(res[1]), cursor=res[2] or None, replid=replid, able=able)
        if int(res[0]) == 0:
            token, holder = parse_lease_value(res[1])
            return Held(
                holder=holder, token=token, ttl_left_ms=int(res[2]), committed=bool(int(res[3])),
                replid=replid, able=able,
            )  # fmt: skip
        _, token, prev_node, prev_token, takeover, cursor, rolled_back, _, _ = res
        if self.on_lease is not None:
            self.on_lease("acquired", self.job, int(token), node)  # granted, replicated or not
        self._check_acked("the lease grant", acked, int(token))
        return Acquired(
            token=int(token),
            previous_node=prev_node or None,
            previous_token=int(prev_token) if prev_token else None,
            takeover_ms=int(takeover) if takeover != "" else None,
            cursor=cursor or None,
            rolled_back_from=int(rolled_back) if rolled_back != "" else None,
            replid=replid,
            able=able,
        )

    async def renew(self, node: str, token: int, ttl_ms: int) -> Renewal:
        """Extend the lease if it still holds exactly ``node`` and ``token``: ``LOST`` (false) if
        it does not; ``HAND_OVER`` when extended and an operator asked this term to hand over
        (:meth:`request_handover`; taken once: who asked is then ``last_handover_by``)."""
        k = self.keys
        keys, args = [k["lease"], k["leader"]], [node, token, ttl_ms]
        if self.limiter is None and not isinstance(self.client, RedisCluster):  # the node's, together
            res = await self._bounded(functools.partial(renewals(self.client, self._renew).renew, keys, args))
        else:
            res = await self._lease_call(self._renew, keys=keys, args=args)
        answer = Renewal(int(res[0]))
        if answer is Renewal.HAND_OVER:
            self.last_handover_by = str(res[1])
        return answer

    async def request_handover(self, token: int, by: str) -> None:
        """Ask the leader of term ``token`` to hand the job over gracefully (finish its commit,
        release, stand aside one TTL): its next renewal takes the request, and it writes who asked
        (``by``) to the audit. A request for a term that has ended is dropped by the next renewal
        of any other term.

        Raises:
            RedisUnavailable: the outcome is unknown.
        """
        await self._call(self.client.hset, self.keys["leader"], mapping=handover_request(token, by))

    async def deployment_id(self) -> str:
        """The Redis deployment's own identity, ``id:`` and 32 hex digits: created once, by the
        first node that asks (``lua/deployment_id.lua``), and kept in Redis with the data, so it
        names this deployment however its address is spelled (``10.0.0.5`` or
        ``redis.internal``), and two deployments apart even when reached by the same URL.

        Raises:
            RedisUnavailable: failed or timed out.
        """
        # (with min_replicas_acked, the replicas are waited for as after a grant: a failover just
        # after the id was made does not lose it)
        answer, _acked, _replid = await self._call(
            self._script_then_wait, self._deployment_id, [DEPLOYMENT_KEY], [f"id:{uuid.uuid4().hex}"]
        )
        return answer if isinstance(answer, str) else bytes(answer).decode()

    async def note_rejection(self, fields: dict[str, str | int]) -> None:
        """Keep a fencing rejection this node was told of in the job's ``rejections`` stream (the
        last ``REJECTIONS_KEPT``), for the console: a diagnostic, not a record or a cursor, so it
        is written by the refused node itself. Bounded; never raises."""
        entry = {k: str(v) for k, v in fields.items()}
        with trio.move_on_after(self.call_timeout):
            try:
                await self._call(
                    self.client.xadd, self.keys["rejections"], entry, maxlen=REJECTIONS_KEPT, approximate=True
                )
            except RedisUnavailable:
                pass

    async def release(self, node: str, token: int, reason: str = "") -> bool:
        """Give the lease up (if still ours) and wake the standbys; False if it was not ours.
        ``reason`` ``handed-over`` (an operator asked) or ``node-exiting`` (the node is going
        away: its worker died): the standbys take over at once (the audit's ``released`` and
        the notice say so)."""
        k = self.keys
        res = await self._lease_call(
            self._release,
            keys=[k["lease"], k["leader"], k["audit"]],
            args=[node, token, k["released"], AUDIT_MAXLEN, reason],
        )
        if self.on_lease is not None:
            self.on_lease("released", self.job, token, node)  # released now, or not ours any more
        return bool(int(res))

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
        watermark: Watermark | None = None,
    ) -> Committed | CommitRejected:
        """Append ``records`` to the events stream and advance the cursor, fenced by ``token``.

        ``previous_cursor`` is the cursor the writer believes is committed; a commit that does not
        continue exactly from it is rejected, so a batch can neither be replayed nor leave a gap.
        ``anchor`` (a paging token after the stored cursor and the last record) then becomes the
        cursor: alone, it pins a position; after records, it is where the source read through.
        ``watermark`` is committed beside the cursor (it only rises, and never once held).

        Raises:
            ValueError: a record's paging token is malformed or the batch is out of order.
            RedisUnavailable: the outcome is unknown; re-read the cursor before going on
                (:class:`ReplicationUnconfirmed`: applied by the primary, not replicated as asked).
        """
        if not records and anchor is None:
            raise ValueError("a commit carries records, an anchor cursor, or both")
        tokens = [r.paging_token for r in records] + ([anchor] if anchor is not None else [])
        if not ascending_after(tokens):  # one pass over the batch; the slow one says where
            previous = None
            for token_text in tokens:
                key = token_key(token_text)
                if previous is not None and key <= previous:
                    raise ValueError(f"batch out of order at paging token {token_text!r}")
                previous = key
        args: list[str | int] = [
            node, token, previous_cursor or "", anchor or "", self.events_max_len,
            "" if watermark is None else str(watermark),
        ]
        args += itertools.chain.from_iterable(records)  # (paging_token, body) pairs, in C
        k = self.keys
        res, acked, _ = await self._lease_call(
            self._script_then_wait, self._commit, [k["token"], k["lease"], k["cursor"], k["events"]], args
        )
        if int(res[0]) == 1:
            self._check_acked("the commit", acked)
            return Committed(
                token=token, count=int(res[1]), cursor=res[2], trimmed=int(res[3]),
                complete_through=int(res[4]) if res[4] else None, held=res[5], newly_held=res[6] == 1,
            )  # fmt: skip
        return CommitRejected(
            token=token, reason=res[1], current_token=int(res[2]), stored_cursor=res[3] or None
        )

    async def fenced_hset(
        self, node: str, token: int, key: str, mapping: dict[str, str]
    ) -> CommitRejected | None:
        """Set fields of the hash ``key`` only if ``token`` is current and ``node`` holds the lease.

        For singleton jobs' own side effects (beyond the events stream): returns None when applied,
        else the rejection. ``key`` should carry the job's hash tag (``job_keys``) on a cluster.

        Raises:
            RedisUnavailable: the outcome is unknown.
        """
        args: list[str | int] = [node, token]
        for field, value in mapping.items():
            args += [field, value]
        k = self.keys
        res = await self._call(self._fenced_hset, keys=[k["token"], k["lease"], key], args=args)
        if int(res[0]) == 1:
            return None
        return CommitRejected(token=token, reason=res[1], current_token=int(res[2]), stored_cursor=None)

    async def report_health(
        self, node: str, age_ms: int | None, window_ms: int, failing_ms: int | None = None
    ) -> list[str]:
        """Record that ``node``'s source answered ``age_ms`` ago (None: never) and, explicitly,
        that it has been failing for ``failing_ms`` (None: it is not failing); returns the nodes
        whose source answered within ``window_ms`` (Redis time) and is not failing.

        Raises:
            RedisUnavailable: failed or timed out.
        """
        k = self.keys["health"]
        args = [node, _optional_ms(age_ms), window_ms, _optional_ms(failing_ms), NODE_FORGET_MS]
        healthy: list[str] = await self._call(self._report_health, keys=[k], args=args)
        return healthy

    async def forget_health(self, node: str) -> None:
        """Remove ``node``'s health entries: it no longer hosts the job (stopped for it here).

        Raises:
            RedisUnavailable: failed or timed out.
        """
        await self._call(self.client.hdel, self.keys["health"], node, f"failing:{node}")

    async def source_health(self) -> dict[str, int]:
        """node -> Redis time (ms) of its source's last successful answer (failing markers
        left out)."""
        raw: dict[str, str] = await self._call(self.client.hgetall, self.keys["health"])  # type: ignore[arg-type]
        return {node: int(ms) for node, ms in raw.items() if not node.startswith("failing:")}

    async def fenced_audit(
        self, node: str, token: int, event: str, fields: dict[str, str], *, stream: str | None = None,
        maxlen: int = AUDIT_MAXLEN,
    ) -> CommitRejected | None:  # fmt: skip
        """Append ``event`` (with ``node``, ``token`` and ``fields``) to the job's audit stream,
        only if ``token`` is current and ``node`` holds the lease: a job's own record of something
        that happened in its term (a skipped history gap). ``stream``: another stream of the job's
        (under its hash tag), kept to ``maxlen``. None when written, else the rejection.

        Raises:
            RedisUnavailable: the outcome is unknown.
        """
        args: list[str | int] = [node, token, maxlen, event]
        for field, value in fields.items():
            args += [field, value]
        k = self.keys
        keys = [k["token"], k["lease"], stream or k["audit"]]
        res = await self._call(self._fenced_audit, keys=keys, args=args)
        if int(res[0]) == 1:
            return None
        return CommitRejected(token=token, reason=res[1], current_token=int(res[2]), stored_cursor=None)

    async def committed_cursor(self) -> str | None:
        cursor: str | None = await self._call(self.client.hget, self.keys["cursor"], "cursor")  # type: ignore[arg-type]
        return cursor

    async def server_time(self) -> float:
        """Redis's clock (``TIME``) in seconds: the one wall clock every node of a deployment
        shares, whatever its own says (a cluster asks each primary; any of them will do).

        Raises:
            RedisUnavailable: it failed or timed out.
        """
        answer = await self._call(self.client.time)
        if isinstance(answer, dict):
            answer = next(iter(answer.values()))
        seconds, micros = answer
        return int(seconds) + int(micros) / 1e6

    async def leader(self) -> LeaderInfo:
        def read() -> LeaderInfo:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.keys["lease"])
            pipe.pttl(self.keys["lease"])
            pipe.hexists(self.keys["cursor"], "cursor")
            value, ttl, committed = pipe.execute()
            if value is None:
                return LeaderInfo(None, None, None, bool(committed))
            token, node = parse_lease_value(value)
            return LeaderInfo(node, token, int(ttl) if int(ttl) >= 0 else None, bool(committed))

        return await self._call(read)

    async def state(self, audit_count: int = 10) -> JobState:
        """The job's state now, with its newest ``audit_count`` audit entries (the one reader:
        :class:`~actors.lease_store.state.StateQuery`).

        Raises:
            RedisUnavailable: it failed or timed out.
        """
        query = StateQuery(self.job, audit_count)

        def read() -> JobState:
            pipe = self.client.pipeline(transaction=False)
            query.queue(pipe)
            return query.parse(pipe.execute())

        return await self._call(read)

    async def events_info(self) -> StreamInfo:
        """Length, trimmed entries and consumer groups of the events stream (read-only)."""
        key = self.keys["events"]

        def read() -> StreamInfo:
            try:
                info: Any = self.client.xinfo_stream(key)
            except redis.ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return StreamInfo(0, 0, None, None, ())
                raise
            groups: Any = self.client.xinfo_groups(key)
            first, last = info.get("first-entry"), info.get("last-entry")
            return StreamInfo(
                length=int(info["length"]),
                # Redis 7.0 counts appended entries; before it, assume nothing was trimmed
                entries_added=int(info.get("entries-added", info["length"])),
                first_id=first[0] if first else None,
                last_id=last[0] if last else None,
                groups=tuple(
                    GroupInfo(
                        name=g["name"],
                        consumers=int(g["consumers"]),
                        pending=int(g["pending"]),
                        lag=int(g["lag"]) if g.get("lag") is not None else None,
                        last_delivered_id=g["last-delivered-id"],
                    )
                    for g in groups
                ),
            )

        return await self._call(read)

    def release_notices(self) -> ReleaseNotices:
        return ReleaseNotices(self)
