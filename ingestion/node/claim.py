"""One running node per node id: the node process claims its id in Redis before it campaigns.

Two processes under one ``--node-id`` on one Redis used to both run: the second took the first's
leases for leftovers of its own (``releasing-orphaned-lease``). Now each node process, before it
joins any election, claims ``ingestion:node:{ID}:instance`` (:func:`instance_key`) with a value of
its own, ``INSTANCE|COUNTER|TTL_MS|PID|PID_START|PID_SPACE|HOST`` (:class:`Holder`), under a PX
of the lease TTL, renews it every TTL/2 while it runs (the counter grows), and deletes it on a
clean exit (compare-and-delete: only its own). A node that finds the key held by another
instance:

- the key is watched for up to its remaining PX (at most one TTL): if it is renewed (or claimed
  anew) meanwhile, a live duplicate runs: refused (within about TTL/2); if it expires, or is
  deleted (that node's clean exit), the node claims it and goes on (a crash elsewhere);
- **held by a process of this host's own pid space** (same boot id, pid namespace and hostname)
  that has exited (no such pid with that start time, or a zombie: a crash, SIGKILL, then systemd
  restarting the node at once): the claim is taken over at once (compare-and-set on the exact
  value seen), so such a restart is not delayed; its leftover leases are then freed as before
  (``releasing-orphaned-lease``).

A refusal is a ``StartupError``: one line on stderr, exit 2, before the node campaigns. A running
node whose claim was taken by another instance (it was paused or cut off from Redis past the TTL,
and a second one started meanwhile) logs ``node-id-claim-lost`` and stops (exit 1).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import attrs
import redis
import trio
from redis.exceptions import ClusterDownError, RedisClusterException

from actors.lease_store.connect import describe_redis_error
from ingestion.common.keyspace import instance_key
from ingestion.node.preflight import StartupError

RENEW_FRACTION = 2  # renewed every TTL / 2 (half its PX left: an idle node's one call a TTL/2)
RELEASE_TIMEOUT = 0.5  # seconds, the delete on a clean exit
RETRY_CAP = 2.0  # seconds, the longest wait between questions to a Redis that does not answer
OUTAGE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, RedisClusterException)

# The claim's scripts, one .lua file each (headed by their KEYS, ARGV and answer), read once.
_LUA = files(__package__) / "lua"
RENEW = (_LUA / "claim_renew.lua").read_text(encoding="utf-8")
TAKE_OVER = (_LUA / "claim_take_over.lua").read_text(encoding="utf-8")
RELEASE = (_LUA / "claim_release.lua").read_text(encoding="utf-8")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_space() -> str:
    """Where a pid means one process: this boot of this kernel, this pid namespace ("" unknown)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{ns.removeprefix('pid:').strip('[]')}" if boot else ""


def process_start(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot ("" when there is no such process,
    or it has exited and awaits its parent: a zombie)."""
    stat = _read(f"/proc/{pid}/stat")
    # (the command name, field 2, is in parentheses and may hold spaces: split after it)
    fields = stat.rpartition(")")[2].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return ""
    return fields[19]


@attrs.frozen
class Holder:
    """What a claim's value says of the process that holds it."""

    instance: str
    counter: int
    ttl_ms: int
    pid: int
    pid_start: str
    space: str
    host: str

    def value(self) -> str:
        return "|".join(
            [self.instance, str(self.counter), str(self.ttl_ms), str(self.pid), self.pid_start,
             self.space, self.host]
        )  # fmt: skip

    @classmethod
    def parse(cls, value: str) -> Holder:
        parts = value.split("|", 6)
        try:
            instance, counter, ttl, pid, start, space, host = parts
            return cls(instance, int(counter), int(ttl), int(pid), start, space, host)
        except ValueError:  # (not ours: never taken for a process of this host)
            return cls(parts[0], 0, 0, 0, "", "", "")

    def here(self) -> bool:
        """Whether its pid names a process of this host's own pid space."""
        return bool(self.space) and self.space == pid_space() and self.host == socket.gethostname()

    def alive(self) -> bool:
        """(for a holder :meth:`here`) whether its process still runs: the pid, started then."""
        return process_start(self.pid) == self.pid_start

    def describe(self, pttl_ms: int) -> str:
        age = max(0, self.ttl_ms - pttl_ms) if self.ttl_ms and pttl_ms >= 0 else None
        where = f"pid {self.pid} on {self.host}" if self.pid else "unknown process"
        refreshed = f", refreshed {age} ms ago" if age is not None else ""
        return f"instance {self.instance}, {where}{refreshed}"


def refusal(node: str, holder: Holder, pttl_ms: int) -> StartupError:
    return StartupError(
        f"node.id {node}: in use by a running node ({holder.describe(pttl_ms)}): give this node "
        "another --node-id (INGESTION_NODE_ID), or stop that node"
    )


class NodeClaim:
    """This process's claim of its node id (see the module's text)."""

    def __init__(
        self, client: Any, node: str, ttl_ms: int, log: Any, where: str = "redis",
        diagnose: Callable[[], str | None] | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.where = where  # the Redis URL, for log lines (without its password)
        # What is wrong with what the URL reaches, in an operator's words (blocking; None: nothing
        # found): asked when Redis answers the claim with an error (a password it lacks, ...).
        self.diagnose = diagnose
        self.node = node
        self.key = instance_key(node)
        self.ttl_ms = ttl_ms
        self.log = log
        pid = os.getpid()
        self.me = Holder(
            secrets.token_hex(8), 0, ttl_ms, pid, process_start(pid), pid_space(), socket.gethostname()
        )
        self.lost = trio.Event()
        self.taken_by: Holder | None = None

    async def _ask(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs), abandon_on_cancel=True)

    def _next(self) -> str:
        self.me = attrs.evolve(self.me, counter=self.me.counter + 1)
        return self.me.value()

    async def claim(self, *, poll: float | None = None) -> None:
        """Claim the node id, waiting out a holder that may have crashed (at most its PX).

        Raises:
            StartupError: a live node holds it, or Redis refuses the questions (not an outage).
        """
        poll = poll if poll is not None else min(0.1, self.ttl_ms / 20000)
        attempt = 0
        watched: tuple[str, int] | None = None  # the value first seen, and its PTTL then
        while True:
            try:
                if await self._ask(self.client.set, self.key, self._next(), nx=True, px=self.ttl_ms):
                    if watched is not None:
                        self.log.info("node-id-claimed", previous=Holder.parse(watched[0]).instance,
                                      reason="expired")  # fmt: skip
                    return
                pipe = self.client.pipeline(transaction=False)
                pipe.get(self.key)
                pipe.pttl(self.key)
                value, pttl = await self._ask(pipe.execute)
            except redis.AuthenticationError as exc:
                raise await self._refused(exc) from exc
            except OUTAGE as exc:
                attempt += 1
                delay = min(RETRY_CAP, 0.1 * 2 ** min(attempt, 10))
                self.log.warning("redis-unavailable", attempt=attempt, retry_in=delay,
                                 error=describe_redis_error(exc, where=self.where))  # fmt: skip
                await trio.sleep(delay)
                continue
            except redis.RedisError as exc:
                raise await self._refused(exc) from exc
            attempt = 0
            if value is None:
                continue  # gone in between: claim it
            value = value.decode() if isinstance(value, bytes) else str(value)
            holder = Holder.parse(value)
            if watched is None:
                watched = (value, int(pttl))
                self.log.info("node-id-held", holder=holder.describe(int(pttl)),
                              wait_ms=max(0, int(pttl)))  # fmt: skip
            elif value != watched[0]:
                raise refusal(self.node, holder, int(pttl))  # renewed meanwhile: it runs
            if holder.here() and not holder.alive():
                if await self._take_over(value):
                    self.log.info("node-id-claimed", previous=holder.instance, previous_pid=holder.pid,
                                  reason="its process has exited")  # fmt: skip
                    return
                watched = None  # (changed in between: look again)
                continue
            await trio.sleep(poll)

    async def _refused(self, exc: Exception) -> StartupError:
        """Redis answered the claim with an error retrying cannot fix: one line, as the start-up
        checks word it when they can tell what is wrong."""
        mistake = None
        if self.diagnose is not None:
            mistake = await trio.to_thread.run_sync(self.diagnose, abandon_on_cancel=True)
        return StartupError(f"redis.url {self.where}: {mistake or f'claiming node.id {self.node}: {exc}'}")

    async def _take_over(self, seen: str) -> bool:
        try:
            new = self._next()
            answer = await self._ask(self.client.eval, TAKE_OVER, 1, self.key, seen, new, self.ttl_ms)
        except OUTAGE:
            return False  # (the next question finds the outage, and waits)
        return bool(answer)

    async def keep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the claim every TTL/2 until cancelled, then delete it; set :attr:`lost` (and
        return) when another instance holds it."""
        task_status.started()
        try:
            while True:
                await trio.sleep(self.ttl_ms / 1000 / RENEW_FRACTION)
                try:
                    answer = await self._ask(
                        self.client.eval, RENEW, 1, self.key, self.me.instance, self._next(), self.ttl_ms
                    )
                except (redis.RedisError, RedisClusterException):
                    continue  # (an outage: the elector says so; the next renewal tries again)
                if answer != 1:
                    value = answer.decode() if isinstance(answer, bytes) else str(answer)
                    self.taken_by = Holder.parse(value)
                    self.log.error(
                        "node-id-claim-lost", holder=self.taken_by.describe(-1),
                        error=f"another node runs under node.id {self.node} (it claimed the id while "
                        "this one was paused or cut off from Redis past the TTL): this node stops",
                    )  # fmt: skip
                    self.lost.set()
                    return
        finally:
            if not self.lost.is_set():
                with trio.move_on_after(RELEASE_TIMEOUT, shield=True), contextlib.suppress(
                    redis.RedisError, RedisClusterException
                ):
                    await self._ask(self.client.eval, RELEASE, 1, self.key, self.me.instance)
