"""The events API's scale store (``benchmarks/api_store.py``), small: its events are stellar-rpc's
``EventInfo`` records with real XDR topics, shaped as the benchmark says, loaded with ``COPY`` into
the sink's tables and projected into the API's store as its projector would, and a cached store is
started again as it is."""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from stellar_sdk import StrKey, scval, xdr

from benchmarks import api_store
from benchmarks.api_store import Shape
from ingestion.rpc.protocol import Cursor, event_head
from ingestion.simulator.render import go_json

SMALL = Shape(events=10_000, contracts=300, accounts=3_000, rare_every=2_000, job="bench-store")


def _rows(shape: Shape) -> list[list[str]]:
    rows = []
    for chunk, first_seq in api_store.plan(shape):
        rows += [line.rstrip("\n").split("\t") for line in api_store.chunk_rows(shape, chunk, first_seq)]
    return rows


def test_scvals_are_stellar_sdks() -> None:
    key = api_store.account_key(SMALL, 7)
    contract = api_store.contract_id(SMALL, 3)
    assert api_store.symbol("transfer") == scval.to_symbol("transfer").to_xdr()
    assert api_store.string("USDC:GA") == scval.to_string("USDC:GA").to_xdr()
    assert api_store.i128(10**12 + 5) == scval.to_int128(10**12 + 5).to_xdr()
    assert api_store.account_address(key) == scval.to_address(StrKey.encode_ed25519_public_key(key)).to_xdr()
    assert api_store.contract_address(StrKey.decode_contract(contract)) == scval.to_address(contract).to_xdr()


def test_events_are_rpc_event_infos_of_the_benchmarks_shape() -> None:
    rows = _rows(SMALL)
    assert [int(r[1]) for r in rows] == list(range(1, SMALL.events + 1))
    ids = [r[2] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    verbs: collections.Counter[str] = collections.Counter()
    contracts: collections.Counter[str] = collections.Counter()
    names = {api_store.symbol(v): v for v in (*api_store.VERBS, "fee", "attest", "set_admin")}
    assert all(scval.to_native(xdr.SCVal.from_xdr(b)) == v for b, v in names.items())
    for n, (job, _seq, paging_token, _token, record, _committed) in enumerate(rows):
        assert job == SMALL.job
        event = orjson.loads(record)
        assert event["id"] == paging_token
        cursor, ok, tx_hash = Cursor.parse(paging_token), event["inSuccessfulContractCall"], event["txHash"]
        head = event_head(event["type"], cursor, event["ledgerClosedAt"], event["contractId"], tx_hash, ok)
        served = {**head, "topic": event["topic"], "value": event["value"]}
        assert go_json(served, indent=False).decode() == record  # RPC's fields, in its order, compact
        verbs[names[event["topic"][0]]] += 1
        contracts[event["contractId"]] += 1
        if n % 10 == 0:  # (stellar-sdk's decoding is slow: a sample)
            assert all(xdr.SCVal.from_xdr(t) for t in event["topic"][1:])
            assert scval.to_native(xdr.SCVal.from_xdr(event["value"])) > 0
    four = sum(verbs[v] for v in ("transfer", "fee", "mint", "burn"))
    assert four / SMALL.events > 0.85
    # rare: exactly one of each in every rare_every events, and nowhere else
    assert contracts[SMALL.rare_contract] == verbs["attest"] == SMALL.events // SMALL.rare_every
    assert verbs["set_admin"] == SMALL.events // SMALL.rare_every
    # Zipf: the top contract (the native asset's, which takes every fee) far ahead, a long tail
    ranked = [n for _, n in contracts.most_common()]
    assert ranked[0] > 0.3 * SMALL.events and len(ranked) > 100


@pytest.fixture
def cache() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ingestion-bench-cache-"))
    root.chmod(0o755)  # the postgres user reaches its data directory inside
    old = os.environ.get("BENCHMARK_CACHE")
    os.environ["BENCHMARK_CACHE"] = str(root)
    try:
        yield root
    finally:
        if old is None:
            del os.environ["BENCHMARK_CACHE"]
        else:
            os.environ["BENCHMARK_CACHE"] = old
        shutil.rmtree(root, ignore_errors=True)


def test_the_store_is_loaded_into_the_sinks_tables_and_reused_from_its_cache(cache: Path) -> None:
    import psycopg

    pg, timings = api_store.open_store(SMALL, log=lambda *_: None)
    try:
        # the events API's store over them, sampled against the API's own projection code
        projected = api_store.ensure_projected(pg, SMALL, log=lambda *_: None)
        assert projected["rows"] == SMALL.events and projected["checked"] == 2000
        with psycopg.connect(pg.url) as conn:
            count, first, last = conn.execute(
                "SELECT count(*), min(paging_token), max(paging_token) FROM ingestion.events WHERE job = %s",
                (SMALL.job,),
            ).fetchone()  # type: ignore[misc]
            cursor = conn.execute(
                "SELECT cursor FROM ingestion.cursors WHERE job = %s", (SMALL.job,)
            ).fetchone()
    finally:
        pg.stop()
    assert count == SMALL.events and cursor == (str(Cursor.through(Cursor.parse(last).ledger)),)
    assert Cursor.parse(first).ledger == SMALL.first_ledger == timings["first_ledger"]
    assert Cursor.parse(last).ledger == timings["latest_ledger"]
    # the second time: the same data directory started as it is, nothing generated
    again, cached = api_store.open_store(SMALL, log=lambda *_: pytest.fail("generated again"))
    try:
        assert again.directory == pg.directory and cached == timings
        assert api_store.ensure_projected(again, SMALL, log=lambda *_: pytest.fail("again")) == projected
        with psycopg.connect(again.url) as conn:
            assert conn.execute("SELECT count(*) FROM ingestion.events").fetchone() == (SMALL.events,)
    finally:
        again.stop()
