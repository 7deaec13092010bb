"""A realistic store of contract events for the events API's scale benchmark (issue 48), loaded
into a real PostgreSQL with ``COPY``, and cached between runs.

The events are stellar-rpc ``EventInfo`` records, as an RPC job commits them (``ingestion.events``:
``paging_token`` the event id ``"%019d-%010d"``, ``record`` its compact JSON in RPC's field order,
``seq`` 1, 2, 3, ... in id order), their topics and values real base64 XDR ``ScVal``s:

- ledgers from :attr:`Shape.first_ledger`, one every 5 s, each with 3 to 11 transactions (7 on
  average); every transaction is charged a fee (protocol 23's ``BeforeAllTxs`` stage: ids
  ``(ledger, 0, 0, i)``, before every transaction's events), topic ``[fee, Address(source)]``
  from the native asset's contract; 2 % of transactions fail (only their fee event, with
  ``inSuccessfulContractCall`` false), the others emit 1 to 3 events at ``(ledger, tx, 0, i)``;
- those events' verbs: ``transfer`` 70 %, ``mint`` 10 %, ``burn`` 7 %, and 13 % spread over
  ``approve``, ``swap``, ``sync``, ``deposit``, ``withdraw``, ``claim``; with the fees, 91 % of
  all events are under the four verbs transfer/fee/mint/burn;
- contracts Zipf-distributed over :attr:`Shape.contracts` (exponent 1.1; rank 0 is the native
  asset's contract, which also emits every fee), accounts over :attr:`Shape.accounts` (exponent
  1.0); the first :data:`SAC_CONTRACTS` contracts are asset contracts, whose transfer, mint and burn
  topics end with the asset's ``String`` (SEP-41 tokens' do not);
- one event in a million from a contract seen nowhere else (:attr:`Shape.rare_contract`, verb
  ``attest``, at ``seq - 1`` = 250,000 + k * 1,000,000) and one in a million with a verb seen nowhere else
  (``set_admin`` from contract rank 1, at 750,000 + k * 1,000,000); :attr:`Shape.rare_every`.

Everything is a function of the shape (seeds by chunk of ledgers), so two runs build the same
store, and workers build chunks in parallel, each ``COPY``ing its own chunk.

    python -m benchmarks.api_store [--events 10000000] [--cache DIR] [--fresh]

prints where the store's PostgreSQL data directory is and how long generation took; the directory
(under ``$BENCHMARK_CACHE``, default ``/var/tmp/ingestion-bench``) is reused by the next run
with the same shape (it holds a ``ready`` file only once loading finished).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import bisect
import concurrent.futures
import hashlib
import inspect
import itertools
import json
import multiprocessing
import os
import random
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg

from ingestion.api import store
from ingestion.common.strkey import encode_contract
from ingestion.postgres.connection import connect, ensure_schema
from ingestion.rpc.protocol import Cursor
from ingestion.testing.local_postgres import LocalPostgres

FORMAT = 1  # bump when the generated content changes: a cached store of another format is rebuilt
SAC_CONTRACTS = 50  # the first contracts by rank are Stellar asset contracts
LEDGERS_PER_CHUNK = 2_000
RARE_EVERY = 1_000_000
RARE_CONTRACT_VERB = "attest"
RARE_VERB = "set_admin"
OTHER_VERBS = ("approve", "swap", "sync", "deposit", "withdraw", "claim")
# op-event verbs and their cumulative weights (the fees come on top: one per transaction)
VERBS = ("transfer", "mint", "burn", *OTHER_VERBS)
VERB_CUM = list(itertools.accumulate([0.70, 0.10, 0.07] + [0.13 / len(OTHER_VERBS)] * len(OTHER_VERBS)))
CLOSE_SECONDS = 5
FIRST_CLOSE = 1_767_225_600  # 2026-01-01T00:00:00Z
TOKEN = 1  # the fencing token the rows carry (one term wrote them all)

_COPY = "COPY {schema}.events (job, seq, paging_token, token, record, committed_at) FROM STDIN"


@attrs.frozen
class Shape:
    """What to generate. ``events`` is reached exactly (the last ledger is cut short)."""

    events: int = 10_000_000
    seed: int = 48
    first_ledger: int = 56_000_000
    contracts: int = 20_000
    accounts: int = 200_000
    contract_exponent: float = 1.1
    account_exponent: float = 1.0
    job: str = "contract-events"
    schema: str = "ingestion"
    rare_every: int = RARE_EVERY  # one rare-contract and one rare-verb event in this many

    @property
    def key(self) -> str:
        """The cache's name for this shape."""
        text = json.dumps(attrs.asdict(self), sort_keys=True) + f":{FORMAT}"
        return f"api-store-{self.events}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    @property
    def rare_contract(self) -> str:
        return contract_id(self, -1)


# -- ScVal XDR, built directly (the smoke test holds them to stellar-sdk's) ----------------------


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


def _padded(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data + b"\0" * (-len(data) % 4)


def symbol(name: str) -> str:
    """``ScVal::Symbol(name)`` as base64 XDR."""
    return _b64(struct.pack(">i", 15) + _padded(name.encode("ascii")))


def string(text: str) -> str:
    """``ScVal::String(text)`` as base64 XDR."""
    return _b64(struct.pack(">i", 14) + _padded(text.encode("utf-8")))


def account_address(key: bytes) -> str:
    """``ScVal::Address`` of the ed25519 account ``key`` (32 bytes) as base64 XDR."""
    return _b64(struct.pack(">iii", 18, 0, 0) + key)


def contract_address(contract_hash: bytes) -> str:
    """``ScVal::Address`` of the contract ``contract_hash`` (32 bytes) as base64 XDR."""
    return _b64(struct.pack(">ii", 18, 1) + contract_hash)


_I128 = struct.Struct(">iqQ")


def i128(value: int) -> str:
    """``ScVal::I128(value)`` (0 <= value < 2**64) as base64 XDR."""
    return binascii.b2a_base64(_I128.pack(10, 0, value), newline=False).decode("ascii")


def _digest(shape: Shape, kind: str, n: int) -> bytes:
    return hashlib.sha256(f"{shape.seed}:{kind}:{n}".encode()).digest()


def contract_id(shape: Shape, rank: int) -> str:
    """The ``C...`` id of the contract of ``rank`` (-1: the rare contract)."""
    return encode_contract(_digest(shape, "contract", rank))


def account_key(shape: Shape, rank: int) -> bytes:
    return _digest(shape, "account", rank)


def _cum_zipf(n: int, exponent: float) -> list[float]:
    return list(itertools.accumulate((k + 1) ** -exponent for k in range(n)))


# -- the layout: how many events each chunk of ledgers holds -------------------------------------


def _ledger_counts(shape: Shape, chunk: int) -> list[tuple[int, list[int], list[bool]]]:
    """Per ledger of ``chunk``: (transactions, op events per transaction, failed per transaction)."""
    rng = random.Random(f"{shape.seed}:counts:{chunk}")
    out = []
    for _ in range(LEDGERS_PER_CHUNK):
        txs = 3 + int(rng.random() * 9)
        failed = [rng.random() < 0.02 for _ in range(txs)]
        ops = [0 if f else 1 + int(rng.random() * 3) for f in failed]
        out.append((txs, ops, failed))
    return out


def plan(shape: Shape) -> list[tuple[int, int]]:
    """(chunk, first seq) for every chunk needed to reach ``shape.events`` events."""
    chunks, seq, chunk = [], 1, 0
    while seq <= shape.events:
        chunks.append((chunk, seq))
        seq += sum(txs + sum(ops) for txs, ops, _ in _ledger_counts(shape, chunk))
        chunk += 1
    return chunks


# -- the rows --------------------------------------------------------------------------------------


@attrs.frozen
class _Tables:
    """What every chunk draws from, built once per process."""

    contract_ids: list[str]
    contract_cum: list[float]
    account_b64: list[str]
    account_cum: list[float]
    assets: list[str]  # per SAC contract: its asset's String ScVal
    verbs: dict[str, str]
    rare_contract: str

    @classmethod
    def build(cls, shape: Shape) -> _Tables:
        assets = [string("native")] + [
            string(f"T{rank:03d}:GA{base64.b32encode(account_key(shape, -rank)).decode()[:54]}")
            for rank in range(1, SAC_CONTRACTS)
        ]
        return cls(
            contract_ids=[contract_id(shape, rank) for rank in range(shape.contracts)],
            contract_cum=_cum_zipf(shape.contracts, shape.contract_exponent),
            account_b64=[account_address(account_key(shape, rank)) for rank in range(shape.accounts)],
            account_cum=_cum_zipf(shape.accounts, shape.account_exponent),
            assets=assets,
            verbs={v: symbol(v) for v in (*VERBS, "fee", RARE_CONTRACT_VERB, RARE_VERB)},
            rare_contract=shape.rare_contract,
        )


def _closed_at(ledger: int, shape: Shape) -> tuple[str, str]:
    epoch = FIRST_CLOSE + (ledger - shape.first_ledger) * CLOSE_SECONDS
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))
    return stamp + "Z", stamp + "+00"


def chunk_rows(shape: Shape, chunk: int, first_seq: int, tables: _Tables | None = None) -> Iterator[str]:
    """``chunk``'s rows as ``COPY`` text lines (tab-separated; nothing in them needs escaping),
    seq from ``first_seq``, never past ``shape.events``."""
    t = tables or _Tables.build(shape)
    rng = random.Random(f"{shape.seed}:content:{chunk}")
    rnd, choose = rng.random, bisect.bisect
    ccum, ctotal = t.contract_cum, t.contract_cum[-1]
    acum, atotal = t.account_cum, t.account_cum[-1]
    clast, alast, vtotal, vlast = len(ccum) - 1, len(acum) - 1, VERB_CUM[-1], len(VERBS) - 1
    accounts, verbs = t.account_b64, t.verbs
    job, seq, last = shape.job, first_seq, shape.events
    rare_every = shape.rare_every
    rare_contract_at, rare_topic_at = rare_every // 4, rare_every * 3 // 4
    for offset, (txs, ops, failed) in enumerate(_ledger_counts(shape, chunk)):
        ledger = shape.first_ledger + chunk * LEDGERS_PER_CHUNK + offset
        closed, committed = _closed_at(ledger, shape)
        hashes = [f"{rng.getrandbits(256):064x}" for _ in range(txs)]
        sources = [choose(acum, rnd() * atotal, 0, alast) for _ in range(txs)]
        # (tx, op, index, contract, topics, value, successful)
        events: list[tuple[int, int, int, str, str, str, bool, str]] = []
        for tx in range(txs):
            fee = i128(100 + int(rnd() * 1_000_000))
            topic = f'"{verbs["fee"]}","{accounts[sources[tx]]}"'
            events.append((0, 0, tx, t.contract_ids[0], topic, fee, not failed[tx], hashes[tx]))
        for tx in range(txs):
            for i in range(ops[tx]):
                rank = choose(ccum, rnd() * ctotal, 0, clast)
                verb = VERBS[choose(VERB_CUM, rnd() * vtotal, 0, vlast)]
                source = accounts[sources[tx]]
                other = accounts[choose(acum, rnd() * atotal, 0, alast)]
                tail = f',"{t.assets[rank]}"' if rank < SAC_CONTRACTS else ""
                if verb == "transfer":
                    topic = f'"{verbs[verb]}","{source}","{other}"{tail}'
                elif verb == "mint":
                    topic = f'"{verbs[verb]}","{other}"{tail}'
                elif verb == "burn":
                    topic = f'"{verbs[verb]}","{source}"{tail}'
                else:
                    topic = f'"{verbs[verb]}","{source}"'
                value = i128(1 + int(rnd() * 10**12))
                events.append((tx + 1, 0, i, t.contract_ids[rank], topic, value, True, hashes[tx]))
        for tx, op, i, contract, topic, value, ok, tx_hash in events:
            if seq > last:
                return
            position = (seq - 1) % rare_every
            if position == rare_contract_at:
                contract, topic = t.rare_contract, f'"{verbs[RARE_CONTRACT_VERB]}","{accounts[0]}"'
            elif position == rare_topic_at:
                contract, topic = t.contract_ids[1], f'"{verbs[RARE_VERB]}","{accounts[1]}"'
            event_id = f"{(ledger << 32) | (tx << 12) | op:019d}-{i:010d}"
            record = (
                f'{{"type":"contract","ledger":{ledger},"ledgerClosedAt":"{closed}",'
                f'"contractId":"{contract}","id":"{event_id}","operationIndex":{op},'
                f'"transactionIndex":{tx},"txHash":"{tx_hash}",'
                f'"inSuccessfulContractCall":{"true" if ok else "false"},'
                f'"topic":[{topic}],"value":"{value}"}}'
            )
            yield f"{job}\t{seq}\t{event_id}\t{TOKEN}\t{record}\t{committed}\n"
            seq += 1


# -- loading -------------------------------------------------------------------------------------------


def _copy_chunks(args: tuple[Shape, str, list[tuple[int, int]]]) -> int:
    shape, url, chunks = args
    tables = _Tables.build(shape)
    rows = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for chunk, first_seq in chunks:
            with conn.cursor().copy(_COPY.format(schema=shape.schema)) as copy:
                buffer: list[str] = []
                for line in chunk_rows(shape, chunk, first_seq, tables):
                    buffer.append(line)
                    if len(buffer) >= 2000:
                        copy.write("".join(buffer))
                        rows += len(buffer)
                        buffer.clear()
                copy.write("".join(buffer))
                rows += len(buffer)
    return rows


def load(url: str, shape: Shape, workers: int = 2, log: Any = print) -> dict[str, Any]:
    """Generate ``shape``'s events into the PostgreSQL at ``url`` (the sink's tables, created when
    missing), with the job's cursor, fence and term as a node leaves them; then ``VACUUM
    ANALYZE``. Returns timings (seconds) and the ledger range."""
    started = time.monotonic()
    with connect(url, 30.0) as conn:
        ensure_schema(conn, shape.schema)
    chunks = plan(shape)
    planned = time.monotonic()
    shares = [(shape, url, chunks[w::workers]) for w in range(workers)]
    if workers == 1:
        rows = _copy_chunks(shares[0])
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            rows = sum(pool.map(_copy_chunks, shares))
    copied = time.monotonic()
    if rows != shape.events:
        raise RuntimeError(f"generated {rows} rows, wanted {shape.events}")
    s = f'"{shape.schema}"'
    with psycopg.connect(url, autocommit=True) as conn:
        last = conn.execute(
            f"SELECT paging_token, (record->>'ledger')::bigint FROM {s}.events WHERE job = %s "
            "ORDER BY seq DESC LIMIT 1",
            (shape.job,),
        ).fetchone()
        assert last is not None
        conn.execute(
            f"INSERT INTO {s}.fences (job, token, node) VALUES (%s, %s, 'api-store') ON CONFLICT (job) "
            "DO UPDATE SET token = excluded.token",
            (shape.job, TOKEN),
        )
        conn.execute(
            f"INSERT INTO {s}.terms (job, token, after_seq) VALUES (%s, %s, 0) ON CONFLICT DO NOTHING",
            (shape.job, TOKEN),
        )
        # an RPC job's cursor after its last page: every event of the last ledger scanned
        conn.execute(
            f"INSERT INTO {s}.cursors (job, cursor, token) VALUES (%s, %s, %s) ON CONFLICT (job) "
            "DO UPDATE SET cursor = excluded.cursor",
            (shape.job, str(Cursor.through(int(last[1]))), TOKEN),
        )
        conn.execute(f"VACUUM ANALYZE {s}.events")
    done = time.monotonic()
    timings = {
        "events": rows,
        "first_ledger": shape.first_ledger,
        "latest_ledger": int(last[1]),
        "plan_s": round(planned - started, 1),
        "copy_s": round(copied - planned, 1),
        "vacuum_s": round(done - copied, 1),
        "total_s": round(done - started, 1),
    }
    log(f"loaded {rows} events in {timings['total_s']} s ({timings})")
    return timings


# -- the events API's store over them ----------------------------------------------------------------


def api_store_key(schema: str = "ingestion") -> str:
    """A digest of the API store's DDL and projection code: a cached projection made by other code
    is made again."""
    parts = [*store.create_statements(schema)]
    parts += [inspect.getsource(f) for f in (store.project_record, store.served_record, store.segment_key)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


_PROJECT = (
    "INSERT INTO {s}.api_events (view, id, ledger, type, contract_id, topic_count, topic1, topic2, "
    "topic3, topic4, record) "
    "SELECT job, paging_token, (record->>'ledger')::bigint, record->>'type', "
    "coalesce(record->>'contractId', ''), coalesce(json_array_length(record->'topic'), 0), "
    "record->'topic'->>0, record->'topic'->>1, record->'topic'->>2, record->'topic'->>3, record::text "
    "FROM {s}.events WHERE job = %s AND seq BETWEEN %s AND %s ORDER BY seq"
)


def _project_range(args: tuple[Shape, str, int, int]) -> int:
    """Project the job's rows ``seq`` in ``[low, high]`` into ``api_events`` in SQL: what the
    API's :func:`~ingestion.api.store.project_record` makes of these events (none has a topic
    segment over its key limit nor a decoding job's additions; :func:`check_projection` holds a
    sample to it), at PostgreSQL's speed."""
    shape, url, low, high = args
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        cursor = conn.execute(_PROJECT.format(s=f'"{shape.schema}"'), (shape.job, low, high))  # type: ignore[arg-type]
        return cursor.rowcount


def check_projection(url: str, shape: Shape, sample: int = 2000) -> int:
    """Hold ``sample`` random projected rows to what the API's own projector code makes of their
    committed records. Returns how many were checked.

    Raises:
        AssertionError: a row differs.
    """
    q = f'"{shape.schema}"'
    picks = sorted(random.Random(shape.seed).sample(range(1, shape.events + 1), min(sample, shape.events)))
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT e.paging_token, e.record::text, a.id, a.ledger, a.type, a.contract_id, a.topic_count, "
            f"a.topic1, a.topic2, a.topic3, a.topic4, a.record FROM {q}.events e JOIN {q}.api_events a "
            "ON a.view = e.job AND a.id = e.paging_token WHERE e.job = %s AND e.seq = ANY(%s)",
            (shape.job, picks),
        ).fetchall()
    assert len(rows) == len(picks), f"{len(picks) - len(rows)} sampled events not projected"
    for paging_token, record, *projected in rows:
        r = store.project_record(paging_token, record)
        want = [r.id, r.ledger, r.type, r.contract_id, r.topic_count, *r.topics, r.record]
        assert projected == want, f"event {paging_token}: projected {projected}, the API makes {want}"
    return len(rows)


def project(url: str, shape: Shape, sessions: int = 4, log: Any = print) -> dict[str, Any]:
    """Build the events API's store (``ingestion/api/store.py``: its tables, every event of the
    job projected as its projector would, its indexes, the job's progress) over the loaded
    events, replacing any earlier one. Returns timings (seconds)."""
    started = time.monotonic()
    statements = store.create_statements(shape.schema)
    s = f'"{shape.schema}"'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {s}.api_events, {s}.api_progress")
        for statement in statements:
            if not statement.startswith("CREATE INDEX"):
                conn.execute(statement)  # type: ignore[arg-type]
    step = -(-shape.events // sessions)
    lows = range(1, shape.events + 1, step)
    ranges = [(shape, url, low, min(low + step - 1, shape.events)) for low in lows]
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:  # (the work is the server's)
        rows = sum(pool.map(_project_range, ranges))
    copied = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for statement in statements:
            if statement.startswith("CREATE INDEX"):
                conn.execute(statement)  # type: ignore[arg-type]
        indexed = time.monotonic()
        row = conn.execute(f"SELECT cursor FROM {s}.cursors WHERE job = %s", (shape.job,)).fetchone()
        assert row is not None
        conn.execute(store.save_progress(shape.schema), (shape.job, shape.job, shape.events, row[0]))  # type: ignore[arg-type]
        conn.execute(f"VACUUM ANALYZE {s}.api_events")
        checked = check_projection(url, shape)
        size = conn.execute(f"SELECT pg_total_relation_size('{s}.api_events')").fetchone()
    done = time.monotonic()
    timings = {
        "rows": rows,
        "copy_s": round(copied - started, 1),
        "index_s": round(indexed - copied, 1),
        "vacuum_s": round(done - indexed, 1),
        "total_s": round(done - started, 1),
        "bytes": int(size[0]) if size else 0,
        "checked": checked,
    }
    log(f"projected {rows} events in {timings['total_s']} s ({timings})")
    return timings


def ensure_projected(pg: LocalPostgres, shape: Shape, log: Any = print) -> dict[str, Any]:
    """The events API's store over ``pg``'s events, made unless this code's is cached there."""
    marker = pg.directory / f"api-{api_store_key(shape.schema)}"
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    for old in pg.directory.glob("api-*"):
        old.unlink()
    timings = project(pg.url, shape, sessions=1 if shape.events < 100_000 else 4, log=log)
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    marker.write_text(json.dumps(timings))
    return timings


def cache_root() -> Path:
    return Path(os.environ.get("BENCHMARK_CACHE", "/var/tmp/ingestion-bench"))


def open_store(
    shape: Shape, *, fresh: bool = False, log: Any = print
) -> tuple[LocalPostgres, dict[str, Any]]:
    """A started PostgreSQL holding ``shape``'s store: the cached one when its data directory is
    complete (``ready``), else generated there. The caller stops it (``stop()``, never
    ``cleanup()``: that deletes the cache)."""
    directory = cache_root() / shape.key
    ready = directory / "ready"
    if fresh or not ready.exists():
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        pg = LocalPostgres(directory=directory).start()
        try:
            timings = load(pg.url, shape, workers=1 if shape.events < 100_000 else 2, log=log)
            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
        except BaseException:
            pg.stop()
            raise
        ready.write_text(json.dumps(timings))
        return pg, timings
    pg = LocalPostgres(directory=directory).start()
    return pg, json.loads(ready.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_store")
    p.add_argument("--events", type=int, default=Shape().events)
    p.add_argument("--fresh", action="store_true", help="generate again even if cached")
    args = p.parse_args(argv)
    shape = Shape(events=args.events)
    pg, timings = open_store(shape, fresh=args.fresh)
    try:
        projected = ensure_projected(pg, shape)
        print(json.dumps({"url": pg.url, "directory": str(pg.directory), **timings, "api_store": projected}))
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
