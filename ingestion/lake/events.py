"""A lake object's contract events, derived exactly as Stellar RPC's ``getEvents`` serves them. Pure.

An object is a zstd-compressed XDR ``LedgerCloseMetaBatch``. For each ``LedgerCloseMeta`` (V0, V1,
V2) and each transaction in application order (``tx`` = its 1-based position in
``txProcessing``), the events are those stellar-rpc stores (``cmd/stellar-rpc/internal/db/event.go``
``InsertEvents`` over the Go SDK's ``LedgerTransaction.GetTransactionEvents``):

- TransactionMeta V1/V2: none.
- V3: a Soroban transaction's ``sorobanMeta.events``, as the events of operation 0 (a Soroban
  transaction has one operation); a classic transaction has none.
- V4 (CAP-67 unified events): each operation's ``events`` (``operations[i].events``) and the
  transaction-level ``events``, each with a stage.

Ids (``"%019d-%010d"`` of the TOID ``ledger << 32 | tx << 12 | op`` and an event index) by stage,
read from ``InsertEvents``:

- an operation's events: ``(ledger, tx, op, i)``, ``i`` counting within the operation;
- ``BeforeAllTxs`` (fees charged before any transaction applies): ``(ledger, 0, 0, i)``, ``i``
  counting across the whole ledger (in transaction order): they sort before every transaction;
- ``AfterTx``: ``(ledger, tx, 4095, i)`` (the operation mask: after the transaction's
  operations), ``i`` counting within the transaction;
- ``AfterAllTxs`` (fee refunds after every transaction): ``(ledger, 1048575, 0, i)`` (the
  transaction mask), ``i`` counting across the ledger.

Every event carries its transaction's hash and ``inSuccessfulContractCall`` = whether the
transaction succeeded (``txSUCCESS`` or ``txFEE_BUMP_INNER_SUCCESS``), fee events of a failed
transaction included. ``diagnosticEvents`` are never indexed by RPC and are left out here (as is an
event of type ``DIAGNOSTIC`` in any other list, which stellar-core does not put there).

Each event is rendered as RPC's ``EventInfo`` JSON in its field order (``type``, ``ledger``,
``ledgerClosedAt`` in RFC 3339 UTC, ``contractId`` ("" for none), ``id``, ``operationIndex``,
``transactionIndex``, ``txHash``, ``inSuccessfulContractCall``, ``topic`` (omitted when empty, as
Go's ``omitempty`` does), ``value``), compact: the text the RPC source stores for the same event.

Known divergence: ledgers before protocol 23 in the public lake were re-encoded with unified events
(TransactionMeta V4: classic payments' and fees' events backfilled). An RPC that indexed those
ledgers live saw V3 meta and served only Soroban contract events; from the lake they have more
events, and the ids of the Soroban ones are the same (``(ledger, tx, 0, i)``) only when no
backfilled event precedes them in the operation.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import orjson

from ingestion.rpc.protocol import OP_MASK, TX_MASK, Cursor

MAX_OBJECT_BYTES = 1 << 31  # a decompressed batch larger than this is refused, not read
_TYPES = {0: "system", 1: "contract"}  # ContractEventType; 2 (diagnostic) is never served
_SUCCESS = (0, 1)  # txSUCCESS, txFEE_BUMP_INNER_SUCCESS


class LakeFormatError(ValueError):
    """An object that cannot be read: not zstd, not XDR, or an XDR version this reader does not
    know. The message says what; the caller adds the ledger and the object's key."""


@attrs.frozen
class LakeEvent:
    """One event as RPC serves it: the id's cursor, what filters look at, and its JSON text."""

    cursor: Cursor
    type: str
    contract_id: str
    topics: tuple[str, ...]
    body: str

    @property
    def id(self) -> str:
        return str(self.cursor)


@attrs.frozen
class LedgerEvents:
    """A ledger's events, ascending by id, and its close time (RFC 3339)."""

    ledger: int
    closed_at: str
    protocol: int
    events: tuple[LakeEvent, ...]


def decompress(data: bytes) -> bytes:
    """The zstd stream ``data`` decompressed (frames without a content size included).

    Raises:
        LakeFormatError: not zstd, or larger than :data:`MAX_OBJECT_BYTES`.
    """
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(MAX_OBJECT_BYTES + 1)
            # read() returns at most one frame's output per call: go on until the end
            chunks = [out]
            while out and sum(map(len, chunks)) <= MAX_OBJECT_BYTES:
                out = reader.read(MAX_OBJECT_BYTES + 1)
                chunks.append(out)
    except zstandard.ZstdError as exc:
        raise LakeFormatError(f"not a zstd object: {exc}") from exc
    raw = b"".join(chunks)
    if len(raw) > MAX_OBJECT_BYTES:
        raise LakeFormatError(f"decompresses to more than {MAX_OBJECT_BYTES} bytes")
    return raw


def read_batch(raw: bytes) -> tuple[int, int, list[Any]]:
    """``(start, end, ledger close metas)`` of an uncompressed XDR ``LedgerCloseMetaBatch``.

    Raises:
        LakeFormatError: not a batch, trailing bytes, an unknown union arm (a newer XDR), or
            ledgers that do not run from start to end.
    """
    from stellar_sdk import xdr

    try:
        batch = xdr.LedgerCloseMetaBatch.from_xdr_bytes(raw)
    except Exception as exc:  # xdrlib3 and the generated classes raise several kinds
        raise LakeFormatError(f"not an XDR LedgerCloseMetaBatch (or a newer XDR version): {exc!r}") from exc
    start, end = batch.start_sequence.uint32, batch.end_sequence.uint32
    metas = list(batch.ledger_close_metas)
    sequences = [ledger_of(m) for m in metas]
    if sequences != list(range(start, end + 1)):
        raise LakeFormatError(f"batch {start}-{end} holds ledgers {sequences[:3]}...{sequences[-3:]}")
    return start, end, metas


def _body(meta: Any) -> Any:
    body = {0: meta.v0, 1: meta.v1, 2: meta.v2}.get(meta.v)
    if body is None:
        raise LakeFormatError(f"LedgerCloseMeta V{meta.v} is not known to this reader")
    return body


def ledger_of(meta: Any) -> int:
    return int(_body(meta).ledger_header.header.ledger_seq.uint32)


def ledger_events(meta: Any) -> LedgerEvents:
    """Every event RPC would serve for this ``LedgerCloseMeta``, ascending by id.

    Raises:
        LakeFormatError: a TransactionMeta or event version this reader does not know.
    """
    from stellar_sdk import xdr

    body = _body(meta)
    header = body.ledger_header.header
    ledger = int(header.ledger_seq.uint32)
    close_time = int(header.scp_value.close_time.time_point.uint64)
    closed_at = datetime.fromtimestamp(close_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found: list[tuple[Cursor, Any, str, bool]] = []
    before = after = 0
    stage = xdr.TransactionEventStage
    for index, processing in enumerate(body.tx_processing, 1):
        tx_hash = processing.result.transaction_hash.hash.hex()
        ok = processing.result.result.result.code.value in _SUCCESS
        tx_meta = processing.tx_apply_processing
        if tx_meta.v in (0, 1, 2):
            continue
        if tx_meta.v == 3:
            soroban = tx_meta.v3.soroban_meta
            for i, event in enumerate(soroban.events if soroban is not None else ()):
                found.append((Cursor(ledger, index, 0, i), event, tx_hash, ok))
            continue
        if tx_meta.v != 4:
            raise LakeFormatError(
                f"TransactionMeta V{tx_meta.v} (transaction {index}) is not known to this reader"
            )
        v4 = tx_meta.v4
        after_tx = 0
        for tx_event in v4.events:
            if tx_event.stage == stage.TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS:
                cursor, before = Cursor(ledger, 0, 0, before), before + 1
            elif tx_event.stage == stage.TRANSACTION_EVENT_STAGE_AFTER_ALL_TXS:
                cursor, after = Cursor(ledger, TX_MASK, 0, after), after + 1
            elif tx_event.stage == stage.TRANSACTION_EVENT_STAGE_AFTER_TX:
                cursor, after_tx = Cursor(ledger, index, OP_MASK, after_tx), after_tx + 1
            else:
                raise LakeFormatError(f"transaction event stage {tx_event.stage} is not known to this reader")
            found.append((cursor, tx_event.event, tx_hash, ok))
        for op, operation in enumerate(v4.operations):
            for i, event in enumerate(operation.events):
                found.append((Cursor(ledger, index, op, i), event, tx_hash, ok))
    found.sort(key=lambda item: item[0])
    events = tuple(e for e in (_render(c, ev, closed_at, h, ok) for c, ev, h, ok in found) if e is not None)
    return LedgerEvents(ledger, closed_at, int(header.ledger_version.uint32), events)


def _render(cursor: Cursor, event: Any, closed_at: str, tx_hash: str, ok: bool) -> LakeEvent | None:
    kind = _TYPES.get(event.type.value)
    if kind is None:
        return None
    if event.body.v != 0:
        raise LakeFormatError(f"ContractEvent body V{event.body.v} is not known to this reader")
    v0 = event.body.v0
    topics = tuple(_b64(t) for t in v0.topics)
    contract_id = _contract_id(event.contract_id)
    doc: dict[str, Any] = {
        "type": kind,
        "ledger": cursor.ledger,
        "ledgerClosedAt": closed_at,
        "contractId": contract_id,
        "id": str(cursor),
        "operationIndex": cursor.op,
        "transactionIndex": cursor.tx,
        "txHash": tx_hash,
        "inSuccessfulContractCall": ok,
    }
    if topics:
        doc["topic"] = list(topics)
    doc["value"] = _b64(v0.data)
    return LakeEvent(cursor, kind, contract_id, topics, orjson.dumps(doc).decode())


def _b64(value: Any) -> str:
    return base64.b64encode(value.to_xdr_bytes()).decode()


def _contract_id(contract_id: Any) -> str:
    if contract_id is None:
        return ""
    from stellar_sdk.strkey import StrKey

    raw = getattr(contract_id, "contract_id", contract_id)  # ContractID wraps a Hash
    return str(StrKey.encode_contract(getattr(raw, "hash", raw)))


def object_events(data: bytes) -> list[LedgerEvents]:
    """A compressed lake object's ledgers and their events.

    Raises:
        LakeFormatError: see :func:`decompress`, :func:`read_batch`, :func:`ledger_events`.
    """
    _, _, metas = read_batch(decompress(data))
    return [ledger_events(m) for m in metas]


def record_frames(raw: bytes) -> Sequence[bytes]:
    """XDR record-marked frames (``0x80000000 | length``, then the bytes), as stellar-core and
    Galexie's test data write a stream of ``LedgerCloseMeta``."""
    out, at = [], 0
    while at < len(raw):
        mark = int.from_bytes(raw[at : at + 4], "big")
        size = mark & 0x7FFFFFFF
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out
