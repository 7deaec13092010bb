"""Horizon paging tokens: TOIDs, and the ordering rule from :mod:`actors.cursor_order`. Pure.

Ledgers, transactions and operations use a TOID, a non-negative int64 written in decimal. Effects use
``"<operation toid>-<n>"``. Tokens must be compared as numbers (pairs for effects), never as strings:
``"9" < "10"`` is false as strings. The same rule is implemented in Lua inside the commit script
(``actors/lease_store/lua/commit.lua``), which compares decimal strings by (length, text) because Redis's Lua
numbers are doubles and cannot hold every int64 exactly.
"""

from __future__ import annotations

from actors.cursor_order import InvalidPagingToken, ascending_after, is_after, token_key

__all__ = [
    "TOID_LEDGER_SHIFT",
    "InvalidPagingToken",
    "ascending_after",
    "is_after",
    "toid",
    "toid_parts",
    "token_key",
]

TOID_LEDGER_SHIFT = 32
TOID_TX_SHIFT = 12
TOID_TX_MASK = (1 << 20) - 1
TOID_OP_MASK = (1 << 12) - 1


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
