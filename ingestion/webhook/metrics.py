"""The webhook jobs' metrics (this node's view, from each job's :class:`WebhookStats`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestion.webhook.source import WebhookStats

JOB_LABEL = "ingestion_job"
STATES = ("idle", "ok", "failing", "disabled", "paused")
OUTCOMES = ("2xx", "3xx", "4xx", "429", "5xx", "timeout", "error")


class WebhookCollector(Collector):
    """``ingestion_webhook_*`` for every webhook job the node hosts (job -> its stats)."""

    def __init__(self, stats: Mapping[str, WebhookStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        delivered = CounterMetricFamily(
            "ingestion_webhook_delivered", "Records acknowledged by the endpoint (2xx) and committed.",
            labels=[JOB_LABEL],
        )  # fmt: skip
        attempts = CounterMetricFamily(
            "ingestion_webhook_attempts", "POSTs to the endpoint by outcome (2xx, 3xx, 4xx, 429, 5xx, "
            "timeout, error).", labels=[JOB_LABEL, "outcome"],
        )  # fmt: skip
        dead = CounterMetricFamily(
            "ingestion_webhook_dead_letters", "Records given up after their retry schedule (dead-lettered).",
            labels=[JOB_LABEL],
        )  # fmt: skip
        held = GaugeMetricFamily(
            "ingestion_webhook_dead_letters_held",
            "Dead letters not yet replayed or dropped (the delivering node's only): each holds its "
            "source record, and every later one, from the source job's retention.",
            labels=[JOB_LABEL],
        )
        lag = GaugeMetricFamily(
            "ingestion_webhook_lag_seconds",
            "How long the oldest record not yet delivered has waited since its commit (0: none).",
            labels=[JOB_LABEL],
        )
        state = GaugeMetricFamily(
            "ingestion_webhook_endpoint_state",
            "1 for the endpoint's state on this node: idle (not leading), ok, failing, disabled, paused.",
            labels=[JOB_LABEL, "state"],
        )
        now_ms = int(time.time() * 1000)
        for job, s in self.stats.items():
            delivered.add_metric([job], s.delivered)
            for outcome in OUTCOMES:
                attempts.add_metric([job, outcome], s.attempts.get(outcome, 0))
            dead.add_metric([job], s.dead_letters)
            if s.dead_letters_held is not None:  # (a standby reports none: no stale count of a past term)
                held.add_metric([job], s.dead_letters_held)
            lag.add_metric([job], s.lag_seconds(now_ms))
            for name in STATES:
                state.add_metric([job, name], 1.0 if s.state == name else 0.0)
        yield from (delivered, attempts, dead, held, lag, state)
