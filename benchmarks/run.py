"""Run every benchmark side by side and write the table to ``docs/BENCHMARKS.md``.

``python -m benchmarks [--quick] [--only SECTION ...] [--output PATH] [--json PATH]``

Sections: ``catchup`` (throughput and memory), ``latency``, ``commit``, ``failover``, ``standby``,
``redis_ha`` (Sentinel failover and the cost of replica acknowledgements), ``memory`` (Redis memory
per ingested record, with and without retention), ``jobs`` (3 nodes sharing 30 jobs: balance,
re-lead after SIGKILL, stability, Redis load, RSS by job count), ``source_cut`` (the leader cut off
from Horizon: time until a standby ingests), ``rpc`` (Stellar RPC jobs: catch-up of a full retention
window, ledger close -> committed at the tip), ``process_crash`` (SIGKILL of the leader's worker:
its parent releases the lease; time until another node leads), ``crash_balanced`` (the same with
six jobs on three nodes, every node at its share).
``liveness``: issue 23's combined faults against the bound B, and the SIGTERM handoff of a node
leading two of four jobs.
``per_record`` (issue 27: node vs bare fetch on Horizon and RPC side by side, the 100 ms ratio, peak
RSS, standby commands/s at TTL 2 s and 5 s; ``--profile DIR`` adds py-spy's heaviest frames).
``postgres``: the PostgreSQL sink against a bare ``COPY`` of the same batches (catch-up,
commit latency at batch 1/10/200, ledger close -> committed); needs Debian's ``postgresql``.
``lake`` (issue 28: pubnet ledgers decoded on 0, 1 and 2 worker processes side by side; an RPC
job's backfill of 10,000 simulated ledgers through the lake and its lake -> RPC handover).
``--quick`` is a smoke run (smaller history, fewer trials, one TTL; without ``--only``, the sections
in ``QUICK_SECTIONS``) that takes about two minutes and prints its table; the full run takes long.
``docs/BENCHMARKS.md`` and its JSON are written only with ``--write``, and only from a full run.
A throwaway ``redis-server`` is started on a free loopback port; the
simulator runs as its own process. Results also go to a JSON file; when
``benchmarks/baseline.json`` exists (an earlier run's JSON) its figures appear as a "before" column.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    audit,
    backfill,
    catchup,
    commit_cost,
    console,
    failover,
    jobs,
    lake,
    latency,
    liveness,
    memory,
    per_record,
    postgres,
    process_crash,
    redis_ha,
    rpc,
    source_cut,
    standby,
)
from ingestion.testing.local_redis import LocalRedis

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = (
    "catchup", "latency", "commit", "failover", "standby", "redis_ha", "memory", "jobs", "source_cut",
    "per_record", "lake", "backfill", "liveness", "catchup_curve", "rpc", "postgres", "process_crash",
    "crash_balanced", "console",
)

# A smoke run: each part of the harness once, small (about two minutes on 2 cores).
QUICK_SECTIONS = ("catchup", "commit", "failover", "per_record")


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "redis": redis_version.split(" sha=")[0],
        "os": f"{platform.system()} {platform.release()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def measure(
    quick: bool, only: tuple[str, ...], partial: Path | None = None, profile: Path | None = None
) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    redis_server = LocalRedis().start()
    try:
        url = redis_server.url
        for section in only:
            print(f"{section}:", flush=True)
            started = time.monotonic()
            if section == "catchup":
                results[section] = catchup.run(
                    url, count=20_000 if quick else 100_000, rounds=1 if quick else 2
                )
            elif section == "latency":
                results[section] = latency.run(url, trials=20 if quick else 100)
            elif section == "commit":
                results[section] = commit_cost.run(url, seconds=1.0 if quick else 3.0)
            elif section == "failover":
                results[section] = failover.run(
                    url,
                    ttls_ms=(1000,) if quick else (1000, 2000, 5000),
                    trials=5 if quick else 20,
                )
            elif section == "process_crash":
                results[section] = process_crash.run(
                    url, ttls_ms=(2000,) if quick else (2000, 5000), trials=5 if quick else 20
                )
            elif section == "crash_balanced":
                results[section] = process_crash.run_balanced(url, kills=5 if quick else 20)
            elif section == "standby":
                results[section] = standby.run(url, standbys=3, seconds=10.0 if quick else 30.0)
            elif section == "redis_ha":
                results[section] = redis_ha.run(trials=3 if quick else 12)
            elif section == "jobs":
                results[section] = jobs.run(
                    url, stable_s=10.0 if quick else 60.0, trials=2 if quick else 5
                )
            elif section == "catchup_curve":
                results[section] = catchup.run_curve(
                    url, count=5_000 if quick else 20_000,
                    delays=(0, 100) if quick else (0, 10, 50, 100, 200),
                )  # fmt: skip
            elif section == "source_cut":
                results[section] = source_cut.run(trials=3 if quick else 12)
            elif section == "liveness":
                results[section] = liveness.run(trials=3 if quick else 20, handoffs=2 if quick else 10)
            elif section == "rpc":
                results[section] = rpc.run(url, quick=quick)
            elif section == "lake":
                results[section] = lake.run(url, quick=quick)
            elif section == "postgres":
                results[section] = postgres.run(url, quick=quick)
            elif section == "backfill":
                results[section] = backfill.run(url, quick=quick)
            elif section == "per_record":
                results[section] = per_record.run(url, quick=quick, profile_dir=profile)
            elif section == "console":
                results[section] = console.run(url, window_s=8.0 if quick else 20.0)
            elif section == "memory":
                results[section] = memory.run(url, count=20_000 if quick else 100_000)
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
            if partial is not None:  # a later section's crash keeps the earlier ones
                partial.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        redis_server.stop()
    return results


# --- the table -----------------------------------------------------------------------------------


def _backfill_rows(bf: dict[str, Any] | None) -> list[tuple[str, str, str, str | None]]:
    if not bf or bf.get("skipped"):
        return []
    one, two = bf["one"], bf["two"]
    return [
        (
            f"backfill of {one['ledgers']:,} pubnet lake ledgers ({bf['events']:,} events) into Redis in "
            f"{one['ranges']} ranges: 1 node vs 2, each on a core of its own, seconds from the plan "
            "(ledgers/s); speed-up",
            f"{one['seconds']:.1f} vs {two['seconds']:.1f} s ({one['ledgers_per_s']:.1f} vs "
            f"{two['ledgers_per_s']:.1f}); {bf['speedup']:.2f}x "
            f"({bf['work_speedup']:.2f}x from the first term)",
            ">= 1.8x", _ok(bf["speedup"] >= 1.8),
        ),
        (
            "backfill: ledgers per node CPU second, 1 node / 2 nodes (the per-core rate); CPU seconds "
            "of the nodes, Redis and the whole machine (of the cores' wall seconds)",
            f"{one['ledgers_per_cpu_s']:.1f} / {two['ledgers_per_cpu_s']:.1f}; 1 node: "
            f"{sum(one['node_cpu_s']):.1f}, {one['redis_cpu_s']:.1f}, {one['machine_cpu_s']:.1f} of "
            f"{2 * one['seconds']:.1f}; 2 nodes: {' + '.join(f'{c:.1f}' for c in two['node_cpu_s'])}, "
            f"{two['redis_cpu_s']:.1f}, {two['machine_cpu_s']:.1f} of {2 * two['seconds']:.1f}",
            "", None,
        ),
        *audit.rows(bf),
    ]  # fmt: skip


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    """(metric, value, target, verdict) rows; verdict None when there is no target."""
    rows: list[tuple[str, str, str, str | None]] = []
    c = r.get("catchup")
    if c:
        node, sdk, paged = c["node"]["rate"], c["sdk"]["rate"], c["paged"]["rate"]
        n = f"{c['count']:,} ops"
        rows += [
            (f"catch-up, our node (fenced commits), {n}", f"{node:,.0f} records/s", "", None),
            (f"catch-up, stellar_sdk stream(), {n}", f"{sdk:,.0f} records/s", "", None),
            (f"catch-up, bare paged fetch (limit=200), {n}", f"{paged:,.0f} records/s", "", None),
            ("node / SDK", f"{node / sdk:.2f}x", ">= 5x", _ok(node / sdk >= 5)),
            ("node / bare paged fetch", f"{node / paged:.2f}", ">= 0.5", _ok(node / paged >= 0.5)),
            ("node peak RSS during catch-up (VmHWM)", _mib(c["node"]["peak_rss_kib"]), "", None),
            ("node RSS idle after catch-up", _mib(c["node"]["idle_rss_kib"]), "", None),
        ]
    lat = r.get("latency")
    if lat:
        rows.append(
            (
                f"live: ledger close -> all {lat['ops_per_ledger']} records committed, p50 / p99",
                f"{lat['last_p50_ms']:.1f} / {lat['last_p99_ms']:.1f} ms",
                "",
                None,
            )
        )
    cc = r.get("commit")
    if cc:
        for size, v in cc.items():
            rows.append(
                (
                    f"commit, batch {size}: commits/s (records/s), p50 / p99",
                    f"{v['commits_per_s']:,.0f} ({v['records_per_s']:,.0f}), "
                    f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f} ms",
                    "",
                    None,
                )
            )
    fo = r.get("failover")
    if fo:
        for v in fo.values():
            if v["signal"] == "SIGKILL":
                target = v["ttl_ms"] + 150
                label, verdict = f"p99 <= {target} ms", _ok(v["p99_ms"] <= target)
            else:
                label, verdict = "p99 <= 50 ms", _ok(v["p99_ms"] <= 50)
            rows.append(
                (
                    f"failover {v['signal']}, ttl {v['ttl_ms']} ms, {v['trials']} trials: p50 / p99 / max",
                    f"{v['p50_ms']:.0f} / {v['p99_ms']:.0f} / {v['max_ms']:.0f} ms",
                    label,
                    verdict,
                )
            )
    pc = r.get("process_crash")
    if pc:
        for v in pc.values():
            lead, first = v["lead"], v["first_commit"]
            rows += [
                (
                    f"worker SIGKILL (parent releases), ttl {v['ttl_ms']} ms, {v['trials']} trials: "
                    "another node leads, p50 / p99 / max",
                    f"{lead['p50_ms']:.0f} / {lead['p99_ms']:.0f} / {lead['max_ms']:.0f} ms",
                    "p99 <= 100 ms",
                    _ok(lead["p99_ms"] <= 100 and v["exactly_once"]),
                ),
                (
                    f"worker SIGKILL, ttl {v['ttl_ms']} ms: first commit of the new leader, p50 / p99",
                    f"{first['p50_ms']:.0f} / {first['p99_ms']:.0f} ms",
                    "",
                    None,
                ),
            ]
    cb = r.get("crash_balanced")
    if cb:
        lead, granted = cb["lead"], cb["granted"]
        rows += [(
            f"worker SIGKILL, 6 jobs on 3 nodes at their share, ttl {cb['ttl_ms']} ms, {cb['kills']} kills: "
            "the kill -> each of the node's jobs granted again (Redis's clock), p50 / p99 / max",
            f"{granted['p50_ms']:.0f} / {granted['p99_ms']:.0f} / {granted['max_ms']:.0f} ms",
            "p99 <= 50 ms", _ok(granted["p99_ms"] <= 50 and cb["exactly_once"]),
        ), (
            "the same: the kill -> the new leader's became-leader line read by the harness",
            f"{lead['p50_ms']:.0f} / {lead['p99_ms']:.0f} / {lead['max_ms']:.0f} ms", "", None,
        )]  # fmt: skip
    ha = r.get("redis_ha")
    if ha:
        # Detection (down-after), election and promotion (about 1 s), one lease TTL, and the
        # node's Redis-retry backoff (capped at 2 s): README, "Redis high availability".
        bound = ha["down_after_ms"] + 1000 + ha["ttl_ms"] + 2000
        for kind, label in (
            ("planned", "SENTINEL FAILOVER, min_replicas_acked 1"),
            ("sigkill", "SIGKILL of the primary, min_replicas_acked 1"),
            ("planned_acked0", "SENTINEL FAILOVER, min_replicas_acked 0"),
            ("sigkill_acked0", "SIGKILL of the primary, min_replicas_acked 0"),
        ):
            if kind not in ha:
                continue
            v = ha[kind]
            rows.append(
                (
                    f"Redis failover, {label}, down-after {ha['down_after_ms']} ms, ttl "
                    f"{ha['ttl_ms']} ms, {v['trials']} trials: fault -> first commit on the new "
                    "primary, p50 / p99 / max",
                    f"{v['p50_ms']:.0f} / {v['p99_ms']:.0f} / {v['max_ms']:.0f} ms",
                    f"p99 <= down-after + 1 s + ttl + 2 s = {bound} ms",
                    _ok(v["p99_ms"] <= bound),
                )
            )
        cm = ha["commit"]
        rows.append(
            (
                "commit of 200 records through Sentinel: min_replicas_acked 0 vs 1 (commits/s)",
                f"{cm['acked0_per_s']:,.0f} vs {cm['acked1_per_s']:,.0f} ({cm['ratio']:.2f}x)",
                "",
                None,
            )
        )
    jb = r.get("jobs")
    if jb:
        rl = jb["relead"]
        bound = jb["ttl_ms"] + 1000
        rows += [
            (f"{jb['nodes']} nodes x {jb['jobs']} jobs, ttl {jb['ttl_ms']} ms: cold start -> all led, "
             "none above its share", f"{jb['cold_start_s']:.1f} s", "", None),
            (f"SIGKILL of a node: each of its jobs re-led, {rl['samples']} jobs: p50 / p99 / max",
             f"{rl['p50_ms']:.0f} / {rl['p99_ms']:.0f} / {rl['max_ms']:.0f} ms",
             f"<= TTL + 1 s = {bound} ms", _ok(rl["p99_ms"] <= bound)),
            (f"leadership changes during {jb['stable_s']:.0f} s of stable membership",
             str(jb["stable_changes"]), "0", _ok(jb["stable_changes"] == 0)),
            (f"Redis commands/s per node ({jb['jobs']} jobs, 3 nodes)",
             f"{jb['commands_per_s_per_node']:.1f}", "", None),
            ("RSS of one node by job count (1 / 10 / 30 jobs)",
             " / ".join(_mib(jb["rss_kib"][k]) for k in ("1", "10", "30")), "", None),
        ]  # fmt: skip
    cv = r.get("catchup_curve")
    if cv:
        for pt in cv["points"]:
            target, verdict = "", None
            if pt["delay_ms"] == 100:
                target, verdict = ">= 3x", _ok(pt["ratio_best_sequential"] >= 3)
            rows.append((
                f"catch-up {cv['count']:,} ops at {pt['delay_ms']} ms per response: node vs paged vs "
                "SDK stream(limit 200), records/s",
                f"{pt['node']:,.0f} vs {pt['paged']:,.0f} vs {pt['sdk']:,.0f} "
                f"({pt['ratio_best_sequential']:.2f}x the best sequential; node peak RSS "
                f"{pt['node_peak_rss_kib'] / 1024:.0f} MiB)",
                target, verdict,
            ))  # fmt: skip
    sc = r.get("source_cut")
    if sc:
        bound = sc["handover_after_ms"] + sc["ttl_ms"] + 1000
        rows.append((
            f"leader cut off from Horizon -> a standby ingests, ttl {sc['ttl_ms']} ms, "
            f"handover_after {sc['handover_after_ms']} ms, {sc['trials']} trials: p50 / p99 / max",
            f"{sc['p50_ms']:.0f} / {sc['p99_ms']:.0f} / {sc['max_ms']:.0f} ms",
            f"<= handover_after + ttl + 1 s = {bound} ms", _ok(sc["p99_ms"] <= bound),
        ))  # fmt: skip
    lv = r.get("liveness")
    if lv:
        settings = f"ttl {lv['ttl_ms']} ms, handover_after {lv['handover_after_ms']} ms"
        for key, what in (("cut", "Horizon cut off (TCP proxy)"),
                          ("root_only", "Horizon answers / but 503 for the job (HTTP proxy)")):
            v = lv[key]
            rows.append((
                f"liveness: 2 nodes x 2 jobs, the leader's {what}, {settings}, {v['trials']} trials: "
                "fault -> the other node's grant (Redis clock), p50 / p99 / max",
                f"{v['p50_ms']:.0f} / {v['p99_ms']:.0f} / {v['max_ms']:.0f} ms",
                f"p99 <= B = {lv['bound_ms']:.0f} ms", _ok(v["p99_ms"] <= lv["bound_ms"]),
            ))
        h = lv["handoff"]
        rows.append((
            f"liveness: 3 nodes x 4 jobs, SIGTERM a node leading two, {h['trials']} jobs: release -> "
            "grant (audit stream), p50 / p99 / max",
            f"{h['p50_ms']:.0f} / {h['p99_ms']:.0f} / {h['max_ms']:.0f} ms",
            "p99 < 50 ms (no rendezvous delay)", _ok(h["p99_ms"] < 50),
        ))  # fmt: skip
    rows.extend(_lake_rows(r.get("lake")))
    rows.extend(_backfill_rows(r.get("backfill")))
    rp = r.get("rpc")
    for key in ("catch_up", "catch_up_100ms"):
        cu = (rp or {}).get(key)
        if not cu:
            continue
        delay = f", {cu.get('delay_ms', 0)} ms per answer"
        rows.append((
            f"RPC catch-up of a full retention window ({cu['ledgers']:,} ledgers, {cu['events']:,} "
            f"events{delay}): plain client building the chain / warm, events/s",
            f"{cu['bare_cold_eps']:,.0f} / {cu['bare_warm_eps']:,.0f}", "", None,
        ))  # fmt: skip
        for run_ in cu["runs"]:
            rows.append((
                f"RPC catch-up{delay}, node, page limit {run_['limit']:,}: events/s (getEvents "
                "requests)",
                f"{run_['eps']:,.0f} ({run_['requests']}; {run_['ratio_bare_warm']:.2f}x the plain "
                "warm pass)",
                "", None,
            ))  # fmt: skip
    if rp:
        tip = rp["tip"]
        rows.append((
            f"RPC ledger close -> committed at the tip, a ledger every {tip['interval_s']:g} s, "
            f"{tip['ledgers']} ledgers: p50 / p99 / max (getEvents requests per ledger)",
            f"{tip['p50_ms']:.0f} / {tip['p99_ms']:.0f} / {tip['max_ms']:.0f} ms "
            f"({tip['requests_per_ledger']:.2f})",
            "", None,
        ))  # fmt: skip
    rows += _per_record_rows(r.get("per_record"))
    pg = r.get("postgres")
    if pg:
        cu = pg["catch_up"]
        rows.append((
            f"PostgreSQL sink: catch-up of {cu['node_records']:,} ops, node process (Horizon -> fenced "
            f"commits) vs COPY of the same {cu['batches']} batches from memory, records/s",
            f"{cu['node_rate']:,.0f} vs {cu['copy_rate']:,.0f} ({cu['ratio']:.2f})", "", None,
        ))  # fmt: skip
        rows.append((
            f"PostgreSQL sink: the same {cu['batches']} batches by the commit path alone "
            "(PostgresSink.commit from memory, interleaved with the COPY), records/s (ratio)",
            f"{cu['commit_rate']:,.0f} vs {cu['copy_rate']:,.0f} ({cu['commit_ratio']:.2f})",
            ">= 0.7", _ok(cu["commit_ratio"] >= 0.7),
        ))  # fmt: skip
        for size, v in pg["commit"].items():
            rows.append((
                f"PostgreSQL sink: commit of batch {size} (PostgresSink.commit vs COPY), records/s "
                "(ratio), p50 / p99",
                f"{v['records_per_s']:,.0f} vs {v['copy_records_per_s']:,.0f} ({v['ratio']:.2f}), "
                f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f} ms vs {v['copy_p50_ms']:.2f} / "
                f"{v['copy_p99_ms']:.2f} ms",
                ">= 0.5", _ok(v["ratio"] >= 0.5),
            ))  # fmt: skip
        lv = pg["live"]
        rows.append((
            f"PostgreSQL sink, live: ledger close -> all {lv['ops_per_ledger']} records committed, "
            f"{lv['trials']} ledgers: p50 / p99 / max",
            f"{lv['p50_ms']:.1f} / {lv['p99_ms']:.1f} / {lv['max_ms']:.1f} ms",
            "p99 <= 100 ms", _ok(lv["p99_ms"] <= 100),
        ))  # fmt: skip
    mem = r.get("memory")
    if mem:
        n = f"{mem['count']:,} ops"
        for name in ("unbounded", "retained", "retained_reader"):
            if name not in mem:
                continue
            v = mem[name]
            kept = "no retention" if not v["max_len"] else f"events.max_len {v['max_len']:,}"
            if name == "retained_reader":
                kept += " and a consumer group reading along"
            rows.append(
                (
                    f"Redis memory after {n}, {kept}: events stream (entries), per entry",
                    f"{v['stream_bytes'] / 2**20:.1f} MiB ({v['stream_entries']:,}), "
                    f"{v['bytes_per_entry']:.0f} B (record {v['record_bytes']:.0f} B + "
                    f"{v['overhead_per_entry']:.0f} B)",
                    "",
                    None,
                )
            )
        rows.append(
            (
                f"catch-up with retention vs without, {n}",
                f"{mem['retained']['rate']:,.0f} vs {mem['unbounded']['rate']:,.0f} records/s "
                f"({mem['rate_ratio']:.2f}x)",
                "",
                None,
            )
        )
        if "retained_reader" in mem:
            rows.append(
                (
                    f"catch-up with retention and a consumer group reading vs without retention, {n}",
                    f"{mem['retained_reader']['rate']:,.0f} vs {mem['unbounded']['rate']:,.0f} "
                    f"records/s ({mem['reader_rate_ratio']:.2f}x)",
                    "",
                    None,
                )
            )
    sb = r.get("standby")
    if sb:
        cps = sb["commands_per_s_per_standby"]
        rows += [
            (
                f"idle standby, ttl {sb['ttl_ms']} ms: Redis commands/s each",
                f"{cps:.2f}",
                "< 1",
                _ok(cps < 1),
            ),
            ("idle standby: CPU each", f"{sb['cpu_percent_per_standby']:.2f}% of a core", "", None),
            ("idle standby: RSS each", _mib(sb["rss_kib_per_standby"]), "", None),
        ]
    return rows


def _lake_rows(lk: dict[str, Any] | None) -> list[tuple[str, str, str, str | None]]:
    if not lk:
        return []
    rows: list[tuple[str, str, str, str | None]] = []
    dec = lk["decode"]
    for d in dec.get("runs", ()):
        where = "a thread of the process" if d["processes"] == 0 else f"{d['processes']} worker processes"
        rows.append((
            f"lake: busy pubnet ledgers decoded on {where} ({d['ledgers']} ledgers; load average "
            f"{d['load_before']} before): ledgers/s (events/s; ledgers per worker CPU second)",
            f"{d['ledgers_per_s']:.2f} ({d['events_per_s']:,}; "
            f"{d.get('ledgers_per_worker_cpu_s') or '-'} per worker CPU s)"
            + (f"; {d['steady_ledgers_per_s']:.2f} once started ({d['first_result_s']} s to the first)"
               if "steady_ledgers_per_s" in d else ""),
            "", None,
        ))  # fmt: skip
    if "speedup_2_over_1" in dec:
        rows.append(("lake: decode, 2 worker processes over 1 (the pool's start included)",
                     f"{dec['speedup_2_over_1']:.2f}x", ">= 1.8x",
                     _ok(dec["speedup_2_over_1"] >= 1.8)))  # fmt: skip
    if "steady_speedup_2_over_1" in dec:
        rows.append(("lake: decode, 2 worker processes over 1, once started",
                     f"{dec['steady_speedup_2_over_1']:.2f}x", ">= 1.8x",
                     _ok(dec["steady_speedup_2_over_1"] >= 1.8)))  # fmt: skip
    if "partial_vs_full" in dec:
        pf = dec["partial_vs_full"]
        rows.append((
            f"lake: one process, the same ledgers ({pf['ledgers']}; load average {pf['load_before']}): "
            "ledgers per CPU second reading what events need, and with stellar-sdk's whole decode",
            f"{pf['partial_ledgers_per_cpu_s']:.2f} vs {pf['full_ledgers_per_cpu_s']:.2f} "
            f"({pf['partial_over_full_cpu']:.2f}x)",
            "", None,
        ))  # fmt: skip
    bf = lk["backfill"]
    for b in bf["runs"]:
        rows.append((
            f"lake: RPC job backfill of {bf['ledgers']:,} simulated ledgers ({b['lake_ledgers']:,} from the "
            f"lake, RPC keeps {bf['retention']}), {b['decode_processes']} decode processes: s, ledgers/s, "
            "events/s; lake -> RPC handover (Redis clock)",
            f"{b['seconds']:.1f} s, {b['ledgers_per_s']:,}, {b['events_per_s']:,}; {b['handover_ms']} ms",
            "", None,
        ))  # fmt: skip
    return rows


def _per_record_rows(pr: dict[str, Any] | None) -> list[tuple[str, str, str, str | None]]:
    if not pr:
        return []
    h, rp, lat = pr["horizon"], pr["rpc"], pr["latency_100ms"]
    rss = (h["node_peak_rss_kib"], rp["node_peak_rss_kib"] or 0, lat["node_peak_rss_kib"])
    rows: list[tuple[str, str, str, str | None]] = [
        (f"per-record cost, Horizon, {h['count']:,} ops, warm, no delay: node vs bare paged fetch, "
         "records/s (best of each)",
         f"{h['node_rate']:,.0f} vs {h['paged_rate']:,.0f} ({h['ratio']:.2f})", ">= 0.8",
         _ok(h["ratio"] >= 0.8)),
        (f"per-record cost, RPC, {rp['events']:,} events, no delay: node vs plain getEvents client, "
         "events/s",
         f"{rp['node_eps']:,.0f} vs {rp['plain_eps']:,.0f} ({rp['ratio']:.2f})", ">= 0.8",
         _ok(rp["ratio"] >= 0.8)),
        *([(f"per-record cost, RPC, {rl['events']:,} events ({rl['ledgers']:,} ledgers), no delay: node vs "
             "plain getEvents client, events/s",
             f"{rl['node_eps']:,.0f} vs {rl['plain_eps']:,.0f} ({rl['ratio']:.2f})", ">= 0.8",
             _ok(rl["ratio"] >= 0.8))] if (rl := pr.get("rpc_long")) else []),
        (f"per-record cost, Horizon at 100 ms per response, {lat['count']:,} ops: node vs best "
         "sequential client", f"{lat['ratio']:.2f}x", ">= 4.5x", _ok(lat["ratio"] >= 4.5)),
        ("per-record cost: node peak RSS (Horizon no delay / RPC / Horizon 100 ms)",
         " / ".join(_mib(v) for v in rss), "<= 150 MiB", _ok(max(rss) <= 150 * 1024)),
    ]  # fmt: skip
    for name, source, ref in (("Horizon", h, ("paged_cpu", "bare paged fetch")),
                              ("RPC", rp, ("plain_cpu", "plain getEvents client"))):  # fmt: skip
        for key, what in (("node_cpu", "node"), ref):
            if source.get(key):
                rows.append((
                    f"per-record cost, {name}, {what}: CPU us per record (cores) by process; cores in all, "
                    "bound (one-core / machine / both / neither)",
                    _cpu_brief(source[key]), "", None,
                ))  # fmt: skip
    for ttl, sb in sorted(pr["standby"].items(), key=lambda kv: int(kv[0])):
        # Issue 27's measure: what a standby sends (a script call is one command, counted with
        # MONITOR); INFO commandstats also counts every command a script runs inside Redis.
        sent = sb.get("sent_per_s_per_standby", sb["commands_per_s_per_standby"])
        what = ", ".join(f"{k} {v:.2f}" for k, v in sorted(sb.get("sent", {}).items()))
        per = sb["seconds"] * sb["standbys"]
        detail = ", ".join(f"{k} {v / per:.2f}" for k, v in sorted(sb["by_command"].items()))
        target = "< 1" if int(ttl) == 2000 else ""
        rows.append((
            f"per-record cost: idle standby, ttl {ttl} ms: commands sent/s each (by kind); "
            "INFO commandstats/s each, script-internal commands included (by command)",
            f"{sent:.2f} ({what}); {sb['commands_per_s_per_standby']:.2f} ({detail})",
            target, _ok(sent < 1) if target else None,
        ))  # fmt: skip
    return rows


def _cpu_brief(usage: dict[str, Any]) -> str:
    per = ", ".join(f"{k} {usage['us_per_record'][k]:.1f} ({usage['cores'][k]:.2f})" for k in usage["cpu_s"])
    busy = usage.get("machine_busy_cores")
    machine = "" if busy is None else f" (machine busy {busy:.2f})"
    return f"{per}; {usage['cores_total']:.2f} of {usage['machine_cores']} cores{machine}, {usage['bound']}"


def _ok(flag: bool) -> str:
    return "met" if flag else "NOT met"


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def table(results: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    rows = _rows(results)
    before = {metric: value for metric, value, _t, _v in _rows(baseline)} if baseline else {}
    if before:
        lines = ["| metric | before | after | target | |", "| --- | --- | --- | --- | --- |"]
        for metric, value, target, verdict in rows:
            lines.append(f"| {metric} | {before.get(metric, '')} | {value} | {target} | {verdict or ''} |")
    else:
        lines = ["| metric | value | target | |", "| --- | --- | --- | --- |"]
        for metric, value, target, verdict in rows:
            lines.append(f"| {metric} | {value} | {target} | {verdict or ''} |")
    return "\n".join(lines)


def machine_line(m: dict[str, str]) -> str:
    return f"{m['cpu']}, {m['cores']} cores, {m['os']}; Python {m['python']}; {m['redis']}; {m['date']}"


def render(results: dict[str, Any], baseline: dict[str, Any] | None, notes: str) -> str:
    mode = "quick smoke run" if results["quick"] else "full run"
    parts = [
        "# Benchmarks",
        "",
        "Produced by `python -m benchmarks` (" + mode + "); regenerate with `python -m benchmarks`"
        " (`--quick` for a smoke run). Everything runs on one machine over loopback: a throwaway"
        " redis-server, the Horizon simulator as its own process, node processes as started by"
        " operators (`python -m ingestion ...`).",
        "",
        f"Machine: {machine_line(results['machine'])}.",
    ]
    if baseline:
        parts.append(f"Before: {machine_line(baseline['machine'])}.")
    parts += ["", table(results, baseline), ""]
    if notes:
        parts += [notes.rstrip(), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a fast smoke run (prints, writes nothing)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=None)
    p.add_argument(
        "--write", action="store_true", help="write --output and its JSON (a full run only)"
    )
    p.add_argument("--profile", type=Path, default=None, help="per_record: py-spy profiles here")
    p.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--baseline", type=Path, default=ROOT / "benchmarks" / "baseline.json")
    p.add_argument(
        "--from-json", type=Path, default=None, help="re-render an earlier run's JSON, measure nothing"
    )
    ns = p.parse_args(argv)
    if ns.write and ns.quick:
        p.error("--write takes a full run's figures: drop --quick")
    only = tuple(ns.only or (QUICK_SECTIONS if ns.quick else SECTIONS))
    os.chdir(ROOT)
    json_path = ns.json or (ns.output.with_suffix(".json") if ns.write else None)
    if ns.from_json is not None:
        results = json.loads(ns.from_json.read_text())
    else:
        results = measure(ns.quick, only, json_path, ns.profile)
    baseline = json.loads(ns.baseline.read_text()) if ns.baseline.exists() else None
    notes_file = ROOT / "benchmarks" / "NOTES.md"
    notes = notes_file.read_text() if notes_file.exists() else ""
    print()
    print(table(results, baseline))
    if json_path is not None and (ns.from_json is None or json_path.resolve() != ns.from_json.resolve()):
        json_path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {json_path}")
    if ns.write:
        ns.output.parent.mkdir(parents=True, exist_ok=True)
        ns.output.write_text(render(results, baseline, notes))
        print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
