"""The simulated ledger chain: deterministic, joined Horizon records and their paging indexes. Pure.

Every ledger's content is a function of ``(seed, sequence)`` only, so the chain is the same in
every process with the same seed and any ledger can be rebuilt on demand. Ledgers are built when
first needed and kept in an LRU, so the chain's memory does not grow with its length; only the
per-account and per-transaction-hash indexes do, and only once someone asks for them.

Paging keys: every record has an integer key ``toid << 16 | n`` where ``n`` is 0 except for
effects (``"<op toid>-<n>"``). Keys sort exactly as Horizon orders paging tokens, and one ledger's
records of all kinds share one key space (ledger ``toid(seq)``, transactions ``toid(seq, t)``,
operations ``toid(seq, t, o)``, effects ``toid(seq, t, o) << 16 | n``), so one dict per ledger
finds any of them.

Links inside records use :data:`PLACEHOLDER_BASE`; the server swaps in the base URL of the request.
"""

from __future__ import annotations

import base64
import bisect
import gc
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import attrs

from ingestion.common.paging import toid
from ingestion.simulator import strkey

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
# Operation mix: (type, weight).
OPERATION_MIX: tuple[tuple[str, int], ...] = (
    ("payment", 32),
    ("account_merge", 2),
    ("create_account", 8),
    ("path_payment_strict_send", 8),
    ("path_payment_strict_receive", 6),
    ("manage_sell_offer", 11),
    ("manage_buy_offer", 5),
    ("change_trust", 8),
    ("invoke_host_function", 10),
    ("set_options", 6),
    ("create_claimable_balance", 2),
    ("claim_claimable_balance", 1),
    ("liquidity_pool_deposit", 1),
    ("liquidity_pool_withdraw", 1),
)
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
_OPERATION_TABLE = tuple(t for t, weight in OPERATION_MIX for _ in range(weight))
_CREDIT_ASSETS = (("USDC", 0), ("EURC", 1), ("BTC", 2), ("AQUA", 3), ("yUSDC", 4), ("SHX", 5))
_MAX_LIMIT = "922337203685.4775807"


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


def _asset_text(asset: Asset) -> str:
    return "native" if asset is None else f"{asset[1]}:{asset[2]}"


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


Asset = tuple[str, str, str] | None  # (asset_type, code, issuer); None is native


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


class _LedgerBuilder:
    """Builds one ledger's records. All randomness comes from ``random.Random(seed, seq)``."""

    def __init__(
        self,
        spec: ChainSpec,
        accounts: Sequence[str],
        contracts: Sequence[str],
        seq: int,
        closed_at: int | None = None,
    ):
        self.spec = spec
        self.closed_at = spec.closed_at(seq) if closed_at is None else closed_at
        self.accounts = accounts
        self.contracts = contracts
        self.seq = seq
        self.rng = random.Random(f"horizon-simulator:{spec.seed}:{seq}")
        self.random = self.rng.random
        self.created_at = timestamp(self.closed_at)
        self.assets: list[Asset] = [None] + [
            ("credit_alphanum4" if len(code) <= 4 else "credit_alphanum12", code, accounts[i])
            for code, i in _CREDIT_ASSETS
        ]
        self.records: dict[int, dict[str, Any]] = {}
        self.kinds: dict[str, list[int]] = {c: [] for c in COLLECTIONS}
        self.participants: dict[int, frozenset[str]] = {}
        self.tx_hashes: dict[str, int] = {}
        self.entities: dict[int, frozenset[tuple[str, str]]] = {}
        self.pools = [
            (pool, self.assets[(2 * i) % len(self.assets)], self.assets[(2 * i + 1) % len(self.assets)])
            for i, pool in enumerate(pool_ids(spec.seed))
        ]
        self.balances: list[tuple[str, Asset, str, int]] = []  # created in this ledger, unclaimed
        self._op_toid = 0  # the operation being built
        self._touched: set[tuple[str, str]] = set()  # entities of the operation being built
        self._trades: list[dict[str, Any]] = []  # trades of the operation being built

    # -- helpers --------------------------------------------------------------------------------

    def account(self) -> str:
        # The first accounts issue the credit assets; the rest are ordinary holders.
        return self.accounts[6 + int(self.random() * (len(self.accounts) - 6))]

    def asset(self) -> Asset:
        return self.assets[int(self.random() * len(self.assets))]

    def stroops(self, low: int = 1_000_000, high: int = 50_000_000_000) -> int:
        return low + int(self.random() * (high - low))

    def b64(self, n: int) -> str:
        return base64.b64encode(self.rng.randbytes(n)).decode("ascii")

    @staticmethod
    def asset_fields(prefix: str, asset: Asset) -> dict[str, str]:
        if asset is None:
            return {f"{prefix}asset_type": "native"}
        kind, code, issuer = asset
        return {
            f"{prefix}asset_type": kind,
            f"{prefix}asset_code": code,
            f"{prefix}asset_issuer": issuer,
        }

    # -- records --------------------------------------------------------------------------------

    def build(self) -> LedgerContent:
        seq = self.seq
        remaining = self.spec.ops_per_ledger
        tx_order = 0
        op_total = 0
        while remaining > 0:
            tx_order += 1
            n_ops = min(remaining, self.rng.choice((1, 1, 1, 1, 2, 2, 3, 5)))
            remaining -= n_ops
            op_total += n_ops
            self.transaction(tx_order, n_ops)
        ledger_key = key_of(toid(seq))
        base = PLACEHOLDER_BASE
        ledger_hash = ledger_hash_of(self.spec.seed, seq)
        self.records[ledger_key] = {
            "_links": {
                "self": {"href": f"{base}/ledgers/{seq}"},
                **{
                    name: {
                        "href": f"{base}/ledgers/{seq}/{name}{{?cursor,limit,order}}",
                        "templated": True,
                    }
                    for name in ("transactions", "operations", "payments", "effects")
                },
            },
            "id": ledger_hash,
            "paging_token": str(toid(seq)),
            "hash": ledger_hash,
            "prev_hash": ledger_hash_of(self.spec.seed, seq - 1),
            "sequence": seq,
            "successful_transaction_count": tx_order,
            "failed_transaction_count": 0,
            "operation_count": op_total,
            "tx_set_operation_count": op_total,
            "closed_at": self.created_at,
            "total_coins": "105443902087.3472865",
            "fee_pool": amount(
                47_610_684_157_944 + (seq - self.spec.first_ledger) * 100 * op_total
            ),
            "base_fee_in_stroops": 100,
            "base_reserve_in_stroops": 5_000_000,
            "max_tx_set_size": 1000,
            "protocol_version": PROTOCOL_VERSION,
            "header_xdr": self.b64(336),
        }
        self.kinds["ledgers"].append(ledger_key)
        return LedgerContent(
            seq, self.records, self.kinds, self.participants, self.tx_hashes, self.entities
        )

    def transaction(self, tx_order: int, n_ops: int) -> None:
        seq, base = self.seq, PLACEHOLDER_BASE
        tx_toid = toid(seq, tx_order)
        tx_key = key_of(tx_toid)
        tx_hash = hashlib.sha256(f"tx:{self.spec.seed}:{seq}:{tx_order}".encode()).hexdigest()
        source = self.account()
        involved = {source}
        touched: set[tuple[str, str]] = set()
        for op_index in range(1, n_ops + 1):
            involved |= self.operation(tx_toid, op_index, tx_hash, source)
            touched |= self.entities.get(key_of(tx_toid + op_index), frozenset())
        if touched:
            self.entities[tx_key] = frozenset(touched)
        fee = 100 * n_ops
        record: dict[str, Any] = {}
        memo_roll = self.rng.random()
        if memo_roll < 0.3:
            memo = f"ref-{self.rng.randrange(10**6):06d}"
            record["memo"] = memo
            record["memo_bytes"] = base64.b64encode(memo.encode()).decode("ascii")
            memo_type = "text"
        elif memo_roll < 0.4:
            record["memo"] = str(self.rng.randrange(1, 10**12))
            memo_type = "id"
        else:
            memo_type = "none"
        tx_path = f"{base}/transactions/{tx_hash}"
        record["_links"] = {
            "self": {"href": tx_path},
            "account": {"href": f"{base}/accounts/{source}"},
            "ledger": {"href": f"{base}/ledgers/{seq}"},
            "operations": {
                "href": f"{tx_path}/operations{{?cursor,limit,order}}",
                "templated": True,
            },
            "effects": {"href": f"{tx_path}/effects{{?cursor,limit,order}}", "templated": True},
            "precedes": {"href": f"{base}/transactions?order=asc&cursor={tx_toid}"},
            "succeeds": {"href": f"{base}/transactions?order=desc&cursor={tx_toid}"},
            "transaction": {"href": tx_path},
        }
        record.update(
            {
                "id": tx_hash,
                "paging_token": str(tx_toid),
                "successful": True,
                "hash": tx_hash,
                "ledger": seq,
                "created_at": self.created_at,
                "source_account": source,
                "source_account_sequence": str(self.rng.randrange(1 << 40, 1 << 57)),
                "fee_account": source,
                "fee_charged": str(fee),
                "max_fee": str(fee * self.rng.choice((1, 1, 2, 10))),
                "operation_count": n_ops,
                "envelope_xdr": self.b64(96 + 72 * n_ops),
                "result_xdr": self.b64(12 + 12 * n_ops),
                "fee_meta_xdr": self.b64(204),
                "memo_type": memo_type,
                "signatures": [self.b64(64)],
                "preconditions": {
                    "timebounds": {
                        "min_time": "0",
                        "max_time": str(self.closed_at + 300),
                    }
                },
            }
        )
        self.records[tx_key] = record
        self.kinds["transactions"].append(tx_key)
        self.participants[tx_key] = frozenset(involved)
        self.tx_hashes[tx_hash] = tx_key

    def operation(self, tx_toid: int, op_index: int, tx_hash: str, source: str) -> set[str]:
        base = PLACEHOLDER_BASE
        op_toid = tx_toid + op_index
        op_key = key_of(op_toid)
        self._op_toid = op_toid
        op_type = _OPERATION_TABLE[int(self.random() * len(_OPERATION_TABLE))]
        record: dict[str, Any] = {
            "_links": {
                "self": {"href": f"{base}/operations/{op_toid}"},
                "transaction": {"href": f"{base}/transactions/{tx_hash}"},
                "effects": {"href": f"{base}/operations/{op_toid}/effects"},
                "succeeds": {"href": f"{base}/effects?order=desc&cursor={op_toid}"},
                "precedes": {"href": f"{base}/effects?order=asc&cursor={op_toid}"},
            },
            "id": str(op_toid),
            "paging_token": str(op_toid),
            "transaction_successful": True,
            "source_account": source,
            "type": op_type,
            "type_i": OPERATION_TYPE_I[op_type],
            "created_at": self.created_at,
            "transaction_hash": tx_hash,
        }
        effects: list[tuple[str, str, dict[str, Any]]] = []
        involved = {source}
        self._touched, self._trades = set(), []
        if op_type == "claim_claimable_balance" and not self.balances:
            op_type = "create_claimable_balance"  # nothing to claim yet in this ledger
            record.update(type=op_type, type_i=OPERATION_TYPE_I[op_type])
        getattr(self, f"op_{op_type}")(record, effects, involved, source)
        self.records[op_key] = record
        touched = frozenset(self._touched)
        if touched:
            self.entities[op_key] = touched
        for order, trade in enumerate(self._trades):
            trade_key = key_of(op_toid, TRADE_BASE + order)
            token = f"{op_toid}-{order}"
            self.records[trade_key] = {
                "_links": {
                    "self": {"href": ""},
                    "base": {"href": f"{base}/accounts/{trade['base_account']}"},
                    "counter": {"href": f"{base}/accounts/{trade['counter_account']}"},
                    "operation": {"href": f"{base}/operations/{op_toid}"},
                },
                "id": token,
                "paging_token": token,
                "ledger_close_time": self.created_at,
                **trade,
            }
            self.kinds["trades"].append(trade_key)
            self.participants[trade_key] = frozenset(
                (trade["base_account"], trade["counter_account"])
            )
            self.entities[trade_key] = frozenset(
                {("offers", trade["base_offer_id"]), ("offers", trade["counter_offer_id"])}
            )
        self.kinds["operations"].append(op_key)
        if op_type in PAYMENT_TYPES or record.get("asset_balance_changes"):
            self.kinds["payments"].append(op_key)
        self.participants[op_key] = frozenset(involved)
        for n, (effect_type, account, details) in enumerate(effects, start=1):
            key = key_of(op_toid, n)
            token = f"{op_toid}-{n}"
            self.records[key] = {
                "_links": {
                    "operation": {"href": f"{base}/operations/{op_toid}"},
                    "succeeds": {"href": f"{base}/effects?order=desc&cursor={token}"},
                    "precedes": {"href": f"{base}/effects?order=asc&cursor={token}"},
                },
                "id": f"{op_toid:019d}-{n:010d}",
                "paging_token": token,
                "account": account,
                "type": effect_type,
                "type_i": EFFECT_TYPE_I[effect_type],
                "created_at": self.created_at,
                **details,
            }
            self.kinds["effects"].append(key)
            if touched:
                self.entities[key] = touched
        return involved

    # -- one method per operation type: fill the record, list the effects, add participants ----

    def op_create_account(self, rec: dict, effects: list, involved: set, source: str) -> None:
        new = strkey.encode_account(self.rng.randbytes(32))
        balance = amount(self.stroops(10_000_000, 1_000_000_000))
        rec.update(starting_balance=balance, funder=source, account=new)
        effects.append(("account_created", new, {"starting_balance": balance}))
        effects.append(("account_debited", source, {"asset_type": "native", "amount": balance}))
        effects.append(("signer_created", new, {"weight": 1, "public_key": new}))
        involved.add(new)

    def op_account_merge(self, rec: dict, effects: list, involved: set, source: str) -> None:
        into, value = self.account(), amount(self.stroops(10_000_000, 1_000_000_000))
        rec.update(account=source, into=into)
        effects.append(("account_debited", source, {"asset_type": "native", "amount": value}))
        effects.append(("account_credited", into, {"asset_type": "native", "amount": value}))
        effects.append(("account_removed", source, {}))
        involved.add(into)

    def op_payment(self, rec: dict, effects: list, involved: set, source: str) -> None:
        asset, to, value = self.asset(), self.account(), amount(self.stroops())
        rec.update(self.asset_fields("", asset))
        rec.update({"from": source, "to": to, "amount": value})
        effects.append(("account_credited", to, {**self.asset_fields("", asset), "amount": value}))
        effects.append(
            ("account_debited", source, {**self.asset_fields("", asset), "amount": value})
        )
        involved.add(to)

    def _path_payment(
        self, rec: dict, effects: list, involved: set, source: str, strict_send: bool
    ) -> None:
        dest_asset, source_asset = self.asset(), self.asset()
        to = self.account()
        dest_amount, source_amount = self.stroops(), self.stroops()
        path = [
            self.asset_fields("", a)
            for a in self.rng.sample(self.assets[1:], self.rng.randrange(3))
        ]
        rec.update(self.asset_fields("", dest_asset))
        rec.update({"from": source, "to": to, "amount": amount(dest_amount), "path": path})
        rec["source_amount"] = amount(source_amount)
        if strict_send:
            rec["destination_min"] = amount(dest_amount * 99 // 100)
        else:
            rec["source_max"] = amount(source_amount * 101 // 100)
        rec.update(self.asset_fields("source_", source_asset))
        effects.append(
            (
                "account_credited",
                to,
                {**self.asset_fields("", dest_asset), "amount": amount(dest_amount)},
            )
        )
        effects.append(
            (
                "account_debited",
                source,
                {**self.asset_fields("", source_asset), "amount": amount(source_amount)},
            )
        )
        involved.add(to)
        if source_asset != dest_asset:
            self.trade(
                effects, involved, source, source_asset, source_amount, dest_asset, dest_amount
            )

    def op_path_payment_strict_send(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        self._path_payment(rec, effects, involved, source, strict_send=True)

    def op_path_payment_strict_receive(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        self._path_payment(rec, effects, involved, source, strict_send=False)

    def trade(
        self,
        effects: list,
        involved: set,
        buyer: str,
        sold: Asset,
        sold_amount: int,
        bought: Asset,
        bought_amount: int,
    ) -> None:
        """Two trade effects, as Horizon writes them: the taker's and the offer owner's."""
        seller = self.account()
        offer_id = str(self.rng.randrange(1, 1_700_000_000))
        effects.append(
            (
                "trade",
                buyer,
                {
                    "seller": seller,
                    "offer_id": offer_id,
                    "sold_amount": amount(sold_amount),
                    **self.asset_fields("sold_", sold),
                    "bought_amount": amount(bought_amount),
                    **self.asset_fields("bought_", bought),
                },
            )
        )
        effects.append(
            (
                "trade",
                seller,
                {
                    "seller": buyer,
                    "offer_id": offer_id,
                    "sold_amount": amount(bought_amount),
                    **self.asset_fields("sold_", bought),
                    "bought_amount": amount(sold_amount),
                    **self.asset_fields("bought_", sold),
                },
            )
        )
        involved.add(seller)
        # The trade as /trades shows it: the offer owner is the base, the taker the counter.
        base_amount, counter_amount = bought_amount, sold_amount
        self._trades.append(
            {
                "trade_type": "orderbook",
                "base_offer_id": offer_id,
                "base_account": seller,
                "base_amount": amount(base_amount),
                **self.asset_fields("base_", bought),
                # a taker without a resting offer gets a synthetic offer id: operation id | 2**62
                "counter_offer_id": str(self._op_toid | 1 << 62),
                "counter_account": buyer,
                "counter_amount": amount(counter_amount),
                **self.asset_fields("counter_", sold),
                "base_is_seller": True,
                "price": {"n": str(counter_amount), "d": str(base_amount)},
            }
        )

    # -- claimable balances and liquidity pools ------------------------------------------------

    def op_create_claimable_balance(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        asset, destination, stroops = self.asset(), self.account(), self.stroops()
        balance_id = "00000000" + hashlib.sha256(
            f"balance:{self.spec.seed}:{self._op_toid}".encode()
        ).hexdigest()
        value = amount(stroops)
        predicate = {"unconditional": True}
        rec.update(
            sponsor=source,
            asset=_asset_text(asset),
            amount=value,
            claimants=[{"destination": destination, "predicate": predicate}],
        )
        fields = {"asset": _asset_text(asset), "balance_id": balance_id, "amount": value}
        effects.append(("claimable_balance_created", source, fields))
        effects.append(
            ("claimable_balance_claimant_created", destination, {**fields, "predicate": predicate})
        )
        effects.append(
            ("account_debited", source, {**self.asset_fields("", asset), "amount": value})
        )
        self.balances.append((balance_id, asset, destination, stroops))
        self._touched.add(("claimable_balances", balance_id))

    def op_claim_claimable_balance(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        balance_id, asset, claimant, stroops = self.balances.pop(0)
        value = amount(stroops)
        rec.update(balance_id=balance_id, claimant=claimant)
        effects.append(
            (
                "claimable_balance_claimed",
                claimant,
                {"asset": _asset_text(asset), "balance_id": balance_id, "amount": value},
            )
        )
        effects.append(
            ("account_credited", claimant, {**self.asset_fields("", asset), "amount": value})
        )
        involved.add(claimant)
        self._touched.add(("claimable_balances", balance_id))

    def _pool(self) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
        pool_id, a, b = self.pools[self.rng.randrange(len(self.pools))]
        moved = [self.stroops(), self.stroops()]
        reserves = [self.stroops(10**12, 10**14), self.stroops(10**12, 10**14)]
        pair = [
            {"asset": _asset_text(asset), "amount": amount(v)}
            for asset, v in zip((a, b), moved, strict=True)
        ]
        state = {
            "id": pool_id,
            "fee_bp": 30,
            "type": "constant_product",
            "total_trustlines": str(self.rng.randrange(1, 5000)),
            "total_shares": amount(self.stroops(10**12, 10**14)),
            "reserves": [
                {"asset": _asset_text(asset), "amount": amount(v)}
                for asset, v in zip((a, b), reserves, strict=True)
            ],
        }
        self._touched.add(("liquidity_pools", pool_id))
        return pool_id, pair, state

    def op_liquidity_pool_deposit(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        pool_id, pair, state = self._pool()
        shares = amount(self.stroops())
        rec.update(
            liquidity_pool_id=pool_id,
            reserves_max=pair,
            min_price="1.0000000",
            min_price_r={"n": 1, "d": 1},
            max_price="2.0000000",
            max_price_r={"n": 2, "d": 1},
            reserves_deposited=pair,
            shares_received=shares,
        )
        effects.append(
            (
                "liquidity_pool_deposited",
                source,
                {"liquidity_pool": state, "reserves_deposited": pair, "shares_received": shares},
            )
        )

    def op_liquidity_pool_withdraw(
        self, rec: dict, effects: list, involved: set, source: str
    ) -> None:
        pool_id, pair, state = self._pool()
        shares = amount(self.stroops())
        rec.update(
            liquidity_pool_id=pool_id, reserves_min=pair, shares=shares, reserves_received=pair
        )
        effects.append(
            (
                "liquidity_pool_withdrew",
                source,
                {"liquidity_pool": state, "reserves_received": pair, "shares_redeemed": shares},
            )
        )

    def _offer(self, rec: dict, effects: list, involved: set, source: str) -> None:
        selling = self.asset()
        buying = self.rng.choice([a for a in self.assets if a != selling])
        n, d = self.rng.randrange(1, 10**9), self.rng.choice((1, 100, 10_000, 10_000_000))
        offered = self.stroops()
        rec.update(
            {
                "amount": amount(offered),
                "price": amount((n * 10_000_000 * 2 + d) // (2 * d)),
                "price_r": {"n": n, "d": d},
                **self.asset_fields("buying_", buying),
                **self.asset_fields("selling_", selling),
                "offer_id": "0",
            }
        )
        if self.rng.random() < 0.4:
            got = max(1, offered * n // d)
            self.trade(effects, involved, source, selling, offered, buying, got)

    def op_manage_sell_offer(self, rec: dict, effects: list, involved: set, source: str) -> None:
        self._offer(rec, effects, involved, source)

    def op_manage_buy_offer(self, rec: dict, effects: list, involved: set, source: str) -> None:
        self._offer(rec, effects, involved, source)

    def op_change_trust(self, rec: dict, effects: list, involved: set, source: str) -> None:
        asset = self.rng.choice(self.assets[1:])
        assert asset is not None
        fields = self.asset_fields("", asset)
        rec.update({**fields, "limit": _MAX_LIMIT, "trustee": asset[2], "trustor": source})
        effects.append(("trustline_created", source, {**fields, "limit": _MAX_LIMIT}))

    def op_invoke_host_function(self, rec: dict, effects: list, involved: set, source: str) -> None:
        contract = self.rng.choice(self.contracts)
        asset = self.asset()
        value = amount(self.stroops())
        rec.update(
            {
                "function": "HostFunctionTypeHostFunctionTypeInvokeContract",
                "parameters": [
                    {"value": self.b64(40), "type": "Address"},
                    {"value": "AAAADwAAAAh0cmFuc2Zlcg==", "type": "Sym"},
                    {"value": self.b64(40), "type": "Address"},
                    {"value": self.b64(40), "type": "Address"},
                    {"value": self.b64(20), "type": "I128"},
                ],
                "address": "",
                "salt": "",
                "asset_balance_changes": [
                    {
                        **self.asset_fields("", asset),
                        "type": "transfer",
                        "from": source,
                        "to": contract,
                        "amount": value,
                    }
                ],
            }
        )
        effects.append(
            ("account_debited", source, {**self.asset_fields("", asset), "amount": value})
        )
        effects.append(
            (
                "contract_credited",
                source,
                {**self.asset_fields("", asset), "contract": contract, "amount": value},
            )
        )

    def op_set_options(self, rec: dict, effects: list, involved: set, source: str) -> None:
        variant = self.rng.randrange(3)
        if variant == 0:
            domain = f"anchor{self.rng.randrange(1000)}.example.com"
            rec["home_domain"] = domain
            effects.append(("account_home_domain_updated", source, {"home_domain": domain}))
        elif variant == 1:
            signer, weight = self.account(), self.rng.randrange(1, 256)
            rec.update(signer_key=signer, signer_weight=weight)
            effects.append(("signer_created", source, {"weight": weight, "public_key": signer}))
        else:
            low, med, high = sorted(self.rng.randrange(0, 256) for _ in range(3))
            rec.update(low_threshold=low, med_threshold=med, high_threshold=high)
            effects.append(
                (
                    "account_thresholds_updated",
                    source,
                    {"low_threshold": low, "med_threshold": med, "high_threshold": high},
                )
            )


def ledger_hash_of(seed: int, sequence: int) -> str:
    return hashlib.sha256(f"ledger:{seed}:{sequence}".encode()).hexdigest()


class Chain:
    """The ledger chain: closed ledgers ``first .. latest`` and the ways to page through them.

    Ledger contents are rebuilt on demand (an LRU keeps about ``cache_records`` records built), so
    the chain's memory does not grow with its length, except for the per-account and per-hash
    indexes, which are built on first use. Not thread-safe: the server uses it from trio tasks.

    Args:
        spec: what the chain contains.
        history_ledgers: ledgers already closed at start (at least 1: Horizon always has a latest).
        cache_records: about how many built records to keep in memory.
        retention_ledgers: keep only the newest N ledgers, as Horizon's history retention
            (``HISTORY_RETENTION_COUNT``): older ones are gone and :attr:`first` (Horizon's
            ``history_elder_ledger``) moves up as ledgers close. 0: keep everything.
    """

    def __init__(
        self,
        spec: ChainSpec,
        history_ledgers: int = 1,
        cache_records: int = 60_000,
        retention_ledgers: int = 0,
    ):
        if not 0 <= spec.ops_per_ledger <= 4000:
            raise ValueError("ops_per_ledger must be between 0 and 4000")
        if not 1 <= spec.first_ledger < (1 << 31) - 10_000_000:
            raise ValueError("first_ledger must be a positive ledger sequence")
        if retention_ledgers < 0:
            raise ValueError("retention_ledgers must be >= 0 (0: keep everything)")
        self.spec = spec
        self.retention_ledgers = retention_ledgers
        self.accounts = [
            strkey.encode_account(hashlib.sha256(f"account:{spec.seed}:{i}".encode()).digest())
            for i in range(96)
        ]
        self.contracts = [
            strkey.encode_contract(hashlib.sha256(f"contract:{spec.seed}:{i}".encode()).digest())
            for i in range(8)
        ]
        self.latest = spec.first_ledger - 1 + max(1, history_ledgers)
        self._cache: OrderedDict[int, LedgerContent] = OrderedDict()
        self._cache_size = 0
        self._cache_records = cache_records
        # Secondary indexes, built on first use up to _indexed, then kept up to date.
        self._indexed = spec.first_ledger - 1
        self._secondary_wanted = False
        self._by_account: dict[str, dict[str, list[int]]] = {}
        self._by_entity: dict[tuple[str, str], dict[str, list[int]]] = {}
        self.pools = frozenset(pool_ids(spec.seed))
        self._tx_by_hash: dict[str, int] = {}
        # Ledgers closed while running close at the wall-clock time, as on a real network (the
        # history before them stays in the past, from the spec); kept so a rebuild agrees.
        self._live_closed_at: dict[int, int] = {}

    @property
    def first(self) -> int:
        """The oldest ledger still held (Horizon's ``history_elder_ledger``)."""
        if self.retention_ledgers:
            return max(self.spec.first_ledger, self.latest - self.retention_ledgers + 1)
        return self.spec.first_ledger

    def closed_at(self, seq: int) -> int:
        """A ledger's close time (Unix seconds)."""
        return self._live_closed_at.get(seq, self.spec.closed_at(seq))

    def close_ledger(self) -> int:
        """Close the next ledger, at the current time, and return its sequence."""
        self._live_closed_at[self.latest + 1] = max(self.closed_at(self.latest), int(time.time()))
        self.latest += 1
        content = self.content(self.latest)
        if self._secondary_wanted:
            self._index_secondary()
        return content.sequence

    # -- lookups --------------------------------------------------------------------------------

    def record(self, key: int) -> dict[str, Any]:
        """The record with this paging key (links use :data:`PLACEHOLDER_BASE`). Do not mutate.

        Raises:
            KeyError: no such record.
        """
        return self.content(key >> (KEY_SHIFT + 32)).records[key]

    def has_record(self, key: int) -> bool:
        seq = key >> (KEY_SHIFT + 32)
        return self.first <= seq <= self.latest and key in self.content(seq).records

    def content(self, seq: int) -> LedgerContent:
        """A closed ledger's content, from the LRU or rebuilt.

        Raises:
            KeyError: the ledger is not closed (or before the first one).
        """
        content = self._cache.get(seq)
        if content is not None:
            self._cache.move_to_end(seq)
            return content
        if not self.first <= seq <= self.latest:
            raise KeyError(seq)
        # Records hold no reference cycles: keep the cyclic GC from re-scanning the cache meanwhile.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            content = _LedgerBuilder(
                self.spec, self.accounts, self.contracts, seq, self._live_closed_at.get(seq)
            ).build()
        finally:
            if gc_was_enabled:
                gc.enable()
        self._cache[seq] = content
        self._cache_size += content.size
        while self._cache_size > self._cache_records and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_size -= old.size
        return content

    def transaction_key(self, tx_hash: str) -> int | None:
        """The paging key of the transaction with this hash, if it exists."""
        self._index_secondary()
        return self._tx_by_hash.get(tx_hash)

    def knows_account(self, account: str) -> bool:
        """Whether the account occurs in the chain (Horizon has ingested it): Horizon answers 404
        for the collections of an account it does not know."""
        self._index_secondary()
        return account in self._by_account

    def knows_entity(self, kind: str, entity: str) -> bool:
        """Whether a liquidity pool (``liquidity_pools``), claimable balance
        (``claimable_balances``) or offer (``offers``) occurs in the chain: Horizon answers 404
        for the collections of one it does not know."""
        if kind == "liquidity_pools":
            return entity in self.pools
        self._index_secondary()
        return (kind, entity) in self._by_entity

    def account_keys(self, account: str, collection: str) -> Sequence[int]:
        """The paging keys of one account's transactions, operations, payments or effects."""
        self._index_secondary()
        per_account = self._by_account.get(account)
        return () if per_account is None else per_account[collection]

    def page(
        self,
        collection: str,
        *,
        after: int | None,
        descending: bool,
        limit: int,
        low: int = 0,
        high: int | None = None,
        account: str | None = None,
        entity: tuple[str, str] | None = None,
    ) -> list[int]:
        """Up to ``limit`` paging keys of ``collection``, strictly beyond the cursor key ``after``.

        Ascending gives keys > ``after``, descending keys < ``after`` (None: from the start, or
        from the end). Only keys in ``[low, high)`` count: a ledger's or a transaction's slice.
        ``account`` restricts to the records that involve that account.
        """
        if high is None:
            high = key_of(toid(self.latest + 1))
        low = max(low, key_of(toid(self.first)))
        if account is not None:
            return _page_sorted(
                self.account_keys(account, collection), after, descending, limit, low, high
            )
        if entity is not None:
            self._index_secondary()
            keys = self._by_entity.get(entity, {}).get(collection, ())
            return _page_sorted(keys, after, descending, limit, low, high)
        if collection == "ledgers":
            return self._page_ledgers(after, descending, limit, low, high)
        if self.spec.ops_per_ledger == 0 or limit <= 0:
            return []
        out: list[int] = []
        if not descending:
            start = low if after is None else max(low, after + 1)
            seq = start >> (KEY_SHIFT + 32)
            last = min(self.latest, (high - 1) >> (KEY_SHIFT + 32))
            while len(out) < limit and seq <= last:
                keys = self.content(seq).kinds[collection]
                i = bisect.bisect_left(keys, start)
                j = bisect.bisect_left(keys, high, i)
                out.extend(keys[i : min(j, i + limit - len(out))])
                seq += 1
        else:
            end = high if after is None else min(high, after)  # exclusive
            seq = min(self.latest, (end - 1) >> (KEY_SHIFT + 32))
            stop = low >> (KEY_SHIFT + 32)
            while len(out) < limit and seq >= stop and end > low:
                keys = self.content(seq).kinds[collection]
                j = bisect.bisect_left(keys, end)
                i = bisect.bisect_left(keys, low, 0, j)
                out.extend(reversed(keys[max(i, j - (limit - len(out))) : j]))
                seq -= 1
        return out

    def _page_ledgers(
        self, after: int | None, descending: bool, limit: int, low: int, high: int
    ) -> list[int]:
        shift = KEY_SHIFT + 32
        first_seq = -(-low >> shift)  # ceiling: the first ledger whose key is >= low
        last_seq = min(self.latest, (high - 1) >> shift)
        if not descending:
            seq = first_seq if after is None else max(first_seq, (after >> shift) + 1)
            return [key_of(toid(s)) for s in range(seq, min(last_seq, seq + limit - 1) + 1)]
        seq = last_seq if after is None else min(last_seq, ((after - 1) >> shift))
        return [key_of(toid(s)) for s in range(seq, max(first_seq, seq - limit + 1) - 1, -1)]

    # -- internals ------------------------------------------------------------------------------

    def _index_secondary(self) -> None:
        self._secondary_wanted = True
        for seq in range(max(self._indexed + 1, self.first), self.latest + 1):
            content = self.content(seq)
            for collection in ACCOUNT_COLLECTIONS:
                for key in content.kinds[collection]:
                    if collection == "effects":
                        accounts: frozenset[str] = frozenset((content.records[key]["account"],))
                    else:
                        accounts = content.participants[key]
                    for account in accounts:
                        per_account = self._by_account.get(account)
                        if per_account is None:
                            per_account = {c: [] for c in ACCOUNT_COLLECTIONS}
                            self._by_account[account] = per_account
                        per_account[collection].append(key)
                    for entity in content.entities.get(key, ()):
                        per_entity = self._by_entity.get(entity)
                        if per_entity is None:
                            per_entity = {c: [] for c in ACCOUNT_COLLECTIONS}
                            self._by_entity[entity] = per_entity
                        per_entity[collection].append(key)
            self._tx_by_hash.update(content.tx_hashes)
            self._indexed = seq


def _page_sorted(
    keys: Sequence[int], after: int | None, descending: bool, limit: int, low: int, high: int
) -> list[int]:
    lo = bisect.bisect_left(keys, low)
    hi = bisect.bisect_left(keys, high, lo)
    if not descending:
        start = lo if after is None else max(lo, bisect.bisect_right(keys, after, lo, hi))
        return list(keys[start : min(hi, start + limit)])
    end = hi if after is None else min(hi, bisect.bisect_left(keys, after, lo, hi))
    return list(reversed(keys[max(lo, end - limit) : end]))
