"""What a :class:`~ingestion.testing.cluster.Cluster` runs, as values, and the one config file they
render into.

A :class:`Job` names a job and its ``[jobs.NAME]`` keys; what the cluster starts (the simulator's
Horizon and RPC, PostgreSQL, the example webhook receiver) is not known until it runs, so a job says
:data:`POSTGRES` for the cluster's PostgreSQL and a webhook job leaves ``url`` and ``secret`` out
for the cluster's receiver: :func:`render` fills them in from the :class:`Endpoints` once, and every
node of the cluster reads that one file. :class:`NodeFaults` are the faults armed on the nodes as
they start (a partition needs each node under a group of its own; a clock jump needs libfaketime
loaded at exec). :func:`check_delivery` is the exactly-once check of a webhook job's receiver.

Pure: no trio, no Redis, no processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ingestion.verify import Verification

POSTGRES = "postgres"  # a job's ``sink``: the cluster's PostgreSQL
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # a signing secret for a test's receiver


@attrs.frozen
class Job:
    """One ``[jobs.NAME]`` table: ``kind`` and the rest of its keys (``settings``)."""

    name: str
    kind: str
    settings: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda m: dict(m))

    @classmethod
    def horizon(cls, name: str, resource: str = "/operations", **settings: Any) -> Job:
        """A Horizon collection from the first record, on the cluster's simulator."""
        return cls(name, "horizon", {"resource": resource, "start_cursor": "0", **settings})

    @classmethod
    def rpc(cls, name: str, **settings: Any) -> Job:
        """Stellar RPC contract events from the oldest ledger the simulated RPC keeps."""
        return cls(name, "rpc", {"start_cursor": "0", **settings})

    @classmethod
    def scheduled(cls, name: str, action: str = "ingestion.jobs:heartbeat", period_ms: int = 500) -> Job:
        return cls(name, "scheduled", {"action": action, "period_ms": period_ms})

    @classmethod
    def webhook(cls, name: str, source: str, **settings: Any) -> Job:
        """Job ``source``'s records, every one and in order (``on_exhausted = "block"``), POSTed to
        the cluster's receiver (unless ``url`` is given) with short timeouts and retries."""
        defaults = {
            "start": "first", "timeout_ms": 800, "connect_timeout_ms": 500,
            "retry_schedule": ["50ms", "100ms", "200ms", "400ms", "500ms"], "on_exhausted": "block",
        }  # fmt: skip
        return cls(name, "webhook", {"from": source, **defaults, **settings})


@attrs.frozen
class Endpoints:
    """What the cluster started, where the jobs find it."""

    horizon: str
    rpc: str = ""
    postgres: str | None = None
    receiver: str | None = None  # the example receiver's URL
    secret: str | None = None  # and its signing secret


@attrs.frozen
class NodeFaults:
    """Faults armed on the nodes as they start. ``partition``: each node runs under a group of its
    own whose connections to Redis go through a proxy (:class:`~ingestion.testing.partition.Links`),
    so one node can be cut off; ``clock``: these nodes run under libfaketime, their wall clock's
    offset read from the cluster's ``clock_file`` (write ``+30s`` there and it jumps)."""

    partition: bool = False
    clock: frozenset[str] = frozenset()


NO_FAULTS = NodeFaults()


def render(jobs: Sequence[Job], at: Endpoints, *, api_job: str | None = None) -> str:
    """The nodes' config file: a ``[jobs.NAME]`` table per job (each on the cluster's sources,
    sinks and receiver), and ``[api]`` serving ``api_job``'s events when given."""
    out: list[str] = []
    for job in jobs:
        keys: dict[str, Any] = {"kind": job.kind}
        if job.kind == "horizon":
            keys["horizon"] = [at.horizon]
        elif job.kind == "rpc":
            keys["rpc"] = [at.rpc]
        elif job.kind == "webhook":
            keys["url"], keys["secret"] = at.receiver, at.secret
        keys.update(job.settings)
        if keys.get("sink") == POSTGRES:
            if at.postgres is None:
                raise ValueError(f"job {job.name}: its sink is PostgreSQL, and the cluster runs none")
            keys["sink"] = at.postgres
        if keys.get("url") is None and job.kind == "webhook":
            raise ValueError(f"job {job.name}: a webhook job needs a url, and the cluster runs no receiver")
        out.append(f"[jobs.{job.name}]")
        out += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    if api_job is not None:
        out += ["[api]", f"job = {toml_value(api_job)}"]
    return "\n".join(out) + "\n"


def toml_value(value: Any) -> str:
    """A TOML value: a JSON string is a TOML basic string, a list of them an array."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML value for {value!r}")


def check_delivery(source: Sequence[str], position: str | None, delivered: Sequence[str]) -> Verification:
    """A webhook job's receiver against the stream it delivers: ``delivered`` (the paging tokens
    the receiver holds, in the order it first accepted them) must be ``source`` (the delivered
    job's, in stream order) up to the hook's ``position`` exactly, each once, and past it only the
    stream's next records (a POST taken whose position was not committed yet)."""
    problems = []
    upto = list(source[: source.index(position) + 1]) if position in source else []
    if position is not None and position not in source:
        problems.append(f"the delivery position {position} is not a record of the delivered job")
    if list(delivered[: len(upto)]) != upto:
        first = next(
            (i for i, (a, b) in enumerate(zip(delivered, upto, strict=False)) if a != b),
            min(len(delivered), len(upto)),
        )
        problems.append(
            f"the receiver's records differ from the stream's at {first}: "
            f"{list(delivered[first : first + 3])} where the stream has {upto[first : first + 3]} "
            f"({len(delivered)} delivered, {len(upto)} up to the position)"
        )
    rest = list(delivered[len(upto) :])
    if rest != list(source[len(upto) : len(upto) + len(rest)]):
        problems.append(f"past the position, the receiver has {rest[:3]}, not the stream's next records")
    if source and not delivered:
        problems.append("the receiver holds no record")
    return Verification(
        count=len(delivered),
        first=delivered[0] if delivered else None,
        last=delivered[-1] if delivered else None,
        tokens=(),
        problems=tuple(problems),
    )
