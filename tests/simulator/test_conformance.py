"""The simulator's records and pages have the shapes of the recorded real Horizon responses.

The recordings live outside the repository (``../shared/data/horizon``, see its PROVENANCE.md);
these tests are skipped when it is absent (:mod:`ingestion.testing.recorded`; the one skip CI allows).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingestion.common.paging import toid_parts
from ingestion.simulator import Simulator, SimulatorConfig
from ingestion.testing import recorded
from tests.support.simulator import running

RECORDED = recorded.HORIZON
pytestmark = recorded.needed

TOID = re.compile(r"[1-9][0-9]*")
EFFECT_TOKEN = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")


def _kind(record: dict[str, Any]) -> str:
    if "sequence" in record and "closed_at" in record:
        return "ledger"
    if "fee_charged" in record:
        return "transaction"
    if "transaction_hash" in record:
        return "operation"
    return "effect"


def _load_recorded() -> tuple[list[tuple[Path, dict[str, Any]]], list[dict[str, Any]]]:
    pages, records = [], []
    if not RECORDED.is_dir():
        return [], []
    for path in sorted(RECORDED.rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
        if "_embedded" in doc:
            pages.append((path, doc))
            records.extend(doc["_embedded"]["records"])
        else:
            records.append(doc)
    return pages, records


PAGES, RECORDS = _load_recorded()


def _by_type(kind: str) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in RECORDS:
        if _kind(record) == kind:
            grouped[record.get("type", kind)].append(record)
    return grouped


def _type_name(value: Any) -> str:
    return type(value).__name__


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=12, ops_per_ledger=40, seed=11)
    async for s in running(config):
        yield s


def _ours(sim: Simulator, resource: str, kind: str) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in sim.records(resource):
        grouped[record.get("type", kind)].append(record)
    return grouped


@pytest.mark.parametrize(
    ("resource", "kind"),
    [
        ("/operations", "operation"),
        ("/effects", "effect"),
        ("/transactions", "transaction"),
        ("/ledgers", "ledger"),
    ],
)
async def test_fields_and_value_types_match_the_recordings(
    sim: Simulator, resource: str, kind: str
) -> None:
    recorded = _by_type(kind)
    ours = _ours(sim, resource, kind)
    assert ours, "the simulator generated nothing"
    for type_name, records in ours.items():
        real = recorded.get(type_name)
        assert real, f"{kind} type {type_name!r} does not occur in the recordings"
        allowed = set().union(*(r.keys() for r in real))
        # A recorded "<prefix>asset_type" may have been native; credit assets add code and issuer.
        for field in list(allowed):
            if field.endswith("asset_type"):
                prefix = field[: -len("asset_type")]
                allowed |= {f"{prefix}asset_code", f"{prefix}asset_issuer"}
        required = {
            field
            for field in set.intersection(*(set(r) for r in real))
            if not field.endswith(("asset_code", "asset_issuer"))  # absent for native assets
            and not field.endswith(("_muxed", "_muxed_id"))  # only for muxed (M...) accounts
        } - {"transaction_successful", "key"}
        types: dict[str, set[str]] = defaultdict(set)
        for r in real:
            for field, value in r.items():
                types[field].add(_type_name(value))
        for record in records:
            assert set(record) <= allowed, (type_name, set(record) - allowed)
            assert required <= set(record), (type_name, required - set(record))
            for field, value in record.items():
                if field in types:
                    assert _type_name(value) in types[field], (type_name, field, value)
            real_links = {k for r in real for k in r["_links"]}
            assert set(record["_links"]) == real_links
            for name, link in record["_links"].items():
                flags = {bool(r["_links"][name].get("templated")) for r in real}
                assert bool(link.get("templated")) in flags, (type_name, name)


async def test_record_links_have_the_recorded_forms(sim: Simulator) -> None:
    op = sim.records("/operations")[0]
    tx = sim.records("/transactions")[0]
    real_op = next(iter(_by_type("operation").values()))[0]
    real_tx = next(iter(_by_type("transaction").values()))[0]

    def shape(href: str, real_base: str, ours_base: str) -> str:
        return re.sub(
            r"[0-9a-f]{64}|G[A-Z2-7]{55}|[0-9]+(-[0-9]+)?", "X", href.replace(real_base, ours_base)
        )

    real_base = re.match(r"https?://[^/]+", real_op["_links"]["self"]["href"])
    assert real_base is not None
    for ours, real in ((op, real_op), (tx, real_tx)):
        base = re.match(r"https?://[^/]+", real["_links"]["self"]["href"])
        assert base is not None
        for name, link in ours["_links"].items():
            assert shape(link["href"], sim.url, "B") == shape(
                real["_links"][name]["href"], base.group(0), "B"
            )


async def test_paging_tokens_and_ids_have_the_recorded_forms(sim: Simulator) -> None:
    for record in sim.records("/operations") + sim.records("/ledgers"):
        assert TOID.fullmatch(record["paging_token"])
    for record in sim.records("/effects"):
        assert EFFECT_TOKEN.fullmatch(record["paging_token"])
        op, n = record["paging_token"].split("-")
        assert record["id"] == f"{int(op):019d}-{int(n):010d}"
    for tx in sim.records("/transactions"):
        ledger, order, index = toid_parts(int(tx["paging_token"]))
        assert ledger == tx["ledger"] and order >= 1 and index == 0
        assert re.fullmatch(r"[0-9a-f]{64}", tx["hash"]) and tx["id"] == tx["hash"]
        assert re.fullmatch(r"G[A-Z2-7]{55}", tx["source_account"])
    real = [r for r in RECORDS if _kind(r) == "effect"]
    assert all(EFFECT_TOKEN.fullmatch(r["paging_token"]) for r in real)


async def test_pages_have_the_recorded_shape_and_escaping(sim: Simulator) -> None:
    verbatim = [(p, d) for p, d in PAGES if "\\u0026" in p.read_text() and "operations" in p.name]
    assert verbatim
    real_path, real_page = verbatim[0]
    async with httpx.AsyncClient() as client:
        ours = await client.get(f"{sim.url}/operations?include_failed=true&limit=200&order=asc")
    ours_page = ours.json()
    assert set(ours_page) == set(real_page)
    assert set(ours_page["_links"]) == set(real_page["_links"])
    real_href = real_page["_links"]["self"]["href"]
    ours_href = ours_page["_links"]["self"]["href"]
    assert ours_href.split("?", 1)[1] == real_href.split("?", 1)[1]  # same sorted query
    assert b"\\u0026" in ours.content and b"&" not in ours.content
    # indented as Go's MarshalIndent does, like the verbatim recording
    real_text = real_path.read_text()
    assert real_text.startswith('{\n  "_links": {\n    "self": {\n      "href": ')
    assert ours.text.startswith('{\n  "_links": {\n    "self": {\n      "href": ')
    assert '\n    "records": [\n      {\n        "_links": {' in ours.text


async def test_payments_hold_the_recorded_payment_types_account_merge_and_asset_moving_invocations(
    sim: Simulator,
) -> None:
    recorded = {
        record["type"]
        for path, page in PAGES
        if "payment" in path.name
        for record in page["_embedded"]["records"]
    }
    assert "account_merge" in recorded
    ours = sim.records("/payments")
    types = {record["type"] for record in ours}
    # Horizon's /payments also has invoke_host_function operations that move assets (SAC).
    assert {"account_merge", "invoke_host_function"} <= types <= recorded | {"invoke_host_function"}
    assert all(r["asset_balance_changes"] for r in ours if r["type"] == "invoke_host_function")
