"""Commit cost: ``LeaseStore.commit`` called directly, one commit at a time, for several batch sizes.

Records carry a realistic body (an operation record of about 1 KB) and strictly increasing TOID
paging tokens; each commit continues from the previous one's cursor, as the CursorWriter's do.
"""

from __future__ import annotations

import json
import time
from typing import Any

import trio

from actors.lease_store import Acquired, Committed, LeaseStore, connect
from actors.source import Record
from benchmarks.procs import percentile
from ingestion.common.paging import toid

_BODY = {
    "_links": {
        "self": {"href": "http://127.0.0.1:8000/operations/214748364800004097"},
        "transaction": {"href": "http://127.0.0.1:8000/transactions/" + "ab" * 32},
        "effects": {"href": "http://127.0.0.1:8000/operations/214748364800004097/effects"},
        "succeeds": {"href": "http://127.0.0.1:8000/effects?order=desc&cursor=1"},
        "precedes": {"href": "http://127.0.0.1:8000/effects?order=asc&cursor=1"},
    },
    "id": "0",
    "paging_token": "0",
    "transaction_successful": True,
    "source_account": "GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7",
    "type": "payment",
    "type_i": 1,
    "created_at": "2024-01-01T00:00:00Z",
    "transaction_hash": "ab" * 32,
    "asset_type": "credit_alphanum4",
    "asset_code": "USDC",
    "asset_issuer": "GA5ZSEJYB37JRC5AVCIA5MOP4RHTM335X2KGX3IHOJAPP5RE34K4KZVN",
    "from": "GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7",
    "to": "GBRPYHIL2CI3FNQ4BXLFMNDLFJUNPU2HY3ZMFSHONUCEOASW7QC7OX2H",
    "amount": "1234.5678901",
}


def _records(start: int, n: int) -> tuple[Record, ...]:
    out = []
    for i in range(start, start + n):
        token = str(toid(50_000_000 + i // 1000, i % 1000 + 1, 1))
        body = json.dumps({**_BODY, "id": token, "paging_token": token}, separators=(",", ":"))
        out.append(Record(token, body))
    return tuple(out)


async def _measure(redis_url: str, sizes: tuple[int, ...], seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size in sizes:
        job = f"commit{size}"
        store = LeaseStore(connect(redis_url, timeout=5.0), job)
        grant = await store.acquire("bench", 600_000)
        assert isinstance(grant, Acquired)
        batches = [_records(i * size, size) for i in range(max(1, int(200_000 / size)))]
        cursor: str | None = None
        latencies: list[float] = []
        started = time.monotonic()
        end = started + seconds
        for batch in batches:
            t0 = time.perf_counter()
            res = await store.commit("bench", grant.token, cursor, batch)
            latencies.append(time.perf_counter() - t0)
            assert isinstance(res, Committed), res
            cursor = res.cursor
            if time.monotonic() >= end:
                break
        elapsed = time.monotonic() - started
        results[str(size)] = {
            "commits": len(latencies),
            "commits_per_s": len(latencies) / elapsed,
            "records_per_s": len(latencies) * size / elapsed,
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
        }
        store.client.delete(*store.keys.values())
        store.client.close()
    return results


def run(redis_url: str, *, seconds: float, log: Any = print) -> dict[str, Any]:
    results = trio.run(_measure, redis_url, (1, 10, 200), seconds)
    for size, r in results.items():
        log(
            f"  batch {size}: {r['commits_per_s']:,.0f} commits/s, "
            f"{r['records_per_s']:,.0f} records/s, p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms"
        )
    return results
