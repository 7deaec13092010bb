"""The Redis key layout: one job's keys (under one cluster hash tag) and the node registry.

The runtime's half of the keyspace: every key name the runtime uses is spelled here, and nowhere
else in ``actors/``. The application names its own keys in ``ingestion/common/keyspace.py``, built
with :func:`job_key` (so they share a job's hash tag, hence its cluster slot); together the two
modules are the whole keyspace (``tests/suite/test_layout.py`` checks that no other module spells
a key, and ``docs/REFERENCE.md`` lists them all with their meanings).
"""

from __future__ import annotations

from typing import Any

AUDIT_MAXLEN = 10_000  # entries kept in a job's audit stream (approximately: MAXLEN ~)
NODE_REGISTRY_KEY = "ingestion:nodes"  # its own key (its own cluster slot): no script mixes it with a job's
# node -> the jobs it hosts, one a line (written with its heartbeat, removed when it leaves)
NODE_HOSTS_KEY = "ingestion:nodes:jobs"
NODE_FORGET_MS = 3_600_000  # a node silent this long is dropped from the registry
DEPLOYMENT_KEY = "ingestion:deployment"  # the deployment's own id, set once: LeaseStore.deployment_id
KEY_PATTERN = "ingestion:*"  # every key of the keyspace (what a Redis ACL must grant)
# one job's keys (see job_keys)
JOB_KEY_NAMES = ("lease", "token", "cursor", "events", "audit", "leader", "released", "health", "rejections")


def job_key(job: str, name: str) -> str:
    """Key ``name`` of job ``job``, under the job's hash tag (``job`` may be a SCAN glob: ``*``)."""
    return f"ingestion:{{{job}}}:{name}"


def job_of_key(key: str | bytes) -> str | None:
    """The job a key of :func:`job_key`'s shape belongs to (None: not such a key)."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    if not text.startswith("ingestion:{"):
        return None
    name, close, _rest = text[len("ingestion:{") :].partition("}:")
    return name if close and name else None


def job_keys(job: str) -> dict[str, str]:
    """The Redis keys of one job; the ``{job}`` hash tag keeps them in one cluster slot."""
    return {name: job_key(job, name) for name in JOB_KEY_NAMES}


def parse_lease_value(value: str) -> tuple[int, str]:
    token, _, node = value.partition("|")
    return int(token), node


def discover_jobs(client: Any) -> list[str]:
    """Every job with state in this Redis (any of its keys), sorted; on a cluster, from every
    master (blocking: run it in a thread)."""
    names: set[str] = set()
    for key in client.scan_iter(match=job_key("*", "*"), count=1000):
        name = job_of_key(key)
        if name:
            names.add(name)
    return sorted(names)
