"""The demo's reads of its cluster (:mod:`ingestion.cli.demo`): where each job is led and how many
records it holds (:func:`placement`), and the checks at the end: every job against the simulator's own
records (:mod:`ingestion.verify`: each record once, in order, under the fencing token then
current), the PostgreSQL job judged by its fence history, and the webhook job's receiver against
the stream it delivers (:meth:`~ingestion.testing.cluster.Cluster.verify_delivery`)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from actors.lease_store import read_states
from ingestion.cli import demo_api
from ingestion.postgres.connection import connect as pg_connect
from ingestion.testing.cluster import Cluster
from ingestion.testing.cluster_config import POSTGRES
from ingestion.verify import Verification, check_stream, fetch_source, read_postgres_evidence, verify_job


def placement(c: Cluster, hook: str | None) -> dict[str, tuple[str | None, int]]:
    """job -> (lease holder, records) read now (a webhook job ``hook``'s: the receiver's; a job
    into PostgreSQL: its rows); blocking, so run it in a thread."""
    out = {s.job: (s.leader, s.events) for s in read_states(c.client, [spec.name for spec in c.jobs])}
    if hook is not None and c.receiver is not None:
        out[hook] = (out[hook][0], c.receiver.stored)
    if c.postgres is not None:
        with pg_connect(c.postgres.url, 1.0) as conn:
            for spec in c.jobs:
                if spec.settings.get("sink") == POSTGRES:
                    row = conn.execute(
                        "SELECT count(*) FROM ingestion.events WHERE job = %s", (spec.name,)
                    ).fetchone()
                    out[spec.name] = (out[spec.name][0], int(row[0]) if row else 0)
    return out


async def horizon_jobs(c: Cluster, jobs: Sequence[tuple[str, str]]) -> list[tuple[str, Verification]]:
    """Each (job, resource) into Redis against the simulator's Horizon."""
    return [(job, await verify_job(c.redis_url, job, c.horizon, resource)) for job, resource in jobs]


async def rpc_job(c: Cluster, job: str, lake: str) -> Verification:
    """The contract-events job against the simulator's lake past the RPC's window and its RPC
    from there: its rows in PostgreSQL when its sink is there, else its Redis stream."""
    if c.postgres is not None and c.api_job == job:
        return await demo_api.verify_rows(c.postgres.url, job, c.rpc, lake)
    start = await demo_api.first_entry_ledger(c.redis_url, job)
    return await c.verify_rpc(job=job, start_ledger=start, lake=lake)


async def postgres_job(c: Cluster, job: str, resource: str = "/payments") -> Verification:
    """A Horizon job's rows in PostgreSQL against the simulator, judged by the fence history."""
    assert c.postgres is not None
    entries, trimmed, fence_problems, terms = await read_postgres_evidence(c.postgres.url, "ingestion", job)
    through = entries[-1].paging_token if entries else None
    source = await fetch_source(c.horizon, resource, "0", through=through)
    result = check_stream(entries, source, None, trimmed)
    return attrs.evolve(result, problems=result.problems + tuple(fence_problems), fence_terms=terms)


async def caught_up(c: Cluster, hook: str, source: str, within: float) -> bool:
    """Until webhook job ``hook`` has delivered ``source``'s last record (at most ``within``)."""
    with trio.move_on_after(within):
        while True:
            if await trio.to_thread.run_sync(c.delivered_all, hook, source):
                return True
            await trio.sleep(0.1)
    return False


async def webhook_job(c: Cluster, hook: str, source: str) -> Verification:
    """What the receiver holds against ``source``'s stream: each record once, in order, up to the
    hook's position; every signature verified (a refused one is a problem)."""
    assert c.receiver is not None
    result = await trio.to_thread.run_sync(c.verify_delivery, hook, source)
    refused = c.receiver.refused_signature
    if refused:
        why = f"{refused} deliveries with a bad signature: {c.receiver.refusals[:2]}"
        result = attrs.evolve(result, problems=(*result.problems, why))
    return result


def webhook_summary(job: str, result: Verification) -> str:
    verdict = "exactly once, in order: OK" if result.ok else "FAILED\n  " + "\n  ".join(result.problems)
    return (
        f"{job}: {result.count} records at the receiver, signatures verified (standardwebhooks), "
        f"paging tokens {result.first} .. {result.last}: {verdict}"
    )
