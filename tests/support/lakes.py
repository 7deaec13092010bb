"""Temporary lakes for tests, built from the real ledger metadata in ``../shared/data/lake`` (read
through :mod:`ingestion.testing.recorded`, never copied into the project) or from XDR made in the test."""

from __future__ import annotations

import functools
import gzip
from collections.abc import Sequence
from pathlib import Path

import zstandard
from stellar_sdk import xdr

from ingestion.lake.events import decompress, ledger_events, record_frames
from ingestion.lake.keys import LakeSchema
from ingestion.lake.source import LakeSource
from ingestion.rpc.protocol import Cursor
from ingestion.testing import recorded
from ingestion.testing.lakes import resequencer, write_ledgers

STANDALONE = "galexie_load-test-ledgers-v23-standalone.xdr.zstd"  # ledgers 84, 85, 88


def real_ledger(name: str) -> xdr.LedgerCloseMeta:
    """One ``LedgerCloseMeta`` from a ``wallet-backend_ledger-N.xdr.gz`` file."""
    return xdr.LedgerCloseMeta.from_xdr_bytes(gzip.decompress(recorded.require_lake(name).read_bytes()))


@functools.cache
def _standalone() -> tuple[xdr.LedgerCloseMeta, ...]:
    raw = decompress(recorded.require_lake(STANDALONE).read_bytes())
    return tuple(xdr.LedgerCloseMeta.from_xdr_bytes(f) for f in record_frames(raw))


def standalone_ledgers() -> list[xdr.LedgerCloseMeta]:
    """Ledgers 84, 85 and 88 of a standalone network's load test (decoded once per session)."""
    return list(_standalone())


def ledger_seq(meta: xdr.LedgerCloseMeta) -> int:
    body = meta.v0 or meta.v1 or meta.v2
    return int(body.ledger_header.header.ledger_seq.uint32)


def batch_bytes(metas: Sequence[xdr.LedgerCloseMeta]) -> bytes:
    """A zstd-compressed ``LedgerCloseMetaBatch`` of consecutive ledgers."""
    seqs = [ledger_seq(m) for m in metas]
    batch = xdr.LedgerCloseMetaBatch(xdr.Uint32(seqs[0]), xdr.Uint32(seqs[-1]), list(metas))
    return zstandard.ZstdCompressor().compress(batch.to_xdr_bytes())


def write_lake(
    root: Path, metas: Sequence[xdr.LedgerCloseMeta], schema: LakeSchema | None = None
) -> LakeSchema:
    """A lake at ``root`` holding ``metas`` (ledgers per file from ``schema``; ledgers absent from
    ``metas`` are absent from the lake)."""
    schema = schema or LakeSchema(1, 64_000)
    root.mkdir(parents=True, exist_ok=True)
    (root / ".config.json").write_bytes(schema.to_manifest())
    by_file: dict[int, list[xdr.LedgerCloseMeta]] = {}
    for meta in metas:
        by_file.setdefault(schema.file_start(ledger_seq(meta)), []).append(meta)
    for start, group in by_file.items():
        path = root / schema.object_key(start)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(batch_bytes(group))
    return schema


def resequenced(meta: xdr.LedgerCloseMeta, seq: int) -> xdr.LedgerCloseMeta:
    """A copy of ``meta`` claiming to be ledger ``seq`` (its events then carry ``seq``'s ids): a
    long lake of real events from one real ledger."""
    copy = xdr.LedgerCloseMeta.from_xdr_bytes(meta.to_xdr_bytes())
    body = copy.v0 or copy.v1 or copy.v2
    body.ledger_header.header.ledger_seq = xdr.Uint32(seq)
    return copy


REAL_LEDGERS = (
    "wallet-backend_ledger-51000294.xdr.gz",
    "wallet-backend_ledger-57500008.xdr.gz",
    "wallet-backend_ledger-63092988.xdr.gz",
    "wallet-backend_ledger-63092990.xdr.gz",
)
REAL_OBJECT = "go_compressxdr_FCD285FF--53312000.xdr.zstd"  # a one-ledger batch, ledger 53312000


def every_real_ledger() -> list[xdr.LedgerCloseMeta]:
    """Every real ledger of ``../shared/data/lake``: the four pubnet ones, the real object's and
    the three standalone ones (LCM V1 and V2, TransactionMeta V3 and V4)."""
    metas = [real_ledger(name) for name in REAL_LEDGERS]
    raw = decompress(recorded.require_lake(REAL_OBJECT).read_bytes())
    metas += xdr.LedgerCloseMetaBatch.from_xdr_bytes(raw).ledger_close_metas
    return metas + standalone_ledgers()


def _envelopes(tx_set: xdr.GeneralizedTransactionSet) -> list[xdr.TransactionEnvelope]:
    out: list[xdr.TransactionEnvelope] = []
    for phase in tx_set.v1_tx_set.phases:
        if phase.v == 0:
            for component in phase.v0_components:
                out += component.txs_maybe_discounted_fee.txs
        else:
            for stage in phase.parallel_txs_component.execution_stages:
                for cluster in stage.parallel_tx_execution_stage:
                    out += cluster.dependent_tx_cluster
    return out


def _older_meta(meta: xdr.TransactionMeta, version: int) -> xdr.TransactionMeta:
    """``meta`` (V3 or V4) as TransactionMeta ``version`` (0-3; 4 keeps a V4): the same changes;
    a V3 made from a V4 carries its operations' events as Soroban events."""
    if version == meta.v:
        return meta
    body = meta.v3 or meta.v4
    if meta.v == 4:
        operations = [xdr.OperationMeta(op.changes) for op in body.operations]
        events = [event for op in body.operations for event in op.events]
        value = body.soroban_meta.return_value if body.soroban_meta else None
        soroban = xdr.SorobanTransactionMeta(
            xdr.SorobanTransactionMetaExt(0),
            events,
            value or xdr.SCVal(xdr.SCValType.SCV_VOID),
            body.diagnostic_events,
        )
    else:
        operations, soroban = body.operations, body.soroban_meta
    before, after = body.tx_changes_before, body.tx_changes_after
    if version == 0:
        return xdr.TransactionMeta(0, operations=operations)
    if version == 1:
        return xdr.TransactionMeta(1, v1=xdr.TransactionMetaV1(before, operations))
    if version == 2:
        return xdr.TransactionMeta(2, v2=xdr.TransactionMetaV2(before, operations, after))
    v3 = xdr.TransactionMetaV3(xdr.ExtensionPoint(0), before, operations, after, soroban)
    return xdr.TransactionMeta(3, v3=v3)


def older_versions(meta: xdr.LedgerCloseMeta, as_v0: bool = True) -> xdr.LedgerCloseMeta:
    """A real V1 or V2 ``meta`` rewritten with every older version: transaction ``i``'s meta is
    TransactionMeta V(``i`` mod 5) (V0, V1, V2 without events, V3 with Soroban events, V4 or V3
    as it was) and, with ``as_v0``, the ledger a ``LedgerCloseMeta`` V0 (a classic
    ``TransactionSet``, ``TransactionResultMeta`` without the V1 extension)."""
    copy = xdr.LedgerCloseMeta.from_xdr_bytes(meta.to_xdr_bytes())
    body = copy.v1 or copy.v2
    for index, processing in enumerate(body.tx_processing, 1):
        processing.tx_apply_processing = _older_meta(processing.tx_apply_processing, index % 5)
    if not as_v0:
        return copy
    processing = [
        xdr.TransactionResultMeta(p.result, p.fee_processing, p.tx_apply_processing)
        for p in body.tx_processing
    ]
    tx_set = xdr.TransactionSet(body.tx_set.v1_tx_set.previous_ledger_hash, _envelopes(body.tx_set))
    v0 = xdr.LedgerCloseMetaV0(
        body.ledger_header, tx_set, processing, body.upgrades_processing, body.scp_info
    )
    return xdr.LedgerCloseMeta(0, v0=v0)


async def ids_until(source: LakeSource, last: int) -> list[str]:
    """The event ids ``source`` streams from the start through ledger ``last``."""
    ids = []
    async with source.stream("0") as batches:
        async for batch in batches:
            ids.extend(r.paging_token for r in batch.records)
            if batch.through == str(Cursor.through(last)):
                break
    return ids


def large_answer(data: bytes) -> list[bytes]:
    """Stands in for ``object_events`` in a decode worker (tests of cancelled decodes): a 64 MB
    answer, whose pickling and sending take a while; ``data`` is the path of a file written just
    before it is returned, so the caller knows when the sending begins."""
    answer = b"x" * (64 << 20)
    Path(data.decode()).write_text("sending")
    return [answer]


async def cancel_decodes_while_answering(fractions: Sequence[float]) -> None:
    """Run in a process of its own (the test watches it exit): one decode worker answering
    :func:`large_answer`, timed whole once, then cancelled at each fraction of that time after its
    answer began, each in a fresh :func:`~ingestion.lake.decoding.open_decoders`. Prints whether it
    was cancelled, and how many worker processes are alive right after the cancel and the exit."""
    import multiprocessing
    import tempfile

    import trio

    from ingestion.lake import decoding
    from ingestion.testing.wait import wait_until

    decoding.object_events = large_answer  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / "sending"

        async def answer_began() -> float:
            await wait_until(marker.exists, 30, what="the answer to begin", every=0.001)
            return trio.current_time()

        async with decoding.open_decoders(1) as decoders:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(decoders.decode, str(marker).encode())
                began = await answer_began()
            whole = trio.current_time() - began
        print(f"an answer takes {whole:.3f} s", flush=True)
        for fraction in fractions:
            marker.unlink()
            answered: list[object] = []

            async def decode(decoders: decoding.Decoders, answered: list[object] = answered) -> None:
                answered.append(await decoders.decode(str(marker).encode()))

            async with decoding.open_decoders(1) as decoders:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(decode, decoders)
                    await answer_began()
                    await trio.sleep(fraction * whole)
                    nursery.cancel_scope.cancel()
                alive = len(multiprocessing.active_children())
            left = len(multiprocessing.active_children())
            what = "answered before the cancel" if answered else "cancelled"
            print(f"at {fraction:.1f}: {what}, {alive} workers alive then, {left} after the exit", flush=True)
    print("done", flush=True)


def answer_late(data: bytes) -> list[bytes]:
    """Stands in for ``object_events`` in a decode worker: writes the worker's pid to the file
    named by ``data``, then takes a minute."""
    import os
    import time

    Path(data.decode()).write_text(str(os.getpid()))
    time.sleep(60)
    return []


async def decode_forever(marker: str) -> None:
    """Run in a process of its own, which the test kills: one decode worker busy with
    :func:`answer_late` (its pid written to ``marker``)."""
    from ingestion.lake import decoding

    decoding.object_events = answer_late  # type: ignore[assignment]
    async with decoding.open_decoders(1) as decoders:
        await decoders.decode(marker.encode())


def die_once(data: bytes) -> list[bytes]:
    """Stands in for ``object_events`` in a decode worker: the first call (no file at the path
    ``data`` names yet) creates that file and SIGKILLs its own worker; later calls answer []."""
    import os
    import signal

    marker = Path(data.decode())
    if not marker.exists():
        marker.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return []


def die_always(_data: bytes) -> list[bytes]:
    """Stands in for ``object_events`` in a decode worker: SIGKILLs its own worker."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return []


def backfill_config(path: Path, job: str, lake: Path, sink: str = "", start: int = 128) -> Path:
    """A config.toml of one lake job ``job`` on the lake at ``lake``, started at ledger ``start``."""
    path.write_text(
        f'[node]\nsource = "lake"\n\n[lake]\nurl = "file://{lake}"\n\n'
        f'[jobs."{job}"]\nkind = "lake"\nstart_cursor = "{start}"\ntopics = ["**"]\n'
        + (f'sink = "{sink}"\n' if sink else "")
    )
    return path


def long_lake(root: Path, last: int) -> list[str]:
    """A lake of ledgers 84..``last``: the real 84 and 85, then 85 again under each later number
    (1,000 events each); its events' ids in order."""
    real = {ledger_seq(m): m for m in standalone_ledgers()}
    template = real[85].to_xdr_bytes()
    copy = resequencer(template)
    write_ledgers(root, [(84, real[84].to_xdr_bytes()), (85, template)]
                  + [(seq, copy(seq)) for seq in range(86, last + 1)])  # fmt: skip
    ids_85 = [Cursor.parse(e.id) for e in ledger_events(real[85]).events]
    return [e.id for seq in (84, 85) for e in ledger_events(real[seq]).events] + [
        str(Cursor(seq, c.tx, c.op, c.event)) for seq in range(86, last + 1) for c in ids_85
    ]
