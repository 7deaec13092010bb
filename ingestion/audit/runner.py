"""The audit of a job's store against the data lake: the lake read again, in parallel, window by
window, and compared with the store's rows (the trio shell over :mod:`ingestion.audit.expect` and
:mod:`ingestion.audit.compare`).

Shape of :func:`audit_lake`: the ledgers ``first..last`` are cut into windows of ``window``
ledgers. In each window, up to ``in_flight`` lake objects are read (each in a worker thread, as the
lake source reads them) and turned into the job's expected records on ``processes`` decode worker
processes (:class:`~ingestion.lake.decoding.Decoders`, the lake source's own: a backfill's ranges
spread the same work over nodes, the audit over worker processes), while the store's rows of the
same ledgers are read in a thread beside them; then the window is compared and dropped
(:func:`audit_windows`, which an RPC's expectation goes through as well:
:mod:`ingestion.audit.from_rpc`). Memory is
bounded by one window's records (and, for a Redis stream store, the audited ledgers' rows: a stream
has no index by ledger). Every ledger of the window must be held by an object read: a lake with a
hole cannot prove anything about those ledgers, and the audit stops saying which (exit 1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from ingestion.audit.compare import Report, StoredRow, Tally, compare, merge
from ingestion.audit.expect import Expected, Rules, object_expectation, uncovered, windows
from ingestion.audit.seams import Seam, split
from ingestion.lake.decoding import DecoderDied, Decoders, open_decoders
from ingestion.lake.events import LakeFormatError
from ingestion.lake.keys import LakeSchema, ManifestError
from ingestion.lake.store import LocalLake, S3Lake

WINDOW = 64  # ledgers compared at a time (a busy pubnet ledger: ~500 events, ~1 MB of records)


class AuditError(Exception):
    """The audit could not be carried out (the lake or the store could not be read): the message
    says what, naming the ledger and the object when it is the lake's."""


class StoreRows(Protocol):
    jobs: list[str]

    def find_jobs(self) -> list[str]: ...

    def rows(self, first: int, last: int) -> list[StoredRow]: ...


class WatchList(Protocol):
    def matches(self, addresses: tuple[str, ...]) -> bool: ...


async def audit_lake(
    lake: LocalLake | S3Lake,
    rules: Rules,
    store: StoreRows,
    job: str,
    first: int,
    last: int,
    *,
    watched: WatchList | None = None,
    processes: int = 1,
    window: int = WINDOW,
    in_flight: int = 0,
    store_errors: tuple[type[Exception], ...] = (),
    on_window: Callable[[int, int, Tally], None] | None = None,
    decoders: Decoders | None = None,
    seam: Seam | None = None,
    start: str = "",
) -> Report:
    """``store``'s rows of ledgers ``first..last`` against the records ``rules`` (and ``watched``,
    the job's watch list) keep of ``lake``'s events (see the module docstring). ``in_flight``: lake
    objects read and decoding at once (0: twice ``processes``, at least 2). ``store_errors``: what
    the store's reads raise when it cannot be read. ``on_window(first, last, tally)`` after each
    window. ``decoders``: workers the caller keeps open (the audit job's, for its term); None:
    ``processes`` of them for this audit. ``seam``: the job's last cursor reset (its rows before
    it set aside, :mod:`ingestion.audit.seams`), ``start`` its ``start_cursor``.

    Raises:
        AuditError: the lake (a missing or unreadable object, no manifest) or the store cannot
            be read.
    """
    try:
        schema = await lake.schema()
    except (OSError, ManifestError) as exc:
        raise AuditError(f"the lake {lake} cannot be read: {exc}") from exc
    if schema is None:
        raise AuditError(f"the lake {lake} has no manifest (.config.json): not a lake, or not written yet")
    flight = in_flight or max(2, 2 * processes)
    if decoders is not None:
        expect = functools.partial(_lake_window, lake, schema, decoders, rules, flight)
        return await audit_windows(
            expect, store, job, first, last, watched=watched, window=window, store_errors=store_errors,
            on_window=on_window, seam=seam, start=start,
        )  # fmt: skip
    async with open_decoders(processes) as opened:
        return await audit_lake(
            lake, rules, store, job, first, last, watched=watched, processes=processes, window=window,
            in_flight=in_flight, store_errors=store_errors, on_window=on_window, decoders=opened,
            seam=seam, start=start,
        )  # fmt: skip


async def audit_windows(
    expect: Callable[[int, int], Awaitable[list[Expected]]],
    store: StoreRows,
    job: str,
    first: int,
    last: int,
    *,
    watched: WatchList | None = None,
    window: int = WINDOW,
    store_errors: tuple[type[Exception], ...] = (),
    on_window: Callable[[int, int, Tally], None] | None = None,
    source: str = "the lake",
    seam: Seam | None = None,
    start: str = "",
) -> Report:
    """``store``'s rows of ledgers ``first..last`` against what ``expect(first, last)`` (the
    lake's or an RPC's expectation) says the job keeps before ``watched``, window by window, each
    window's expectation and rows read side by side.

    Raises:
        AuditError: the source (raised by ``expect``) or the store cannot be read.
    """
    try:
        jobs = await trio.to_thread.run_sync(store.find_jobs)
    except store_errors as exc:
        raise AuditError(f"the store cannot be read: {exc}") from exc
    tallies = []
    for a, b in windows(first, last, window):
        expected, stored = await _side_by_side(expect, store, store_errors, a, b)
        kept = {i: text for i, text, names in expected if watched is None or watched.matches(names)}
        kept, stored, aside = split(seam, job, start, kept, stored)
        tally = attrs.evolve(await trio.to_thread.run_sync(compare, kept, stored), aside=aside)
        tallies.append(tally)
        if on_window is not None:
            on_window(a, b, tally)
    return merge(job, first, last, tallies, jobs, source, seam, start)


async def _side_by_side(
    expect: Callable[[int, int], Awaitable[list[Expected]]],
    store: StoreRows,
    store_errors: tuple[type[Exception], ...],
    first: int,
    last: int,
) -> tuple[list[Expected], list[StoredRow]]:
    """The expectation and the store's rows of ledgers ``first..last``, read at once."""
    expected: list[Expected] = []
    stored: list[StoredRow] = []
    problems: list[AuditError] = []

    async def read_store() -> None:
        try:
            stored.extend(await trio.to_thread.run_sync(store.rows, first, last, abandon_on_cancel=True))
        except store_errors as exc:
            problems.append(AuditError(f"the store cannot be read: {exc}"))
            nursery.cancel_scope.cancel("the store cannot be read")

    async def read_source() -> None:
        try:
            expected.extend(await expect(first, last))
        except AuditError as exc:
            problems.append(exc)
            nursery.cancel_scope.cancel("the source cannot be read")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_store)
        nursery.start_soon(read_source)
    if problems:
        raise problems[0]
    return expected, stored


async def _lake_window(
    lake: LocalLake | S3Lake,
    schema: LakeSchema,
    decoders: Decoders,
    rules: Rules,
    in_flight: int,
    first: int,
    last: int,
) -> list[Expected]:
    """The expected records of ledgers ``first..last``, up to ``in_flight`` objects at a time."""
    expected: list[Expected] = []
    held: list[int] = []
    problems: list[str] = []
    ahead = trio.Semaphore(in_flight)

    async def one(ledger: int) -> None:
        key = schema.object_key(ledger)
        try:
            key, data = await lake.read_ledger(schema, ledger)
            if data is None:
                return  # its ledgers stay uncovered: said below, with the object's key
            ledgers, events = await decoders.run(object_expectation, data, rules, first, last)
            held.extend(ledgers)
            expected.extend(events)
        except (OSError, LakeFormatError, DecoderDied) as exc:
            problems.append(f"the lake object {key} (ledger {ledger}) in {lake} cannot be read: {exc}")
            nursery.cancel_scope.cancel("the lake cannot be read")
        finally:
            ahead.release()

    async with trio.open_nursery() as nursery:
        ledger = schema.file_start(first)
        while ledger <= last:
            await ahead.acquire()
            nursery.start_soon(one, ledger)
            ledger = schema.file_end(ledger) + 1
    if problems:
        raise AuditError(problems[0])
    lacking = uncovered(first, last, held)
    if lacking:
        keys = sorted({schema.object_key(n) for n in lacking[:3]})
        raise AuditError(
            f"the lake {lake} lacks ledgers {_spans(lacking)} (no object {', '.join(keys)}): "
            "nothing can be said of their records; restore the objects (re-export them with Galexie)"
        )
    return expected


def _spans(ledgers: Sequence[int]) -> str:
    """``[5, 6, 7, 9]`` as ``"5..7, 9"``."""
    out: list[str] = []
    start = previous = -math.inf
    for n in [*ledgers, math.inf]:
        if n != previous + 1:
            if start != -math.inf:
                out.append(f"{int(start)}" if start == previous else f"{int(start)}..{int(previous)}")
            start = n
        previous = n
    return ", ".join(out)
