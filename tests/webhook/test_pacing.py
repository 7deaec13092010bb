"""The retry pacing of a failing record (``RetryPacing``), driven with plain numbers: an ordered
endpoint is back within seconds of a short outage, while the schedule still decides when a record
is given up and a ``Retry-After`` still wins."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from structlog.testing import capture_logs

from actors.lease_store import LeaseStore
from ingestion.config import ConfigError
from ingestion.config.layers import load
from ingestion.node.build import build_source
from ingestion.testing.cluster import figure
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook.core import DEFAULT_SCHEDULE, PROBE_MAX, RetryPacing, RetrySchedule
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.support.webhooks import SECRET, commit_source_records, webhook

SCHEDULE = RetrySchedule.parse(DEFAULT_SCHEDULE)


def resume_delay(pacing: RetryPacing, outage: float, rng: random.Random, took: float = 0.01) -> float:
    """An endpoint failing every attempt made before ``outage`` seconds (each attempt taking
    ``took`` to fail), then answering 2xx: seconds from its recovery to the first attempt it gets."""
    at = 0.0
    while at < outage:
        failed_at = at + took
        at = failed_at + pacing.failed(failed_at, rng.random())
        assert not pacing.exhausted
    return at - outage


@pytest.mark.parametrize("outage", [5.0, 20.0, 60.0])
def test_with_the_defaults_delivery_resumes_within_seconds_of_an_outage_ending(outage: float) -> None:
    rng = random.Random(46)
    delays = [resume_delay(RetryPacing(SCHEDULE), outage, rng) for _ in range(500)]
    # an outage of up to 60 s is seen within 10 s of its end (the target); in fact within about a
    # tenth of its length (at least ~1 s), jitter included
    assert max(delays) <= 10.0
    assert max(delays) <= max(1.0, 0.1 * outage) * 1.2 + 0.02, max(delays)
    # the same with an attempt that hangs until a 2 s timeout
    assert max(resume_delay(RetryPacing(SCHEDULE), outage, rng, took=2.0) for _ in range(100)) <= 10.0


def test_the_schedule_alone_waits_minutes_after_a_six_second_outage() -> None:
    """``probe_max = 0``: no probes, as before the pacing. The failure this pacing is for."""
    rng = random.Random(46)
    delays = [resume_delay(RetryPacing(SCHEDULE, probe_max=0), 6.0, rng) for _ in range(200)]
    assert min(delays) < 1.0  # the 5 s step (+-20 %) came after the outage
    assert max(delays) > 200.0  # ... or before its end: the next step is 5 minutes on


def test_probes_stretch_out_to_the_cap_and_the_schedule_still_decides_the_dead_letter() -> None:
    pacing, rng = RetryPacing(SCHEDULE), random.Random(7)
    now, waits = 0.0, []
    while not pacing.exhausted:
        waits.append(pacing.failed(now, rng.random()))
        now += waits[-1]
    last = now - waits[-1]  # the failure that exhausted the schedule
    # given up only after the schedule's full age, jitter included, not after 8 attempts
    assert SCHEDULE.span * 0.8 <= last <= SCHEDULE.span * 1.2
    assert 0.8 <= waits[0] <= 1.2  # soon at first
    assert max(waits) <= PROBE_MAX * 1.2  # never further apart than the cap
    # stretched out to it (but for the waits cut short by one of the schedule's steps)
    assert sum(w < PROBE_MAX * 0.8 for w in waits[200:]) <= len(SCHEDULE.delays)
    assert len(waits) <= SCHEDULE.span / (PROBE_MAX * 0.8) + 100  # ~one attempt per 30 s


def test_max_age_gives_up_early_and_time_paused_does_not_count() -> None:
    pacing = RetryPacing(RetrySchedule.parse(DEFAULT_SCHEDULE, max_age=60.0))
    pacing.failed(0.0, 0.5)
    pacing.paused(1000.0)  # an operator paused delivery
    pacing.failed(1050.0, 0.5)
    assert not pacing.exhausted  # failing for 50 s, the pause aside
    pacing.failed(1061.0, 0.5)
    assert pacing.exhausted


def test_a_pause_moves_the_schedules_next_step_too() -> None:
    pacing = RetryPacing(RetrySchedule((10.0, 10.0), jitter=0.0), probe_max=0)
    assert pacing.failed(0.0, 0.5) == 10.0
    pacing.paused(100.0)
    assert pacing.failed(100.0, 0.5) == 10.0  # the step due at 110: this attempt was not it
    assert pacing.failed(110.0, 0.5) == 10.0 and not pacing.exhausted
    pacing.failed(120.0, 0.5)
    assert pacing.exhausted


def test_retry_after_wins_over_the_probes() -> None:
    pacing = RetryPacing(SCHEDULE)
    assert pacing.failed(0.0, 0.0, retry_after=4.0) == 4.0  # never earlier than it asks
    assert pacing.failed(4.0, 0.0, retry_after=600.0) == 600.0  # even past the probe cap
    assert pacing.failed(604.0, 0.5, retry_after=0.0) == pytest.approx(30.0)  # 10 % of 604 s, capped


def test_without_probes_the_waits_are_the_schedules() -> None:
    pacing = RetryPacing(SCHEDULE, probe_max=0)
    now, waits = 0.0, []
    while True:
        wait = pacing.failed(now, 0.5)
        if pacing.exhausted:
            break
        waits.append(wait)
        now += wait
    assert waits == list(SCHEDULE.delays) and pacing.failures == len(SCHEDULE.delays) + 1


def test_blocking_after_the_schedule_keeps_probing_at_the_cap() -> None:
    """``on_exhausted = "block"``: the record is tried on, at most the cap apart (not 10 h)."""
    pacing = RetryPacing(RetrySchedule((1.0,), jitter=0.0))
    pacing.failed(0.0, 0.5)
    pacing.failed(1.0, 0.5)
    assert pacing.exhausted
    assert pacing.failed(3600.0, 0.5) == 1.0  # the schedule's last interval, shorter than a probe
    long = RetryPacing(RetrySchedule((1.0, 36000.0), jitter=0.0))
    for now in (0.0, 1.0, 36001.0):
        long.failed(now, 0.5)
    assert long.exhausted and long.failed(40000.0, 0.5) == PROBE_MAX


def hook_config(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[jobs.ops]\nkind = "horizon"\n[jobs.hook]\nkind = "webhook"\nfrom = "ops"\n'
                    f'url = "http://127.0.0.1:1/"\nsecret = "{SECRET}"\n{lines}')  # fmt: skip
    return path


@pytest.mark.parametrize(("lines", "expected"), [("", PROBE_MAX), ("retry_probe_max_ms = 0\n", 0.0),
                                                 ("retry_probe_max_ms = 120000\n", 120.0)])  # fmt: skip
def test_the_probe_cap_is_a_setting_of_the_job(tmp_path: Path, lines: str, expected: float) -> None:
    settings = load(hook_config(tmp_path, lines), {}, {})
    source = build_source(settings, settings.jobs[1], LeaseStore(redis.Redis(), "hook"))
    assert isinstance(source, WebhookSource)
    assert source.probe_max == expected


def test_a_negative_probe_cap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load(hook_config(tmp_path, "retry_probe_max_ms = -1\n"), {}, {})
    assert caught.value.problems == ["jobs.hook.retry_probe_max_ms: must be at least 0, got -1"]


# -- over real HTTP: a receiver that fails for a while, then answers -------------------------------


async def outage_then_resume(
    url: str, open_store: OpenStore, job: str, fault: Fault, outage: float, **options: Any
) -> tuple[float, Receiver]:
    """Deliver 20 records, with the default schedule, to a receiver failing with ``fault`` from
    the first POST for ``outage`` seconds: seconds from its recovery to the first record taken."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(url, source_job), 1, 20)
    receiver = Receiver(SECRET, fault=fault)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, url, source_job, hook_job, port, schedule=SCHEDULE, **options)
        node = await start_node(nursery, Recorder(), url, hook_job, "a", hook)
        await wait_until(lambda: receiver.posts > 0, 10, what="the first POST")
        await trio.sleep(outage)
        receiver.fault = None
        recovered = trio.current_time()
        await receiver.wait_for(1, 60)
        resumed = trio.current_time() - recovered
        await receiver.wait_for(20, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert [r["seq"] for r in receiver.records()] == list(range(1, 21))
    return resumed, receiver


@pytest.mark.parametrize(
    ("fault", "outage"),
    [
        (Fault(status=503), 6.0),  # the issue's blip: 5 minutes' stall with the schedule alone
        # (outages of 20 s and a minute over real HTTP, 1.46 and 2.80 s to resume, are in
        # docs/BENCHMARKS.md; the suite keeps its time: the pacing core's test above covers 5, 20
        # and 60 s outages)
        pytest.param(Fault(drop=True), 10.0, marks=pytest.mark.slow),
    ],
    ids=["503-6s", "drop-10s"],
)
async def test_an_ordered_endpoint_is_back_within_seconds_of_an_outage_with_the_defaults(
    redis_server: LocalRedis, job: str, open_store: OpenStore, fault: Fault, outage: float
) -> None:
    with capture_logs() as logs:
        resumed, receiver = await outage_then_resume(redis_server.url, open_store, job, fault, outage)
    figure("webhook_resume_after_outage", fault=repr(fault), outage_s=outage, resumed_s=f"{resumed:.2f}",
           posts=receiver.posts)  # fmt: skip
    assert resumed <= 10.0  # the target: within 10 s of the endpoint answering 2xx again
    assert resumed <= max(1.0, 0.1 * outage) * 1.2 + 1.0  # in fact a tenth of the outage (+ load)
    waits = [e["retry_in_s"] for e in logs if e["event"] == "webhook-failed"]
    assert 0.8 <= waits[0] <= 1.2 and max(waits) <= max(1.0, 0.1 * outage) * 1.2  # what an operator sees


async def test_retry_after_still_wins_over_the_probes(
    redis_server: LocalRedis, job: str, open_store: OpenStore
) -> None:
    resumed, receiver = await outage_then_resume(
        redis_server.url, open_store, job, Fault(status=429, retry_after=3), 0.5
    )
    assert 2.0 <= resumed <= 3.5  # asked to wait 3 s after the failure 0.5 s before the recovery
    assert receiver.posts == 1 + 20  # one refused attempt, none more before the Retry-After was up
