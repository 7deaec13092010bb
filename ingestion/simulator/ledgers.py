"""The ledger builder: one ledger's transactions, operations, effects and trades, made up from
``(seed, sequence)`` only (:func:`build_ledger`). Pure.

Every ledger's content is a function of ``(seed, sequence)`` (and its close time) only, so any ledger
can be rebuilt on demand, in any process: :class:`~ingestion.simulator.chain.Chain` builds them when
first needed and keeps an LRU of them.
"""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Sequence
from typing import Any

from ingestion.common.paging import toid
from ingestion.common.strkey import encode_account
from ingestion.simulator.records import (
    COLLECTIONS,
    EFFECT_TYPE_I,
    OPERATION_TYPE_I,
    PAYMENT_TYPES,
    PLACEHOLDER_BASE,
    PROTOCOL_VERSION,
    TRADE_BASE,
    ChainSpec,
    LedgerContent,
    amount,
    key_of,
    ledger_hash_of,
    pool_ids,
    timestamp,
)

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
_OPERATION_TABLE = tuple(t for t, weight in OPERATION_MIX for _ in range(weight))
_CREDIT_ASSETS = (("USDC", 0), ("EURC", 1), ("BTC", 2), ("AQUA", 3), ("yUSDC", 4), ("SHX", 5))
_MAX_LIMIT = "922337203685.4775807"
Asset = tuple[str, str, str] | None  # (asset_type, code, issuer); None is native


def _asset_text(asset: Asset) -> str:
    return "native" if asset is None else f"{asset[1]}:{asset[2]}"


def build_ledger(
    spec: ChainSpec,
    accounts: Sequence[str],
    contracts: Sequence[str],
    seq: int,
    closed_at: int | None = None,
) -> LedgerContent:
    """Ledger ``seq``'s content (closed at ``closed_at``, None: the spec's time for it), among the
    chain's ``accounts`` and ``contracts``."""
    return _LedgerBuilder(spec, accounts, contracts, seq, closed_at).build()


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
        new = encode_account(self.rng.randbytes(32))
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
