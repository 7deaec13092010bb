"""The window a ``getEvents`` request is planned against: one read serves the requests of the
next ``window_ttl`` seconds (no statement of its own per request), and no request later than
that: a newly projected ledger is served as soon as the window read expires."""

from __future__ import annotations

import orjson
import psycopg
import trio

from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp
from ingestion.rpc.protocol import Cursor
from ingestion.testing.local_postgres import LocalPostgres
from tests.api.conftest import build_view

PARAMS = {"startLedger": 290, "pagination": {"limit": 1}}
BODY = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "getEvents", "params": PARAMS})


async def latest_served(app: ApiApp) -> int:
    answer = orjson.loads(await app.answer(BODY))
    return int(answer["result"]["latestLedger"])


def complete_through(url: str, view: str, ledger: int) -> None:
    """The view's live job complete through ``ledger`` (its projector's progress row, moved on)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE ingestion.api_progress SET through = %s WHERE view = %s AND source = %s",
            (str(Cursor.through(ledger)), view, view),
        )


async def test_a_window_read_serves_the_requests_within_its_ttl_and_none_after(pg: LocalPostgres) -> None:
    await build_view(pg.url, "apittl")
    reader = StoreReader(pg.url, "ingestion", "apittl", window_ttl=3600)
    app = ApiApp(reader)
    assert await latest_served(app) == 300
    complete_through(pg.url, "apittl", 305)
    assert await latest_served(app) == 300  # the first request's window read served this one too
    reader.window_ttl = 0
    assert await latest_served(app) == 305  # expired: read again
    complete_through(pg.url, "apittl", 308)
    assert await latest_served(app) == 308  # (ttl 0: every request reads the window)

    fresh = ApiApp(StoreReader(pg.url, "ingestion", "apittl"))  # the default: 10 ms
    assert await latest_served(fresh) == 308
    complete_through(pg.url, "apittl", 310)
    await trio.sleep(fresh.reader.window_ttl)  # a request that begins a ttl after the commit sees it
    assert await latest_served(fresh) == 310
    reader.close()
    fresh.reader.close()


def test_psycopg_runs_compiled() -> None:
    # the pure-Python implementation reads each value through ctypes: a third of the API's CPU
    assert psycopg.pq.__impl__ in ("c", "binary")
