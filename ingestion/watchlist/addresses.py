"""Watch-list entries: strkey addresses (SEP-23) checked in full, one by one and in bulk.

Entries are strkeys: base32 of a version byte, the payload and the CRC16-XModem of both
(little-endian). Accepted: ``G`` accounts, ``C`` contracts, ``M`` muxed accounts, ``B`` claimable
balances, ``L`` liquidity pools; each is checked in full (alphabet, length, version byte, unused
bits, checksum), so a mistyped character is refused instead of silently watching nothing. A list
of 1,000,000 entries is checked in bulk (:func:`valid_entries`, :func:`shaped_entries`) far faster
than one by one; an ``M`` address's ``G`` account is decoded by :func:`account_of_muxed`.
"""

from __future__ import annotations

import binascii
import functools
import itertools
import operator
import struct

import attrs
import structlog

from ingestion.common.strkey import (
    ACCOUNT,
    CLAIMABLE_BALANCE,
    CONTRACT,
    LIQUIDITY_POOL,
    MUXED,
    encode_account,
)

log = structlog.get_logger()

EXAMPLES = 5  # invalid members named in a report
MUXED_CACHE = 4096  # M addresses whose G account is kept decoded

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# base32 -> the digits int(..., 32) reads; every other byte -> "!", which int() refuses (so no
# whitespace, underscore or sign slips through as it would into int())
_DIGITS = bytearray(b"!" * 256)
for _value, _char in enumerate(_ALPHABET):
    _DIGITS[_char] = b"0123456789abcdefghijklmnopqrstuv"[_value]
_TO_DIGITS = bytes(_DIGITS)


@attrs.frozen
class _Kind:
    name: str  # with its article, as a message says it ("an account")
    version: int  # the version byte
    payload: int  # payload bytes
    chars: int  # strkey length: ceil((1 + payload + 2) * 8 / 5)
    pad: int  # unused low bits of the last character (must be zero: one canonical spelling)


def _kind(name: str, version: int, payload: int) -> _Kind:
    bits = (1 + payload + 2) * 8
    chars = -(-bits // 5)
    return _Kind(name, version, payload, chars, chars * 5 - bits)


KINDS: dict[str, _Kind] = {
    "G": _kind("an account", ACCOUNT, 32),
    "C": _kind("a contract", CONTRACT, 32),
    "M": _kind("a muxed account", MUXED, 40),  # ed25519 key (32) and id (8)
    "B": _kind("a claimable balance", CLAIMABLE_BALANCE, 33),  # type byte (0: v0) and hash (32)
    "L": _kind("a liquidity pool", LIQUIDITY_POOL, 32),
}


class InvalidAddress(ValueError):
    """A watch-list entry that is not a valid G, C, M, B or L strkey; the message names it."""


def _decoded(text: str, kind: _Kind) -> int | None:
    """The strkey's bits without the padding, or None when the alphabet or padding is wrong."""
    try:
        value = int(text.encode("ascii").translate(_TO_DIGITS), 32)
    except (UnicodeEncodeError, ValueError):
        return None
    if value & ((1 << kind.pad) - 1):
        return None
    return value >> kind.pad


def _checked(value: int, kind: _Kind) -> bool:
    body, checksum = value >> 16, value & 0xFFFF
    if body >> (kind.payload * 8) != kind.version:
        return False
    expected = binascii.crc_hqx(body.to_bytes(1 + kind.payload, "big"), 0)
    return expected == ((checksum & 0xFF) << 8 | checksum >> 8)  # stored little-endian


def is_address(text: str) -> bool:
    """Whether ``text`` is a valid G, C, M, B or L strkey (about 1 µs: reloads check a million)."""
    kind = KINDS.get(text[:1])
    if kind is None or len(text) != kind.chars:
        return False
    value = _decoded(text, kind)
    return value is not None and _checked(value, kind)


def address_problem(text: object) -> str | None:
    """What is wrong with ``text`` as a watch-list entry, in an operator's words, or None."""
    if not isinstance(text, str):
        return f"{text!r} is not a string"
    kind = KINDS.get(text[:1])
    if kind is None:
        return f"{text!r} is not a G, C, M, B or L address (a strkey starts with one of those letters)"
    if len(text) != kind.chars:
        return f"{text!r} has {len(text)} characters; {kind.name} address ({text[0]}...) has {kind.chars}"
    value = _decoded(text, kind)
    if value is None:
        return f"{text!r} is not base32 as a strkey spells it (upper-case A-Z and 2-7, nothing else)"
    if (value >> 16) >> (kind.payload * 8) != kind.version:
        return f"{text!r} has the wrong version byte for {kind.name} address"
    if not _checked(value, kind):
        return f"{text!r} fails its checksum (a mistyped character?)"
    return None


def check_address(text: str) -> str:
    """``text`` when it is a valid entry.

    Raises:
        InvalidAddress: it is not; the message says why.
    """
    problem = address_problem(text)
    if problem is not None:
        raise InvalidAddress(problem)
    return text


@attrs.define
class Skipped:
    """Invalid entries met while building a list: a count and the first few."""

    count: int = 0
    examples: list[str] = attrs.Factory(list)

    def add(self, entry: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(entry)


_FIXED_CHARS = 56  # G, C and L strkeys: 35 bytes, 280 bits, no unused bits
_FIXED_VERSIONS = frozenset(KINDS[k].version for k in "GCL")


_RECORD = struct.Struct("35s")  # a G, C or L strkey decoded: version, payload 32, checksum 2
_first = operator.itemgetter(0)


def _all_valid(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` is a valid G, C or L strkey, checked all at once.

    A reload checks up to a million entries, and one at a time (:func:`is_address`) costs about
    1.3 µs each in Python calls. Here the chunk is joined and decoded as one base32 number, cut
    into 35-byte records and checksummed by ``map``: every loop is in C. Each record's checksum
    is first swapped to big-endian (two slice assignments over the chunk), because the XModem CRC
    of a message followed by its own CRC, big-endian, is 0: then one ``crc_hqx`` call per record
    says valid or not, with nothing to compare afterwards. False when any entry is of another
    kind or invalid; the caller then checks them one by one.

    ``struct.iter_unpack`` makes one short tuple per record: each is freed as soon as the next is
    made, so the count of live container objects, which is what triggers a garbage collection
    (one that would walk a million-entry set), does not grow.
    """
    if not chunk or set(map(len, chunk)) != {_FIXED_CHARS}:
        return False
    try:
        value = int("".join(chunk).encode("ascii").translate(_TO_DIGITS), 32)
    except (UnicodeEncodeError, ValueError):
        return False
    raw = bytearray(value.to_bytes(35 * len(chunk), "big"))
    if not set(raw[0::35]) <= _FIXED_VERSIONS:  # the version bytes (they fix the first letters)
        return False
    raw[33::35], raw[34::35] = raw[34::35], raw[33::35]
    return not any(map(binascii.crc_hqx, map(_first, _RECORD.iter_unpack(raw)), itertools.repeat(0)))


def every_valid(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` is valid: the G, C and L entries in bulk, M and B (rare)
    one by one."""
    if _all_valid(chunk):
        return True
    fixed = [entry for entry in chunk if len(entry) == _FIXED_CHARS]
    if fixed and not _all_valid(fixed):
        return False
    return len(fixed) < len(chunk) and all(is_address(e) for e in chunk if len(e) != _FIXED_CHARS)


def valid_entries(chunk: list[str], skipped: Skipped | None = None) -> list[str]:
    """The valid entries of ``chunk`` (the chunk itself when all are); the others go to ``skipped``."""
    if every_valid(chunk):
        return chunk
    valid = []
    for entry in chunk:
        if is_address(entry):
            valid.append(entry)
        elif skipped is not None:
            skipped.add(entry)
    return valid


_SHAPES = frozenset((letter, kind.chars) for letter, kind in KINDS.items())
_FIXED_LETTERS = frozenset("GCL")


def has_address_shape(text: str) -> bool:
    """Whether ``text`` looks like a strkey: a G, C, M, B or L, that kind's length, and base32.

    The checksum is not checked: see :class:`RedisWatch` for why a reload of the Redis set
    needs no more than this.
    """
    kind = KINDS.get(text[:1])
    return (
        kind is not None and len(text) == kind.chars and text.isascii()
        and not text.encode("ascii").translate(None, _ALPHABET)
    )  # fmt: skip


def _all_shaped(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` has a strkey's shape (:func:`has_address_shape`), checked
    all at once: each step is one C loop over the chunk (lengths, first letters, and the joined
    chunk's characters against the base32 alphabet)."""
    if not chunk:
        return True
    if set(map(len, chunk)) == {_FIXED_CHARS}:
        joined = "".join(chunk)
        if not set(joined[::_FIXED_CHARS]) <= _FIXED_LETTERS:
            return False
    else:
        if "" in chunk or not set(zip(map(_first, chunk), map(len, chunk), strict=True)) <= _SHAPES:
            return False
        joined = "".join(chunk)
    # str.isascii() is a flag the string carries: free; the rest is one pass over the bytes
    return joined.isascii() and not joined.encode("ascii").translate(None, _ALPHABET)


def shaped_entries(chunk: list[str], skipped: Skipped) -> list[str]:
    """The entries of ``chunk`` shaped as strkeys (the chunk itself when all are); the others go
    to ``skipped``."""
    if _all_shaped(chunk):
        return chunk
    shaped = []
    for entry in chunk:
        if has_address_shape(entry):
            shaped.append(entry)
        else:
            skipped.add(entry)
    return shaped


@functools.lru_cache(maxsize=MUXED_CACHE)
def account_of_muxed(text: str) -> str | None:
    """The G account under a valid M address (version, key 32, id 8, checksum 2), else None."""
    kind = KINDS["M"]
    if text[:1] != "M" or not is_address(text):
        return None
    value = _decoded(text, kind)
    assert value is not None
    key = (value >> (16 + 64)) & ((1 << 256) - 1)
    return encode_account(key.to_bytes(32, "big"))
