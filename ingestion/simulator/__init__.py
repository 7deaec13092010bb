"""A bundled Horizon simulator: an HTTP server that Horizon clients cannot tell apart from Horizon.

It serves a deterministic, joined ledger chain (ledgers, transactions, operations, payments,
effects, and their account- and ledger-scoped lists) as paged HAL JSON and as Server-Sent Event
streams, with Horizon's exact wire formats, and it can misbehave on demand (rate limits, server
errors, dropped, stalled or malformed streams, downtime) so that clients can be tested against real
failure modes.

In-process use (tests)::

    from ingestion.simulator import SimulatorConfig, serve_simulator, open_simulator

    async with trio.open_nursery() as nursery:
        sim = await nursery.start(serve_simulator, SimulatorConfig(ledger_interval=0.05))
        ...  # talk HTTP to sim.url; use sim.faults, sim.close_ledger(), sim.go_down(...)
        nursery.cancel_scope.cancel()

    # or, equivalently
    async with open_simulator(SimulatorConfig(ledger_interval=None)) as sim:
        ...

Out of process: ``python -m ingestion simulate --port 0`` prints one JSON line
``{"event": "simulator-listening", "url": "http://127.0.0.1:PORT"}`` once it is listening; the
control endpoint ``/_simulator/faults`` (see :mod:`ingestion.simulator.control`) drives the faults.

With ``rpc_port`` (``--rpc-port``) a Stellar RPC server (:mod:`ingestion.simulator.rpc`) serves
the same chain's contract events over JSON-RPC (``getEvents``, ``getHealth``, ``getLatestLedger``,
``getNetwork``) at ``sim.rpc_url``, with faults of its own (``sim.rpc_faults``, or
``/_simulator/faults`` on the RPC port); ``sim.rpc_events()`` lists what it serves.
"""

from ingestion.simulator.chain import Chain
from ingestion.simulator.faults import Faults, MalformedKind, RpcFailureKind, RpcFaults
from ingestion.simulator.server import (
    Simulator,
    SimulatorConfig,
    open_simulator,
    serve_simulator,
)

__all__ = [
    "Chain",
    "Faults",
    "MalformedKind",
    "RpcFailureKind",
    "RpcFaults",
    "Simulator",
    "SimulatorConfig",
    "open_simulator",
    "serve_simulator",
]
