"""``python -m ingestion inspect`` as a subprocess against a real redis-server, and against a real
(simulated) Horizon for the lag."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.lease_store import Acquired, LeaseStore, connect, job_keys
from actors.source import Record
from ingestion.common.paging import toid_parts, token_key
from ingestion.simulator.server import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import child_env

CONTRACT_KEYS = {"job", "leader", "token", "lease_ttl_ms_left", "cursor", "events", "audit"}


async def run_inspect(*args: str) -> trio.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "ingestion", "inspect", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(),
        )  # fmt: skip


async def test_inspect_json_of_an_empty_job_has_the_contract_keys(
    redis_server: LocalRedis, job: str
) -> None:
    client = connect(redis_server.url, timeout=2.0)
    client.set(job_keys(job)["token"], 0)  # a job that exists, with nothing committed yet
    client.close()
    done = await run_inspect("--redis", redis_server.url, "--job", job, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc) == CONTRACT_KEYS | {"lag", "stream", "leader_source_ok", "backfill", "complete_through",
                                        "complete_held", "decode_errors"}  # fmt: skip
    assert doc == {"job": job, "leader": None, "token": 0, "lease_ttl_ms_left": None,
                   "cursor": None, "events": 0, "audit": [], "lag": None,
                   "stream": {"trimmed": 0, "groups": []}, "leader_source_ok": None,
                   "backfill": None, "complete_through": None, "complete_held": "",
                   "decode_errors": []}  # fmt: skip


def documented_fields() -> set[str]:
    """The fields docs/OPERATIONS.md's `inspect` section lists in its table of --json fields."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md").read_text()
    section = text.split("### `inspect`", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))


async def test_every_field_of_inspect_json_is_documented(redis_server: LocalRedis, job: str) -> None:
    client = connect(redis_server.url, timeout=2.0)
    client.set(job_keys(job)["token"], 0)
    client.close()
    one = json.loads((await run_inspect("--redis", redis_server.url, "--job", job, "--json")).stdout)
    every = json.loads((await run_inspect("--redis", redis_server.url, "--json")).stdout)
    fields = set(one).union(*(set(doc) for doc in every)) | {"sink"}  # (sink: PostgreSQL jobs)
    assert fields - documented_fields() == set()


async def test_inspect_shows_leader_cursor_takeover_audit_and_lag_behind_horizon(
    redis_server: LocalRedis, job: str
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=6, ops_per_ledger=4)
    async with open_simulator(config) as sim:
        async with httpx.AsyncClient(timeout=5) as http:
            page = (await http.get(f"{sim.url}/operations", params={"limit": "6"})).json()
        records = [
            Record(paging_token=r["paging_token"], body=json.dumps(r))
            for r in page["_embedded"]["records"]
        ]
        store = LeaseStore(connect(redis_server.url, timeout=2.0), job)
        grant = await store.acquire("node-a", 60_000)
        assert isinstance(grant, Acquired)
        await store.commit("node-a", grant.token, None, records)
        await store.release("node-a", grant.token)
        second = await store.acquire("node-b", 60_000)
        assert isinstance(second, Acquired)
        store.client.close()

        done = await run_inspect(
            "--redis", redis_server.url, "--job", job, "--json", "--horizon", sim.url
        )
        assert done.returncode == 0, done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        assert set(doc) >= CONTRACT_KEYS
        assert (doc["leader"], doc["token"], doc["events"]) == ("node-b", 2, 6)
        assert doc["cursor"] == records[-1].paging_token
        assert 0 < doc["lease_ttl_ms_left"] <= 60_000
        takeover = doc["audit"][-1]  # newest last
        assert takeover["event"] == "became-leader" and takeover["node"] == "node-b"
        assert takeover["previous_node"] == "node-a" and takeover["previous_token"] == 1
        assert [e["event"] for e in doc["audit"]] == ["became-leader", "released", "became-leader"]
        # Tokens are integers (a stream keeps text); a first leader's unknown predecessor is null.
        first, released = doc["audit"][0], doc["audit"][1]
        assert (first["token"], first["previous_token"], first["previous_node"]) == (1, None, "")
        assert (released["token"], takeover["token"]) == (1, 2)
        assert isinstance(takeover["takeover_ms"], int)

        lag = doc["lag"]
        head_ledger = toid_parts(token_key(lag["head"])[0])[0]
        cursor_ledger = toid_parts(token_key(doc["cursor"])[0])[0]
        assert lag["error"] is None and lag["horizon"] == sim.url
        assert lag["ledgers"] == head_ledger - cursor_ledger > 0
        assert lag["seconds"] > 0  # the simulator's ledgers close 5 s apart in its own clock

        table = await run_inspect("--redis", redis_server.url, "--job", job, "--horizon", sim.url)
        text = table.stdout.decode()
        assert table.returncode == 0
        for expected in ("leader", "node-b", "events", f"{lag['ledgers']} ledgers",
                         "became-leader  node-b token 2 after node-a (token 1), leaderless"):  # fmt: skip
            assert expected in text, text


async def test_inspect_reports_an_unreachable_horizon_as_unknown_lag(
    redis_server: LocalRedis, job: str
) -> None:
    from tests.support.ports import closed_port

    client = connect(redis_server.url, timeout=2.0)
    client.set(job_keys(job)["token"], 0)  # a job that exists
    client.close()
    done = await run_inspect("--redis", redis_server.url, "--job", job, "--json",
                             "--horizon", f"http://127.0.0.1:{closed_port()}")  # fmt: skip
    assert done.returncode == 0
    assert json.loads(done.stdout)["lag"]["error"].startswith("ConnectError")


async def test_inspect_of_an_unknown_job_or_a_bad_flag_is_exit_2_with_one_line(
    redis_server: LocalRedis, job: str
) -> None:
    for args, says in (
        (["--job", job], f"ingestion: inspect: no job {job!r} at "),
        (["--job", job, "--audit", "0"], "ingestion: inspect: --audit: must be at least 1, got 0"),
        (["--bogus"], "ingestion: inspect: unrecognized arguments: --bogus"),
    ):
        done = await run_inspect("--redis", redis_server.url, *args)
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(says), lines
        assert not done.stdout


async def test_inspect_with_an_unreachable_redis_exits_1_naming_the_setting() -> None:
    from tests.support.ports import closed_port

    done = await run_inspect("--redis", f"redis://u:hunter2@127.0.0.1:{closed_port()}/0", "--json")
    err = done.stderr.decode()
    assert done.returncode == 1
    assert "redis.url redis://u@127.0.0.1:" in err and "connection refused" in err
    assert "hunter2" not in err and not done.stdout


async def test_inspect_bad_setting_exits_2() -> None:
    done = await run_inspect("--redis", "http://nope", "--json")
    assert done.returncode == 2
    assert b"redis.url: must start with redis://" in done.stderr


async def test_inspect_shows_retention_and_consumer_groups(redis_server: LocalRedis, job: str) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=2.0), job, events_max_len=100)
    grant = await store.acquire("node-a", 60_000)
    assert isinstance(grant, Acquired)
    records = [Record(str(i << 32), f'{{"paging_token":"{i << 32}"}}') for i in range(1, 401)]
    key = store.keys["events"]
    store.client.xgroup_create(key, "billing", id="0", mkstream=True)
    await store.commit("node-a", grant.token, None, records[:300])
    done = store.client.xreadgroup("billing", "c", {key: ">"}, count=300)[0][1]
    store.client.xack(key, "billing", *[entry_id for entry_id, _ in done])
    await store.commit("node-a", grant.token, records[299].paging_token, records[300:])
    store.client.xreadgroup("billing", "c", {key: ">"}, count=40)
    done = await run_inspect("--redis", redis_server.url, "--job", job, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["stream"]["trimmed"] >= 200 and doc["stream"]["trimmed"] + doc["events"] == 400
    (group,) = doc["stream"]["groups"]
    assert (group["name"], group["consumers"], group["pending"], group["lag"]) == ("billing", 1, 40, 60)
    table = await run_inspect("--redis", redis_server.url, "--job", job)
    assert "billing: 40 pending, 60 undelivered" in table.stdout.decode()
    assert "trimmed by retention" in table.stdout.decode()


async def test_inspect_without_a_job_lists_every_job(private_redis: LocalRedis) -> None:
    client = connect(private_redis.url, timeout=2.0)
    for name, holder in (("alpha", "node-a"), ("beta", "node-b"), ("gamma", None)):
        store = LeaseStore(client, name)
        grant = await store.acquire(holder or "node-c", 60_000)
        assert isinstance(grant, Acquired)
        await store.commit(holder or "node-c", grant.token, None, [Record("4294967296", "{}")])
        if holder is None:
            await store.release("node-c", grant.token)
    done = await run_inspect("--redis", private_redis.url, "--json")
    assert done.returncode == 0, done.stderr
    docs = json.loads(done.stdout)
    assert [(d["job"], d["leader"], d["token"], d["cursor"], d["events"]) for d in docs] == [
        ("alpha", "node-a", 1, "4294967296", 1),
        ("beta", "node-b", 1, "4294967296", 1),
        ("gamma", None, 1, "4294967296", 1),
    ]
    table = (await run_inspect("--redis", private_redis.url)).stdout.decode()
    assert "3 jobs; leases held by node-a: 1, node-b: 1" in table
    header = ["job", "leader", "token", "lease", "left", "cursor", "events", "complete", "through", "lag"]
    assert table.splitlines()[0].split() == header


async def test_inspect_shows_when_the_leaders_horizon_last_answered(
    redis_server: LocalRedis, job: str
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=2.0), job)
    grant = await store.acquire("node-a", 60_000)
    assert isinstance(grant, Acquired)
    reported_at = trio.current_time()
    assert await store.report_health("node-a", 1500, 10_000) == ["node-a"]
    await store.report_health("node-b", None, 10_000)  # node-b's source does not answer
    done = await run_inspect("--redis", redis_server.url, "--job", job, "--json")
    since_report = trio.current_time() - reported_at
    source = json.loads(done.stdout)["leader_source_ok"]
    # 1.5 s before the report, plus however long inspect took to read it (a loaded machine may
    # take seconds to start a process): both measured, so no guess at the load.
    print(f"\nseconds_ago {source['seconds_ago']}, report to inspect's answer {since_report:.3f} s")
    assert 1.5 - 0.001 <= source["seconds_ago"] <= 1.5 + since_report + 0.1
    assert source["at"].endswith("Z")
    table = (await run_inspect("--redis", redis_server.url, "--job", job)).stdout.decode()
    assert "leader's source" in table and "s ago)" in table


async def test_inspect_shows_the_watermark_where_a_gap_holds_it_and_the_records_not_decoded(
    redis_server: LocalRedis, job: str
) -> None:
    """Issue 49: the completeness watermark and why a gap holds it, and the newest records
    committed with a decodeError, newest first."""
    from actors.source import Watermark

    store = LeaseStore(connect(redis_server.url, timeout=2.0), job)
    grant = await store.acquire("node-a", 60_000)
    assert isinstance(grant, Acquired)
    bad = [Record(str(i << 32), json.dumps({"id": i, "decodeError": f"bad ScVal {i}"})) for i in (3, 5)]
    good = [Record(str(i << 32), json.dumps({"id": i})) for i in (2, 4, 6)]
    batch = sorted(bad + good, key=lambda r: int(r.paging_token))
    held = "history gap: ledgers before 9 are gone"
    await store.commit("node-a", grant.token, None, batch, watermark=Watermark(6, held))
    done = await run_inspect("--redis", redis_server.url, "--job", job, "--json")
    doc = json.loads(done.stdout)
    assert (doc["complete_through"], doc["complete_held"]) == (6, held)
    assert [(d["paging_token"], d["decode_error"]) for d in doc["decode_errors"]] == [
        (str(5 << 32), "bad ScVal 5"), (str(3 << 32), "bad ScVal 3")
    ]
    table = (await run_inspect("--redis", redis_server.url, "--job", job)).stdout.decode()
    assert re.search(rf"^complete through +ledger 6 \(held for good: {held}\)$", table, re.MULTILINE), table
    lines = table.splitlines()
    start = lines.index("records committed with a decodeError (newest first, among the newest 10000):")
    assert [line.split()[1:] for line in lines[start + 1 :]] == [
        [str(5 << 32), "bad", "ScVal", "5"], [str(3 << 32), "bad", "ScVal", "3"]
    ]
    every = (await run_inspect("--redis", redis_server.url)).stdout.decode()
    assert "6 (held)" in next(line for line in every.splitlines() if line.startswith(job + " "))
