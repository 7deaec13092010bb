"""The campaign's judge: after the run, every sink read and checked against its source
(:func:`ingestion.verify.check_stream`: exactly once, in order, tokens that never fall), the
election audited against the nodes' logs and liveness held to B (the rules of :mod:`chaos.check`).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actors.lease_store import job_keys
from chaos import check
from chaos.jobs import HOOK, OPS, PG, RPC, TICK
from ingestion.testing.cluster_config import check_delivery
from ingestion.testing.receiver import Receiver
from ingestion.verify import (
    SourceRecord,
    Verification,
    check_stream,
    fetch_source,
    read_evidence,
    read_postgres_evidence,
    verify_job,
    verify_rpc_job,
)

if TYPE_CHECKING:
    from chaos.campaign import Campaign

ALLOWANCE = 1.5  # seconds beyond B: polling, the log pipe, process start-up on 2 busy cores


async def judge(c: Campaign, begin: float, end: float, client: Any) -> None:
    """Every sink against its source, the fencing, the election audit and liveness within B, into
    ``c.report`` (``client``: Redis's, after every fault is healed and the nodes stopped)."""
    r = c.report
    v = r.violations
    results: dict[str, Verification] = {}
    results[OPS] = await verify_job(c.redis.url, OPS, c.horizon, "/operations")
    results[RPC] = await verify_rpc_job(c.redis.url, RPC, c.rpc)
    results[TICK] = await verify_tick(c.redis.url)
    if c.pg is not None:
        entries, trimmed, fence_problems, terms = await read_postgres_evidence(c.pg.url, "ingestion", PG)
        through = entries[-1].paging_token if entries else None
        source = await fetch_source(c.horizon, "/payments", "0", through=through)
        res = check_stream(entries, source, None, trimmed)
        results[PG] = attrs.evolve(res, problems=res.problems + tuple(fence_problems), fence_terms=terms)
    results[HOOK] = await trio.to_thread.run_sync(verify_hook, client, c.receiver)
    rollbacks = bool(
        [e for e in c.log.lines if e.event == "redis-failover-detected" and e.fields.get("rolled_back")]
        or c.log.of("redis-state-lost")
    )
    for job in c.jobs:
        res = results[job]
        v += [f"{job}: {p}" for p in res.problems]
        samples = [s for s in c.polls.samples if s.job == job]
        commits = check.commit_times(samples)
        v += check.liveness_problems(job, commits, r.faults, begin, end, c.bound + ALLOWANCE)
        audit = await trio.to_thread.run_sync(read_audit, client, job)
        logged = [
            check.LoggedGrant(e.at, e.node, int(e.fields["token"]), kind)
            for event, kind in (("became-leader", "became-leader"),
                                ("redis-unavailable", "unconfirmed"),
                                ("releasing-orphaned-lease", "orphaned"))
            for e in c.log.of(event, job=job)
            if e.fields.get("token") is not None
        ]  # fmt: skip
        # the nodes' lines on Redis's clock (the same host's wall clock) for the audit
        wall_ms = time.time() * 1000 - trio.current_time() * 1000
        unanswered = [
            (e.node, int(wall_ms + e.at * 1000)) for e in c.log.of("redis-unavailable", job=job)
            if e.fields.get("token") is None
        ]  # fmt: skip
        v += check.election_problems(
            job, audit, logged, c.o.ttl_ms, rollbacks=rollbacks, unanswered=unanswered
        )
        gap = check.longest_gap(commits, begin, end)
        quiet = [
            check.longest_gap(commits, q.start, q.end) for q in check.fault_free(r.faults, job, begin, end)
        ]
        lost = check.leaderless([s for s in samples if begin <= s.at <= end])
        r.jobs[job] = {
            "records": res.count,
            "terms": len({g.token for g in logged}),
            "summary": res.summary().splitlines()[0],
            "longest_no_commit_s": round(gap.length, 2) if gap else 0,
            "longest_fault_free_no_commit_s": round(max((q.length for q in quiet if q), default=0), 2),
            "longest_fault_free_no_commit_at": span(
                max((q for q in quiet if q), key=lambda q: q.length, default=None)
            ),
            "longest_leaderless_s": round(max((s.length for s in lost), default=0), 2),
            "longest_leaderless_at": span(max(lost, key=lambda q: q.length, default=None)),
            "reissued_tokens": check.reissued_tokens(logged),
        }
    count = {e: len(c.log.of(e)) for e in (
        "became-leader", "lost-leadership", "fencing-token-rejected", "commit-outcome-unknown",
        "commit-unknown", "redis-failover-detected", "ingestion-stopped-at-deadline", "job-stopped",
        "worker-died",
    )}  # fmt: skip
    count["webhook_duplicates"] = c.receiver.duplicates
    count["webhook_stale_refused"] = c.receiver.refused_stale
    count["webhook_bad_signatures"] = c.receiver.refused_signature
    r.counts = count
    if c.receiver.refused_signature:
        v.append(f"{HOOK}: {c.receiver.refused_signature} deliveries with a bad signature "
                 f"({'; '.join(c.receiver.refusals[:3])})")
    stopped = [e for name in ("job-stopped", "ingestion-fatal", "term-failed", "job-failed")
               for e in c.log.of(name)]  # fmt: skip
    v += [f"{e.node}: {e.event} {e.fields.get('job')}: {e.fields.get('error', '')}" for e in stopped]
    tracebacks = [text for _n, text in c.log.raw if "Traceback (most recent call last)" in text]
    v += [f"a node printed a traceback ({len(tracebacks)} in all)"] if tracebacks else []


async def verify_tick(redis_url: str) -> Verification:
    """The scheduled job's runs 1..n, each record naming the token it was committed under."""
    entries, grants, trimmed = await read_evidence(redis_url, TICK)
    source = []
    for i, e in enumerate(entries):
        run = str(trimmed + i + 1)
        body = json.loads(e.record)
        source.append(
            SourceRecord(run, body if e.paging_token == run and str(body.get("run")) == run else None)
        )
    res = check_stream(entries, source, grants, trimmed)
    wrong = [
        f"run {e.paging_token}: its record says token {json.loads(e.record).get('token')}, "
        f"committed under {e.token}"
        for e in entries
        if json.loads(e.record).get("token") != e.token
    ]
    return attrs.evolve(res, problems=res.problems + tuple(wrong[:5]))


def verify_hook(client: Any, receiver: Receiver) -> Verification:
    """What the receiver holds against the delivered stream, up to the hook's position exactly."""
    source = [f["paging_token"] for _id, f in client.xrange(job_keys(OPS)["events"])]
    position = client.hget(job_keys(HOOK)["cursor"], "cursor")
    delivered = [str(rec.get("paging_token")) for rec in receiver.records()]
    return check_delivery(source, position, delivered)


def span(stretch: check.Stretch | None) -> list[float] | None:
    return None if stretch is None else [round(stretch.start, 2), round(stretch.end, 2)]


def read_audit(client: Any, job: str) -> list[check.AuditGrant]:
    out = []
    for entry_id, f in client.xrange(job_keys(job)["audit"]):
        if f.get("event") not in ("became-leader", "released"):
            continue
        prev = f.get("previous_token") or ""
        take = f.get("takeover_ms") or ""
        out.append(check.AuditGrant(
            int(entry_id.partition("-")[0]), f["event"], f["node"], int(f["token"]),
            int(prev) if prev else None, int(float(take)) if take else None,
        ))  # fmt: skip
    return out
