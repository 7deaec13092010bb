"""Stellar StrKey encoding (SEP-23), pure: what the simulator, the event decoder and the watch
lists share.

A StrKey is base32 (RFC 4648, no padding) of: one version byte, the payload, and the CRC16-XModem
of both, little-endian. Implemented here so that neither the node's hot path nor the simulator's
runtime depends on stellar-sdk (which the tests check these against).
"""

from __future__ import annotations

import base64
import binascii

ACCOUNT, CONTRACT, MUXED, CLAIMABLE_BALANCE, LIQUIDITY_POOL = 6 << 3, 2 << 3, 12 << 3, 1 << 3, 11 << 3
"""Strkey version bytes (SEP-23): G, C, M, B, L."""


def strkey(version: int, payload: bytes) -> str:
    """The strkey of ``payload`` with ``version`` (one of the version bytes above): base32 of the
    version byte, the payload and their CRC16-XModem (``crc_hqx`` from 0), little-endian, with the
    base32 padding left off."""
    data = bytes((version,)) + payload
    data += binascii.crc_hqx(data, 0).to_bytes(2, "little")
    return base32(data)


# base32 without padding. The standard library's is a Python loop over 5-byte chunks (4 us for a
# strkey); here the bits are spread in a few big-int steps, each 5-bit group moved into a byte of
# its own (in log2(groups) halvings: a block's upper half moves up by 3 bits a group), then the
# bytes become letters in one translate. Twice as fast: a new address costs a strkey per topic.
_BASE32 = bytes(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[i] if i < 32 else 0 for i in range(256))


def _spread_steps(slots: int) -> tuple[tuple[int, int, int], ...]:
    """(upper halves' mask, the rest's mask, shift) per halving of ``slots`` 5-bit groups (a power
    of two) into bytes."""
    steps = []
    block = slots
    while block > 1:
        half = block // 2
        mask = 0
        for base in range(0, slots * 8, block * 8):  # a block's final place; its bits packed by 5
            mask |= ((1 << (block - half) * 5) - 1) << (base + half * 5)
        steps.append((mask, ~mask, 3 * half))
        block = half
    return tuple(steps)


_SPREADS = {1 << k: _spread_steps(1 << k) for k in range(8)}  # up to 128 groups: 80 bytes


def base32(data: bytes) -> str:
    """RFC 4648 base32 of ``data`` (at most 80 bytes), without padding."""
    pad = -len(data) % 5
    groups = (len(data) + pad) * 8 // 5
    slots = 1 << (groups - 1).bit_length()
    bits = int.from_bytes(data, "big") << pad * 8
    for mask, rest, shift in _SPREADS[slots]:
        bits = (bits & mask) << shift | bits & rest
    letters = bits.to_bytes(slots, "big")[slots - groups : slots - groups + (len(data) * 8 + 4) // 5]
    return letters.translate(_BASE32).decode("ascii")


def crc16_xmodem(data: bytes) -> int:
    """CRC16-XModem (polynomial 0x1021, initial value 0), as StrKey checksums use."""
    return binascii.crc_hqx(data, 0)


def encode_account(payload: bytes) -> str:
    """A ``G...`` account id for a 32-byte ed25519 public key."""
    if len(payload) != 32:
        raise ValueError(f"a StrKey payload is 32 bytes, got {len(payload)}")
    return strkey(ACCOUNT, payload)


def encode_contract(payload: bytes) -> str:
    """A ``C...`` contract id for a 32-byte contract hash."""
    if len(payload) != 32:
        raise ValueError(f"a StrKey payload is 32 bytes, got {len(payload)}")
    return strkey(CONTRACT, payload)


def is_valid_account(text: str) -> bool:
    """True when ``text`` is a well-formed ``G...`` account id with a correct checksum."""
    if len(text) != 56 or not text.startswith("G"):
        return False
    try:
        raw = base64.b32decode(text)
    except (binascii.Error, ValueError):
        return False
    body, checksum = raw[:-2], raw[-2:]
    return body[0] == ACCOUNT and crc16_xmodem(body).to_bytes(2, "little") == checksum
