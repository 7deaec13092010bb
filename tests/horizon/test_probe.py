"""The Horizon source's probe asks for what the job reads: a page of its collection *and* its
stream (held until Horizon's ``hello``). A Horizon that answers pages but blocks or buffers
streams (a proxy) fails the probe, so a node behind it is not counted able to lead the job
(docs/FAILOVER.md, "Liveness")."""

from __future__ import annotations

import trio

from ingestion.horizon.resources import STREAM_LIMIT
from ingestion.horizon.source import HorizonSource
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.http_fault_proxy import HttpFaultProxy

CONFIG = SimulatorConfig(port=0, ledger_interval=None, history_ledgers=5, ops_per_ledger=5)


async def test_the_probe_answers_only_when_pages_and_the_stream_both_answer() -> None:
    async with open_simulator(CONFIG) as sim, trio.open_nursery() as nursery:
        proxy: HttpFaultProxy = await nursery.start(HttpFaultProxy(sim.url).serve)
        for resource in ("/operations", "/payments"):
            source = HorizonSource(
                (f"http://127.0.0.1:{proxy.port}",), resource, connect_timeout=0.5, read_timeout=0.5
            )
            answered = {}
            for mode in ("forward", "no-stream", "root-only", "forward"):
                proxy.set_mode(mode)
                with trio.fail_after(5):  # the probe bounds itself: 1 s per request here
                    answered[mode] = await source.probe()
            assert answered == {"forward": True, "no-stream": False, "root-only": False}, resource
        assert proxy.held >= 2 and proxy.failed >= 2
        nursery.cancel_scope.cancel()


async def test_the_probes_stream_asks_for_the_streams_limit_not_horizons_default_of_10() -> None:
    """Horizon closes a stream after ``limit`` records and defaults it to 10: the probe's stream
    request names the same limit as the follower's (STREAM_LIMIT), with the resource's own query
    parameters, from ``now``."""
    async with open_simulator(CONFIG) as sim:
        source = HorizonSource((sim.url,), "/payments?include_failed=true")
        with trio.fail_after(5):
            assert await source.probe()
        streams = [r for r in sim.requests if r.stream]
        assert [r.path for r in streams] == ["/payments"]
        assert streams[0].query == {"include_failed": "true", "limit": str(STREAM_LIMIT), "cursor": "now"}
