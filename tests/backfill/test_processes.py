"""A backfill with real processes: two nodes host a lake job that follows the lake's tip; the CLI
plans the history below it in four ranges, which the two nodes share, through a SIGKILL and a
restart. Every event of the lake then lies exactly once in the job's stream or in one range's,
each stream in id order, and the ranges meet the live job without a gap. Bad spans are refused
with one line and nothing written."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from actors.lease_store import job_keys
from ingestion.backfill.plan import Plan
from ingestion.common.keyspace import backfill_key
from ingestion.postgres.connection import connect
from ingestion.postgres.readers import check_job, job_state
from ingestion.rpc.protocol import Cursor
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import free_port
from ingestion.testing.wait import wait_until
from tests.support.cli import one_line, run
from tests.support.lakes import backfill_config as config
from tests.support.lakes import long_lake

pytestmark = pytest.mark.slow

TTL_MS = 1500
LIVE_FROM = 128  # the job itself starts here; the backfill fills 84..127 below it


def ids_of(client: object, job: str) -> list[str]:
    entries = client.xrange(job_keys(job)["events"])  # type: ignore[attr-defined]
    return [fields.get("paging_token") or fields.get("id") for _, fields in entries]


async def test_two_nodes_backfill_a_lake_span_in_ranges_through_a_sigkill(job: str, tmp_path: Path) -> None:
    expected = long_lake(tmp_path / "lake", LIVE_FROM + 3)
    cfg = config(tmp_path / "config.toml", job, tmp_path / "lake")
    args = ["--config", str(cfg), "--source", "lake"]
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        await c.start_node("n1", extra=args)
        port = free_port()
        await c.start_node("n2", extra=[*args, "--metrics-port", str(port)])
        scrape = f"http://127.0.0.1:{port}/metrics"
        tip = str(Cursor.through(LIVE_FROM + 3))
        await wait_until(lambda: c.state()["cursor"] == tip, 60, what="the live job at the tip")
        live = ids_of(c.client, job)
        assert live and Cursor.parse(live[0]).ledger == LIVE_FROM
        cli = ["backfill", job, "--config", str(cfg), "--redis", c.redis_url]

        # bad spans: one line, exit 2, nothing written
        async def refusal(*span: str) -> str:
            return one_line(await trio.to_thread.run_sync(lambda: run(*cli, *span)))

        refused = {
            "--to below --from": await refusal("--from", "90", "--to", "89"),
            "beyond the lake": await refusal("--from", "2", "--to", "90"),
            "over the live job": await refusal("--from", "84", "--to", str(LIVE_FROM + 1)),
        }
        assert "below --from" in refused["--to below --from"]
        assert f"beyond the lake's reach (it holds ledgers 84..{LIVE_FROM + 3})" in refused["beyond the lake"]
        assert (
            f"overlap job {job}'s committed span (ledgers {LIVE_FROM}..{LIVE_FROM + 3})"
            in refused["over the live job"]
        )
        assert f"give --to {LIVE_FROM - 1}" in refused["over the live job"]
        # a lake that lacks an object of the span: named, nothing written
        hole = next((tmp_path / "lake").rglob("*--100.xdr.zst"))
        kept = hole.read_bytes()
        hole.unlink()
        missing = await refusal("--from", "84", "--ranges", "4")
        assert f"lacks 1 object(s) of the span: {hole.parent.name}/{hole.name}" in missing, missing
        hole.write_bytes(kept)
        assert not c.client.exists(backfill_key(job))
        # a settled cluster: each node's source watch has read the other's report (once a TTL)
        await wait_until(lambda: c.client.hlen(job_keys(job)["health"]) == 2, 10, what="both reports")
        await trio.sleep(2 * TTL_MS / 1000)

        planned_at = trio.current_time()
        planned = await trio.to_thread.run_sync(
            lambda: run(*cli, "--from", "84", "--ranges", "4", "--detach")
        )
        assert planned.returncode == 0, planned.stderr
        assert f"ledgers 84..{LIVE_FROM - 1} in 4 ranges" in planned.stdout
        plan = Plan("j", 84, LIVE_FROM - 1, 4)
        names = [n.replace("j~", f"{job}~", 1) for n in plan.names]
        # a range n1 leads, part done: n1 is killed, then comes back
        led = await _range_led_by(c, "n1", names)
        killed_at = await c.kill("n1")
        # placed over both hosts from the start: each node knew the other hosts the job (its
        # source watch's view), none took more than its share of the four ranges and handed the
        # rest back (before the kill, nothing was rebalanced)
        hosts = c.log.of("backfill-ranges-hosted", since=planned_at)
        hosted = {e.node: e.fields["other_hosts"] for e in hosts}
        assert hosted == {"n1": ["n2"], "n2": ["n1"]}, hosted
        terms = c.log.of("became-leader", since=planned_at)
        first_terms = [e for e in terms if e.fields.get("job") in names]
        assert len([e for e in first_terms if e.node == "n1" and e.at < killed_at]) <= 2, first_terms
        assert not [
            e for e in c.log.of("lost-leadership", since=planned_at)
            if e.fields.get("job") in names and e.fields.get("reason") == "rebalanced" and e.at < killed_at
        ]  # fmt: skip
        taken = await c.log.wait_for(
            "became-leader", "n2", since=killed_at, within=TTL_MS / 1000 + 5, job=led
        )
        assert taken.fields["job"] == led
        await c.start_node("n1", extra=args)

        def every_range_done() -> bool:
            return all(c.client.hexists(backfill_key(n), "done") for n in names)

        await wait_until(every_range_done, 120, what="every range done")
        status = await trio.to_thread.run_sync(lambda: run(*cli, "--status"))
        assert status.returncode == 0 and f"{LIVE_FROM - 84}/{LIVE_FROM - 84} ledgers" in status.stdout, (
            status.stdout
        )
        assert f"complete through ledger {LIVE_FROM - 1}" in status.stdout
        # the same figures in n2's metrics (read once a TTL; the same on every host)
        records = sum(c.client.xlen(job_keys(n)["events"]) for n in names)
        want = {
            f'ingestion_backfill_ledgers{{ingestion_job="{job}"}}': LIVE_FROM - 84,
            f'ingestion_backfill_ledgers_done{{ingestion_job="{job}"}}': LIVE_FROM - 84,
            f'ingestion_backfill_records{{ingestion_job="{job}"}}': records,
            f'ingestion_backfill_complete_through_ledger{{ingestion_job="{job}"}}': LIVE_FROM - 1,
            f'ingestion_backfill_ranges{{ingestion_job="{job}",state="done"}}': 4,
            f'ingestion_backfill_ranges{{ingestion_job="{job}",state="running"}}': 0,
        }

        async def scraped() -> dict[str, float]:
            async with httpx.AsyncClient(timeout=5) as http:
                text = (await http.get(scrape)).text
            pairs = (line.rpartition(" ") for line in text.splitlines())
            return {k: float(v) for k, _, v in pairs if k in want}

        for _ in range(50):
            if await scraped() == want:
                break
            await trio.sleep(0.2)
        assert await scraped() == want
        follow = await trio.to_thread.run_sync(lambda: run(*cli, "--from", "84", "--ranges", "4"))
        assert follow.returncode == 0 and f"done: ledgers 84..{LIVE_FROM - 1}" in follow.stdout, follow.stdout

        # every event exactly once: the ranges' streams, then the live job's, each in order
        streams = [ids_of(c.client, n) for n in names]
        for ids in streams:
            assert ids == sorted(ids, key=Cursor.parse) and len(set(ids)) == len(ids)
        merged = [i for ids in streams for i in ids] + ids_of(c.client, job)
        assert merged == expected
        # the ranges were shared: each node led at least one
        leaders = {e.node for e in c.log.of("became-leader") if e.fields.get("job") in names}
        assert leaders == {"n1", "n2"}
        # and each range's leader released it once done (no lease left behind)
        await wait_until(lambda: not any(c.client.exists(job_keys(n)["lease"]) for n in names), 10,
                         what="the done ranges' leases released")  # fmt: skip
        c.signal("n2", signal.SIGTERM)
        assert await c.exited("n2") == 0


async def _range_led_by(c: object, node: str, names: list[str], since: float | None = None) -> str:
    """The first range ``node`` leads (since ``since``), waiting for it."""
    log = c.log  # type: ignore[attr-defined]
    with trio.fail_after(30):
        while True:
            for e in log.of("became-leader", node, since=since):
                if e.fields.get("job") in names:
                    return str(e.fields["job"])
            await log.changed()


async def test_a_backfill_into_postgres_holds_every_event_once_through_kill_pause_and_restart(
    job: str, tmp_path: Path, pg: LocalPostgres
) -> None:
    """The acceptance run: two nodes backfill into PostgreSQL while one is killed (and comes
    back), one is paused past its TTL, and PostgreSQL restarts. Every event of the span is then
    in exactly one range's rows, in id order across them, and every range's rows pass the fence
    history check."""
    live_from = 200  # a long span (116 ledgers, 116,000 events): every fault lands while ranges run
    last = live_from + 3
    expected = long_lake(tmp_path / "lake", last)
    cfg = config(tmp_path / "config.toml", job, tmp_path / "lake", sink=pg.url, start=live_from)
    args = ["--config", str(cfg), "--source", "lake"]
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        await c.start_node("n1", extra=args)
        await c.start_node("n2", extra=args)
        tip = str(Cursor.through(last))
        await wait_until(
            lambda: job_state(pg.url, "ingestion", job)["cursor"] == tip, 60, what="the live job"
        )
        cli = ["backfill", job, "--config", str(cfg), "--redis", c.redis_url]
        planned = await trio.to_thread.run_sync(
            lambda: run(*cli, "--from", "84", "--ranges", "4", "--detach")
        )
        assert planned.returncode == 0 and f"ledgers 84..{live_from - 1} in 4 ranges" in planned.stdout, (
            planned.stderr
        )
        names = [n.replace("j~", f"{job}~", 1) for n in Plan("j", 84, live_from - 1, 4).names]

        led = await _range_led_by(c, "n1", names)
        killed_at = await c.kill("n1")
        await c.log.wait_for("became-leader", "n2", since=killed_at, within=TTL_MS / 1000 + 5, job=led)
        await c.start_node("n1", extra=args)
        await _range_led_by(c, "n1", names, since=killed_at)
        c.signal("n1", signal.SIGSTOP)  # paused past its TTL: its ranges go to n2
        await trio.sleep(TTL_MS / 1000 + 1)
        c.signal("n1", signal.SIGCONT)

        def every_range_done() -> bool:
            return all(c.client.hexists(backfill_key(n), "done") for n in names)

        # (the faults must land while ranges run, or this test proves nothing)
        assert not every_range_done(), "the backfill ended before PostgreSQL's restart"
        await trio.to_thread.run_sync(pg.stop)
        await trio.sleep(0.5)
        await trio.to_thread.run_sync(pg.start)

        await wait_until(every_range_done, 120, what="every range done")
        with connect(pg.url, 5) as conn:
            rows = conn.execute(
                "SELECT paging_token FROM ingestion.events WHERE starts_with(job, %s) ORDER BY paging_token",
                (f"{job}~",),
            ).fetchall()  # fmt: skip
            live = conn.execute(
                "SELECT paging_token FROM ingestion.events WHERE job = %s ORDER BY seq", (job,)
            ).fetchall()
        assert [r[0] for r in rows] + [r[0] for r in live] == expected
        for name in names:
            problems, count = check_job(pg.url, "ingestion", name)
            assert problems == [] and count > 0, (name, problems)
        leaders = {e.node for e in c.log.of("became-leader") if e.fields.get("job") in names}
        assert leaders == {"n1", "n2"}


async def test_two_backfills_one_after_the_other_both_reach_done_and_leave_no_job_behind(
    job: str, tmp_path: Path
) -> None:
    """A finished backfill is done everywhere (Redis, --status, inspect, metrics, the console) with
    no --cancel, whether the nodes or the command see the end first, and the next span is
    accepted at once; its finished ranges are shown under it, never listed as jobs."""
    live_from = 100
    long_lake(tmp_path / "lake", live_from + 3)
    cfg = config(tmp_path / "config.toml", job, tmp_path / "lake", start=live_from)
    args = ["--config", str(cfg), "--source", "lake"]
    port = free_port()
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        await c.start_node("n1", extra=[*args, "--metrics-port", str(port)])
        await c.start_node("n2", extra=args)
        await wait_until(lambda: c.state()["cursor"] == str(Cursor.through(live_from + 3)), 60,
                         what="the live job at the tip")  # fmt: skip
        cli = ["backfill", job, "--config", str(cfg), "--redis", c.redis_url]

        async def cli_run(*more: str, within: float = 30) -> subprocess.CompletedProcess[str]:
            return await trio.to_thread.run_sync(lambda: run(*more, timeout=within))

        def plan_state() -> str | None:
            return c.client.hget(backfill_key(job), "state")  # type: ignore[no-any-return]

        # the first span, left to the nodes (--detach): they settle it done, no command watching
        first = await cli_run(*cli, "--from", "84", "--to", "91", "--ranges", "2", "--detach")
        assert first.returncode == 0 and "planned: ledgers 84..91 in 2 ranges" in first.stdout, first.stderr
        await wait_until(lambda: plan_state() == "done", 90, what="the first backfill done in Redis")
        # the node that settled it logs the line just after its write: the harness reads it a moment later
        await wait_until(lambda: c.log.of("backfill-done"), 10, what="the backfill-done line")
        assert [e.fields["parent_job"] for e in c.log.of("backfill-done")] == [job]
        status = await cli_run(*cli, "--status")
        assert f"backfill of {job}: ledgers 84..91 in 2 ranges, done" in status.stdout, status.stdout
        cancel = await cli_run(*cli, "--cancel")
        assert cancel.returncode == 0 and "is done: nothing to cancel" in cancel.stdout, cancel.stdout
        assert plan_state() == "done"

        # the next span at once, followed by the command to its end: accepted, and done
        second = await cli_run(*cli, "--from", "92", "--ranges", "2", within=120)
        assert second.returncode == 0, second.stderr
        assert "planned: ledgers 92..99 in 2 ranges" in second.stdout, second.stdout
        assert "backfill of " + job + " done: ledgers 92..99" in second.stdout, second.stdout
        assert plan_state() == "done"
        status = await cli_run(*cli, "--status")
        assert "ledgers 92..99 in 2 ranges, done" in status.stdout and "8/8 ledgers" in status.stdout

        # inspect: no range listed as a job; the job's own page shows them under its backfill
        ranges = [n.replace("j~", f"{job}~", 1) for p in (Plan("j", 84, 91, 2), Plan("j", 92, 99, 2))
                  for n in p.names]  # fmt: skip
        listed = await cli_run("inspect", "--redis", c.redis_url, "--json")
        assert [d["job"] for d in json.loads(listed.stdout)] == [job], listed.stdout
        table = await cli_run("inspect", "--redis", c.redis_url)
        assert not [r for r in ranges if r in table.stdout], table.stdout
        shown = await cli_run("inspect", "--config", str(cfg), "--redis", c.redis_url, "--job", job)
        assert "backfill: ledgers 92..99 in 2 ranges, done: 8/8 ledgers" in shown.stdout, shown.stdout
        for name in ranges[2:]:
            assert f"  {name}: 4/4 ledgers, 4,000 records, done" in shown.stdout, shown.stdout
        assert "--rpc URL, a Stellar RPC of the lake's network" in shown.stdout  # a lake job's lag hint

        # the metrics keep the final figures, done; the console lists no finished range as a job
        async def scrape() -> str:
            async with httpx.AsyncClient(timeout=5) as http:
                return (await http.get(f"http://127.0.0.1:{port}/metrics")).text

        done_metric = f'ingestion_backfill_done{{ingestion_job="{job}"}} 1.0'
        for _ in range(50):
            if done_metric in await scrape():
                break
            await trio.sleep(0.2)
        assert done_metric in await scrape()
        assert f'ingestion_backfill_ledgers{{ingestion_job="{job}"}} 8.0' in await scrape()

        async def console_jobs() -> list[str]:
            async with httpx.AsyncClient(timeout=5) as http:
                state = (await http.get(f"http://127.0.0.1:{port}/console/state")).json()
            return [j["job"] for j in state["jobs"]]

        for _ in range(30):  # (the console looks for unreported jobs every 5 s)
            if await console_jobs() == [job]:
                break
            await trio.sleep(0.5)
        assert await console_jobs() == [job]
        # ... and shows them on the job's page, under its backfill, done
        async with httpx.AsyncClient(timeout=5) as http:
            detail = (await http.get(f"http://127.0.0.1:{port}/console/job/{job}/state")).json()
            page = (await http.get(f"http://127.0.0.1:{port}/console/job/{job}")).text
        assert detail["backfill"]["state"] == "done", detail["backfill"]
        assert [r["range"] for r in detail["backfill"]["range_states"]] == ranges[2:]
        assert [r["state"] for r in detail["backfill"]["range_states"]] == ["done", "done"]
        assert '<span id="backfill-state">done</span>' in page and all(r in page for r in ranges[2:])
