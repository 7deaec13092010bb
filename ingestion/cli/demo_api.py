"""The demo's events API step (``ingestion demo``, :mod:`ingestion.cli.demo`): the simulated Stellar
RPC keeps a short window, the nodes keep the contract-events job in PostgreSQL and serve it with
stellar-rpc's ``getEvents`` (docs/API.md); the same request from the first ledger the job holds is
refused by the RPC and answered by the API. Also the job's rows verified against the simulator's
data lake (the ledgers the RPC no longer keeps) and the RPC (the rest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx

from ingestion.common.paging import token_key
from ingestion.rpc.protocol import Cursor
from ingestion.verify import (
    StreamEntry,
    Verification,
    check_stream,
    fetch_lake_events,
    fetch_rpc_events,
    read_evidence,
    read_postgres_evidence,
    rpc_ledger_range,
)

TIMEOUT = 5.0  # seconds for one JSON-RPC call


async def call(url: str, method: str, params: Any = None) -> dict[str, Any]:
    """One JSON-RPC call: the answer's ``result`` or ``error`` object, whole."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params else {})}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        answer: dict[str, Any] = (await http.post(url, json=body)).json()
    return answer


@attrs.frozen
class Compared:
    """One ``getEvents`` from ``start``, asked of the RPC and of the API."""

    start: int
    rpc_window: tuple[int, int]
    rpc_error: str  # the RPC's refusal ("" when it answered)
    api_events: int
    api_held: tuple[int, int]  # the API's oldest and latest ledger (getHealth)
    first_id: str

    def lines(self) -> list[str]:
        oldest, latest = self.rpc_window
        rpc = f"refused: {self.rpc_error}"
        if not self.rpc_error:
            rpc = f"(keeping ledgers {oldest}..{latest}) answered"
        return [
            f"getEvents from ledger {self.start}: the RPC {rpc}",
            f"getEvents from ledger {self.start}: the API holds ledgers {self.api_held[0]}.."
            f"{self.api_held[1]} and answered {self.api_events} events, the first {self.first_id}",
        ]


async def compare(rpc: str, api: str, start: int) -> Compared:
    """The same ``getEvents`` (from ``start``, 100 events) to the RPC and to the API."""
    params = {"startLedger": start, "pagination": {"limit": 100}}
    window = await rpc_ledger_range(rpc)
    refused = (await call(rpc, "getEvents", params)).get("error") or {}
    answer = await call(api, "getEvents", params)
    if "result" not in answer:
        raise RuntimeError(f"the events API answered {answer.get('error')}")
    events = answer["result"]["events"]
    health = (await call(api, "getHealth"))["result"]
    return Compared(
        start=start,
        rpc_window=window,
        rpc_error=str(refused.get("message", "")),
        api_events=len(events),
        api_held=(int(health["oldestLedger"]), int(health["latestLedger"])),
        first_id=str(events[0]["id"]) if events else "-",
    )


async def show(pg_url: str, job: str, rpc: str, api: str, node: str, say: Callable[[str], None]) -> bool:
    """The events API at ``api`` (on ``node``) against the RPC, from the first ledger ``job``
    holds (the RPC's oldest when the job began: past its window by now); True when the API
    answered from there."""
    start = await first_row_ledger(pg_url, job)
    if start is None:
        say(f"{job} holds no events")
        return False
    say(f"{api} on {node} (stellar-rpc's JSON-RPC, every node serves it): {job}'s events from PostgreSQL")
    try:
        compared = await compare(rpc, api, start)
    except (OSError, ValueError, KeyError, RuntimeError, httpx.HTTPError) as exc:
        say(f"failed: {exc}")
        return False
    for line in compared.lines():
        say(line)
    return compared.api_events > 0 and compared.api_held[0] <= start


def first_ledger(entries: Sequence[StreamEntry]) -> int | None:
    """The ledger of a job's first record: where it began (``start_cursor = "0"`` is the RPC's
    oldest ledger when the job's first leader asked, which only the job knows)."""
    return Cursor.parse(entries[0].paging_token).ledger if entries else None


async def first_row_ledger(pg_url: str, job: str) -> int | None:
    """:func:`first_ledger` of a job in PostgreSQL."""
    return first_ledger((await read_postgres_evidence(pg_url, "ingestion", job))[0])


async def first_entry_ledger(redis_url: str, job: str) -> int | None:
    """:func:`first_ledger` of a job in Redis."""
    return first_ledger((await read_evidence(redis_url, job))[0])


async def verify_rows(pg_url: str, job: str, rpc: str, lake: str) -> Verification:
    """The job's rows against the simulator: its lake from the job's first ledger to the middle
    of the RPC's window, the RPC's own paging from there (as :func:`ingestion.verify.verify_rpc_job`
    does for a job in Redis), judged by the fence history too."""
    entries, trimmed, fence_problems, terms = await read_postgres_evidence(pg_url, "ingestion", job)
    through = entries[-1].paging_token if entries else None
    start = first_ledger(entries)
    if start is None:
        return Verification(0, None, None, (), ("the job committed no rows",))
    oldest, latest = await rpc_ledger_range(rpc)
    middle = max(oldest, (oldest + latest) // 2)
    source = await fetch_lake_events(lake, (), start, middle)
    if through is not None and (not source or token_key(source[-1].paging_token) < token_key(through)):
        source += await fetch_rpc_events(rpc, (), middle + 1, through=through)
    result = check_stream(entries, source, None, trimmed)
    return attrs.evolve(result, problems=result.problems + tuple(fence_problems), fence_terms=terms)
