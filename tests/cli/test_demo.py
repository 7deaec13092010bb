"""The demo (``ingestion demo``, ingestion/cli/demo.py) on the testing kit's cluster: its jobs,
rendered by the kit into the nodes' one config file, are a config the node accepts, a webhook job
into the example receiver among them; the check of that job refuses a receiver holding a record
twice, out of order, or none; and the whole demo, shortened, runs its failovers and verifies every
job, the receiver's records each once and in order."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ingestion.cli.demo import Demo
from ingestion.config import load
from ingestion.testing.cluster_config import SECRET, Endpoints, check_delivery, render
from ingestion.testing.local_postgres import server_bin

AT = Endpoints(
    "http://127.0.0.1:8000", "http://127.0.0.1:8001", "postgresql://u:p@127.0.0.1:5432/db",
    "http://127.0.0.1:9000/in", SECRET,
)  # fmt: skip


def demo(out: io.StringIO | None = None, **given: object) -> Demo:
    return Demo(nodes=3, ttl_ms=2000, duration=8, out=out or io.StringIO(), color=False, **given)  # type: ignore[arg-type]


def test_the_demos_jobs_rendered_by_the_kit_are_a_config_the_node_accepts(tmp_path: Path) -> None:
    d = demo(jobs=3, rpc_job=True)
    d.postgres = True
    path = tmp_path / "cluster.toml"
    path.write_text(render(d.specs(), AT, api_job=d.rpc_job_name))
    jobs = {job.name: job for job in load(path, {}, {}).jobs}
    assert jobs["demo-webhook"].kind == "webhook"
    assert jobs["demo-webhook"].webhook is not None
    assert jobs["demo-webhook"].webhook.url == "http://127.0.0.1:9000/in"
    assert jobs["demo-webhook"].webhook.source_job == "demo"
    assert jobs["demo-contract-events"].sink == AT.postgres
    assert jobs["demo-postgres"].sink == AT.postgres
    assert [j.horizon_urls for j in jobs.values() if j.kind == "horizon"] == [(AT.horizon,)] * 4


def test_the_delivery_check_refuses_a_record_twice_out_of_order_or_none() -> None:
    stream = ["1", "2", "3", "4"]
    assert check_delivery(stream, "3", ["1", "2", "3"]).ok
    assert check_delivery(stream, "3", ["1", "2", "3", "4"]).ok  # taken, position not yet moved
    assert not check_delivery(stream, "3", ["1", "2", "2", "3"]).ok  # twice
    assert not check_delivery(stream, "3", ["1", "2", "3", "3"]).ok  # twice, past the position
    assert not check_delivery(stream, "3", ["1", "3", "2"]).ok  # out of order
    assert not check_delivery(stream, "3", ["1", "3"]).ok  # one lost
    assert not check_delivery(stream, None, []).ok  # the webhook job left out: nothing delivered


@pytest.mark.slow
async def test_the_demo_delivers_every_record_to_the_receiver_once_in_order_across_its_failovers() -> None:
    out = io.StringIO()
    d = demo(out, jobs=2, rpc_job=server_bin() is not None)
    ok = await d.run()
    text = out.getvalue()
    print(text)
    assert ok, text
    assert d.hook_result is not None and d.hook_result.ok, text
    assert d.hook_result.count > 0
    for step in ("failover-time", "process-crash-time", "handoff-time", "console"):
        assert f" {step} " in text, step
    verified = [line for line in text.splitlines() if " verify " in line and "demo-webhook:" in line]
    assert len(verified) == 1 and verified[0].endswith("exactly once, in order: OK"), verified
    summary = [line for line in text.splitlines() if " summary " in line]
    assert summary and "webhook" in summary[0] and "each once, in order" in summary[0], summary
