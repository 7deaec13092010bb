"""A contract event's ScVals, from base64 XDR to SEP-51 XDR-JSON. Pure.

Stellar RPC serves an event's ``topic`` items and ``value`` as base64 XDR ``SCVal``s; with
``xdrFormat: json`` it serves them as SEP-51 JSON instead (``topicJson``, ``valueJson``). This module
turns the first into the second, value for value equal to stellar-sdk's
``SCVal.from_xdr(b64).to_json_dict()`` (the tests hold it to that on real ledgers and random values),
without stellar-sdk: its generated classes build an object per field and take tens of microseconds
an event, and this runs per event on the node's one thread. Here one ``a2b_base64`` and
``struct.unpack_from`` over the bytes build the JSON values directly.

The JSON, as SEP-51 and stellar-sdk 16 write it:

- ``"void"``, ``"ledger_key_contract_instance"``; every other arm a one-key object named by the arm:
  ``{"bool": true}``, ``{"u32": 7}``, ``{"i32": -7}`` (JSON numbers), ``{"u64": "7"}``, ``i64``,
  ``timepoint``, ``duration``, ``u128``, ``i128``, ``u256``, ``i256`` (decimal strings: JSON numbers
  lose precision past 2**53), ``{"bytes": "<hex>"}``, ``{"string": s}``, ``{"symbol": s}``,
  ``{"vec": [...]}``, ``{"map": [{"key": k, "val": v}, ...]}``, ``{"address": "<strkey>"}``,
  ``{"error": {"contract": 7}}`` or ``{"error": {"<type>": "<code>"}}``,
  ``{"contract_instance": {"executable": ..., "storage": [...] | null}}``,
  ``{"ledger_key_nonce": {"nonce": "<i64>"}}``, ``{"executable_tag": s}``.
- Strings and symbols are XDR byte strings, not text: SEP-51's escaped ASCII (printable ASCII as is,
  ``\\0 \\t \\n \\r \\\\``, every other byte ``\\xNN``), so a string's JSON is ASCII whatever it held.
- Addresses are strkeys: ``G`` account, ``C`` contract, ``M`` muxed account (key then id),
  ``B`` claimable balance (its type byte then hash), ``L`` liquidity pool.
- An absent vec or map (XDR's optional pointer, never made by the Soroban host) is ``{"vec": null}``
  as the Rust XDR (stellar-rpc's) writes it; stellar-sdk cannot render one (it asserts).

Stricter than stellar-sdk where the XDR standard is (as the Rust XDR stellar-rpc uses is): a bool
or an optional's flag other than 0 or 1, and non-zero padding, are errors. Nesting deeper than
:data:`MAX_DEPTH` ScVals is an error: the Soroban host refuses values deeper than 100, so no real
event is, and the bound keeps a crafted one from exhausting the stack.

Every malformed input raises :class:`ScValError` and nothing else.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from ingestion.common.strkey import ACCOUNT, CLAIMABLE_BALANCE, CONTRACT, LIQUIDITY_POOL, MUXED, strkey

MAX_DEPTH = 128
"""ScVals nested deeper than this are refused (the Soroban host's own limit is 100)."""

CACHE_LIMIT = 65_536
"""Entries a cache holds before it is cleared (each a few hundred bytes: tens of MB at worst)."""


class ScValError(ValueError):
    """A ScVal that cannot be decoded: not base64, truncated, trailing bytes, an unknown arm or
    code, bad padding, or nested too deep. The message says which and where."""


class Decoded(NamedTuple):
    """One ScVal decoded: its SEP-51 JSON value, the same as compact JSON text, and the address
    strkeys it names anywhere inside (in order, repeats kept).

    Shared through the caches: treat ``json`` as read-only."""

    json: Any
    text: str
    addresses: tuple[str, ...]


# -- the decoder -----------------------------------------------------------------------------------

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_QQ = struct.Struct(">QQ").unpack_from
_QQ_SIGNED = struct.Struct(">qQ").unpack_from
_QQQQ = struct.Struct(">QQQQ").unpack_from
_QQQQ_SIGNED = struct.Struct(">qQQQ").unpack_from

_SYMBOL_LIMIT = 32  # SCSYMBOL_LIMIT
_ERROR_TYPES: tuple[str, ...] = (
    *("contract", "wasm_vm", "context", "storage", "object", "crypto", "events", "budget", "value", "auth"),
)
_ERROR_CODES: tuple[str, ...] = (
    *("arith_domain", "index_bounds", "invalid_input", "missing_value", "existing_value"),
    *("exceeded_limit", "invalid_action", "internal_error", "unexpected_type", "unexpected_size"),
)

# SEP-51 escaped ASCII: a byte's text, and the bytes that stand for themselves (deleted by
# translate: a string left empty needs no escaping, the common case, done in C)
_ESCAPED = [chr(b) if 0x20 <= b <= 0x7E else f"\\x{b:02x}" for b in range(256)]
_ESCAPED[0], _ESCAPED[9], _ESCAPED[10], _ESCAPED[13], _ESCAPED[92] = "\\0", "\\t", "\\n", "\\r", "\\\\"
_PLAIN = bytes(b for b in range(0x20, 0x7F) if b != 92)


def escaped(raw: bytes) -> str:
    """``raw`` as SEP-51 escaped ASCII (how an XDR string or symbol is written in JSON)."""
    if not raw.translate(None, _PLAIN):
        return raw.decode("ascii")
    return "".join([_ESCAPED[b] for b in raw])


def _need(buf: bytes, at: int, size: int, what: str) -> None:
    if at + size > len(buf):
        raise ScValError(f"truncated: {what} needs {size} bytes at offset {at}, {len(buf) - at} left")


def _opaque(buf: bytes, at: int, limit: int, what: str) -> tuple[bytes, int]:
    """A variable-length opaque (length, bytes, zero padding to 4)."""
    (size,) = _U32(buf, at)
    at += 4
    if size > limit:
        raise ScValError(f"{what} of {size} bytes exceeds its limit of {limit}")
    padded = (size + 3) & ~3
    _need(buf, at, padded, what)
    end = at + size
    if padded != size and buf[end : at + padded].strip(b"\0"):
        raise ScValError(f"non-zero padding after the {what} at offset {end}")
    return buf[at:end], at + padded


def _address(buf: bytes, at: int) -> tuple[str, int]:
    (kind,) = _U32(buf, at)
    at += 4
    if kind == 0:  # account: a PublicKey union, whose one arm is ed25519
        (key_type,) = _U32(buf, at)
        if key_type != 0:
            raise ScValError(f"unknown public key type {key_type} at offset {at}")
        _need(buf, at + 4, 32, "account key")
        return strkey(ACCOUNT, buf[at + 4 : at + 36]), at + 36
    if kind == 1:
        _need(buf, at, 32, "contract id")
        return strkey(CONTRACT, buf[at : at + 32]), at + 32
    if kind == 2:  # MuxedEd25519Account {uint64 id; uint256 ed25519}: the strkey holds key then id
        _need(buf, at, 40, "muxed account")
        return strkey(MUXED, buf[at + 8 : at + 40] + buf[at : at + 8]), at + 40
    if kind == 3:  # ClaimableBalanceID union: the strkey holds the type's low byte, then the hash
        (id_type,) = _U32(buf, at)
        if id_type != 0:
            raise ScValError(f"unknown claimable balance id type {id_type} at offset {at}")
        _need(buf, at + 4, 32, "claimable balance id")
        return strkey(CLAIMABLE_BALANCE, buf[at + 3 : at + 36]), at + 36
    if kind == 4:
        _need(buf, at, 32, "liquidity pool id")
        return strkey(LIQUIDITY_POOL, buf[at : at + 32]), at + 32
    raise ScValError(f"unknown address type {kind} at offset {at - 4}")


def _entries(buf: bytes, at: int, depth: int) -> tuple[list[Any], int]:
    """An SCMap: its entries as ``{"key", "val"}`` objects."""
    (count,) = _U32(buf, at)
    at += 4
    if count * 8 > len(buf) - at:  # each entry is two ScVals of at least 4 bytes
        raise ScValError(f"truncated: a map of {count} entries at offset {at - 4}")
    out = []
    for _ in range(count):
        key, at = _val(buf, at, depth)
        val, at = _val(buf, at, depth)
        out.append({"key": key, "val": val})
    return out, at


def _present(buf: bytes, at: int) -> bool:
    (flag,) = _U32(buf, at)
    if flag > 1:
        raise ScValError(f"optional flag {flag} at offset {at} is neither 0 nor 1")
    return flag == 1


# The arms, indexed by SCValType: each reads its body at ``at`` and returns (JSON, next offset).
_Arm = Callable[[bytes, int, int], tuple[Any, int]]


def _bool(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    (flag,) = _U32(buf, at)
    if flag > 1:
        raise ScValError(f"bool {flag} at offset {at} is neither 0 nor 1")
    return {"bool": flag == 1}, at + 4


def _void(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return "void", at


def _error(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    kind, code = _U32(buf, at)[0], _U32(buf, at + 4)[0]
    if kind >= len(_ERROR_TYPES):
        raise ScValError(f"unknown error type {kind} at offset {at}")
    if kind == 0:
        return {"error": {"contract": code}}, at + 8
    if code >= len(_ERROR_CODES):
        raise ScValError(f"unknown error code {code} at offset {at + 4}")
    return {"error": {_ERROR_TYPES[kind]: _ERROR_CODES[code]}}, at + 8


def _u32(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return {"u32": _U32(buf, at)[0]}, at + 4


def _i32(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return {"i32": _I32(buf, at)[0]}, at + 4


def _unsigned64(name: str) -> _Arm:
    def arm(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
        return {name: str(_U64(buf, at)[0])}, at + 8

    return arm


def _i64(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return {"i64": str(_I64(buf, at)[0])}, at + 8


def _u128(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    hi, lo = _QQ(buf, at)
    return {"u128": str(hi << 64 | lo)}, at + 16


def _i128(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    hi, lo = _QQ_SIGNED(buf, at)
    return {"i128": str(hi << 64 | lo)}, at + 16


def _u256(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    a, b, c, d = _QQQQ(buf, at)
    return {"u256": str(a << 192 | b << 128 | c << 64 | d)}, at + 32


def _i256(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    a, b, c, d = _QQQQ_SIGNED(buf, at)
    return {"i256": str(a << 192 | b << 128 | c << 64 | d)}, at + 32


def _bytes(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    raw, at = _opaque(buf, at, 0xFFFFFFFF, "bytes")
    return {"bytes": raw.hex()}, at


def _text(name: str, limit: int) -> _Arm:
    def arm(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
        raw, at = _opaque(buf, at, limit, name)
        return {name: escaped(raw)}, at

    return arm


def _vec(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    if not _present(buf, at):
        return {"vec": None}, at + 4
    (count,) = _U32(buf, at + 4)
    at += 8
    if count * 4 > len(buf) - at:  # each item is at least 4 bytes
        raise ScValError(f"truncated: a vec of {count} items at offset {at - 4}")
    out = []
    for _ in range(count):
        item, at = _val(buf, at, depth)
        out.append(item)
    return {"vec": out}, at


def _map(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    if not _present(buf, at):
        return {"map": None}, at + 4
    entries, at = _entries(buf, at + 4, depth)
    return {"map": entries}, at


def _address_arm(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    address, at = _address(buf, at)
    return {"address": address}, at


def _contract_instance(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    (kind,) = _U32(buf, at)
    at += 4
    executable: Any
    if kind == 0:
        _need(buf, at, 32, "wasm hash")
        executable, at = {"wasm": buf[at : at + 32].hex()}, at + 32
    elif kind == 1:
        executable = "stellar_asset"
    elif kind == 2:  # ContractExecutableExternalRef {SCAddress executable_owner; SCString tag}
        owner, at = _address(buf, at)
        tag, at = _opaque(buf, at, 0xFFFFFFFF, "external ref tag")
        executable = {"external_ref": {"executable_owner": owner, "tag": escaped(tag)}}
    else:
        raise ScValError(f"unknown contract executable type {kind} at offset {at - 4}")
    storage = None
    if _present(buf, at):
        storage, at = _entries(buf, at + 4, depth)
    else:
        at += 4
    return {"contract_instance": {"executable": executable, "storage": storage}}, at


def _ledger_key_contract_instance(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return "ledger_key_contract_instance", at


def _ledger_key_nonce(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    return {"ledger_key_nonce": {"nonce": str(_I64(buf, at)[0])}}, at + 8


_ARMS: tuple[_Arm, ...] = (
    _bool,
    _void,
    _error,
    _u32,
    _i32,
    _unsigned64("u64"),
    _i64,
    _unsigned64("timepoint"),
    _unsigned64("duration"),
    _u128,
    _i128,
    _u256,
    _i256,
    _bytes,
    _text("string", 0xFFFFFFFF),
    _text("symbol", _SYMBOL_LIMIT),
    _vec,
    _map,
    _address_arm,
    _contract_instance,
    _ledger_key_contract_instance,
    _ledger_key_nonce,
    _text("executable_tag", 0xFFFFFFFF),
)


def _val(buf: bytes, at: int, depth: int) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise ScValError(f"ScVals nested deeper than {MAX_DEPTH} at offset {at}")
    (kind,) = _U32(buf, at)
    if kind >= len(_ARMS):
        raise ScValError(f"unknown ScVal type {kind} at offset {at}")
    return _ARMS[kind](buf, at + 4, depth + 1)


def from_bytes(raw: bytes) -> Any:
    """The SEP-51 JSON of one XDR ``SCVal``: all of ``raw``, nothing after it.

    Raises:
        ScValError: truncated, trailing bytes, an unknown arm or code, bad padding, too deep.
    """
    try:
        value, end = _val(raw, 0, 0)
    except struct.error as exc:  # a fixed-size read past the end
        raise ScValError(f"truncated: {exc}") from None
    if end != len(raw):
        raise ScValError(f"{len(raw) - end} trailing bytes after the ScVal at offset {end}")
    return value


def from_base64(text: str) -> Any:
    """The SEP-51 JSON of a base64 XDR ``SCVal`` (as ``getEvents`` serves topics and values).

    Raises:
        ScValError: not base64 (strictly: no whitespace, right padding), or see :func:`from_bytes`.
    """
    return from_bytes(_base64(text))


def _base64(text: str) -> bytes:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a non-ASCII str
        raise ScValError(f"not base64: {exc}") from None


def addresses_in(value: Any) -> tuple[str, ...]:
    """The address strkeys anywhere in a SEP-51 JSON value, in order (repeats kept)."""
    found: list[str] = []
    _collect(value, found)
    return tuple(found)


def _collect(value: Any, found: list[str]) -> None:
    if not isinstance(value, dict):
        return
    for arm, body in value.items():
        if arm == "address":
            found.append(body)
        elif arm == "vec" and body:
            for item in body:
                _collect(item, found)
        elif arm == "map" and body:
            for entry in body:
                _collect(entry["key"], found)
                _collect(entry["val"], found)
        elif arm == "contract_instance":
            executable = body["executable"]
            if isinstance(executable, dict) and "external_ref" in executable:
                found.append(executable["external_ref"]["executable_owner"])
            for entry in body["storage"] or ():
                _collect(entry["key"], found)
                _collect(entry["val"], found)


def decode(text: str) -> Decoded:
    """A base64 XDR ``SCVal`` decoded (:func:`from_base64`), its compact JSON and its addresses.

    Raises:
        ScValError: see :func:`from_base64`.
    """
    value = from_base64(text)
    return Decoded(value, orjson.dumps(value).decode(), addresses_in(value))


_I128 = b"\0\0\0\n"


def i128_of(text: str) -> str | None:
    """The decimal amount of a base64 XDR ``SCVal`` when it is an ``i128`` (most events' value),
    else None: the short way to :func:`decode`'s ``{"i128": amount}``, for the per-event path."""
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 20 or raw[:4] != _I128:
        return None
    hi, lo = _QQ_SIGNED(raw, 4)
    return str(hi << 64 | lo)


class DecodeCache:
    """:func:`decode` behind a bounded dict from the base64 text: events repeat their topics (the
    symbol ``transfer``, the same accounts, the same asset) and often their values. Cleared whole
    when full: cheaper per hit than an LRU's bookkeeping, and refilled within a few ledgers.
    Errors are not cached (they are rare, and the message is built again)."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self.limit = limit
        self.entries: dict[str, Decoded] = {}

    def __call__(self, text: str) -> Decoded:
        """:func:`decode` of ``text``, from the cache when seen.

        Raises:
            ScValError: see :func:`from_base64`.
        """
        hit = self.entries.get(text)
        if hit is not None:
            return hit
        decoded = decode(text)
        if len(self.entries) >= self.limit:
            self.entries.clear()
        self.entries[text] = decoded
        return decoded
