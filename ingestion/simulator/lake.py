"""The simulator's data lake: its chain's ledgers as Galexie writes them (SEP-54), so that a lake
job, or an RPC job backfilling from the lake, reads the very events the simulator's RPC serves.

The lake is a directory in the layout :mod:`ingestion.lake.keys` describes (``.config.json``,
one ledger per object, partitions of 64,000 objects), each object a zstd-compressed XDR
``LedgerCloseMetaBatch`` of one ``LedgerCloseMeta`` V2 (protocol 23's), built by the pure
:func:`ledger_close_meta` from the chain alone:

- every transaction of the ledger, in application order, is one ``TransactionResultMetaV1``
  (its hash the chain's, ``txSUCCESS``) with a ``TransactionMeta`` V4 holding one
  ``OperationMetaV2`` per operation;
- each contract event :func:`~ingestion.simulator.rpc_events.ledger_events` gives at
  ``(ledger, tx, op, i)`` is the ``i``-th event of operation ``op`` of transaction ``tx``;
- the ``system`` event at ``(ledger, TX_MASK, 0, 0)`` is an ``AfterAllTxs`` transaction event of
  the ledger's last transaction (RPC serves it under that transaction's hash).

So :func:`ingestion.lake.events.ledger_events` derives, id for id and byte for byte, the events
``getEvents`` serves (tested). What stellar-core would also write but nothing here reads is left
empty: the transaction set, ledger entry changes, operation results, SCP messages.

:class:`LakeWriter` is the thin part: the history at start, then each ledger as it closes, in
ascending order, each object written to a temporary name and renamed (a reader never sees half an
object, and never a later ledger before an earlier one: that would look like a hole).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingestion.lake.keys import MANIFEST, LakeSchema
from ingestion.rpc.protocol import TX_MASK
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import NETWORK_PASSPHRASE, PROTOCOL_VERSION, ledger_hash_of
from ingestion.simulator.rpc_events import RpcEvent, ledger_events, scval_of

#: The layout the simulator writes: the public lakes' (one ledger per object).
SCHEMA = LakeSchema(ledgers_per_file=1, files_per_partition=64_000, network_passphrase=NETWORK_PASSPHRASE)


def _xdr() -> Any:
    from stellar_sdk import xdr  # lazy: stellar_sdk (~700 ms): only a simulator with a lake

    return xdr


@functools.lru_cache(maxsize=256)
def _contract(contract_id: str) -> Any:
    from stellar_sdk.strkey import StrKey  # lazy: stellar_sdk (~700 ms): only a simulator with a lake

    xdr = _xdr()
    return xdr.ContractID(xdr.Hash(StrKey.decode_contract(contract_id)))


def _contract_event(event: RpcEvent) -> Any:
    xdr = _xdr()
    *topic, value = event.specs
    kind = xdr.ContractEventType.CONTRACT if event.type == "contract" else xdr.ContractEventType.SYSTEM
    return xdr.ContractEvent(
        ext=xdr.ExtensionPoint(0),
        contract_id=_contract(event.contract_id) if event.contract_id else None,
        type=kind,
        body=xdr.ContractEventBody(0, xdr.ContractEventV0([scval_of(s) for s in topic], scval_of(value))),
    )


def _hash(hex_digest: str) -> Any:
    return _xdr().Hash(bytes.fromhex(hex_digest))


def ledger_close_meta(chain: Chain, seq: int) -> Any:
    """Ledger ``seq`` of ``chain`` as an ``xdr.LedgerCloseMeta`` V2 (see the module docstring).

    Raises:
        KeyError: the chain does not hold ``seq``.
    """
    xdr = _xdr()
    content = chain.content(seq)
    transactions: dict[int, tuple[str, int]] = {}  # tx order -> (hash, operations)
    for key in content.kinds["operations"]:
        record = content.records[key]
        op_toid = int(record["id"])
        tx, op = (op_toid >> 12) & TX_MASK, (op_toid & 0xFFF) - 1
        _, ops = transactions.get(tx, ("", 0))
        transactions[tx] = (record["transaction_hash"], max(ops, op + 1))
    op_events: dict[tuple[int, int], list[Any]] = {}
    after_all: list[Any] = []
    for event in ledger_events(chain, seq):
        toid = event.key >> 32
        tx, op = (toid >> 12) & TX_MASK, toid & 0xFFF
        if tx == TX_MASK:
            after_all.append(event)
        else:
            op_events.setdefault((tx, op), []).append(_contract_event(event))
    last_tx = max(transactions, default=0)
    processing = []
    for tx in sorted(transactions):
        tx_hash, n_ops = transactions[tx]
        tx_events = [
            xdr.TransactionEvent(
                xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_AFTER_ALL_TXS, _contract_event(e)
            )
            for e in (after_all if tx == last_tx else ())
        ]
        meta = xdr.TransactionMetaV4(
            ext=xdr.ExtensionPoint(0),
            tx_changes_before=xdr.LedgerEntryChanges([]),
            operations=[
                xdr.OperationMetaV2(
                    xdr.ExtensionPoint(0), xdr.LedgerEntryChanges([]), op_events.get((tx, op), [])
                )
                for op in range(n_ops)
            ],
            tx_changes_after=xdr.LedgerEntryChanges([]),
            soroban_meta=None,
            events=tx_events,
            diagnostic_events=[],
        )
        result = xdr.TransactionResult(
            fee_charged=xdr.Int64(100 * n_ops),
            result=xdr.TransactionResultResult(xdr.TransactionResultCode.txSUCCESS, results=[]),
            ext=xdr.TransactionResultExt(0),
        )
        processing.append(
            xdr.TransactionResultMetaV1(
                ext=xdr.ExtensionPoint(0),
                result=xdr.TransactionResultPair(_hash(tx_hash), result),
                fee_processing=xdr.LedgerEntryChanges([]),
                tx_apply_processing=xdr.TransactionMeta(4, v4=meta),
                post_tx_apply_fee_processing=xdr.LedgerEntryChanges([]),
            )
        )
    zero = xdr.Hash(bytes(32))
    header = xdr.LedgerHeader(
        ledger_version=xdr.Uint32(PROTOCOL_VERSION),
        previous_ledger_hash=_hash(ledger_hash_of(chain.spec.seed, seq - 1)),
        scp_value=xdr.StellarValue(
            tx_set_hash=zero,
            close_time=xdr.TimePoint(xdr.Uint64(chain.closed_at(seq))),
            upgrades=[],
            ext=xdr.StellarValueExt(xdr.StellarValueType.STELLAR_VALUE_BASIC),
        ),
        tx_set_result_hash=zero,
        bucket_list_hash=zero,
        ledger_seq=xdr.Uint32(seq),
        total_coins=xdr.Int64(1_000_000_000_000_000_000),
        fee_pool=xdr.Int64(0),
        inflation_seq=xdr.Uint32(0),
        id_pool=xdr.Uint64(0),
        base_fee=xdr.Uint32(100),
        base_reserve=xdr.Uint32(5_000_000),
        max_tx_set_size=xdr.Uint32(1000),
        skip_list=[zero, zero, zero, zero],
        ext=xdr.LedgerHeaderExt(0),
    )
    body = xdr.LedgerCloseMetaV2(
        ext=xdr.LedgerCloseMetaExt(0),
        ledger_header=xdr.LedgerHeaderHistoryEntry(
            _hash(ledger_hash_of(chain.spec.seed, seq)), header, xdr.LedgerHeaderHistoryEntryExt(0)
        ),
        tx_set=xdr.GeneralizedTransactionSet(1, xdr.TransactionSetV1(zero, [])),
        tx_processing=processing,
        upgrades_processing=[],
        scp_info=[],
        total_byte_size_of_live_soroban_state=xdr.Uint64(0),
        evicted_keys=[],
    )
    return xdr.LedgerCloseMeta(2, v2=body)


def object_bytes(metas: Iterable[Any]) -> bytes:
    """A lake object: consecutive ``LedgerCloseMeta`` as a zstd-compressed ``LedgerCloseMetaBatch``."""
    import zstandard  # lazy: only a simulator with a lake

    xdr = _xdr()
    metas = list(metas)
    seqs = [int(m.v2.ledger_header.header.ledger_seq.uint32) for m in metas]
    batch = xdr.LedgerCloseMetaBatch(xdr.Uint32(seqs[0]), xdr.Uint32(seqs[-1]), metas)
    return zstandard.ZstdCompressor().compress(batch.to_xdr_bytes())


class LakeWriter:
    """Writes a chain's ledgers into the lake at ``root``, in ascending order (not thread-safe:
    one writer, one caller at a time).

    Args:
        root: the lake's directory (created, with its manifest, on the first write).
        schema: the layout; one ledger per object here (:data:`SCHEMA`).
    """

    def __init__(self, root: Path, schema: LakeSchema = SCHEMA):
        if schema.ledgers_per_file != 1:
            raise ValueError("the simulator's lake writes one ledger per object")
        self.root = root
        self.schema = schema
        self.written = 0  # the newest ledger written, 0 for none

    def _manifest(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / MANIFEST
        if not path.exists():
            _write_atomically(path, self.schema.to_manifest())

    def write(self, seq: int, data: bytes) -> None:
        """Write ledger ``seq``'s object (:func:`object_bytes`); ledgers must come in order.

        Raises:
            ValueError: ``seq`` is not the ledger after the last one written.
            OSError: the directory cannot be written.
        """
        if self.written and seq != self.written + 1:
            raise ValueError(f"the lake holds ledgers up to {self.written}; ledger {seq} would leave a hole")
        if not self.written:
            self._manifest()
        path = self.root / self.schema.object_key(seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, data)
        self.written = seq

    def write_history(self, chain: Chain, first: int, last: int) -> None:
        """Build and write ledgers ``first..last`` of ``chain`` (blocking: call it in a thread
        with a chain of its own)."""
        for seq in range(first, last + 1):
            self.write(seq, object_bytes([ledger_close_meta(chain, seq)]))


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")  # not a schema name: listings pass it over
    temp.write_bytes(data)
    os.replace(temp, path)
