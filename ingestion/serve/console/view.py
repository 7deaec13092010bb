"""The console's pure core: the nodes' presence reports in, the cluster's state out (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

MAX_JOBS = 500  # jobs the console shows (a larger cluster shows the first, sorted, and says so)
LIVE_REPORTS = 2.5  # a node is live while its last report is younger than this many report periods
CLAIM_SLACK = 0.25  # seconds a leader's claim outlives the lease it reported (the report's travel)
CLAIM_REPORTS = 1.5  # a leader's claim holds this many report periods whatever lease it reported

# -- the pure core: reports in, the cluster out ----------------------------------------------------


@attrs.define
class Seen:
    at_ms: int  # the report's Redis time
    seen_at: float  # when it was made, on this process's trio clock
    report: dict[str, Any] | None  # None: the node left


@attrs.define
class ClusterView:
    """The nodes' latest reports and what they say of the cluster (no I/O: times are given)."""

    node: str
    nodes: dict[str, Seen] = attrs.Factory(dict)
    unreported: dict[str, dict[str, Any]] = attrs.Factory(dict)  # job -> lease read from Redis
    error: str | None = None
    version: int = 0  # moves with every report taken (the events feed pushes when it moves)

    def heard(self, node: str, at_ms: int, report: dict[str, Any] | None, seen_at: float) -> None:
        """A report (None: the node left) made at Redis time ``at_ms``, ``seen_at`` on our clock."""
        old = self.nodes.get(node)
        if old is not None and old.at_ms > at_ms:
            return  # an older report than the one held (a seed read after a message)
        self.nodes[node] = Seen(at_ms, seen_at, report)
        self.version += 1

    def _live(self, seen: Seen, now: float) -> bool:
        if seen.report is None:
            return False
        every = float(seen.report.get("every_ms", 2000)) / 1000
        return now - seen.seen_at <= LIVE_REPORTS * every

    def state(self, now: float) -> dict[str, Any]:
        jobs: dict[str, dict[str, Any]] = {}
        hosts: dict[str, list[dict[str, Any]]] = {}
        for name, seen in sorted(self.nodes.items()):
            if seen.report is None:
                continue
            live = self._live(seen, now)
            for job, r in (seen.report.get("jobs") or {}).items():
                if not isinstance(r, dict):
                    continue
                job = str(job)
                hosts.setdefault(job, []).append({
                    "node": name, "live": live, "role": str(r.get("role", "")),
                    "source_up": r.get("source_up"), "held_off": r.get("held_off") or "",
                })  # fmt: skip
                entry = jobs.setdefault(job, _empty_job(job))
                if r.get("kind") and not entry["kind"]:
                    entry["kind"] = str(r["kind"])
                claim = self._claim(seen, r, now)
                if claim is not None and (entry["token"] is None or claim["token"] > entry["token"]):
                    entry.update(claim, leader=name)
        for job, lease in self.unreported.items():
            if job not in jobs:
                jobs[job] = {**_empty_job(job), **lease}
        out = []
        for name in sorted(jobs)[:MAX_JOBS]:
            job = jobs[name]
            job["hosts"] = hosts.get(name, [])
            job["why"] = "" if job["leader"] else why_leaderless(job["hosts"])
            out.append(job)
        nodes = []
        for name, seen in sorted(self.nodes.items()):
            if seen.report is None and name != self.node:
                continue  # left gracefully: gone from the picture
            report = seen.report or {}
            hosted = sorted(str(j) for j in (report.get("jobs") or {}))
            leads = sorted(j["job"] for j in out if j["leader"] == name)
            job_reports = report.get("jobs") or {}
            nodes.append({
                "node": name, "live": self._live(seen, now), "version": str(report.get("version", "")),
                "heartbeat_ms_ago": max(0, round(1000 * (now - seen.seen_at))),
                "hosts": hosted, "leads": leads, "share": f"{len(leads)} of {len(hosted)}",
                "health": {j: _health(job_reports[j]) for j in hosted},
                "held_off": {j: str(job_reports[j].get("held_off")) for j in hosted
                             if isinstance(job_reports[j], dict) and job_reports[j].get("held_off")},
            })  # fmt: skip
        return {
            "node": self.node, "error": self.error, "jobs": out, "nodes": nodes,
            "truncated": len(jobs) > MAX_JOBS,
        }  # fmt: skip

    def _claim(self, seen: Seen, r: dict[str, Any], now: float) -> dict[str, Any] | None:
        """A report's claim to lead its job, while the lease it reported lasts."""
        if r.get("role") != "leader" or not isinstance(r.get("token"), int):
            return None
        left = r.get("lease_ms_left")
        if not isinstance(left, int | float):
            return None
        # A leader renews between its reports: its claim holds until its next report is overdue,
        # and no longer than the lease it reported once its reports stop (a SIGKILLed leader).
        since = now - seen.seen_at
        remaining = left / 1000 - since
        overdue = since > CLAIM_REPORTS * float((seen.report or {}).get("every_ms", 2000)) / 1000
        if overdue and remaining + CLAIM_SLACK < 0:
            return None
        return {
            "token": r["token"], "lease_ttl_ms_left": max(0, round(remaining * 1000)),
            "leader_since_ms": r.get("since_ms"), "cursor": str(r.get("cursor") or ""),
            "rate": r.get("rate"), "lag_seconds": r.get("lag_seconds"),
            "webhook": {k: r[k] for k in ("delivery", "delivered", "dead_letters", "lag") if k in r},
        }  # fmt: skip


def _empty_job(job: str) -> dict[str, Any]:
    return {
        "job": job, "kind": "", "leader": "", "token": None, "lease_ttl_ms_left": None,
        "leader_since_ms": None, "cursor": "", "rate": None, "lag_seconds": None, "webhook": {},
    }  # fmt: skip


def _health(r: Any) -> str:
    if not isinstance(r, dict) or r.get("source_up") is None:
        return "unknown"
    return "up" if r["source_up"] else "down"


def why_leaderless(hosts: Sequence[dict[str, Any]]) -> str:
    """Why a job has no leader, from its hosts' reports, in an operator's words."""
    live = [h for h in hosts if h["live"]]
    if not live:
        if hosts:
            return "no live node hosts it (hosted by " + ", ".join(h["node"] for h in hosts) + ", all down)"
        return "no live node hosts it"
    parts = []
    for h in live:
        if h["held_off"]:
            parts.append(f"{h['node']}: held off: {h['held_off']}")
        elif h["source_up"] is False:
            parts.append(f"{h['node']}: its source is unreachable")
        elif h["role"] in ("starting", "stopped"):
            parts.append(f"{h['node']}: {h['role']}")
        else:
            parts.append(f"{h['node']}: about to campaign ({h['role'] or 'standby'})")
    return "; ".join(parts)
