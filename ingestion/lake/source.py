"""The lake source: contract events from a ledger-metadata data lake, as Stellar RPC serves them.

:class:`LakeSource` reads one object after another (:mod:`~ingestion.lake.store`: a directory or S3),
decodes each in a worker process (:mod:`~ingestion.lake.decoding`, running
:func:`~ingestion.lake.events.object_events`: zstd, XDR, the events with RPC's ids) and leaves
every decision to the I/O-free :class:`~ingestion.lake.follower.LakeFollower`. The ids, filters and
cursors are RPC's, so a lake job's stream is what an RPC job with the same filters would have
written, event for event (see ``events.py`` for the one divergence, ledgers before protocol 23).

Shape of ``stream(cursor)``: one pump task reads and decodes ``read_ahead`` objects ahead of the
consumer (on ``decode_processes`` worker processes, started with the stream and stopped with it:
no worker outlives the term), handed over in ledger order, and sends one batch per object (split
into commits of at most ``commit_max_records``). At the tip it polls for the next object every
``poll_interval`` seconds. A missing object with later ones present is a history gap
(``history-gap``, exit 1, nothing written); an object that cannot be read is one error line naming
the ledger and the object, and a stop: retrying cannot repair it.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Sequence

import attrs
import structlog
import trio

from actors.health import SourceHealth
from actors.source import Batch, SourceFatalError
from ingestion.common.gaps import record_history_gap
from ingestion.common.http import describe
from ingestion.common.network import SourceLook
from ingestion.common.retry import RetryPolicy
from ingestion.lake.decoding import DecoderDied, Decoders, open_decoders
from ingestion.lake.events import LakeFormatError, LedgerEvents
from ingestion.lake.follower import LakeFollower
from ingestion.lake.keys import LakeSchema, ManifestError
from ingestion.lake.store import LocalLake, S3Lake, open_lake
from ingestion.rpc.protocol import Cursor, EventFilter, checked_filters

log = structlog.get_logger()


@attrs.frozen
class LakeSource:
    """A :class:`~actors.source.Source` of a lake's contract events.

    Args:
        url: the lake (a directory, ``file://PATH`` or ``s3://BUCKET/PREFIX``).
        endpoint_url: an S3-compatible endpoint for an ``s3://`` URL ("": AWS).
        filters: up to 5 ``getEvents`` filters (OR-ed), RPC's semantics; none: every event.
        poll_interval: seconds between looks for the next object at the tip.
        read_ahead: objects read and decoded ahead of the consumer (1: one at a time); this
            bounds the memory (at most this many objects and their events are held).
        decode_processes: worker processes decoding objects (0: a thread of the node's process,
            which then decodes on the node's one core).
        commit_max_records: an object's events are committed in batches of at most this many.

    Raises:
        ValueError: a bad URL, filter or setting (a configuration error).
    """

    url: str
    filters: tuple[EventFilter, ...] = attrs.field(default=(), converter=checked_filters)
    endpoint_url: str = ""
    poll_interval: float = 1.0
    read_ahead: int = 4
    decode_processes: int = 1
    commit_max_records: int = 1000
    retry_base: float = 0.2
    retry_cap: float = 10.0
    health: SourceHealth = attrs.field(factory=SourceHealth, eq=False)
    lake: LocalLake | S3Lake = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "lake", open_lake(self.url, self.endpoint_url))
        if self.poll_interval <= 0 or self.read_ahead < 1 or self.decode_processes < 0:
            raise ValueError("poll_interval must be > 0, read_ahead >= 1 and decode_processes >= 0")

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(base=self.retry_base, cap=self.retry_cap)

    async def probe(self) -> bool:
        """Whether the lake can be read: its manifest is there and usable."""
        try:
            return await self.lake.schema() is not None
        except (OSError, ManifestError):
            return False

    async def network_looks(self, ledger: int | None) -> list[SourceLook]:
        """What the lake says of its network: its manifest's ``networkPassphrase`` (None when
        unreadable or empty). A lake is not reset in place, so neither its latest ledger nor a
        hash is read (ingestion/node/network.py judges only the passphrase)."""
        try:
            schema = await self.lake.schema()
        except (OSError, ManifestError):
            schema = None
        return [SourceLook(self.url, schema.network_passphrase or None if schema is not None else None)]

    async def _schema(self) -> LakeSchema:
        """The manifest, waiting (with backoff) while it is absent or unreadable; a manifest this
        reader cannot use is fatal."""
        attempt = 0
        while True:
            try:
                schema = await self.lake.schema()
                if schema is not None:
                    self.health.ok(trio.current_time())
                    return schema
                error = "no .config.json yet"
            except ManifestError as exc:
                log.error("lake-fatal", lake=self.url, error=str(exc))
                raise SourceFatalError(f"lake {self.url}: {exc}") from exc
            except OSError as exc:
                error = describe(exc)
            self.health.failed(trio.current_time())
            attempt += 1
            delay = self.policy.delay(attempt, random.random())
            log.warning("lake-retry", lake=self.url, attempt=attempt, delay=round(delay, 3), error=error)
            await trio.sleep(delay)

    async def resolve_start(self, cursor: str) -> str:
        """``"now"`` as the scanned-through cursor of the lake's newest ledger (``"0"`` for an
        empty lake); other cursors unchanged."""
        if cursor != "now":
            return cursor
        await self._schema()
        edges = await self.lake.edges()
        resolved = "0" if edges is None else str(Cursor.through(edges[1]))
        log.info(
            "lake-now-resolved", lake=self.url, latest_ledger=edges[1] if edges else None, cursor=resolved
        )
        return resolved

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        """Batches of events strictly after ``cursor`` (``"0"``, a ledger, an id or a
        scanned-through cursor), one object at a time. Runs until cancelled; raises
        SourceFatalError for a hole in the lake or an object that cannot be read."""
        try:
            follower = LakeFollower(self.filters, cursor, self.poll_interval)
        except ValueError as exc:
            raise SourceFatalError(str(exc)) from exc
        log.info("lake-follow", lake=self.url, cursor=cursor, filters=[f.to_json() for f in self.filters])
        fatal: list[SourceFatalError] = []
        send, receive = trio.open_memory_channel[Batch](1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, follower, send, fatal)
            with receive:
                async for batch in receive:
                    yield batch
        if fatal:
            raise fatal[0]

    async def _pump(
        self, follower: LakeFollower, send: trio.MemorySendChannel[Batch], fatal: list[SourceFatalError]
    ) -> None:
        with send:
            try:
                schema = await self._schema()
                await self._find_start(follower)
                async with open_decoders(self.decode_processes) as decoders:
                    await self._follow(schema, follower, send, decoders)
            except SourceFatalError as exc:
                fatal.append(exc)

    async def _find_start(self, follower: LakeFollower) -> None:
        while not follower.knows_start:
            edges = await self.lake.edges()
            if edges is not None:
                follower.skip_to(edges[0])
                log.info("lake-start-oldest", lake=self.url, oldest_ledger=edges[0])
                return
            await trio.sleep(self.poll_interval)

    async def _follow(
        self,
        schema: LakeSchema,
        follower: LakeFollower,
        send: trio.MemorySendChannel[Batch],
        decoders: Decoders,
    ) -> None:
        while True:
            missing = await self._run(schema, follower, send, decoders)
            await self._missing(schema, follower, missing)

    async def _run(
        self,
        schema: LakeSchema,
        follower: LakeFollower,
        send: trio.MemorySendChannel[Batch],
        decoders: Decoders,
    ) -> Decoded:
        """Objects from the needed ledger on until one is missing (returned). Up to
        ``read_ahead`` objects are read and decoding at once, handed over in ledger order through a
        chain of one-slot channels."""
        problem: SourceFatalError | None = None
        async with trio.open_nursery() as nursery:
            ahead = trio.Semaphore(self.read_ahead)
            results, ordered = trio.open_memory_channel[trio.MemoryReceiveChannel[Decoded]](self.read_ahead)
            nursery.start_soon(self._reader, schema, follower.needed, ahead, results, nursery, decoders)
            with ordered:
                async for slot in ordered:
                    with slot:
                        decoded = await slot.receive()
                    ahead.release()
                    if decoded.missing:
                        nursery.cancel_scope.cancel("the next object is missing")
                        return decoded
                    try:
                        batch = self._accept(follower, decoded)
                    except SourceFatalError as exc:  # raised outside the nursery: not in a group
                        problem = exc
                        nursery.cancel_scope.cancel("an object cannot be read")
                        break
                    if batch is not None:
                        for part in batch.split(self.commit_max_records):
                            await send.send(part)
        if problem is not None:
            raise problem
        raise AssertionError("the reader stopped without a missing object")  # pragma: no cover

    def _accept(self, follower: LakeFollower, decoded: Decoded) -> Batch | None:
        """A decoded object's batch, or SourceFatalError (logged) when it cannot be used."""
        where = {"ledger": decoded.ledger, "object": decoded.key, "lake": self.url}
        error = decoded.error
        if error is None:
            try:
                batch = follower.on_ledgers(decoded.ledgers)
            except ValueError as exc:
                error = str(exc)
            else:
                self.health.ok(trio.current_time())
                return batch
        log.error("lake-object-unreadable", **where, error=error)
        raise SourceFatalError(
            f"lake object {decoded.key} (ledger {decoded.ledger}) in {self.url} cannot be read: {error}"
        )

    async def _missing(self, schema: LakeSchema, follower: LakeFollower, decoded: Decoded) -> None:
        """The needed object is not there: wait for it at the tip, or stop on a hole."""
        while True:
            gap = follower.on_missing(await self.lake.newest())
            _, data = await self.lake.read_ledger(schema, follower.needed)
            if data is not None:
                return  # written meanwhile
            if gap is not None:
                fields = {
                    "cursor": gap.cursor, "cursor_ledger": gap.ledger, "elder_ledger": gap.ledger,
                    "latest_ledger": gap.latest, "object": decoded.key, "lake": self.url,
                }  # fmt: skip
                await record_history_gap(
                    fields,
                    on_history_gap="stop",
                    audit=None,
                    stop_message=(
                        f"history gap: the lake {self.url} has no object {decoded.key} for ledger "
                        f"{gap.ledger} but holds ledgers up to {gap.latest}; going on would silently "
                        "skip its events, so nothing was written. Restore the object (re-export the "
                        "range with Galexie)"
                    ),
                    resume={},
                )
            await trio.sleep(self.poll_interval)

    async def _reader(
        self,
        schema: LakeSchema,
        first: int,
        ahead: trio.Semaphore,
        results: trio.MemorySendChannel[trio.MemoryReceiveChannel[Decoded]],
        nursery: trio.Nursery,
        decoders: Decoders,
    ) -> None:
        """Start reading objects from ``first`` on, each into its own one-slot channel, sent in
        order; stops after the first missing object (the consumer decides what it means)."""
        ledger = first
        with results:
            while True:
                await ahead.acquire()
                slot_send, slot_receive = trio.open_memory_channel[Decoded](1)
                await results.send(slot_receive)
                key, data = await self._read(schema, ledger)
                if data is None:
                    with slot_send:
                        await slot_send.send(Decoded(ledger, key, missing=True))
                    return
                nursery.start_soon(self._decode, decoders, ledger, key, data, slot_send)
                ledger = schema.file_end(ledger) + 1

    async def _read(self, schema: LakeSchema, ledger: int) -> tuple[str, bytes | None]:
        attempt = 0
        while True:
            try:
                return await self.lake.read_ledger(schema, ledger)
            except OSError as exc:
                self.health.failed(trio.current_time())
                attempt += 1
                delay = self.policy.delay(attempt, random.random())
                log.warning("lake-retry", lake=self.url, ledger=ledger, attempt=attempt, error=describe(exc))
                await trio.sleep(delay)

    async def _decode(
        self,
        decoders: Decoders,
        ledger: int,
        key: str,
        data: bytes,
        slot: trio.MemorySendChannel[Decoded],
    ) -> None:
        with slot:
            try:
                ledgers = await decoders.decode(data)
                await slot.send(Decoded(ledger, key, ledgers=ledgers))
            except (LakeFormatError, DecoderDied) as exc:
                await slot.send(Decoded(ledger, key, error=str(exc)))


@attrs.frozen
class Decoded:
    """One object as the reader hands it over: its events, or why not."""

    ledger: int
    key: str
    ledgers: Sequence[LedgerEvents] = ()
    missing: bool = False
    error: str | None = None

