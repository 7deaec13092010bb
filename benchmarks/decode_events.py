"""Microseconds per event of :func:`ingestion.decode.decoded.decode_event_text` (not a test).

``python -m benchmarks.decode_events``: a typical SAC transfer event (4 topics, an i128 amount)
with warm caches, the same with a new amount every event (the value's cache misses, as in a real
catch-up), the real ledgers of ``../shared/data/lake`` (every event once cold, then warm), and
stellar-sdk's decode of the same ScVals for scale.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable

import orjson
from stellar_sdk import Keypair, scval, xdr

from ingestion.decode import decoded
from ingestion.decode.decoded import decode_event_text
from ingestion.lake.events import ledger_events
from ingestion.testing import recorded

REAL = (
    "wallet-backend_ledger-51000294.xdr.gz",
    "wallet-backend_ledger-57500008.xdr.gz",
    "wallet-backend_ledger-63092988.xdr.gz",
    "wallet-backend_ledger-63092990.xdr.gz",
)


def typical(amount: int) -> str:
    topics = [
        scval.to_symbol("transfer"),
        scval.to_address(Keypair.from_raw_ed25519_seed(b"\1" * 32).public_key),
        scval.to_address(Keypair.from_raw_ed25519_seed(b"\2" * 32).public_key),
        scval.to_string("USDC:GA5ZSEJYB37JRC5AVCIA5MOP4RHTM335X2KGX3IHOJAPP5RE34K4KZVN"),
    ]
    event = {
        "type": "contract",
        "ledger": 57500008,
        "ledgerClosedAt": "2025-06-18T10:00:00Z",
        "contractId": "CCW67TSZV3SSS2HXMBQ5JFGCKJNXKZM7UQUWUZPUTHXSTZLEO7SJMI75",
        "id": "0246958573012414464-0000000001",
        "operationIndex": 0,
        "transactionIndex": 5,
        "txHash": "ab" * 32,
        "inSuccessfulContractCall": True,
        "topic": [t.to_xdr() for t in topics],
        "value": scval.to_int128(amount).to_xdr(),
    }
    return orjson.dumps(event).decode()


def per_event(texts: list[str], rounds: int, reset: Callable[[], None] | None = None) -> float:
    best = float("inf")
    for _ in range(rounds):
        if reset is not None:
            reset()
        start = time.perf_counter()
        for text in texts:
            decode_event_text(text)
        best = min(best, (time.perf_counter() - start) / len(texts) * 1e6)
    return best


def cold() -> None:
    decoded._heads.clear()
    decoded._tails.clear()
    decoded._topics.entries.clear()


def main() -> None:
    same = [typical(3_711_000)] * 20_000
    decode_event_text(same[0])
    print(f"typical SAC transfer, warm caches:      {per_event(same, 5):.2f} us/event")
    fresh = [typical(1_000_000 + i) for i in range(20_000)]
    new_amounts = per_event(fresh, 5, reset=decoded._tails.clear)
    print(f"the same, a new amount every event:     {new_amounts:.2f} us/event")
    events = []
    for name in REAL:
        meta = xdr.LedgerCloseMeta.from_xdr_bytes(gzip.decompress(recorded.require_lake(name).read_bytes()))
        events += [e.body for e in ledger_events(meta).events]
    print(f"real ledgers ({len(events)} events), cold:     {per_event(events, 5, reset=cold):.2f} us/event")
    print(f"real ledgers, warm:                     {per_event(events, 5):.2f} us/event")
    body = orjson.loads(same[0])
    start = time.perf_counter()
    for _ in range(2000):
        [xdr.SCVal.from_xdr(t).to_json_dict() for t in body["topic"]]
        xdr.SCVal.from_xdr(body["value"]).to_json_dict()
    sdk = (time.perf_counter() - start) / 2000 * 1e6
    print(f"stellar-sdk, the typical event's ScVals: {sdk:.2f} us/event")


if __name__ == "__main__":
    main()
