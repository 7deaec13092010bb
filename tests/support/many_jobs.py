"""Six jobs on three nodes: the many-jobs scenarios' job names, flags, holders and verification
(the balancer's real-process tests, and the same scenario over a Redis Cluster)."""

from __future__ import annotations

from actors.lease_store import read_states
from ingestion.testing.cluster import Cluster
from ingestion.verify import verify_job

RESOURCES = ("/operations", "/payments", "/effects", "/transactions", "/ledgers", "/operations")
NODES = ("n1", "n2", "n3")


def job_names(base: str) -> list[str]:
    return [base] + [f"{base}-{i}" for i in range(1, len(RESOURCES))]


def job_flags(base: str) -> list[str]:
    # The base job comes from the harness's own --job (with the default resource, /operations).
    return [f for name, res in zip(job_names(base)[1:], RESOURCES[1:], strict=True)
            for f in ("--job", f"{name}={res}")]  # fmt: skip


def holders(c: Cluster) -> dict[str, str | None]:
    return {state.job: state.leader for state in read_states(c.client, job_names(c.job))}


async def verify_all(c: Cluster) -> None:
    for name, resource in zip(job_names(c.job), RESOURCES, strict=True):
        result = await verify_job(c.redis_url, name, c.horizon, resource, "0")
        assert result.ok, f"{name}: {result.summary()}"
        assert result.count > 0, f"{name}: nothing ingested"
