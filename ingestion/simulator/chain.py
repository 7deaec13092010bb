"""The simulated ledger chain: deterministic, joined Horizon records and their paging indexes. Pure.

Every ledger's content is a function of ``(seed, sequence)`` only (built by
:mod:`ingestion.simulator.ledgers`), so the chain is the same in every process with the same seed
and any ledger can be rebuilt on demand. Ledgers are built when first needed and kept in an LRU, so
the chain's memory does not grow with its length; only the per-account and per-transaction-hash
indexes do, and only once someone asks for them. The records' paging keys, and what determines the
chain, are in :mod:`ingestion.simulator.records`.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ingestion.common.paging import toid
from ingestion.common.strkey import encode_account, encode_contract
from ingestion.simulator.ledgers import build_ledger
from ingestion.simulator.records import (
    ACCOUNT_COLLECTIONS,
    KEY_SHIFT,
    ChainSpec,
    LedgerContent,
    key_of,
    pool_ids,
)


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
            encode_account(hashlib.sha256(f"account:{spec.seed}:{i}".encode()).digest())
            for i in range(96)
        ]
        self.contracts = [
            encode_contract(hashlib.sha256(f"contract:{spec.seed}:{i}".encode()).digest())
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
            content = build_ledger(
                self.spec, self.accounts, self.contracts, seq, self._live_closed_at.get(seq)
            )
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
