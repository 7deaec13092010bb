"""The parent of a node process: when the worker dies, its leases are released in milliseconds.

``ingestion run`` forks. The child, the *worker*, runs the node exactly as before (actors, jobs,
endpoints). The parent keeps only a Redis connection of its own and a pipe on which the worker
reports each lease it acquires and releases (:mod:`ingestion.node.lease_reports`). Without the parent,
a crashed process (an OOM kill, a segfault in a C extension, an unhandled exception, ``kill -9``)
leaves its lease to expire: up to a whole TTL without a leader. With it:

- **The worker dies** (any signal, any non-zero exit): the parent reads what is left on the pipe,
  withdraws the node from the node registry (the others' shares grow at once), then runs the
  fenced release script (``lua/release.lua``) for exactly the leases the worker reported
  holding, with the reason ``node-exiting``, which also publishes the release notice the standbys
  wait on: a standby held off at its share takes the job over at once, as for a hand-over, rather
  than wait for the dead node to age out of the registry (about a lease TTL). It logs ``worker-died``
  (killed by a signal, or exited still holding a lease) and exits with a failure status (the
  worker's own, or 128 + the signal) so that the service manager restarts the node: there is no
  restart loop in here.
- **Safe even if the parent's view is stale**: the script frees the lease only while it is
  still exactly ``token|node``; a lease that expired or was taken under a newer token is left
  alone, and a write the dead worker left in flight is refused by the fencing check once another
  node holds a newer token.
- **The worker is paused** (SIGSTOP) or cut off: it is not dead (``waitpid`` without
  ``WUNTRACED`` does not return), so the parent does nothing and the TTL path applies.
- **The parent dies**: the worker gets SIGKILL from the kernel (``PR_SET_PDEATHSIG``), so it
  never outlives its parent; nobody releases, and the TTL path applies.
- **SIGTERM / SIGINT** to the parent are forwarded to the worker (a graceful stop as before).
  The worker has a process group of its own, so a terminal's Ctrl-C reaches it once, through
  the parent, not twice (a second signal would force the stop); under systemd,
  ``KillMode=mixed`` does the same.

Both processes log under the node's id on the same stdout; the worker's ``node-starting`` line
carries its ``pid``, the one to signal to pause the node.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

import redis
import trio
from redis.exceptions import RedisClusterException

from actors.lease_store import NODE_EXITING, LeaseStore, NodeRegistry, RedisUnavailable, scripts
from ingestion.config import Settings
from ingestion.node import stop_signals
from ingestion.node.build import build_store
from ingestion.node.lease_reports import HeldLeases
from ingestion.node.logs import configure_logging, node_logger

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
RELEASE_RETRY = 0.05  # seconds between attempts at a release Redis did not answer
CONNECT_RETRY = 1.0  # seconds between attempts at a cluster whose nodes do not answer
DRAIN_TIMEOUT = 0.5  # seconds to read what the dead worker left on the pipe (EOF comes at once)


def supported() -> bool:
    """Whether this platform can run a node as parent and worker (Linux: fork, prctl)."""
    return sys.platform == "linux" and hasattr(os, "fork")


def fork_worker() -> tuple[int, int] | None:
    """Fork. In the worker: None (the caller goes on to run the node; :func:`worker_pipe` is the
    lease pipe's write end). In the parent: ``(the worker's pid, the pipe's read end)``.

    Call it before any thread or event loop exists: only the forking thread survives a fork.
    """
    read_end, write_end = os.pipe()
    parent = os.getpid()
    # SIGINT and SIGTERM stay held (ingestion/node/stop_signals.py) in both processes: the parent
    # releases them once it forwards them (supervise), the worker once its node receives them.
    stop_signals.hold()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _become_worker(parent, write_end)
        return None
    os.close(write_end)
    return pid, read_end


_WORKER_PIPE: int | None = None


def worker_pipe() -> int | None:
    """In a worker: the write end of its lease pipe; else None."""
    return _WORKER_PIPE


def _become_worker(parent: int, write_end: int) -> None:
    global _WORKER_PIPE
    # Its own process group: a terminal's Ctrl-C goes to the parent only, which forwards it once.
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the death signal was set: nobody would release
    # Never block the node on a parent that does not read (paused): a report that does not fit
    # is dropped, and a dropped report only means the TTL path (see ingestion.node.lease_reports).
    os.set_blocking(write_end, False)
    _WORKER_PIPE = write_end



def exit_status(wait_status: int) -> tuple[int, str | None, int | None]:
    """``(the parent's exit status, the signal's name or None, the worker's exit status or
    None)`` from a ``waitpid`` status: the worker's own status, or 128 + the signal that killed
    it (a shell's convention)."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:
        return 128 - code, signal.Signals(-code).name, None
    return code, None, code


async def wait_for_exit(pid: int) -> int:
    """The ``waitpid`` status of child ``pid`` once it has exited (not merely stopped)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return (await trio.to_thread.run_sync(os.waitpid, pid, 0, abandon_on_cancel=True))[1]
    try:
        await trio.lowlevel.wait_readable(pidfd)  # readable: exited (a stop does not count)
        return os.waitpid(pid, os.WNOHANG)[1]  # noqa: ASYNC222 (it has exited: no wait)
    finally:
        os.close(pidfd)


async def release_until(store: LeaseStore, node: str, token: int, give_up_at: float) -> bool | None:
    """Release ``token|node`` (True: released; False: not held any more), retrying a Redis that
    does not answer until ``give_up_at`` (None: it never answered; the lease expires by itself).
    The release says the node is exiting, so standbys at their share take over at once."""
    while True:
        try:
            return await store.release(node, token, NODE_EXITING)
        except RedisUnavailable:
            if trio.current_time() + RELEASE_RETRY >= give_up_at:
                return None
            await trio.sleep(RELEASE_RETRY)


async def withdraw(registry: NodeRegistry, node: str, give_up_at: float) -> bool:
    """Take ``node`` out of the node registry (one bounded call, not retried: a Redis that does
    not answer now would delay the releases; the entry then ages out by itself, within a TTL)."""
    with trio.move_on_at(give_up_at):
        try:
            await registry.leave(node)
        except RedisUnavailable:
            return False
        return True
    return False


def run_parent(settings: Settings, worker: int, pipe: int) -> int:
    """The parent's whole life: :func:`supervise` under trio; its exit status."""
    return trio.run(supervise, settings, worker, pipe)


async def supervise(settings: Settings, worker: int, pipe: int) -> int:
    """Watch ``worker`` until it exits; release what it still held; the parent's exit status."""
    configure_logging(settings.log.level, settings.log.format)
    log = node_logger(settings.node.id, ",".join(settings.node.jobs))
    client: redis.Redis | None = None
    stores: dict[str, LeaseStore] = {}

    async def connect(*, once: bool = False) -> None:
        # A cluster client reads the slot map when built: while no node answers (the worker says
        # so, redis-unavailable), keep asking; the worker cannot hold a lease meanwhile.
        nonlocal client, stores
        while client is None:
            try:
                client = await trio.to_thread.run_sync(settings.redis.connect, abandon_on_cancel=True)
            except (RedisClusterException, redis.ConnectionError):  # (the worker says which)
                pass
            else:
                stores = {job: build_store(settings, job, client) for job in settings.node.jobs}
                return
            if once:
                return
            await trio.sleep(CONNECT_RETRY)

    view = HeldLeases()
    reports = trio.lowlevel.FdStream(pipe)
    eof = trio.Event()

    async def read_reports() -> None:
        while data := await reports.receive_some(65536):
            for line in view.feed(data):
                log.warning("lease-report-malformed", line=line.decode(errors="replace"))
        eof.set()

    async def forward_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            # Only now that the receiver holds them: a stop asked for at any moment since the
            # process started (held pending) is forwarded, never dropped by a default handler.
            stop_signals.release()
            async for signum in signals:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, signum)

    async def warm_up() -> None:
        # Connect (and load the release script) now, not when every millisecond counts.
        await connect()
        assert client is not None
        any_store = next(iter(stores.values()))
        with contextlib.suppress(RedisUnavailable):
            await any_store.run(client.ping)
            await any_store.run(client.script_load, scripts.RELEASE)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_reports)
            nursery.start_soon(forward_signals)
            nursery.start_soon(warm_up)
            status = await wait_for_exit(worker)
            died_at = trio.current_time()
            with trio.move_on_after(DRAIN_TIMEOUT):
                await eof.wait()  # what the worker wrote before it died
            nursery.cancel_scope.cancel()
        code, signame, worker_status = exit_status(status)
        held = view.leases()
        give_up_at = died_at + settings.lease.ttl_ms / 1000
        outcomes: dict[tuple[str, int, str], bool | None] = {}

        async def release(job: str, token: int, node: str) -> None:
            # (a backfill's range job is not configured: its store is built when needed)
            store = stores.get(job) or build_store(settings, job, client)
            outcomes[job, token, node] = await release_until(store, node, token, give_up_at)

        if held and client is None:
            with trio.move_on_at(give_up_at):
                await connect(once=True)
        if client is None:
            outcomes.update({lease: None for lease in held})
            held = []
        withdrawn = False
        if client is not None and (signame is not None or held):
            # The node is going away: out of the registry first, so that a standby woken by the
            # release notice reads a view without it (its share grows: it campaigns at once).
            withdrawn = await withdraw(NodeRegistry(client), settings.node.id, give_up_at)
        async with trio.open_nursery() as nursery:
            for lease in held:
                nursery.start_soon(release, *lease)
        release_ms = round((trio.current_time() - died_at) * 1000, 1)
        # A worker that exited by itself released its leases on the way out (a fatal error says
        # so in node-stopped); one that still held some, or was killed, died without releasing.
        if signame is not None or held:
            log.error(
                "worker-died",
                worker_pid=worker,
                signal=signame,
                exit_status=worker_status,
                leases_released=[f"{j}:{t}" for (j, t, _n), ok in outcomes.items() if ok],
                leases_not_held=[f"{j}:{t}" for (j, t, _n), ok in outcomes.items() if ok is False],
                leases_unreleased=[f"{j}:{t}" for (j, t, _n), ok in outcomes.items() if ok is None],
                release_ms=release_ms,
                left_registry=withdrawn,
            )
        return code
    finally:
        reports.close()
        if client is not None:
            client.close()
