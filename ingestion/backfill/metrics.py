"""The backfills' metrics (``ingestion_backfill_*``): each plan's progress as the node's runner
last read it from Redis and the sink (what ``ingestion backfill --status`` and ``inspect`` show),
once a lease TTL while it runs and once more when it is done (then kept, with
``ingestion_backfill_done`` 1, until the job's next plan or a cancel). Every node that hosts a
job reads the same plan, so the figures are the same on each (aggregate with ``max``, not
``sum``); only ``ranges_led`` is the node's own.
Rates and time left are PromQL's: ``rate(ingestion_backfill_ledgers_done[5m])``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestion.backfill.status import Snapshot, shown_state

JOB_LABEL = "ingestion_job"


class BackfillCollector(Collector):
    """``progress()``: job -> its plan's last snapshot; ``node``: this node's id."""

    def __init__(self, progress: Callable[[], Mapping[str, Snapshot]], node: str) -> None:
        self._progress = progress
        self._node = node

    def collect(self) -> Iterator[Metric]:
        snaps = dict(self._progress())
        if not snaps:
            return

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"ingestion_backfill_{name}", doc, labels=[JOB_LABEL, *labels])

        ledgers = gauge("ledgers", "Ledgers in the job's backfill plan.")
        finished = gauge(
            "done", "1 once every range of the job's backfill plan is done (its state done), else 0."
        )
        done = gauge("ledgers_done", "Ledgers of the plan its ranges have committed through.")
        records = gauge("records", "Records the plan's ranges have committed.")
        through = gauge(
            "complete_through_ledger",
            "The plan is complete from its first ledger through this one (first - 1: not yet).",
        )
        ranges = gauge("ranges", "The plan's ranges by state: done, running (led), waiting.", ("state",))
        mine = gauge("ranges_led", "The plan's ranges this node leads now.")
        for job, snap in sorted(snaps.items()):
            p = snap.progress
            ledgers.add_metric([job], p.total)
            finished.add_metric([job], 1 if shown_state(p.plan, p) == "done" else 0)
            done.add_metric([job], p.ledgers_done)
            records.add_metric([job], snap.records)
            through.add_metric([job], p.complete_through)
            ended = sum(1 for r in p.ranges if r.done)
            ranges.add_metric([job, "done"], ended)
            ranges.add_metric([job, "running"], p.running)
            ranges.add_metric([job, "waiting"], len(p.ranges) - ended - p.running)
            mine.add_metric([job], p.by_node().get(self._node, 0))
        yield from (ledgers, finished, done, records, through, ranges, mine)
