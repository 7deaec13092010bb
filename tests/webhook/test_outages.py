"""Short outages with the default retry schedule, through real failures: three node processes, an
ingest job and an ordered webhook job to the example receiver. The deliverer is SIGKILLed and
SIGSTOPped past its TTL; the receiver answers 503, 429 with Retry-After, hangs past the timeout
and drops connections, each for a few seconds as a real endpoint's blips go. After each fault the
receiver holds what the source had committed when it ended within 10 s, and at the end it holds
every record once, first accepted in the source's order."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from actors.lease_store import job_keys
from ingestion.testing.cluster import Cluster, figure, open_cluster
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from tests.support.webhooks import SECRET, hook_leader

pytestmark = pytest.mark.slow

TTL_MS = 1500  # (as the webhook process test's)

CATCH_UP = 10.0  # seconds from a fault's end to the receiver holding what was committed by then
# (fault, seconds): the faults of the reproduction, each once
BLIPS = [(Fault(status=503), 6.0), (Fault(status=429, retry_after=2), 4.0), (Fault(hang=2.0), 6.0),
         (Fault(drop=True), 4.0)]  # fmt: skip


def default_schedule_config(path: Path, port: int, job: str) -> Path:
    """The webhook job with the default retry schedule and pacing; only the timeouts are short,
    so that a hang is past the timeout (2 s against 0.8 s)."""
    path.write_text(
        f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
        f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\ntimeout_ms = 800\nconnect_timeout_ms = 500\n'
    )
    return path


async def catch_up(cluster: Cluster, receiver: Receiver, job: str) -> float:
    """Seconds until the receiver holds the source job's last record as of now."""
    began = time.time()  # (the receiver notes when it took each record by the wall clock)
    last = cluster.client.xrevrange(job_keys(job)["events"], count=1)[0][1]["paging_token"]
    msg_id = f"{job}:{last}"
    await wait_until(lambda: msg_id in receiver.received_at, 60, what=f"the receiver holding {msg_id}")
    return max(0.0, receiver.received_at[msg_id] - began)


async def test_the_receiver_catches_up_within_seconds_of_each_fault_with_the_default_schedule(
    job: str, tmp_path: Path
) -> None:
    hook = f"{job}-hook"
    receiver = Receiver(SECRET)
    took: dict[str, float] = {}
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = default_schedule_config(tmp_path / "config.toml", port, job)
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=5, history_ledgers=20) as cluster:
            for name in ("n1", "n2", "n3"):
                await cluster.start_node(name, extra=extra)
            await wait_until(lambda: hook_leader(cluster.client, hook) is not None, 20, what="a deliverer")
            await receiver.wait_for(50, 30)

            victim = await wait_until(lambda: hook_leader(cluster.client, hook), 20, what="a deliverer")
            # (that deliverer SIGKILLed)
            await cluster.kill(victim)
            took["sigkill"] = await catch_up(cluster, receiver, job)
            await cluster.start_node(victim, extra=extra)

            # the deliverer paused past its TTL (the restarted node may be taking its share back
            # this moment: a lease handed back is free for an instant)
            victim = await wait_until(lambda: hook_leader(cluster.client, hook), 20, what="a deliverer")
            cluster.signal(victim, signal.SIGSTOP)
            await wait_until(lambda: hook_leader(cluster.client, hook) not in (None, victim), 20,
                             what="a deliverer instead of the paused one")  # fmt: skip
            took["sigstop"] = await catch_up(cluster, receiver, job)
            cluster.signal(victim, signal.SIGCONT)

            for fault, seconds in BLIPS:  # the endpoint failing for a few seconds, then answering
                receiver.fault = fault
                await trio.sleep(seconds)
                receiver.fault = None
                took[f"{fault.status or ('hang' if fault.hang else 'drop')}_{seconds:.0f}s"] = await catch_up(
                    cluster, receiver, job
                )
            source = [f["paging_token"] for _id, f in cluster.client.xrange(job_keys(job)["events"])]
        outer.cancel_scope.cancel()
    figure("webhook_catch_up_s", **{k: f"{v:.2f}" for k, v in took.items()}, records=len(source),
           posts=receiver.posts, duplicates=receiver.duplicates)  # fmt: skip
    assert max(took.values()) <= CATCH_UP, took
    delivered = [r["paging_token"] for r in receiver.records()]
    assert delivered == source[: len(delivered)]  # each once, first accepted in the source's order
    assert len(delivered) >= len(source) - 2000  # (the source goes on committing meanwhile)
    assert receiver.refused_signature == 0, receiver.refusals
