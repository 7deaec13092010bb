"""The checker, checked: every kind of broken stream that ``ingestion.verify`` exists to catch is
reported, by the pure :func:`check_stream` and end to end by :func:`verify_rpc_job` (a real Redis
holding the broken stream, the simulator's Stellar RPC as the source's truth).

The slow failover tests trust ``verify`` to say "exactly once, in order, each write fenced"; a
checker that waved a duplicate through would make all of them pass for the wrong reason."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
import trio

from actors.lease_store import job_keys
from ingestion.common.http import SourceUnreadable
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.verify import (
    Grant,
    SourceRecord,
    StreamEntry,
    Verification,
    check_stream,
    fetch_rpc_events,
    fetch_source,
    verify_rpc_job,
)

# --- the pure core -------------------------------------------------------------------------

# Ten source records; a granted token 1 at 1000 ms, b granted token 2 at 2000 ms.
SOURCE = [
    SourceRecord(str(n << 32), {"paging_token": str(n << 32), "_links": {"self": {"href": f"http://h/{n}"}}})
    for n in range(1, 11)
]
GRANTS = [Grant("1000-0", "a", 1), Grant("2000-0", "b", 2)]


def entry(
    i: int,
    *,
    at: int | None = None,
    token: int | None = None,
    node: str | None = None,
    record: str | None = None,
) -> StreamEntry:
    """The stream entry for source record ``i`` as an honest run writes it: records 0-4 by a under
    token 1 (at 1100-1500 ms), 5-9 by b under token 2 (at 2100-2500 ms)."""
    first_term = i < 5
    src = SOURCE[i]
    return StreamEntry(
        f"{at if at is not None else (1100 if first_term else 1600) + 100 * i}-0",
        src.paging_token,
        token if token is not None else (1 if first_term else 2),
        node if node is not None else ("a" if first_term else "b"),
        record if record is not None else json.dumps(src.record),
    )


HONEST = [entry(i) for i in range(10)]


def test_an_honest_stream_passes() -> None:
    result = check_stream(HONEST, SOURCE, GRANTS)
    assert result.ok, result.problems
    assert (result.count, result.tokens) == (10, (1, 2))
    assert result.summary().endswith("exactly once, in order: OK")


def test_a_record_read_through_another_host_is_the_same_record() -> None:
    moved = [
        entry(
            i, record=json.dumps({**SOURCE[i].record, "_links": {"self": {"href": f"https://x:8/{i + 1}"}}})
        )
        for i in range(10)
    ]
    assert check_stream(moved, SOURCE, GRANTS).ok


def test_a_trimmed_stream_without_a_hole_passes() -> None:
    result = check_stream(HONEST[3:], SOURCE, GRANTS, trimmed=3)
    assert result.ok, result.problems
    assert "after 3 trimmed by retention" in result.summary()


def _swap(entries: list[StreamEntry], i: int, j: int) -> list[StreamEntry]:
    out = list(entries)
    out[i], out[j] = entries[j], entries[i]
    return out


# (what is wrong, the stream, trimmed, a pattern one of the problems must match)
BROKEN: list[tuple[str, Callable[[], list[StreamEntry]], int, str]] = [
    (
        "duplicate",
        lambda: [*HONEST[:4], entry(3, at=1450), *HONEST[4:]],
        0,
        r"^entry 4 \(1450-0\): paging token \d+ duplicates entry 3$",
    ),
    (
        "gap",
        lambda: HONEST[:4] + HONEST[5:],
        0,
        r"^entry 4: paging token \d+, the source has \d+ there \(gap or reordering\)$",
    ),
    (
        "reordering",
        lambda: _swap(HONEST, 2, 3),
        0,
        r"^entry 2: paging token \d+, the source has \d+ there \(gap or reordering\)$",
    ),
    (
        "token backwards",
        lambda: [*HONEST[:6], entry(6, token=1, node="a"), *HONEST[7:]],
        0,
        r"^entry 6: fencing token 1 after 2: the token went backwards$",
    ),
    (
        "write after the successor's grant",
        lambda: [*HONEST[:4], entry(4, at=2050), *HONEST[5:]],
        0,
        r"^entry 4: written under token 1 by a at 2050 ms, after token 2 was granted to b .*stale",
    ),
    (
        "wrong node",
        lambda: [*HONEST[:2], entry(2, node="b"), *HONEST[3:]],
        0,
        r"^entry 2: written by b under token 1, which was granted to a$",
    ),
    (
        "token never granted",
        lambda: [*HONEST[:9], entry(9, token=3)],
        0,
        r"^entry 9: fencing token 3 was never granted",
    ),
    (
        "written before its grant",
        lambda: [entry(0, at=900), *HONEST[1:]],
        0,
        r"^entry 0: written before token 1 was granted$",
    ),
    (
        "record differs",
        lambda: [*HONEST[:1], entry(1, record='{"paging_token": "x"}'), *HONEST[2:]],
        0,
        r"^entry 1: paging token \d+: the record differs from Horizon's$",
    ),
    (
        "record not JSON",
        lambda: [*HONEST[:1], entry(1, record="{"), *HONEST[2:]],
        0,
        r"^entry 1: paging token \d+: the record is not JSON$",
    ),
    (
        "beyond the source",
        lambda: [*HONEST, StreamEntry("2600-0", str(11 << 32), 2, "b", "{}")],
        0,
        r"^entry 10: paging token \d+ is beyond the source's records$",
    ),
    (
        "trimmed stream with a hole",
        lambda: HONEST[3:5] + HONEST[6:],
        3,
        r"^entry 2: paging token \d+, the source has \d+ there \(gap or reordering\)$",
    ),
    (
        "trimmed count with a hole at the head",
        lambda: HONEST[4:],
        3,
        r"^entry 0: paging token \d+, the source has \d+ there \(gap or reordering\)$",
    ),
]


@pytest.mark.parametrize(
    ("stream", "trimmed", "pattern"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN]
)
def test_check_stream_reports_each_kind_of_broken_stream(
    stream: Callable[[], list[StreamEntry]], trimmed: int, pattern: str
) -> None:
    result = check_stream(stream(), SOURCE, GRANTS, trimmed=trimmed)
    assert not result.ok
    assert any(re.search(pattern, p) for p in result.problems), result.problems
    assert "FAILED" in result.summary()


def test_a_stream_broken_everywhere_is_described_by_its_first_few_problems() -> None:
    everywhere = [entry(i, node="z") for i in range(10)] * 3
    result = check_stream(everywhere, SOURCE, GRANTS)
    assert len(result.problems) == 12


def test_without_grants_a_backwards_token_is_still_reported() -> None:
    stream = [*HONEST[:6], entry(6, token=1), *HONEST[7:]]
    result = check_stream(stream, SOURCE, None)
    assert result.problems == ("entry 6: fencing token 1 after 2: the token went backwards",)


# --- end to end: verify_rpc_job against Redis and the simulated RPC -------------------------

RPC_CONFIG = SimulatorConfig(ledger_interval=None, history_ledgers=20, ops_per_ledger=20, rpc_port=0)


def write_evidence(
    client: redis.Redis, job: str, source: list[SourceRecord], picks: list[dict[str, Any]], trim: int
) -> None:
    """Write the job's audit grants (a: 1 at 1000 ms, b: 2 at 2000 ms) and an events stream of
    ``picks`` (each: source index ``i`` and overrides of ``at``, ``token``, ``node``) with explicit
    stream ids, then trim the first ``trim`` entries as retention would."""
    keys = job_keys(job)
    for grant in GRANTS:
        client.xadd(
            keys["audit"],
            {"event": "became-leader", "node": grant.node, "token": grant.token},
            id=grant.entry_id,
        )
    for n, pick in enumerate(picks):
        first_term = pick["i"] < 5
        at = pick.get("at", (1100 if first_term else 2100) + 10 * n)
        client.xadd(keys["events"], {
            "paging_token": source[pick["i"]].paging_token,
            "token": pick.get("token", 1 if first_term else 2),
            "node": pick.get("node", "a" if first_term else "b"),
            "record": json.dumps(source[pick["i"]].record),
        }, id=f"{at}-{n}")  # fmt: skip
    if trim:
        ids = [entry_id for entry_id, _ in client.xrange(keys["events"], count=trim + 1)]
        client.xtrim(keys["events"], minid=ids[trim], approximate=False)


def _honest(n: int = 10) -> list[dict[str, Any]]:
    return [{"i": i} for i in range(n)]


E2E: list[tuple[str, list[dict[str, Any]], int, str | None]] = [
    ("honest", _honest(), 0, None),
    ("honest, trimmed", _honest(), 3, None),
    ("duplicate", [*_honest(4), {"i": 3}, *_honest(10)[4:]], 0, r"duplicates entry 3$"),
    ("gap", _honest(4) + _honest(10)[5:], 0, r"^entry 4: .*\(gap or reordering\)$"),
    (
        "reordering",
        [*_honest(2), {"i": 3}, {"i": 2}, *_honest(10)[4:]],
        0,
        r"^entry 2: .*\(gap or reordering\)$",
    ),
    (
        "token backwards",
        [*_honest(6), {"i": 6, "token": 1, "node": "a"}, *_honest(10)[7:]],
        0,
        r"^entry 6: fencing token 1 after 2: the token went backwards$",
    ),
    (
        "write after the successor's grant",
        [*_honest(4), {"i": 4, "at": 2050}, *_honest(10)[5:]],
        0,
        r"^entry 4: written under token 1 by a at 2050 ms, after token 2 was granted to b",
    ),
    (
        "wrong node",
        [*_honest(2), {"i": 2, "node": "b"}, *_honest(10)[3:]],
        0,
        r"^entry 2: written by b under token 1, which was granted to a$",
    ),
    ("trimmed stream with a hole", _honest(5) + _honest(10)[6:], 3, r"^entry 2: .*\(gap or reordering\)$"),
]


@pytest.mark.parametrize(("picks", "trim", "pattern"), [c[1:] for c in E2E], ids=[c[0] for c in E2E])
async def test_verify_rpc_job_reports_what_is_wrong_with_the_stream_in_redis(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str,
    picks: list[dict[str, Any]], trim: int, pattern: str | None,
) -> None:  # fmt: skip
    async with open_simulator(RPC_CONFIG) as sim:
        with trio.fail_after(30):
            source = await fetch_rpc_events(sim.rpc_url, through=str(1 << 62))
            assert len(source) >= 10
            # The verifier reads from the oldest ledger the RPC keeps: the stream starts at its
            # first event.
            write_evidence(redis_client, job, source[:10], picks, trim)
            result: Verification = await verify_rpc_job(redis_server.url, job, sim.rpc_url)
    assert result.trimmed == trim
    if pattern is None:
        assert result.ok, result.problems
        assert result.count == len(picks) - trim and result.tokens == (1, 2)
    else:
        assert not result.ok
        assert any(re.search(pattern, p) for p in result.problems), result.problems


async def test_a_source_that_refuses_is_said_in_one_line_by_its_package() -> None:
    """``verify`` reads Horizon and RPC through their packages (``Reader``, ``RpcReader``): a
    refusal comes back as :class:`SourceUnreadable` with what the source said (its status and
    problem detail, its JSON-RPC error), a URL that is none as the sources' own URL check says."""
    async with open_simulator(RPC_CONFIG) as sim:
        with trio.fail_after(30):
            with pytest.raises(SourceUnreadable, match=r"^HTTP 400: Bad Request .* invalid_field=account_id"):
                await fetch_source(sim.url, "/accounts/GNOBODY/payments", through="1")
            with pytest.raises(SourceUnreadable, match=r"^getEvents: RPC error -32602: "):
                await fetch_rpc_events(sim.rpc_url, [{"type": "nonsense"}], 1, through="1")
    with pytest.raises(ValueError, match="must be an http:// or https:// URL with a host"):
        await fetch_source("ftp://h", through="1")


def test_a_one_shot_commands_source_logs_go_to_stderr_warnings_only() -> None:
    """verify reads its source through the source packages, which log (a rate limit waited out at
    debug, a page size reduced at warning): none of it may land in the command's stdout."""
    import subprocess
    import sys

    code = (
        "import structlog\n"
        "from ingestion.cli.usage import quiet_logs\n"
        "quiet_logs()\n"
        "structlog.get_logger().debug('horizon-rate-paced', delay=1.0)\n"
        "structlog.get_logger().warning('horizon-page-limit-reduced', limit=100)\n"
        "print('job j: ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "job j: ok\n"
    assert "horizon-page-limit-reduced" in done.stderr and "horizon-rate-paced" not in done.stderr
