"""The simulator process-in-a-task: the chain, the ledger clock, and hypercorn serving the apps.

:func:`serve_simulator` runs until cancelled and hands a :class:`Simulator` to ``task_status`` once
the listeners are really up; :func:`open_simulator` wraps it as an async context manager. Horizon
(:mod:`ingestion.simulator.app`) listens on ``port``; with ``rpc_port`` set, a Stellar RPC server
(:mod:`ingestion.simulator.rpc`) listens on a port of its own, over the same chain. With
``lake_dir`` set, the chain is also written into a data lake (:mod:`ingestion.simulator.lake`).
"""

from __future__ import annotations

import collections
import gc
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from ingestion.rpc.protocol import EventFilter
from ingestion.simulator.app import CollectionQuery, HorizonApp, SeenRequest, resolve
from ingestion.simulator.chain import Chain
from ingestion.simulator.faults import Faults, RpcFaults
from ingestion.simulator.lake import SCHEMA, LakeWriter, ledger_close_meta, object_bytes
from ingestion.simulator.records import KEY_SHIFT, NETWORK_PASSPHRASE, ChainSpec
from ingestion.simulator.render import compact_form, with_base
from ingestion.simulator.rpc import RpcApp, SeenRpcRequest
from ingestion.simulator.rpc_events import EventLog


@attrs.frozen
class SimulatorConfig:
    """How to run a simulator. Built from CLI flags by :mod:`ingestion.cli.simulate`.

    Attributes:
        host, port: where to listen; port 0 picks a free port (kept across restarts).
        seed: the chain's content is a function of the seed (and the ledger sequence) only.
        ledger_interval: seconds between ledger closes; 0 or None: no live ledgers (close them
            with :meth:`Simulator.close_ledger` or ``POST /_simulator/ledgers``).
        ops_per_ledger: operations in each ledger (0 to 4000), in transactions of 1 to 5.
        history_ledgers: ledgers already closed at start (at least 1).
        stream_timeout: seconds after which a stream ends with byebye (Horizon's 55 s).
        first_ledger: sequence of the oldest ledger (realistic default: TOIDs above 2**53).
        cache_records: about how many built records (with their rendered forms) to keep in
            memory; a benchmark that pages through a long history more than once raises it so
            that every pass after the first is served from memory.
        response_delay_ms: every Horizon response (a page, a stream's first bytes) is delayed
            this long, sleeping (no CPU): a real Horizon's query time and network.
        retention_ledgers: keep only the newest N ledgers (Horizon's history retention); the
            elder ledger moves up as ledgers close. 0: keep everything.
        rate_limit, rate_burst: Horizon's per-client limiter (GCRA): ``rate_limit`` requests an
            hour in bursts of ``rate_burst + 1``, 429 with Horizon's headers and problem beyond,
            and an ``event: error`` on a stream that runs out. 0: no limit (no headers).
        sse_update_frequency: seconds between a stream's polls for new ledgers, as Horizon's
            ``--sse-update-frequency`` (Horizon: 5); 0: woken at once when a ledger closes.
        rpc_port: where the Stellar RPC server listens (on ``host``); 0 picks a free port;
            None: no RPC server. ``response_delay_ms`` delays its answers too.
        rpc_retention_ledgers: the RPC serves only the newest N ledgers (stellar-rpc's
            ``HISTORY_RETENTION_WINDOW``, 7 days by default), whatever Horizon keeps; older ones
            are outside its range (``startLedger must be within the ledger range``). 0: what the
            chain holds.
        rpc_max_healthy_latency: ``getHealth`` fails once the latest ledger closed longer ago
            than this many seconds (stellar-rpc's default: 30); 0: always healthy.
        lake_dir: also write the chain into a data lake in this directory (SEP-54, see
            :mod:`ingestion.simulator.lake`): every ledger from the first, retention or not,
            then each ledger as it closes. None: no lake.
        network_passphrase: the network's passphrase, as Horizon's root, RPC's ``getNetwork`` and
            the lake's manifest say it.
    """

    host: str = "127.0.0.1"
    port: int = 0
    seed: int = 1
    ledger_interval: float | None = 5.0
    ops_per_ledger: int = 20
    history_ledgers: int = 100
    stream_timeout: float = 55.0
    first_ledger: int = 50_000_000
    cache_records: int = 60_000
    response_delay_ms: int = 0
    retention_ledgers: int = 0
    rate_limit: int = 0
    rate_burst: int = 100
    sse_update_frequency: float = 0.0
    rpc_port: int | None = None
    rpc_max_healthy_latency: float = 30.0
    rpc_retention_ledgers: int = 0
    lake_dir: str | None = None
    network_passphrase: str = NETWORK_PASSPHRASE

    def chain_spec(self) -> ChainSpec:
        return ChainSpec(
            seed=self.seed, ops_per_ledger=self.ops_per_ledger, first_ledger=self.first_ledger
        )


class Simulator:
    """A running simulator. Made by :func:`serve_simulator`; use it only from trio tasks.

    Attributes:
        url: ``http://host:port``, fixed for the simulator's life (restarts reuse the port).
        chain: the :class:`Chain`; ``chain.latest`` is the latest closed ledger.
        faults: the :class:`Faults` knobs.
        active_streams: how many SSE responses are open right now.
        requests, statuses: the latest Horizon requests received and a count of the statuses
            answered (for tests).
        rpc_url: ``http://host:rpc_port`` of the Stellar RPC server, "" when there is none.
        rpc_faults: the RPC server's :class:`RpcFaults` knobs (:meth:`rpc_go_down` and
            :meth:`rpc_come_up` stop and restart its listener, on the same port).
        rpc_requests, rpc_statuses, rpc_errors: the latest RPC requests received, a count of
            the HTTP statuses answered and one of the JSON-RPC error codes (for tests).
        config: the :class:`SimulatorConfig`.
    """

    def __init__(self, config: SimulatorConfig, nursery: trio.Nursery):
        self.config = config
        self.chain = _build_without_gc(
            lambda: Chain(
                config.chain_spec(),
                config.history_ledgers,
                config.cache_records,
                retention_ledgers=config.retention_ledgers,
            )
        )
        self.faults = Faults(clock=trio.current_time)
        self._core_latest = 0
        self.url = ""
        self.active_streams = 0  # open SSE responses, for tests and status
        #: The latest Horizon requests received (not the control endpoint), oldest first.
        self.requests: collections.deque[SeenRequest] = collections.deque(maxlen=10_000)
        #: How many Horizon responses went out with each status (a stream counts once, as 200).
        self.statuses: collections.Counter[int] = collections.Counter()
        self.rpc_url = ""
        self.rpc_faults = RpcFaults(clock=trio.current_time)
        #: The chain's contract events by ledger (built on demand, an LRU of their own).
        self.rpc_log = EventLog(self.chain)
        #: The latest RPC requests received (not the control endpoint), oldest first.
        self.rpc_requests: collections.deque[SeenRpcRequest] = collections.deque(maxlen=10_000)
        #: How many RPC responses went out with each HTTP status.
        self.rpc_statuses: collections.Counter[int] = collections.Counter()
        #: JSON-RPC requests received, by method ("" for a body that was not a request).
        self.rpc_methods: collections.Counter[str] = collections.Counter()
        #: How many JSON-RPC errors went out with each code.
        self.rpc_errors: collections.Counter[int] = collections.Counter()
        self._nursery = nursery
        self._app = HorizonApp(self)
        self._rpc_app = RpcApp(self)
        self._port = config.port
        self._ledger_closed = trio.Event()
        self._shutdown: trio.Event | None = None
        self._stopped: trio.Event | None = None
        self._restart_scope: trio.CancelScope | None = None
        self._rpc_port = config.rpc_port
        self._rpc_shutdown: trio.Event | None = None
        self._rpc_stopped: trio.Event | None = None
        #: The lake writer (None without ``lake_dir``); ``lake.written`` is the newest ledger written.
        self.lake = (
            LakeWriter(
                Path(config.lake_dir), attrs.evolve(SCHEMA, network_passphrase=config.network_passphrase)
            )
            if config.lake_dir
            else None
        )
        self._lake_history_last = self.chain.latest
        self._lake_pending: collections.deque[tuple[int, bytes]] = collections.deque()
        self._lake_wakeup = trio.Event()
        self._lake_wrote = trio.Event()

    # -- the chain ------------------------------------------------------------------------------

    def close_ledger(self) -> int:
        """Close one ledger now (wakes streams waiting for it); returns its sequence.

        While ingestion is frozen (``faults.freeze_ingestion``) only stellar-core's ledger
        (:attr:`core_latest`) moves; the ledgers closed meanwhile reach history at the first close
        after the freeze ends.
        """
        self._core_latest = max(self._core_latest, self.chain.latest) + 1
        if self.faults.ingestion_frozen():
            return self.chain.latest
        while self.chain.latest < self._core_latest:
            seq = _build_without_gc(self.chain.close_ledger)
            if self.lake is not None:  # built now: the ledger may leave the chain's retention later
                self._lake_pending.append((seq, object_bytes([ledger_close_meta(self.chain, seq)])))
                self._lake_wakeup.set()
        self._ledger_closed.set()
        self._ledger_closed = trio.Event()
        return self.chain.latest

    def reset_network(self, seed: int | None = None) -> int:
        """A network reset (as testnet's and futurenet's): the chain starts again at ledger 1,
        with the same passphrase and new hashes (``seed``, default the current one + 1), its first
        ledger closing now (after the old chain's last); returns its latest ledger (1). Open
        streams end at their timeout; a lake is not reset."""
        old = self.chain
        spec = attrs.evolve(
            old.spec, seed=old.spec.seed + 1 if seed is None else seed, first_ledger=1,
            genesis_time=max(int(time.time()), old.closed_at(old.latest) + 1),
        )  # fmt: skip
        config = self.config
        self.chain = _build_without_gc(
            lambda: Chain(spec, 1, config.cache_records, retention_ledgers=config.retention_ledgers)
        )
        self.rpc_log = EventLog(self.chain)
        self._core_latest = self.chain.latest
        self._ledger_closed.set()
        self._ledger_closed = trio.Event()
        return self.chain.latest

    @property
    def core_latest(self) -> int:
        """stellar-core's latest ledger: ahead of ``chain.latest`` while ingestion is frozen."""
        return max(self._core_latest, self.chain.latest)

    async def wait_for_ledger(self, seen: int) -> None:
        """Return once a ledger after ``seen`` has closed."""
        while self.chain.latest <= seen:
            await self._ledger_closed.wait()

    async def wait_for_lake(self, seq: int) -> None:
        """Return once the lake holds ledger ``seq`` (needs ``lake_dir``)."""
        assert self.lake is not None, "no lake_dir: the simulator writes no lake"
        while self.lake.written < seq:
            await self._lake_wrote.wait()

    def records(self, resource: str) -> list[dict[str, Any]]:
        """Every record of a collection path, ascending, exactly as the server sends them.

        ``resource`` is a Horizon collection path: ``/operations``, ``/effects``,
        ``/accounts/G.../payments``, ``/ledgers/123/transactions`` and so on.

        Raises:
            ValueError: not a collection path.
        """
        query = resolve(resource, self.chain)
        if not isinstance(query, CollectionQuery):
            raise ValueError(f"not a Horizon collection path: {resource!r}")
        out: list[dict[str, Any]] = []
        after: int | None = None
        base = self.url.encode()
        while True:
            keys = self.chain.page(
                query.collection,
                after=after,
                descending=False,
                limit=1000,
                low=query.low,
                high=query.high,
                account=query.account,
                entity=query.entity,
            )
            if not keys:
                return out
            for key in keys:
                compact = compact_form(self.chain.content(key >> (KEY_SHIFT + 32)), key)
                out.append(json.loads(with_base(compact, base)))
            after = keys[-1]

    def rpc_events(self, filters: tuple[EventFilter, ...] | list[EventFilter] = ()) -> list[dict[str, Any]]:
        """Every event of the RPC's ledger range (oldest retained to latest) that matches
        ``filters``, ascending, exactly as ``getEvents`` serves them (base64 format)."""
        return self._rpc_app.events(tuple(filters))

    # -- the HTTP server ------------------------------------------------------------------------

    @property
    def is_up(self) -> bool:
        return self._stopped is not None and not self._stopped.is_set()

    async def go_down(self, seconds: float | None = None) -> None:
        """Stop listening and drop every connection; return once down.

        The chain and the ledger clock keep going. After ``seconds`` (None: only on
        :meth:`come_up`) the server listens again on the same port.
        """
        if self._restart_scope is not None:
            self._restart_scope.cancel("superseded by go_down")
            self._restart_scope = None
        if self.is_up:
            assert self._shutdown is not None and self._stopped is not None
            self._shutdown.set()
            await self._stopped.wait()
        if seconds is not None:
            self._nursery.start_soon(self._come_up_later, seconds)

    def schedule_down(self, seconds: float) -> None:
        """Go down for ``seconds`` from a task of our own (used by the control endpoint)."""
        self._nursery.start_soon(self.go_down, seconds)

    async def come_up(self) -> None:
        """Listen again (same host, port and chain); return once listening. No-op when up."""
        if self._restart_scope is not None:
            self._restart_scope.cancel("superseded by come_up")
            self._restart_scope = None
        if not self.is_up:
            await self._nursery.start(self._serve)

    async def restart(self) -> None:
        """Drop every connection and listen again at once."""
        await self.go_down()
        await self.come_up()

    async def _come_up_later(self, seconds: float) -> None:
        with trio.CancelScope() as scope:
            self._restart_scope = scope
            await trio.sleep(seconds)
            self._restart_scope = None
            await self.come_up()

    async def _serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = _hypercorn_config(self.config.host, self._port)
        shutdown, stopped = trio.Event(), trio.Event()
        self._shutdown, self._stopped = shutdown, stopped
        try:

            async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(
                    cast(Any, self._app),
                    config,
                    shutdown_trigger=shutdown.wait,
                    task_status=task_status,
                )

            async with trio.open_nursery() as nursery:
                binds: list[str] = await nursery.start(run)
                url = binds[0]
                self._port = int(url.rsplit(":", 1)[1])
                self.url = url
                task_status.started()
        finally:
            stopped.set()

    @property
    def rpc_is_up(self) -> bool:
        return self._rpc_stopped is not None and not self._rpc_stopped.is_set()

    async def rpc_go_down(self) -> None:
        """Stop the RPC listener (connections refused; Horizon and the chain go on); return once
        down. :meth:`rpc_come_up` listens again on the same port."""
        if self.rpc_is_up:
            assert self._rpc_shutdown is not None and self._rpc_stopped is not None
            self._rpc_shutdown.set()
            await self._rpc_stopped.wait()

    async def rpc_come_up(self) -> None:
        """Listen for RPC again (same port); return once listening. No-op when up or when the
        simulator runs no RPC server."""
        if self.config.rpc_port is not None and not self.rpc_is_up:
            await self._nursery.start(self._serve_rpc)

    async def _serve_rpc(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The Stellar RPC listener; Horizon's downtime knobs leave it alone (another service)."""
        assert self._rpc_port is not None
        config = _hypercorn_config(self.config.host, self._rpc_port)
        shutdown, stopped = trio.Event(), trio.Event()
        self._rpc_shutdown, self._rpc_stopped = shutdown, stopped
        try:

            async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(
                    cast(Any, self._rpc_app), config, shutdown_trigger=shutdown.wait, task_status=task_status
                )

            async with trio.open_nursery() as nursery:
                binds: list[str] = await nursery.start(run)
                self.rpc_url = binds[0]
                self._rpc_port = int(self.rpc_url.rsplit(":", 1)[1])  # port 0: keep the one picked
                task_status.started()
        finally:
            stopped.set()

    async def _write_lake(self, lake: LakeWriter) -> None:
        """The history (from the first ledger, built from a chain of its own in worker threads,
        100 ledgers at a time), then each closed ledger as it comes, in order."""
        spec = self.config.chain_spec()
        history = Chain(spec, self._lake_history_last - spec.first_ledger + 1, cache_records=4_000)
        for first in range(spec.first_ledger, self._lake_history_last + 1, 100):
            last = min(first + 99, self._lake_history_last)
            await trio.to_thread.run_sync(lake.write_history, history, first, last)
            self._lake_wrote.set()
            self._lake_wrote = trio.Event()
        while True:
            while self._lake_pending:
                seq, data = self._lake_pending.popleft()
                await trio.to_thread.run_sync(lake.write, seq, data)
                self._lake_wrote.set()
                self._lake_wrote = trio.Event()
            await self._lake_wakeup.wait()
            self._lake_wakeup = trio.Event()

    async def _close_ledgers(self, interval: float) -> None:
        start = trio.current_time()
        k = 1
        while True:
            await trio.sleep_until(start + k * interval)  # no drift: the trio-util way
            self.close_ledger()
            k += 1


def _hypercorn_config(host: str, port: int) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.graceful_timeout = 0.0  # going down drops streams at once, as a crash would
    config.include_server_header = False
    config.loglevel = "WARNING"
    config.accesslog = None
    return config


def _build_without_gc(build: Callable[[], Any]) -> Any:
    # Records hold no reference cycles; the cyclic GC would only re-scan the cache while building.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return build()
    finally:
        if was_enabled:
            gc.enable()


async def serve_simulator(
    config: SimulatorConfig,
    *,
    task_status: trio.TaskStatus[Simulator] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a simulator until cancelled.

    Builds the chain (``history_ledgers`` closed ledgers), starts listening, then calls
    ``task_status.started(simulator)``; ledgers then close every ``ledger_interval`` seconds.
    Cancel the enclosing scope to stop it: the listener closes and open streams are dropped.

    Raises:
        OSError: the address cannot be bound.
        ValueError: a bad setting (for example ``ops_per_ledger`` out of range).
    """
    async with trio.open_nursery() as nursery:
        sim = Simulator(config, nursery)
        await nursery.start(sim._serve)
        if config.rpc_port is not None:
            await nursery.start(sim._serve_rpc)
        if sim.lake is not None:
            nursery.start_soon(sim._write_lake, sim.lake)
        if config.ledger_interval:
            nursery.start_soon(sim._close_ledgers, config.ledger_interval)
        task_status.started(sim)
        await trio.sleep_forever()  # keep the nursery open while the server is down


@asynccontextmanager
async def open_simulator(config: SimulatorConfig | None = None) -> AsyncIterator[Simulator]:
    """``async with open_simulator(cfg) as sim:`` runs a simulator for the block, then stops it."""
    async with trio.open_nursery() as nursery:
        sim: Simulator = await nursery.start(serve_simulator, config or SimulatorConfig())
        try:
            yield sim
        finally:
            nursery.cancel_scope.cancel("simulator closed")
