"""Long lakes of real ledgers, fast: one real ``LedgerCloseMeta`` written again under many ledger
numbers by patching the header's sequence in its XDR bytes (found once, by re-encoding the
ledger with another sequence and comparing), not by decoding and encoding each copy. A copy's
events are the real ledger's with that ledger's ids (the ids derive from the ledger number)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import zstandard
from stellar_sdk import xdr

from ingestion.lake.keys import LakeSchema


def resequencer(raw: bytes) -> Callable[[int], bytes]:
    """For the XDR of a ``LedgerCloseMeta``: a function giving the same ledger's XDR claiming to
    be ledger ``seq``."""
    meta = xdr.LedgerCloseMeta.from_xdr_bytes(raw)
    body = meta.v0 or meta.v1 or meta.v2
    assert body is not None
    seq = body.ledger_header.header.ledger_seq.uint32
    body.ledger_header.header.ledger_seq = xdr.Uint32(seq ^ 0x5A5A5A5A)
    moved = meta.to_xdr_bytes()
    changed = [i for i in range(len(raw)) if raw[i] != moved[i]]
    if len(raw) != len(moved) or not changed or changed[-1] - changed[0] > 3:
        raise ValueError("the ledger sequence is not one 4-byte field of this XDR")
    at = changed[-1] - 3
    if struct.unpack(">I", raw[at : at + 4])[0] != seq:
        raise ValueError("the ledger sequence was not found in this XDR")
    return lambda new: raw[:at] + struct.pack(">I", new) + raw[at + 4 :]


def write_ledgers(root: Path, ledgers: Iterable[tuple[int, bytes]]) -> LakeSchema:
    """A lake at ``root`` of one ledger an object: ``(seq, LedgerCloseMeta XDR)`` each, as
    Galexie writes them (a zstd ``LedgerCloseMetaBatch``)."""
    schema = LakeSchema(1, 64_000)
    root.mkdir(parents=True, exist_ok=True)
    (root / ".config.json").write_bytes(schema.to_manifest())
    compress = zstandard.ZstdCompressor().compress
    for seq, meta in ledgers:
        path = root / schema.object_key(seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(compress(struct.pack(">III", seq, seq, 1) + meta))  # a batch of one
    return schema
