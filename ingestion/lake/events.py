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

Two readings, equal event for event: :func:`object_events` (:func:`batch_events`) reads only what
events need and walks past the rest without building objects (:mod:`ingestion.lake.skip`: the
transaction set, every ledger entry change, ... are most of a ledger's bytes); :func:`read_batch`
then :func:`ledger_events` decode the whole batch with stellar-sdk's classes (the reference the
tests hold the partial decode to, and what needs the objects).

Known divergence: ledgers before protocol 23 in the public lake were re-encoded with unified events
(TransactionMeta V4: classic payments' and fees' events backfilled). An RPC that indexed those
ledgers live saw V3 meta and served only Soroban contract events; from the lake they have more
events, and the ids of the Soroban ones are the same (``(ledger, tx, 0, i)``) only when no
backfilled event precedes them in the operation.
"""

from __future__ import annotations

import base64
import functools
import io
import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import attrs
import orjson
import zstandard

from ingestion.lake.skip import TooLong, UnknownArm, shape_of, skippers
from ingestion.rpc.protocol import OP_MASK, TX_MASK, Cursor, event_head

MAX_OBJECT_BYTES = 1 << 31  # a decompressed batch larger than this is refused, not read
_TYPES = {0: "system", 1: "contract"}  # ContractEventType; 2 (diagnostic) is never served
_SUCCESS = (0, 1)  # txSUCCESS, txFEE_BUMP_INNER_SUCCESS


class LakeFormatError(ValueError):
    """An object that cannot be read: not zstd, not XDR, or an XDR version this reader does not
    know. The message says what; the caller adds the ledger and the object's key."""


class LakeEvent(NamedTuple):
    """One event as RPC serves it: its position, id, what filters look at, and its JSON text.

    A tuple of plain values (built and read in C), not an attrs class: a worker process sends a
    busy ledger's hundreds of events to the node, and an attrs instance pickles through Python
    (``__getstate__``/``__setstate__``): 2.7 us an event to unpickle, 0.3 as a tuple."""

    key: tuple[int, int, int, int]  # (ledger, tx, op, event): Cursor's order, as a plain tuple
    id: str  # str(Cursor(*key))
    type: str
    contract_id: str
    topics: tuple[str, ...]
    body: str

    @property
    def cursor(self) -> Cursor:
        return Cursor(*self.key)


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
    """``(start, end, ledger close metas)`` of an uncompressed XDR ``LedgerCloseMetaBatch``,
    decoded whole by stellar-sdk (:func:`batch_events` reads the events faster).

    Raises:
        LakeFormatError: not a batch, trailing bytes, an unknown union arm (a newer XDR), or
            ledgers that do not run from start to end.
    """
    from stellar_sdk import xdr  # lazy: start-up time (stellar_sdk, ~700 ms)

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
    from stellar_sdk import xdr  # lazy: start-up time (stellar_sdk, ~700 ms)

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
    events = tuple(
        e for e in (_render(c, _parts(ev), closed_at, h, ok) for c, ev, h, ok in found) if e is not None
    )
    return LedgerEvents(ledger, closed_at, int(header.ledger_version.uint32), events)


_Parts = tuple[int, bytes | None, Sequence[bytes], bytes]
"""An event as rendering needs it: its type, its contract's 32 bytes or None, and the XDR of its
topics and of its value."""


def _parts(event: Any) -> _Parts | None:
    """A decoded ``ContractEvent``'s parts; None for a type RPC does not serve."""
    if event.type.value not in _TYPES:
        return None
    if event.body.v != 0:
        raise LakeFormatError(f"ContractEvent body V{event.body.v} is not known to this reader")
    v0 = event.body.v0
    contract_id = event.contract_id
    if contract_id is not None:
        contract_id = getattr(contract_id, "contract_id", contract_id)  # ContractID wraps a Hash
        contract_id = getattr(contract_id, "hash", contract_id)
    return event.type.value, contract_id, [t.to_xdr_bytes() for t in v0.topics], v0.data.to_xdr_bytes()


def _render(cursor: Cursor, parts: _Parts | None, closed_at: str, tx_hash: str, ok: bool) -> LakeEvent | None:
    if parts is None:
        return None
    kind_value, contract_bytes, topics_xdr, data_xdr = parts
    kind = _TYPES[kind_value]
    topics = tuple(base64.b64encode(t).decode() for t in topics_xdr)
    contract_id = _contract_id(contract_bytes)
    doc = event_head(kind, cursor, closed_at, contract_id, tx_hash, ok)
    if topics:
        doc["topic"] = list(topics)
    doc["value"] = base64.b64encode(data_xdr).decode()
    key = (cursor.ledger, cursor.tx, cursor.op, cursor.event)
    return LakeEvent(key, doc["id"], kind, contract_id, topics, orjson.dumps(doc).decode())


def _contract_id(contract_id: bytes | None) -> str:
    return "" if contract_id is None else _strkey(contract_id)


@functools.lru_cache(maxsize=4096)  # a ledger's events name few contracts (fees: the XLM contract)
def _strkey(contract_id: bytes) -> str:
    from stellar_sdk.strkey import StrKey  # lazy: start-up time (stellar_sdk, ~700 ms)

    return str(StrKey.encode_contract(contract_id))


def object_events(data: bytes) -> list[LedgerEvents]:
    """A compressed lake object's ledgers and their events (:func:`batch_events`).

    Raises:
        LakeFormatError: see :func:`decompress`, :func:`batch_events`.
    """
    raw = decompress(data)
    if _skips() is None:  # the walks could not be compiled: stellar-sdk's whole decode
        return [ledger_events(m) for m in read_batch(raw)[2]]
    return batch_events(raw)


# -- the partial decode ----------------------------------------------------------------------------
#
# batch_events reads what events need and walks past the rest (ingestion.lake.skip): the header's
# sequence, close time and protocol; per transaction its hash and result code (from the result
# pair) and its TransactionMeta's event lists; each event's contract, type, and the XDR of its
# topics and value, sliced from the input (the bytes the full decode would re-encode: XDR is
# canonical). Skipped: the transaction set, results past their code, every LedgerEntryChanges
# (fee processing, changes before and after, each operation's), diagnostic events, Soroban return
# values, upgrades, SCP messages, evicted keys and entries.

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U64 = struct.Struct(">Q").unpack_from

# the layouts the walk below reads by hand, as the installed stellar-sdk's classes define them:
# checked when the walk is compiled, so a changed XDR fails loudly instead of misreading
_LAYOUTS = {
    "LedgerCloseMetaBatch": "Ref(Uint32) Ref(Uint32) Array(Ref(LedgerCloseMeta))",
    "LedgerCloseMetaV0": "Ref(LedgerHeaderHistoryEntry) Ref(TransactionSet) "
    "Array(Ref(TransactionResultMeta)) *",
    "LedgerCloseMetaV1": "Ref(LedgerCloseMetaExt) Ref(LedgerHeaderHistoryEntry) "
    "Ref(GeneralizedTransactionSet) Array(Ref(TransactionResultMeta)) *",
    "LedgerCloseMetaV2": "Ref(LedgerCloseMetaExt) Ref(LedgerHeaderHistoryEntry) "
    "Ref(GeneralizedTransactionSet) Array(Ref(TransactionResultMetaV1)) *",
    "LedgerHeaderHistoryEntry": "Ref(Hash) Ref(LedgerHeader) *",
    "LedgerHeader": "Ref(Uint32) Ref(Hash) Ref(StellarValue) Ref(Hash) Ref(Hash) Ref(Uint32) *",
    "StellarValue": "Ref(Hash) Ref(TimePoint) *",
    "TimePoint": "Ref(Uint64)",
    "Hash": "Fixed(32)",
    "TransactionResultMeta": "Ref(TransactionResultPair) Ref(LedgerEntryChanges) Ref(TransactionMeta)",
    "TransactionResultMetaV1": "Ref(ExtensionPoint) Ref(TransactionResultPair) Ref(LedgerEntryChanges) "
    "Ref(TransactionMeta) Ref(LedgerEntryChanges)",
    "TransactionResultPair": "Ref(Hash) Ref(TransactionResult)",
    "TransactionResult": "Ref(Int64) Ref(TransactionResultResult) *",
    "TransactionMetaV3": "Ref(ExtensionPoint) Ref(LedgerEntryChanges) Array(Ref(OperationMeta)) "
    "Ref(LedgerEntryChanges) Opt(Ref(SorobanTransactionMeta))",
    "SorobanTransactionMeta": "Ref(SorobanTransactionMetaExt) Array(Ref(ContractEvent)) Ref(SCVal) "
    "Array(Ref(DiagnosticEvent))",
    "TransactionMetaV4": "Ref(ExtensionPoint) Ref(LedgerEntryChanges) Array(Ref(OperationMetaV2)) "
    "Ref(LedgerEntryChanges) Opt(Ref(SorobanTransactionMetaV2)) Array(Ref(TransactionEvent)) "
    "Array(Ref(DiagnosticEvent))",
    "OperationMetaV2": "Ref(ExtensionPoint) Ref(LedgerEntryChanges) Array(Ref(ContractEvent))",
    "TransactionEvent": "Ref(TransactionEventStage) Ref(ContractEvent)",
    "ContractEvent": "Ref(ExtensionPoint) Opt(Ref(ContractID)) Ref(ContractEventType) Ref(ContractEventBody)",
    "ContractID": "Ref(Hash)",
    "ContractEventV0": "Array(Ref(SCVal)) Ref(SCVal)",
}
_SKIPPED = (
    "LedgerCloseMetaExt",
    "LedgerHeaderHistoryEntry",
    "StellarValue",
    "TransactionSet",
    "GeneralizedTransactionSet",
    "ExtensionPoint",
    "TransactionResult",
    "LedgerEntryChanges",
    "TransactionMeta",
    "SCVal",
    "LedgerCloseMetaV0:3:5",  # upgrades, SCP
    "LedgerCloseMetaV1:4:9",  # upgrades, SCP, bucket list size, evicted keys and entries
    "LedgerCloseMetaV2:4:8",
    "TransactionMetaV3:0:4",  # ext, changes before, operations, changes after
    "SorobanTransactionMeta:0:1",  # ext
    "SorobanTransactionMeta:2:4",  # return value, diagnostic events
    "TransactionMetaV4:0:2",  # ext, changes before
    "TransactionMetaV4:3:5",  # changes after, Soroban meta (return value)
    "TransactionMetaV4:6:7",  # diagnostic events
    "OperationMetaV2:0:2",  # ext, changes
)


def _layout(shapes: Sequence[Any]) -> str:
    def one(shape: Any) -> str:
        if hasattr(shape, "item"):
            return f"{type(shape).__name__}({one(shape.item)})"
        if hasattr(shape, "size"):
            return f"Fixed({shape.size})"
        return f"{type(shape).__name__}({shape.name})"

    return " ".join(one(s) for s in shapes)


@functools.cache
def _skips() -> dict[str, Any] | None:
    """The walks, compiled once per process (about 0.2 s), after checking the layouts they assume;
    None when they cannot be: stellar-sdk's source is not installed, a construct the compiler does
    not know, or a layout other than the one assumed (a newer stellar-sdk). Then
    :func:`object_events` decodes whole, slower but right (a test holds the walks compilable)."""
    try:
        for name, expected in _LAYOUTS.items():
            got = _layout(shape_of(name))
            prefix = expected.removesuffix(" *")
            if got != prefix and not (expected.endswith(" *") and got.startswith(prefix + " ")):
                return None
        return skippers(*_SKIPPED)
    except (OSError, TypeError, ValueError, AttributeError, SyntaxError):
        return None


def compile_walks() -> bool:
    """Compile the partial decode's walks now (a worker does it at start, not on its first
    object); whether they compiled."""
    return _skips() is not None


def batch_events(raw: bytes) -> list[LedgerEvents]:
    """The ledgers and events of an uncompressed XDR ``LedgerCloseMetaBatch``, equal to
    :func:`ledger_events` of each of :func:`read_batch`'s metas, reading only what events need.

    Raises:
        LakeFormatError: not a batch, trailing bytes, an unknown union arm or version (a newer
            XDR), or ledgers that do not run from start to end.
    """
    skips = _skips()
    if skips is None:
        raise RuntimeError("the XDR walks did not compile with the installed stellar-sdk")
    try:
        start, end, count = struct.unpack_from(">III", raw, 0)
        at = 12
        if count > len(raw) - at:
            raise TooLong(f"{count} ledgers")
        out = []
        for _ in range(count):
            ledger, at = _ledger(skips, raw, at)
            out.append(ledger)
    except UnknownArm as exc:
        raise LakeFormatError(f"not an XDR LedgerCloseMetaBatch this reader knows: {exc}") from exc
    except (struct.error, TooLong, RecursionError) as exc:
        raise LakeFormatError(f"not an XDR LedgerCloseMetaBatch (or a newer XDR version): {exc!r}") from exc
    if at != len(raw):
        raise LakeFormatError(
            f"not an XDR LedgerCloseMetaBatch (or a newer XDR version): trailing {len(raw) - at} bytes"
        )
    sequences = [ledger.ledger for ledger in out]
    if sequences != list(range(start, end + 1)):
        raise LakeFormatError(f"batch {start}-{end} holds ledgers {sequences[:3]}...{sequences[-3:]}")
    return out


def _array(raw: bytes, at: int) -> tuple[int, int]:
    (count,) = _U32(raw, at)
    if count > len(raw) - at - 4:
        raise TooLong(f"array of {count} past the end")
    return count, at + 4


def _ledger(skips: dict[str, Any], raw: bytes, at: int) -> tuple[LedgerEvents, int]:
    (version,) = _I32(raw, at)
    at += 4
    if version not in (0, 1, 2):
        raise LakeFormatError(f"LedgerCloseMeta V{version} is not known to this reader")
    if version:
        at = skips["LedgerCloseMetaExt"](raw, at)
    # LedgerHeaderHistoryEntry: hash, then LedgerHeader: ledgerVersion, previousLedgerHash,
    # StellarValue (txSetHash, closeTime, ...), txSetResultHash, bucketListHash, ledgerSeq
    (protocol,) = _U32(raw, at + 32)
    (close_time,) = _U64(raw, at + 100)
    (ledger,) = _U32(raw, skips["StellarValue"](raw, at + 68) + 64)
    at = skips["LedgerHeaderHistoryEntry"](raw, at)
    at = skips["TransactionSet" if version == 0 else "GeneralizedTransactionSet"](raw, at)
    closed_at = datetime.fromtimestamp(close_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found: list[tuple[Cursor, _Parts | None, str, bool]] = []
    counts = [0, 0]  # BeforeAllTxs, AfterAllTxs events so far in the ledger
    transactions, at = _array(raw, at)
    for index in range(1, transactions + 1):
        if version == 2:
            at = skips["ExtensionPoint"](raw, at)
        tx_hash = raw[at : at + 32].hex()
        (code,) = _I32(raw, at + 40)  # TransactionResult: feeCharged, then the result's code
        at = skips["TransactionResult"](raw, at + 32)
        at = skips["LedgerEntryChanges"](raw, at)  # fee processing
        at = _transaction_meta(skips, raw, at, ledger, index, tx_hash, code in _SUCCESS, counts, found)
        if version == 2:
            at = skips["LedgerEntryChanges"](raw, at)  # post-apply fee processing
    at = skips[("LedgerCloseMetaV0:3:5", "LedgerCloseMetaV1:4:9", "LedgerCloseMetaV2:4:8")[version]](raw, at)
    found.sort(key=lambda item: (item[0].ledger, item[0].tx, item[0].op, item[0].event))  # Cursor's order
    events = tuple(e for e in (_render(c, p, closed_at, h, ok) for c, p, h, ok in found) if e is not None)
    return LedgerEvents(ledger, closed_at, protocol, events), at


def _transaction_meta(
    skips: dict[str, Any],
    raw: bytes,
    at: int,
    ledger: int,
    index: int,
    tx_hash: str,
    ok: bool,
    counts: list[int],
    found: list[tuple[Cursor, _Parts | None, str, bool]],
) -> int:
    """Walks the TransactionMeta at ``at`` (transaction ``index``), adding its events to ``found``;
    the offset after it."""
    (version,) = _I32(raw, at)
    if version in (0, 1, 2):
        return int(skips["TransactionMeta"](raw, at))
    at += 4
    if version == 3:
        at = skips["TransactionMetaV3:0:4"](raw, at)
        (soroban,) = _U32(raw, at)
        at += 4
        if soroban:
            at = skips["SorobanTransactionMeta:0:1"](raw, at)
            n, at = _array(raw, at)
            for i in range(n):
                parts, at = _event(skips, raw, at)
                found.append((Cursor(ledger, index, 0, i), parts, tx_hash, ok))
            at = skips["SorobanTransactionMeta:2:4"](raw, at)
        return at
    if version != 4:
        raise LakeFormatError(f"TransactionMeta V{version} (transaction {index}) is not known to this reader")
    at = skips["TransactionMetaV4:0:2"](raw, at)
    operations, at = _array(raw, at)
    for op in range(operations):
        at = skips["OperationMetaV2:0:2"](raw, at)
        n, at = _array(raw, at)
        for i in range(n):
            parts, at = _event(skips, raw, at)
            found.append((Cursor(ledger, index, op, i), parts, tx_hash, ok))
    at = skips["TransactionMetaV4:3:5"](raw, at)
    n, at = _array(raw, at)
    after_tx = 0
    for _ in range(n):
        (stage,) = _I32(raw, at)
        parts, at = _event(skips, raw, at + 4)
        if stage == 0:  # TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS
            cursor, counts[0] = Cursor(ledger, 0, 0, counts[0]), counts[0] + 1
        elif stage == 2:  # TRANSACTION_EVENT_STAGE_AFTER_ALL_TXS
            cursor, counts[1] = Cursor(ledger, TX_MASK, 0, counts[1]), counts[1] + 1
        elif stage == 1:  # TRANSACTION_EVENT_STAGE_AFTER_TX
            cursor, after_tx = Cursor(ledger, index, OP_MASK, after_tx), after_tx + 1
        else:
            raise LakeFormatError(f"transaction event stage {stage} is not known to this reader")
        found.append((cursor, parts, tx_hash, ok))
    return int(skips["TransactionMetaV4:6:7"](raw, at))


def _event(skips: dict[str, Any], raw: bytes, at: int) -> tuple[_Parts | None, int]:
    """The ``ContractEvent`` at ``at``: its parts (None for a type RPC does not serve) and the
    offset after it."""
    at = skips["ExtensionPoint"](raw, at)
    (has_contract,) = _U32(raw, at)
    at += 4
    contract_id = None
    if has_contract:
        contract_id, at = raw[at : at + 32], at + 32
    kind, body = struct.unpack_from(">ii", raw, at)
    at += 8
    if kind not in (0, 1, 2):
        raise UnknownArm("ContractEventType", kind)
    if body != 0:
        raise LakeFormatError(f"ContractEvent body V{body} is not known to this reader")
    n, at = _array(raw, at)
    topics = []
    for _ in range(n):
        end = skips["SCVal"](raw, at)
        topics.append(raw[at:end])
        at = end
    end = skips["SCVal"](raw, at)
    data, at = raw[at:end], end
    return ((kind, contract_id, topics, data) if kind in _TYPES else None), at


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
