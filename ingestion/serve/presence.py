"""Every node's presence: what it hosts, leads and sees, for the console of any node.

Each node, console or not, publishes one report of itself every ``PRESENCE_EVERY`` seconds (at
most a lease TTL) while it leads a job, every lease TTL (at most ``STANDBY_EVERY_CAP``) while it
leads none (:func:`report_every`), and at once after an election event of one of its jobs (a new
leader, a lost term, a hold-off, a stop), debounced to ``DEBOUNCE``. One call to one script on one key does it
(:data:`SCRIPT`): the report goes into the ``ingestion:presence`` hash (node -> ``at_ms|JSON``,
``at_ms`` Redis's clock) and, the same instant, onto the ``ingestion:presence:changes`` channel
(``node|at_ms|JSON``). A node that stops gracefully publishes its leaving (an empty report) and
removes its entry; one that crashed is told by the age of its last report.

So the console of any node reads the cluster from the channel alone, at no Redis command per
second whatever the number of jobs or viewers (it reads the hash once when it subscribes). A
report is the node's own view, kept short:

    {"version": "0.9.0", "every_ms": 2000, "jobs": {"horizon": {
        "kind": "horizon", "role": "leader", "token": 7, "leader": "a", "lease_ms_left": 1210,
        "since_ms": 1764950000000, "cursor": "123-1", "rate": 118.5, "lag_seconds": 1.2,
        "source_up": true, "held_off": null, "fencing_rejections": 0}}}

A leader's claim holds on the console while its reports keep coming, and once they stop (a leader
SIGKILLed says nothing more) until the ``lease_ms_left`` it reported has run out; of several claims
the highest token wins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from importlib.resources import files
from typing import Any

import trio

from actors.lease_store import NODE_FORGET_MS, LeaseStore, RedisUnavailable
from actors.observe import NodeObserver
from ingestion import __version__
from ingestion.common.keyspace import PRESENCE_CHANNEL, PRESENCE_KEY
from ingestion.serve.status import StatusHub

PRESENCE_EVERY = 2.0  # seconds between a leading node's reports (or the lease TTL, when shorter)
STANDBY_EVERY_CAP = 10.0  # seconds: a node that leads nothing reports every lease TTL, at most this
DEBOUNCE = 0.1  # seconds: election events closer than this share one report
PROMPT_EVENTS = frozenset({
    "became-leader", "lost-leadership", "standby", "campaign-held-off", "stopped", "duplicate-node-id",
    "redis-state-lost", "fencing-token-rejected",
})  # fmt: skip

# One key (so one Redis Cluster slot): the report in the hash and on the channel, with Redis's time
# (``lua/presence.lua``, read once).
SCRIPT = (files(__package__) / "lua" / "presence.lua").read_text(encoding="utf-8")


def parse_entry(value: str) -> tuple[int, dict[str, Any]] | None:
    """A presence hash value (``at_ms|JSON``) as (at_ms, report); None when unreadable."""
    at, _, text = value.partition("|")
    try:
        report = json.loads(text)
        return (int(at), report) if isinstance(report, dict) else None
    except ValueError:
        return None


def parse_message(data: str) -> tuple[str, int, dict[str, Any] | None] | None:
    """A channel message as (node, at_ms, report); the report is None for a node that left."""
    node, _, rest = data.partition("|")
    at, _, text = rest.partition("|")
    if not node or not at.isdigit():
        return None
    if text == "":
        return node, int(at), None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    return (node, int(at), report) if isinstance(report, dict) else None


def job_report(hub: StatusHub, observer: NodeObserver, kind: str, since_ms: int | None) -> dict[str, Any]:
    """One job as this node sees it (its status, shortened)."""
    s = hub.status(observer)
    return {
        "kind": kind, "role": s["role"], "token": s["token"], "leader": s["leader"],
        "lease_ms_left": s["lease_ms_left"], "since_ms": since_ms if s["role"] == "leader" else None,
        "cursor": s["cursor"], "rate": s["ingest_rate"], "lag_seconds": s["lag_seconds"],
        "source_up": s["source_up"], "held_off": observer.held_off,
        "fencing_rejections": s["fencing_rejections"],
    }  # fmt: skip


def report_every(ttl_ms: int, *, leading: bool) -> float:
    """Seconds between a node's reports: a leader's figures move (rate, lag, lease left), so every
    :data:`PRESENCE_EVERY` s (at most a TTL); a node that leads nothing has only its being there
    to say, so every lease TTL (at most :data:`STANDBY_EVERY_CAP` s), which keeps an idle
    standby's Redis cost under a command a second (with its campaigns and its node-id claim).
    Any election event sends one at once either way; a report says its own ``every_ms``."""
    ttl = ttl_ms / 1000
    return min(PRESENCE_EVERY, ttl) if leading else min(STANDBY_EVERY_CAP, ttl)


async def keep_present(
    client: Any, node: str, observers: list[NodeObserver], kinds: Mapping[str, str], ttl_ms: int, log: Any,
    extras: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
) -> None:  # fmt: skip
    """Publish this node's report until cancelled, then publish its leaving (shielded, bounded).
    ``extras``: more fields of a job's report (a webhook job's delivery figures). Never raises
    for Redis: a node that cannot reach Redis is simply not seen."""
    extras = extras or {}
    store = LeaseStore(client, "-")
    script = client.register_script(SCRIPT)
    hub = StatusHub(observers)
    prompt = trio.Event()
    since: dict[str, int] = {}

    def listener(observer: NodeObserver) -> Any:
        def heard(event: str, fields: dict[str, Any]) -> None:
            if event == "became-leader":
                since[observer.job] = int(time.time() * 1000)
            if event in PROMPT_EVENTS:
                prompt.set()

        return heard

    unsubscribe = [o.subscribe(listener(o)) for o in observers]
    said = False

    async def publish(report: str) -> None:
        await store.run(lambda: script(keys=[PRESENCE_KEY], args=[node, report, PRESENCE_CHANNEL]))

    try:
        await _forget_the_long_gone(store, client)
        while True:
            prompt = trio.Event()
            jobs = {}
            for o in observers:
                jobs[o.job] = job_report(hub, o, kinds.get(o.job, ""), since.get(o.job))
                extra = extras.get(o.job)
                if extra is not None:
                    jobs[o.job].update(extra())
            every = report_every(ttl_ms, leading=any(o.role == "leader" for o in observers))
            report = {"version": __version__, "every_ms": round(every * 1000), "jobs": jobs}
            try:
                await publish(json.dumps(report, separators=(",", ":")))
                said = False
            except RedisUnavailable as exc:
                if not said:
                    log.debug("presence-unrecorded", error=str(exc))
                said = True
            with trio.move_on_after(every):
                await prompt.wait()
            await trio.sleep(DEBOUNCE)
    finally:
        for off in unsubscribe:
            off()
        with trio.move_on_after(1.0, shield=True):
            try:
                await publish("")
            except RedisUnavailable:
                pass


async def _forget_the_long_gone(store: LeaseStore, client: Any) -> None:
    """Remove reports older than the registry keeps a silent node (once, at start-up)."""
    try:
        now_s, now_us = await store.run(client.time)
        now = int(now_s) * 1000 + int(now_us) // 1000
        entries = await store.run(client.hgetall, PRESENCE_KEY)
        gone = [n for n, v in entries.items() if (p := parse_entry(v)) is None or now - p[0] > NODE_FORGET_MS]
        if gone:
            await store.run(client.hdel, PRESENCE_KEY, *gone)
    except RedisUnavailable:
        pass
