"""The Redis key layout: one job's keys (under one cluster hash tag) and the node registry."""

from __future__ import annotations

from typing import Any

AUDIT_MAXLEN = 10_000  # entries kept in a job's audit stream (approximately: MAXLEN ~)
NODE_REGISTRY_KEY = "ingestion:nodes"  # its own key (its own cluster slot): no script mixes it with a job's
# node -> the jobs it hosts, one a line (written with its heartbeat, removed when it leaves)
NODE_HOSTS_KEY = "ingestion:nodes:jobs"
NODE_FORGET_MS = 3_600_000  # a node silent this long is dropped from the registry
DEPLOYMENT_KEY = "ingestion:deployment"  # the deployment's own id, set once: LeaseStore.deployment_id


def job_keys(job: str) -> dict[str, str]:
    """The Redis keys of one job; the ``{job}`` hash tag keeps them in one cluster slot."""
    prefix = f"ingestion:{{{job}}}"
    return {
        name: f"{prefix}:{name}"
        for name in (
            "lease", "token", "cursor", "events", "audit", "leader", "released", "health", "rejections",
        )
    }


def parse_lease_value(value: str) -> tuple[int, str]:
    token, _, node = value.partition("|")
    return int(token), node


def discover_jobs(client: Any) -> list[str]:
    """Every job with state in this Redis (any of its keys), sorted; on a cluster, from every
    master (blocking: run it in a thread)."""
    names: set[str] = set()
    for key in client.scan_iter(match="ingestion:{*}:*", count=1000):
        name, close, _rest = key[len("ingestion:{"):].partition("}:")
        if close and name:
            names.add(name)
    return sorted(names)
