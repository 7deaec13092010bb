"""The simulated Stellar RPC against what a real one answered.

There is no recorded RPC traffic in ../shared/data; the real values below are the few that public
code quotes from live calls (a Rust Soroban client's notes on a testnet ``getEvents`` answer,
2026-08-02, protocol 27): the answer's keys and their JSON types, an event's keys, and a cursor
taken as is. Each check says which rule of stellar-rpc's ``get_events.go`` it confirms.
"""

from __future__ import annotations

from typing import Any

import httpx

from ingestion.rpc.protocol import LEDGER_SCAN_LIMIT, Cursor
from ingestion.simulator import SimulatorConfig, open_simulator

# A real testnet answer (see the module docstring): the result's keys and types...
REAL_RESULT_TYPES = {
    "events": list, "cursor": str, "latestLedger": int, "oldestLedger": int,
    "latestLedgerCloseTime": str, "oldestLedgerCloseTime": str,
}  # fmt: skip
REAL_LATEST, REAL_OLDEST = 3_940_684, 3_819_725
REAL_CURSOR = "0016449724743679999-4294967295"
# ...and an event's, in the order the server writes them.
REAL_EVENT_KEYS = [
    "type", "ledger", "ledgerClosedAt", "contractId", "id", "operationIndex", "transactionIndex",
    "txHash", "inSuccessfulContractCall", "topic", "value",
]  # fmt: skip
REAL_EVENT_ID = "0016406951164395520-0000000000"  # ledger 3820041, transactionIndex 4, operationIndex 0
REAL_EVENT_LEDGER, REAL_EVENT_TX = 3_820_041, 4


def test_a_real_cursor_is_a_scanned_through_cursor_at_the_10000_ledger_scan_cap() -> None:
    """The real answer's cursor is ``MaxCursor`` of a ledger (event index 4294967295): the scan
    stopped at ``endLedger - 1`` with a page that was not full; its ledger is 10,000 past a start
    just above the oldest ledger, as ``endLedger = start + LedgerScanLimit`` says."""
    cursor = Cursor.parse(REAL_CURSOR)
    assert cursor == Cursor.through(3_829_999) and str(cursor) == REAL_CURSOR
    start = cursor.ledger + 1 - LEDGER_SCAN_LIMIT
    assert REAL_OLDEST <= start <= REAL_LATEST


def test_a_real_event_id_is_the_toid_of_its_ledger_and_transaction() -> None:
    parsed = Cursor.parse(REAL_EVENT_ID)
    assert (parsed.ledger, parsed.tx, parsed.op, parsed.event) == (REAL_EVENT_LEDGER, REAL_EVENT_TX, 0, 0)


async def test_the_simulators_answer_has_the_real_keys_types_and_event_shape() -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=50, rpc_port=0)
    async with open_simulator(config) as sim, httpx.AsyncClient() as http:
        body = {
            "jsonrpc": "2.0", "id": 7, "method": "getEvents",
            "params": {"startLedger": sim.chain.first, "pagination": {"limit": 5}},
        }  # fmt: skip
        doc: dict[str, Any] = (await http.post(sim.rpc_url, json=body)).json()
    assert doc["jsonrpc"] == "2.0" and doc["id"] == 7
    result = doc["result"]
    assert {k: type(v) for k, v in result.items()} == REAL_RESULT_TYPES
    assert len(result["events"]) == 5 and result["cursor"] == result["events"][-1]["id"]
    for event in result["events"]:
        assert list(event) == REAL_EVENT_KEYS
        at = Cursor.parse(event["id"])
        assert (event["ledger"], event["transactionIndex"], event["operationIndex"]) == (
            at.ledger, at.tx, at.op
        )
        assert isinstance(event["topic"], list) and isinstance(event["value"], str)
        assert event["ledgerClosedAt"].endswith("Z") and len(event["ledgerClosedAt"]) == 20
