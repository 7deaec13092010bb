"""Horizon paging tokens: parsing and ordering. Pure: no I/O.

Ledgers, transactions and operations use a TOID, a non-negative int64 written in decimal. Effects use
``"<operation toid>-<n>"``. Tokens must be compared as numbers (pairs for effects), never as strings:
``"9" < "10"`` is false as strings. The same rule is implemented in Lua inside the commit script
(``ingestion/lease_store.py``), which compares decimal strings by (length, text) because Redis's Lua
numbers are doubles and cannot hold every int64 exactly.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"(0|[1-9][0-9]{0,18})(?:-(0|[1-9][0-9]{0,9}))?")

TOID_LEDGER_SHIFT = 32
TOID_TX_SHIFT = 12
TOID_TX_MASK = (1 << 20) - 1
TOID_OP_MASK = (1 << 12) - 1


class InvalidPagingToken(ValueError):
    """A paging token that is neither a TOID nor an effect id ``"<toid>-<n>"``."""


def token_key(token: str) -> tuple[int, int]:
    """Return the sort key of a paging token: ``(toid, n)``, ``n`` being 0 for plain TOIDs.

    Raises:
        InvalidPagingToken: the token is not a well-formed paging token.
    """
    m = _TOKEN.fullmatch(token)
    if m is None:
        raise InvalidPagingToken(f"not a Horizon paging token: {token!r}")
    toid = int(m.group(1))
    if toid >= 1 << 63:
        raise InvalidPagingToken(f"paging token out of int64 range: {token!r}")
    return toid, int(m.group(2) or 0)


def is_after(token: str, previous: str | None) -> bool:
    """True when ``token`` sorts strictly after ``previous`` (anything is after ``None``)."""
    return previous is None or token_key(token) > token_key(previous)


def toid(ledger: int, tx_order: int = 0, op_index: int = 0) -> int:
    """Compose a TOID: ledger sequence in the top 32 bits, transaction order 20 bits, op index 12."""
    if not (0 <= ledger < 1 << 31 and 0 <= tx_order <= TOID_TX_MASK and 0 <= op_index <= TOID_OP_MASK):
        raise ValueError(f"TOID parts out of range: {ledger}, {tx_order}, {op_index}")
    return (ledger << TOID_LEDGER_SHIFT) | (tx_order << TOID_TX_SHIFT) | op_index


def toid_parts(value: int) -> tuple[int, int, int]:
    """Split a TOID into (ledger, transaction order, operation index)."""
    return (
        value >> TOID_LEDGER_SHIFT,
        (value >> TOID_TX_SHIFT) & TOID_TX_MASK,
        value & TOID_OP_MASK,
    )
