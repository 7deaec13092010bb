"""Real processes: nodes following the simulator's Stellar RPC with a watch list, through a leader's
SIGKILL. What they commit is checked against the simulator's own ``getEvents`` paging, decoded and
filtered again here: exactly the events naming a watched address, each decoded, none other, and
the cursor past the rest."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ingestion.common.strkey import encode_account
from ingestion.config import load
from ingestion.decode.decoded import decode_event_text
from ingestion.node.build import watch_source
from ingestion.rpc.protocol import Cursor
from ingestion.testing.cluster import Cluster, open_cluster
from ingestion.testing.wait import child_env, wait_until
from ingestion.verify import DERIVED, fetch_rpc_events, verify_configured_job

pytestmark = pytest.mark.slow

TTL_MS = 1500


def _config(path: Path, job: str, **table: Any) -> Path:
    lines = [f'[jobs."{job}"]', 'kind = "rpc"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


async def _named(c: Cluster) -> list[tuple[str, tuple[str, ...]]]:
    """Every event the simulator serves so far: its id and the addresses it names."""
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(c.rpc, json={"jsonrpc": "2.0", "id": 1, "method": "getLatestLedger"})
    latest = int(answer.json()["result"]["sequence"])
    records = await fetch_rpc_events(c.rpc, [], None, through=str(Cursor.through(latest)))
    return [
        (r.paging_token, decode_event_text(json.dumps(r.record, separators=(",", ":")))[1]) for r in records
    ]


def _as_sent(text: str) -> str:
    """A committed event's text without what decoding added (the source's own fields)."""
    record = json.loads(text)
    return json.dumps({k: v for k, v in record.items() if k not in DERIVED}, separators=(",", ":"))


def _some_but_not_all(named: list[tuple[str, tuple[str, ...]]], how_many: int) -> list[str]:
    """Addresses that appear in some of the events, not most (so that the filter has work)."""
    counts = Counter(a for _, addresses in named for a in set(addresses))
    ranked = [a for a, n in sorted(counts.items(), key=lambda kv: kv[1]) if a.startswith("G") and n >= 2]
    assert len(ranked) >= how_many, counts
    return ranked[:how_many]


async def _verified(c: Cluster, config: Path, job: str, at_least: int) -> None:
    settings = load(config, {}, {"redis": {"url": c.redis_url}, "node": {"job": [job]}})
    configured = settings.jobs[0]
    result = await verify_configured_job(settings, configured, c.rpc, watch_source(settings, configured))
    print(f"\nverification: {result.summary()}")
    assert result.ok, result.summary()
    assert result.count >= at_least, result.summary()


async def test_a_watch_file_keeps_exactly_the_events_naming_its_accounts_through_a_kill(
    job: str, tmp_path: Path
) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS, rpc=True, history_ledgers=120) as c:
        named = await _named(c)
        watched = _some_but_not_all(named, 3)
        listing = tmp_path / "watch.txt"
        filler = [encode_account(os.urandom(32)) for _ in range(5000)]  # accounts nobody pays
        listing.write_text("# deposit accounts\n" + "\n".join(watched + filler) + "\n")
        config = _config(tmp_path / "config.toml", job, watch_file=str(listing))
        extra = ["--source", "rpc", "--rpc", c.rpc, "--config", str(config)]
        await c.start_node("n1", extra=extra)
        await c.log.wait_for("became-leader", "n1")
        await c.start_node("n2", extra=extra)
        await c.wait_for_events(5, within=30)
        killed_at = await c.kill("n1")
        await c.log.wait_for("became-leader", "n2", since=killed_at, within=10)
        before = c.events_added()
        await c.wait_for_events(before + 3, within=30)

        entries = c.client.xrange(c.keys["events"])
        records = [json.loads(fields["record"]) for _, fields in entries]
        assert records, "nothing committed"
        for (_, fields), record in zip(entries, records, strict=True):
            assert set(decode_event_text(_as_sent(fields["record"]))[1]) & set(watched), record["id"]
            assert "topicJson" in record and "valueJson" in record
        # the cursor moved past what the list left out: at or beyond the last committed event
        await _verified(c, config, job, len(records))


async def test_a_watch_set_edit_applies_from_the_next_batch_without_a_restart(
    job: str, tmp_path: Path
) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS, rpc=True, history_ledgers=60) as c:
        config = _config(tmp_path / "config.toml", job, watch_set=True)
        extra = ["--source", "rpc", "--rpc", c.rpc, "--config", str(config)]
        await c.start_node("n1", extra=extra)
        await c.log.wait_for("became-leader", "n1")
        # an empty list: nothing is committed, but the cursor follows the chain
        first = c.state()["cursor"]
        await wait_until(lambda: c.state()["cursor"] != first, 20, what="the cursor moving")
        assert c.events_added() == 0

        named = await _named(c)
        watched = _some_but_not_all(named, 1)[0]
        edit = await trio.run_process(
            [sys.executable, "-m", "ingestion", "watchlist", "--redis", c.redis_url, "add", job, watched],
            capture_stdout=True, capture_stderr=True, env=child_env(), check=False,
        )  # fmt: skip
        assert edit.returncode == 0, edit.stderr
        await c.wait_for_events(2, within=30)
        entries = c.client.xrange(c.keys["events"])
        for _, fields in entries:
            assert watched in decode_event_text(_as_sent(fields["record"]))[1]
        # from the first committed event on, every event naming the account is there, in order
        first_id = json.loads(entries[0][1]["record"])["id"]
        last_id = json.loads(entries[-1][1]["record"])["id"]
        expected = [i for i, names in await _named(c) if watched in names and first_id <= i <= last_id]
        assert [json.loads(f["record"])["id"] for _, f in entries] == expected
