"""Temporary lakes for tests, built from the real ledger metadata in ``../shared/data/lake`` (read
through :mod:`tests.recorded`, never copied into the project) or from XDR made in the test."""

from __future__ import annotations

import functools
import gzip
from collections.abc import Sequence
from pathlib import Path

import zstandard
from stellar_sdk import xdr

from ingestion.lake.events import decompress, record_frames
from ingestion.lake.keys import LakeSchema
from tests import recorded

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
