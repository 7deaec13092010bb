"""What the simulated chain's records are: paging keys and tokens, what determines the chain, one
ledger's content, Horizon's type codes and formats. Pure.

Paging keys: every record has an integer key ``toid << 16 | n`` where ``n`` is 0 except for
effects (``"<op toid>-<n>"``). Keys sort exactly as Horizon orders paging tokens, and one ledger's
records of all kinds share one key space (ledger ``toid(seq)``, transactions ``toid(seq, t)``,
operations ``toid(seq, t, o)``, effects ``toid(seq, t, o) << 16 | n``), so one dict per ledger
finds any of them.

Links inside records use :data:`PLACEHOLDER_BASE`; the server swaps in the base URL of the request.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import attrs

PLACEHOLDER_BASE = "http://horizon.invalid"
KEY_SHIFT = 16
COLLECTIONS = ("ledgers", "transactions", "operations", "payments", "effects", "trades")
ACCOUNT_COLLECTIONS = ("transactions", "operations", "payments", "effects", "trades")
#: Trades of an operation have keys ``key_of(op, TRADE_BASE + order)``: beside its effects
#: (``key_of(op, n)``, n small) in one key space; their tokens are ``"<op>-<order>"``.
TRADE_BASE = 0x8000
POOLS = 4  # liquidity pools, fixed per seed
# Horizon's /payments: these types, and invoke_host_function operations that move assets (SAC
# transfers: is_payment in Horizon's history_operations).
PAYMENT_TYPES = frozenset(
    {
        "create_account",
        "payment",
        "path_payment_strict_receive",
        "path_payment_strict_send",
        "account_merge",
    }
)
NETWORK_PASSPHRASE = "Standalone Network ; February 2017"
PROTOCOL_VERSION = 23
OPERATION_TYPE_I = {
    "create_account": 0,
    "payment": 1,
    "path_payment_strict_receive": 2,
    "manage_sell_offer": 3,
    "set_options": 5,
    "change_trust": 6,
    "account_merge": 8,
    "manage_buy_offer": 12,
    "path_payment_strict_send": 13,
    "create_claimable_balance": 14,
    "claim_claimable_balance": 15,
    "liquidity_pool_deposit": 22,
    "liquidity_pool_withdraw": 23,
    "invoke_host_function": 24,
}
EFFECT_TYPE_I = {
    "account_created": 0,
    "account_removed": 1,
    "account_credited": 2,
    "account_debited": 3,
    "account_thresholds_updated": 4,
    "account_home_domain_updated": 5,
    "signer_created": 10,
    "trustline_created": 20,
    "trade": 33,
    "claimable_balance_created": 50,
    "claimable_balance_claimant_created": 51,
    "claimable_balance_claimed": 52,
    "liquidity_pool_deposited": 90,
    "liquidity_pool_withdrew": 91,
    "contract_credited": 96,
    "contract_debited": 97,
}


def key_of(toid_value: int, n: int = 0) -> int:
    """The paging key of a TOID (``n`` = 0) or of effect ``n`` of an operation."""
    return toid_value << KEY_SHIFT | n


def token_of(key: int) -> str:
    """The Horizon paging token of a key: ``"<toid>"``, ``"<toid>-<n>"`` for effects, and
    ``"<operation>-<order>"`` (order from 0) for trades."""
    n = key & 0xFFFF
    if n >= TRADE_BASE:
        return f"{key >> KEY_SHIFT}-{n - TRADE_BASE}"
    return str(key >> KEY_SHIFT) if n == 0 else f"{key >> KEY_SHIFT}-{n}"


def pool_ids(seed: int) -> list[str]:
    """The liquidity pools of a chain (they exist from its first ledger)."""
    return [hashlib.sha256(f"pool:{seed}:{i}".encode()).hexdigest() for i in range(POOLS)]


def amount(stroops: int) -> str:
    """Horizon's amount format: 7 decimals."""
    return f"{stroops // 10_000_000}.{stroops % 10_000_000:07d}"


def timestamp(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@attrs.frozen
class ChainSpec:
    """What determines the chain. Two chains with equal specs hold identical records."""

    seed: int = 1
    ops_per_ledger: int = 20
    first_ledger: int = 50_000_000
    genesis_time: int = 1_735_689_600  # 2025-01-01T00:00:00Z, closed_at of the first ledger
    close_seconds: int = 5  # closed_at advances this much per ledger, whatever the real interval

    def closed_at(self, sequence: int) -> int:
        return self.genesis_time + (sequence - self.first_ledger) * self.close_seconds


@attrs.define
class LedgerContent:
    """One ledger's records (with placeholder links), keyed by paging key, plus index facts."""

    sequence: int
    records: dict[int, dict[str, Any]]
    kinds: dict[str, list[int]]  # collection -> keys in order (ledgers, transactions, ...)
    participants: dict[int, frozenset[str]]  # tx/op key -> accounts involved
    tx_hashes: dict[str, int]
    # key -> (kind, id) of the pools, claimable balances and offers it touches
    entities: dict[int, frozenset[tuple[str, str]]] = attrs.Factory(dict)
    compact: dict[int, bytes] = attrs.Factory(dict)  # key -> stream form (render.compact_form)
    pretty: dict[int, bytes] = attrs.Factory(dict)  # key -> page form (render.page_form)

    @property
    def size(self) -> int:
        return len(self.records)


def ledger_hash_of(seed: int, sequence: int) -> str:
    return hashlib.sha256(f"ledger:{seed}:{sequence}".encode()).hexdigest()

