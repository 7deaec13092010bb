"""The campaign's five jobs and the config file the nodes share (rendered once, here):

- ``chaos-ops``: Horizon ``/operations`` into its Redis stream;
- ``chaos-rpc``: the simulator's Stellar RPC contract events into a Redis stream;
- ``chaos-pg``: Horizon ``/payments`` into PostgreSQL (when installed);
- ``chaos-tick``: a scheduled job (``ingestion.jobs:heartbeat``, twice a second);
- ``chaos-hook``: a webhook job delivering ``chaos-ops`` to the receiver (``on_exhausted =
  "block"``: every record, in order).
"""

from __future__ import annotations

OPS, RPC, PG, TICK, HOOK = "chaos-ops", "chaos-rpc", "chaos-pg", "chaos-tick", "chaos-hook"
HORIZON_JOBS = frozenset({OPS, PG, HOOK})  # HOOK delivers OPS: what holds OPS up holds it up
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def config_text(rpc: str, hook_port: int, pg_url: str | None) -> str:
    """The nodes' config file: the jobs on the simulator's RPC at ``rpc``, the receiver on
    ``hook_port``, and the Postgres job when there is a server at ``pg_url``."""
    text = (
        f'[jobs.{OPS}]\nkind = "horizon"\nresource = "/operations"\nstart_cursor = "0"\n'
        f'[jobs.{RPC}]\nkind = "rpc"\nrpc = ["{rpc}"]\nstart_cursor = "0"\n'
        f'[jobs.{TICK}]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 500\n'
        f'[jobs.{HOOK}]\nkind = "webhook"\nfrom = "{OPS}"\nurl = "http://127.0.0.1:{hook_port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\ntimeout_ms = 800\nconnect_timeout_ms = 500\n'
        'retry_schedule = ["50ms", "100ms", "200ms", "400ms", "500ms"]\non_exhausted = "block"\n'
    )
    if pg_url is not None:
        text += (
            f'[jobs.{PG}]\nkind = "horizon"\nresource = "/payments"\nstart_cursor = "0"\nsink = "{pg_url}"\n'
        )
    return text
