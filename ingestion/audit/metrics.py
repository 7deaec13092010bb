"""The audit jobs' metrics (this node's view: the jobs it leads, from each one's :class:`AuditStats`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestion.audit.compare import KINDS
from ingestion.audit.job import AuditStats

JOB_LABEL = "ingestion_job"


class AuditCollector(Collector):
    """``ingestion_audit_ledger`` and ``ingestion_audit_findings_total`` for every audit job the
    node hosts (job -> its stats), labelled with the audit job's name."""

    def __init__(self, stats: Mapping[str, AuditStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        ledger = GaugeMetricFamily(
            "ingestion_audit_ledger", "The last ledger the audit job checked against the lake "
            "(its leader's).",
            labels=[JOB_LABEL],
        )  # fmt: skip
        findings = CounterMetricFamily(
            "ingestion_audit_findings", "Records the audit job found missing, extra, duplicated or "
            "differing in the audited job's store (since this node started).", labels=[JOB_LABEL, "kind"],
        )  # fmt: skip
        for job, s in sorted(self.stats.items()):
            if s.ledger is not None:
                ledger.add_metric([job], s.ledger)
            for kind in KINDS:
                findings.add_metric([job, kind], s.findings.get(kind, 0))
        yield ledger
        yield findings
