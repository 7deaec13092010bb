"""A short chaos campaign on every change: a real cluster (Redis under Sentinel, PostgreSQL, the
simulator, a webhook receiver, three nodes, five jobs) under about 60 s of random faults from every
layer, judged by :mod:`chaos` (exactly once and in order per sink, fencing, the audit
against the log, liveness within B). The seed is fixed, so a failure reproduces
(``./scripts/chaos --seconds 60 --seed 20261205``); ``CHAOS_SEED`` picks another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos import mutants
from chaos.campaign import Campaign, Options, partition

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("CHAOS_SEED", "20261205"))


async def test_a_minute_of_faults_from_every_layer_loses_duplicates_and_stalls_nothing() -> None:
    lines: list[str] = []
    report = await Campaign(Options(seconds=60, seed=SEED), out=lines.append).run()
    print("\n".join(lines))
    print(report.text())
    assert report.ok, report.text()
    assert len(report.faults) >= 20, report.text()
    layers = {f.kind.split("-")[0] for f in report.faults}
    assert {"node", "redis", "horizon", "rpc", "receiver"} <= layers, sorted(layers)
    for job, figures in report.jobs.items():
        assert figures["records"] > 0, job


@pytest.mark.skipif(partition.available() is not None, reason=f"{partition.available()}")
async def test_the_campaign_fails_a_build_whose_commit_script_does_not_fence(tmp_path: Path) -> None:
    """The checker checked: the nodes run a copy of the code whose commit script lacks its token
    and cursor checks (:mod:`chaos.mutants`), under partitions that deliver a cut-off
    leader's commit late. The real script refuses such a commit; the mutant applies it, and the
    campaign must say so: records twice."""
    build = mutants.build("no-fence", tmp_path / "build")
    lines: list[str] = []
    options = Options(seconds=20, seed=SEED, kinds=("node-partition",), build=str(build))
    report = await Campaign(options, out=lines.append).run()
    print(report.text())
    assert not report.ok
    assert any("duplicate" in v for v in report.violations), report.violations[:5]


def test_a_mutant_whose_edits_no_longer_apply_is_refused(tmp_path: Path) -> None:
    mutants.MUTANTS["broken"] = [(mutants.COMMIT, "no such line\n", "")]
    try:
        with pytest.raises(ValueError, match="0 copies"):
            mutants.build("broken", tmp_path / "build")
    finally:
        del mutants.MUTANTS["broken"]
