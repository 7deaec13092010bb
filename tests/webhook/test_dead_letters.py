"""Dead letters are kept until dealt with: never trimmed by ``events.max_len``, and the source
records they name held on the source job's stream until they are replayed or dropped.

The reproduction runs real node processes: a Horizon job committing from the simulator, with
``events.max_len`` small, and a webhook job delivering it to an endpoint that answers 500, so that
every record is dead-lettered while the source job's commits trim its stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.lease_store import job_keys
from ingestion.testing.cluster import open_cluster
from ingestion.webhook.receiver import Fault, Receiver, serve_receiver

pytestmark = pytest.mark.slow

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TTL_MS = 1500
MAX_LEN = 10
LETTERS = 250  # over a Redis stream node (100 entries): the approximate trim drops whole nodes


def failing_hook_config(path: Path, port: int, job: str, extra: str = "") -> Path:
    path.write_text(
        f"[events]\nmax_len = {MAX_LEN}\n"
        f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
        f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\nretry_schedule = ["10ms"]\n{extra}'
    )
    return path


async def test_dead_letters_and_the_source_records_they_name_outlive_events_max_len(
    job: str, tmp_path: Path
) -> None:
    hook = f"{job}-hook"
    receiver = Receiver(SECRET, fault=Fault(status=500))  # every record fails: each is dead-lettered
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = failing_hook_config(tmp_path / "config.toml", port, job)
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=10, history_ledgers=30) as cluster:
            await cluster.start_node("n1", extra=extra)
            await cluster.log.wait_for("webhook-dead-lettered", job=hook, count=LETTERS, within=60)
            await cluster.terminate("n1")
            named = [line.fields["record"] for line in cluster.log.of("webhook-dead-lettered", job=hook)]
            client = cluster.client
            kept = {f["paging_token"] for _id, f in client.xrange(job_keys(hook)["events"])}
            source = {f["paging_token"] for _id, f in client.xrange(job_keys(job)["events"])}
        outer.cancel_scope.cancel()
    assert len(named) >= LETTERS
    lost = [token for token in named if token not in kept]
    assert not lost, f"{len(lost)} of {len(named)} dead letters trimmed from {hook}'s stream"
    unheld = [token for token in named if token not in source]
    assert not unheld, f"{len(unheld)} of {len(named)} dead-lettered records trimmed from {job}'s stream"
