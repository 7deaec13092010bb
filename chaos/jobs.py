"""The campaign's five jobs, as the kit's :class:`~ingestion.testing.cluster_config.Job` specs (the
cluster renders the nodes' one config file from them):

- ``chaos-ops``: Horizon ``/operations`` into its Redis stream;
- ``chaos-rpc``: the simulator's Stellar RPC contract events into a Redis stream;
- ``chaos-pg``: Horizon ``/payments`` into PostgreSQL (when installed);
- ``chaos-tick``: a scheduled job (``ingestion.jobs:heartbeat``, twice a second);
- ``chaos-hook``: a webhook job delivering ``chaos-ops`` to the receiver (``on_exhausted =
  "block"``: every record, in order).
"""

from __future__ import annotations

from ingestion.testing.cluster_config import POSTGRES, SECRET, Job

OPS, RPC, PG, TICK, HOOK = "chaos-ops", "chaos-rpc", "chaos-pg", "chaos-tick", "chaos-hook"
HORIZON_JOBS = frozenset({OPS, PG, HOOK})  # HOOK delivers OPS: what holds OPS up holds it up
__all__ = ["HOOK", "HORIZON_JOBS", "OPS", "PG", "RPC", "SECRET", "TICK", "specs"]


def specs(postgres: bool) -> list[Job]:
    """The jobs, the Postgres one when the cluster runs a PostgreSQL server."""
    jobs = [Job.horizon(OPS), Job.rpc(RPC), Job.scheduled(TICK), Job.webhook(HOOK, OPS)]
    return jobs + ([Job.horizon(PG, "/payments", sink=POSTGRES)] if postgres else [])
