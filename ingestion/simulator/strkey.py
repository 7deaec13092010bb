"""Stellar StrKey encoding (SEP-23) for account (G...) and contract (C...) ids. Pure, no I/O.

A StrKey is base32 (RFC 4648, no padding) of: one version byte, the 32-byte payload, and the
CRC16-XModem of those 33 bytes, little-endian. Implemented here so that the simulator's runtime does
not depend on stellar-sdk.
"""

from __future__ import annotations

import base64
import binascii

ACCOUNT_VERSION = 6 << 3  # "G"
CONTRACT_VERSION = 2 << 3  # "C"


def crc16_xmodem(data: bytes) -> int:
    """CRC16-XModem (polynomial 0x1021, initial value 0), as StrKey checksums use."""
    return binascii.crc_hqx(data, 0)


def encode(version: int, payload: bytes) -> str:
    """Encode a 32-byte payload under a version byte (``ACCOUNT_VERSION``, ``CONTRACT_VERSION``)."""
    if len(payload) != 32:
        raise ValueError(f"a StrKey payload is 32 bytes, got {len(payload)}")
    body = bytes([version]) + payload
    return base64.b32encode(body + crc16_xmodem(body).to_bytes(2, "little")).decode("ascii")


def encode_account(payload: bytes) -> str:
    """A ``G...`` account id for an ed25519 public key."""
    return encode(ACCOUNT_VERSION, payload)


def encode_contract(payload: bytes) -> str:
    """A ``C...`` contract id for a contract hash."""
    return encode(CONTRACT_VERSION, payload)


def is_valid_account(text: str) -> bool:
    """True when ``text`` is a well-formed ``G...`` account id with a correct checksum."""
    if len(text) != 56 or not text.startswith("G"):
        return False
    try:
        raw = base64.b32decode(text)
    except (binascii.Error, ValueError):
        return False
    body, checksum = raw[:-2], raw[-2:]
    return body[0] == ACCOUNT_VERSION and crc16_xmodem(body).to_bytes(2, "little") == checksum
