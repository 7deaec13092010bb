"""A real Redis Sentinel deployment on loopback for the tests: one primary, replicas, three sentinels.

Every server is a ``redis-server`` child (sentinels run ``redis-server <conf> --sentinel``, each with
its own config file because a sentinel rewrites it). Sentinels monitor the service ``ingest`` with
quorum 2 and a short ``down-after-milliseconds`` so failovers take about a second or two. The
methods are blocking (tests call them through ``trio.to_thread`` where a node must keep running).

Faults: :meth:`SentinelGroup.kill` (SIGKILL), :meth:`pause`/:meth:`resume` (SIGSTOP/SIGCONT: a
replica that cannot acknowledge, or a primary that does not answer), :meth:`failover` (a planned
``SENTINEL FAILOVER``), :meth:`debug_sleep` (the primary stalls, then wakes still believing it is the
primary), :meth:`restart` (a killed server comes back on its port and rejoins as a replica).
"""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors.lease_store import job_keys
from ingestion.testing.cluster import TTL_MS, Cluster, open_cluster
from ingestion.testing.local_redis import LocalRedis

SERVICE = "ingest"


def _client(port: int, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=True,
    )  # fmt: skip


def _wait(what: str, check: object, timeout: float) -> object:
    """Call ``check`` until it returns something truthy (Redis errors count as not yet)."""
    end = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            value = check()  # type: ignore[operator]
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout} s" + (f" (last error: {last})" if last else ""))


@attrs.define
class SentinelGroup:
    replicas_count: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    min_replicas_to_write: int = 0
    min_replicas_max_lag: int = 1
    directory: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="ingestion-ha-")))
    servers: list[LocalRedis] = attrs.field(factory=list)
    sentinels: list[LocalRedis] = attrs.field(factory=list)

    # -- start and stop -------------------------------------------------------------------------

    def _server_args(self) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--replica-announce-ip", "127.0.0.1", "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0", "--appendfsync", "everysec",
                "--enable-debug-command", "local")  # fmt: skip
        if self.min_replicas_to_write:
            args += ("--min-replicas-to-write", str(self.min_replicas_to_write),
                     "--min-replicas-max-lag", str(self.min_replicas_max_lag))  # fmt: skip
        return args

    def start(self) -> SentinelGroup:
        primary = LocalRedis(persistence=True, directory=self._dir("primary"),
                             extra_args=self._server_args()).start()  # fmt: skip
        self.servers.append(primary)
        for i in range(self.replicas_count):
            replica = LocalRedis(
                persistence=True, directory=self._dir(f"replica{i}"),
                extra_args=(*self._server_args(), "--replicaof", "127.0.0.1", str(primary.port)),
            ).start()  # fmt: skip
            self.servers.append(replica)
        self.wait_replicas_synced()
        for i in range(3):
            conf = self._dir(f"sentinel{i}") / "sentinel.conf"  # its port: --port, picked by start()
            conf.write_text(
                "bind 127.0.0.1\nprotected-mode no\n"
                f"sentinel resolve-hostnames no\nsentinel announce-ip 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            sentinel = LocalRedis(directory=conf.parent, config_file=conf, extra_args=("--sentinel",))
            self.sentinels.append(sentinel.start())
            if self.down_after_ms <= 1000:
                # Sentinel pings every min(down-after, 1 s) and counts a fresh link as down about
                # a second after it opened: with down-after 1 s, a just-promoted primary could be
                # marked down and failed over again. Ping twice per down-after period instead.
                c = _client(sentinel.port)
                try:
                    c.execute_command("SENTINEL", "DEBUG", "ping-period", self.down_after_ms // 2)
                finally:
                    c.close()
        for s in self.sentinels:  # each knows the primary, every replica and the other sentinels
            c = _client(s.port)
            _wait("sentinels discover each other",
                  lambda c=c: len(c.sentinel_sentinels(SERVICE)) == 2
                  and len(c.sentinel_slaves(SERVICE)) == self.replicas_count, 20)  # fmt: skip
            c.close()
        return self

    def _dir(self, name: str) -> Path:
        path = self.directory / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
            server.kill()

    # -- where things are -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def ports(self) -> list[int]:
        """Every port a client may connect to: the servers' and the sentinels'."""
        return [s.port for s in self.servers + self.sentinels]

    def primary_port(self) -> int:
        """The primary as the sentinels name it now."""
        for s in self.sentinels:
            c = _client(s.port)
            try:
                addr = c.sentinel_get_master_addr_by_name(SERVICE)
            except (redis.RedisError, OSError):
                continue
            finally:
                c.close()
            if addr:
                return int(addr[1])  # type: ignore[index]  # (a (host, port) pair when truthy)
        raise RuntimeError("no sentinel names a primary")

    def server(self, port: int) -> LocalRedis:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> LocalRedis:
        return self.server(self.primary_port())

    def replicas(self) -> list[LocalRedis]:
        primary = self.primary_port()
        return [s for s in self.servers if s.port != primary]

    def client(self, server: LocalRedis, timeout: float = 2.0) -> redis.Redis:
        """A direct connection to one server (not through Sentinel)."""
        return _client(server.port, timeout)

    # -- waiting --------------------------------------------------------------------------------

    def describe(self) -> str:
        """Every server's replication view, for a failure message."""
        rows = []
        for server in self.servers:
            c = _client(server.port, 0.5)
            try:
                i = c.info("replication")
                rows.append(f"{server.port}: role={i.get('role')} master_port={i.get('master_port')} "
                            f"link={i.get('master_link_status')} offset={i.get('master_repl_offset')} "
                            f"replicas={i.get('connected_slaves')}")  # fmt: skip
            except (redis.RedisError, OSError) as exc:
                rows.append(f"{server.port}: {exc}")
            finally:
                c.close()
        return "; ".join(rows)

    def wait_replicas_synced(self, timeout: float = 20.0, at_least: int | None = None) -> None:
        """Until the primary (as the sentinels name it, asked again on every poll, since it can
        move meanwhile) sees every other live server, or ``at_least`` of them, as an online
        replica that acknowledged the offset the primary had when first seen."""
        targets: dict[int, int] = {}  # primary port -> its offset when first seen

        def synced() -> bool:
            port = self.primary_port() if self.sentinels else self.servers[0].port
            c = _client(port)
            try:
                info = c.info("replication")
            finally:
                c.close()
            if info.get("role") != "master":
                return False
            target = targets.setdefault(port, int(info["master_repl_offset"]))
            states = [info.get(f"slave{i}") or {} for i in range(int(info.get("connected_slaves", 0)))]
            online = [
                s for s in states
                if s.get("state") == "online" and int(s.get("offset", -1)) >= target
            ]  # fmt: skip
            others = [s for s in self.servers if s.port != port and s.process is not None]
            return len(online) >= (len(others) if at_least is None else at_least)

        try:
            _wait("replicas in sync", synced, timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.describe()}") from None

    def wait_for_new_primary(self, old_port: int, timeout: float = 20.0) -> LocalRedis:
        """Until every sentinel names a primary other than ``old_port`` and it says role:master."""

        def promoted() -> int | None:
            named = set()
            for s in self.sentinels:
                c = _client(s.port)
                try:
                    addr = c.sentinel_get_master_addr_by_name(SERVICE)
                finally:
                    c.close()
                named.add(int(addr[1]) if addr else None)  # type: ignore[index]
            if len(named) != 1 or old_port in named or None in named:
                return None
            port = named.pop()
            assert port is not None
            c = _client(port)
            try:
                return port if c.info("replication").get("role") == "master" else None
            finally:
                c.close()

        port = _wait("a new primary", promoted, timeout)
        assert isinstance(port, int)
        return self.server(port)

    def wait_is_replica(self, server: LocalRedis, timeout: float = 30.0) -> None:
        """Until ``server`` (say, a returned old primary) is a replica, linked to the primary."""
        c = _client(server.port)
        try:
            _wait("the server rejoins as a replica",
                  lambda: (i := c.info("replication"))["role"] == "slave"
                  and i.get("master_link_status") == "up", timeout)  # fmt: skip
        finally:
            c.close()

    # -- faults ---------------------------------------------------------------------------------

    def failover(self) -> None:
        """A planned failover (``SENTINEL FAILOVER``), asked of the first sentinel that agrees."""
        for s in self.sentinels:
            c = _client(s.port)
            try:
                c.execute_command("SENTINEL", "FAILOVER", SERVICE)
                return
            except redis.ResponseError:
                continue  # e.g. INPROG: another failover is running
            finally:
                c.close()
        raise RuntimeError("no sentinel accepted SENTINEL FAILOVER")

    def kill(self, server: LocalRedis) -> None:
        server.kill()

    def pause(self, server: LocalRedis) -> None:
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)

    def resume(self, server: LocalRedis) -> None:
        assert server.process is not None
        server.process.send_signal(signal.SIGCONT)

    def cut_replicas(self) -> None:
        """Cut every replica off the primary: stop them (SIGSTOP) and close their links from the
        primary's side (``CLIENT KILL TYPE replica``). Stopping alone does not cut: the
        replication stream keeps landing in a stopped replica's socket buffer and is applied when
        it resumes. Writes after this reach the primary only, until :meth:`resume`."""
        for replica in self.replicas():
            self.pause(replica)
        c = _client(self.primary_port())
        try:
            c.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            c.close()

    def restart(self, server: LocalRedis) -> None:
        """Start a killed server again on its port and directory (with its AOF). It comes back as
        a primary, as a killed primary does (not as a replica of the first primary, which its
        start-up arguments named); the sentinels turn it into a replica of the current one."""
        args = list(server.extra_args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
            server.extra_args = tuple(args)
        server.start()

    def debug_sleep(self, server: LocalRedis, seconds: float) -> threading.Thread:
        """Make ``server`` stall for ``seconds`` (``DEBUG SLEEP``, in a background thread: the
        command blocks until the server wakes). Returns the thread; join it to wait for the wake."""

        errors: list[BaseException] = []

        def sleep() -> None:
            c = _client(server.port, timeout=seconds + 5)
            try:
                c.execute_command("DEBUG", "SLEEP", seconds)
            except (redis.RedisError, OSError) as exc:
                errors.append(exc)
            finally:
                c.close()

        thread = threading.Thread(target=sleep, daemon=True)
        thread.start()
        thread.join(0.2)
        if errors:  # e.g. DEBUG disabled: the fault would silently not happen
            raise RuntimeError(f"DEBUG SLEEP failed: {errors[0]}")
        return thread


# The Sentinel scenarios: real nodes on a SentinelGroup.
ECHO = bool(__import__("os").environ.get("ECHO"))


@asynccontextmanager
async def sentinel_cluster(
    job: str, *, min_replicas_acked: int | None = None, **group: Any
) -> AsyncIterator[tuple[Cluster, SentinelGroup]]:
    g = await trio.to_thread.run_sync(lambda: SentinelGroup(**group).start())
    try:
        async with open_cluster(job, ttl_ms=TTL_MS, redis_url=g.url, echo=ECHO) as c:
            c.node_env = (
                {"INGESTION_REDIS_MIN_REPLICAS_ACKED": str(min_replicas_acked)}
                if min_replicas_acked is not None else {}
            )  # fmt: skip
            yield c, g
    finally:
        await trio.to_thread.run_sync(g.stop)


async def start_nodes(c: Cluster, *names: str) -> None:
    for name in names:
        await c.start_node(name, env=c.node_env)
    await c.log.wait_for("became-leader")


def last_entry_id(client: Any, job: str) -> str:
    last = client.xrevrange(job_keys(job)["events"], count=1)
    return str(last[0][0]) if last else "0-0"


async def promoted(g: SentinelGroup, old_port: int, job: str) -> tuple[int, str]:
    """Wait for the new primary; return its port and its newest entry id when first seen as it."""
    new = await trio.to_thread.run_sync(g.wait_for_new_primary, old_port)
    client = g.client(new)
    try:
        return new.port, last_entry_id(client, job)
    finally:
        client.close()
