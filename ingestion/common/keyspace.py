"""The application's Redis keyspace: every key it names beside the runtime's, and the one table
of both.

The runtime names its keys in ``actors/lease_store/keys.py`` (a job's lease, token, cursor,
events, ...; the node registry; the deployment id). The application's own are named here: the
webhook jobs' endpoint state, the watch lists, the backfill plans, the audit jobs' progress, the
console's presence reports, the node-id claims. A job's are built with the runtime's
:func:`~actors.lease_store.keys.job_key`, so that they carry the job's hash tag (one cluster slot:
a script may take keys of both halves). No other module spells a key (``tests/suite/test_layout.py``
checks it): whoever needs one asks these two modules.

:func:`keyspace` is the table of both halves with what each key is for; ``ingestion/cli/reference.py``
renders it into docs/REFERENCE.md ("Redis keys"). Pure: names only, no Redis.
"""

from __future__ import annotations

import attrs

from actors.lease_store.keys import (
    DEPLOYMENT_KEY,
    JOB_KEY_NAMES,
    NODE_HOSTS_KEY,
    NODE_REGISTRY_KEY,
    job_key,
    job_keys,
)

PRESENCE_KEY = "ingestion:presence"  # hash: node -> "at_ms|JSON report" (at_ms: Redis's clock)
PRESENCE_CHANNEL = "ingestion:presence:changes"  # pub/sub: "node|at_ms|JSON report" ("" report: left)
INSTANCE_KEY = "ingestion:node:{{{node}}}:instance"  # a node id's claim (ingestion/node/claim.py)
WEBHOOK_KEY_NAMES = ("endpoint", "requests", "replayed", "attempts")


def instance_key(node: str) -> str:
    """The claim of node id ``node`` by its running process (``ingestion/node/claim.py``)."""
    return INSTANCE_KEY.format(node=node)


def webhook_keys(job: str) -> dict[str, str]:
    """The webhook job's own keys beside its lease store's (same hash tag, same cluster slot)."""
    return {name: job_key(job, name) for name in WEBHOOK_KEY_NAMES}


def dead_letter_keys(job: str) -> tuple[str, str]:
    """The webhook job's dead letters (its events stream) and the ids of those replayed."""
    return job_keys(job)["events"], webhook_keys(job)["replayed"]


def watch_keys(job: str) -> dict[str, str]:
    """The job's watch set, its version counter and the marker of an edit in progress, beside its
    lease store's keys (same hash tag, so one cluster slot, so one script may edit two of them)."""
    watch = job_key(job, "watch")
    return {"watch": watch, "version": f"{watch}:version", "editing": f"{watch}:editing"}


def backfill_key(job: str) -> str:
    """The plan's hash (``job`` a job) or a range's end (``job`` a range job)."""
    return job_key(job, "backfill")


def audit_keys(name: str) -> dict[str, str]:
    """The audit job's own keys (under its hash tag): its progress hash and its findings stream."""
    return {"audited": job_key(name, "audited"), "findings": job_key(name, "findings")}


# -- the table: what each key is for ---------------------------------------------------------------
# The runtime's keys too are explained here, not in actors/: what they hold for this application
# (its commands, its webhook jobs' dead letters, its documents) is the application's to say.

# The runtime's keys of a job (actors/lease_store/keys.py, ``job_keys``): what each is for.
JOB_KEY_MEANINGS: dict[str, tuple[str, str]] = {
    "lease": ("string, PX expiry", "`token|node` of the holder; gone once expired or released"),
    "token": (
        "integer",
        "the fencing-token counter; only increases (floored at the committed cursor's token if lost)",
    ),
    "cursor": (
        "hash",
        "`cursor`, `token`, `node` of the last commit (events stream sink only), with "
        "`complete_through` (the completeness watermark, a ledger: it only rises) and "
        "`complete_held` (why a history gap holds it for good) when the source says; `source`: what "
        "the job follows; `sink`: where it commits (`redis`, or `postgres database DB schema S`); "
        "`network`: its passphrase (set, or recorded by its first term); `network_ledger`, "
        "`network_ledger_hash`, `network_ledger_closed_at`: its last committed ledger, that ledger's "
        "hash at the source and its close time; "
        "`network_reset`: a detected reset (the job is held off until `ingestion cursor reset`)",
    ),
    "events": (
        "stream",
        "one entry per source record: `paging_token`, `token`, `node`, `record` (CONSUMING.md); a "
        "webhook job's: its dead letters, never trimmed by `events.max_len` (WEBHOOKS.md)",
    ),
    "audit": (
        "stream",
        "the last 10,000 or so of: `became-leader` (`previous_node`, `previous_token`, `takeover_ms`; "
        "`rolled_back_from` after a rollback), `released` (`reason` when said: `handed-over`, "
        "`node-exiting`: its worker died, `term-failed`: its term raised), and `history-gap` "
        "(`cursor`, `cursor_ledger`, "
        '`elder_ledger`, `horizon` or `rpc`; only with `on_history_gap = "skip"`), `handover-requested` '
        "(`by`: an operator's hand-over, written by the leader that took it) and `operator-request` "
        "(`action`, `by`, `request`, `result`: a webhook request its leader carried out), "
        "`dead-letters-dropped` (`by`, `dropped`, `replayed`, `before`, `first`, `last`: written by "
        "`webhooks drop-dead-letters`), `network-reset` (`detail`, `ledger`, `hash`: a reset its "
        "leader detected) and `cursor-reset` (`by`, `from`, `to`, `token`, `why`, `seam`: where the "
        "job's rows before it end, `entry ID` or `seq N`: written by `ingestion cursor reset`)",
    ),
    "leader": (
        "hash", "the last holder, its token and its lease's end (Redis time): gives `takeover_ms`; "
        "`handover_token`, `handover_by`: an operator's hand-over request, taken by that term's next "
        "renewal and dropped by any other",
    ),
    "released": ("pub/sub channel", "release notices that wake the standbys"),
    "health": ("hash", "node -> Redis time (ms) its source last answered (source-aware leadership)"),
    "rejections": (
        "stream", "the last 100 or so fencing rejections of the job (the fields of "
        "`fencing-token-rejected` and `node`), kept by the refused node for the console",
    ),
}  # fmt: skip
CLAIM_MEANING = (
    "the running node process of node id `ID` (`ingestion/node/claim.py`): `INSTANCE|COUNTER|TTL_MS|PID|"
    "PID_START|PID_SPACE|HOST`, set before the node campaigns with a PX of the lease TTL, renewed every "
    "TTL/2 (the counter grows), deleted on a clean exit; a node that finds it renewed by another "
    "instance refuses to start (exit 2, OPERATIONS.md)"
)
REGISTRY_MEANING = ("sorted set", "the live nodes, scored with the Redis time of their last heartbeat")
HOSTS_MEANING = (
    "hash",
    "node -> the jobs it hosts, one name a line: written with a balancing node's heartbeat, "
    "removed when it leaves; a node never hands a lease back for balance to a live node that does "
    "not host the job (a node absent here counts as hosting every job)",
)
DEPLOYMENT_MEANING = (
    "string",
    "the deployment's own id (`id:` and 32 hex digits), set once by the first node that "
    "asks (SET NX) and replicated with the data: the election domain a PostgreSQL job's fence "
    "records (POSTGRES.md)",
)
PRESENCE_MEANING = (
    "node -> `at_ms|JSON`: its last presence report (what it hosts, leads and "
    "sees, at Redis time at_ms; every 2 s or a lease TTL while it leads a job, every TTL (at "
    "most 10 s) while it leads none, and at once after an election event; "
    "removed when it stops gracefully): the console's picture of the cluster"
)
PRESENCE_CHANNEL_MEANING = (
    "`node|at_ms|JSON`, each presence report as it is written (an empty report: the node left); the "
    "console follows it"
)
# The application's own keys of a job, beside the runtime's (same hash tag): what each is for.
APP_KEY_MEANINGS: dict[str, tuple[str, str]] = {
    "audited": (
        "hash", "an audit job's progress (RELIABILITY.md, \"The audit job\"): `audited_through` (the "
        "last ledger it checked against the lake), `audits` (the audited job), `token`; written fenced",
    ),
    "findings": (
        "stream", "an audit job's findings, the last 10,000 or so: `event` (`audit-finding`), `node`, "
        "`token`, `audits`, `first`, `last` (the window), `kind` (missing, extra, duplicated, "
        "differing), `id`, `detail`; written fenced",
    ),
    "endpoint": (
        "hash", "a webhook job's endpoint state: disabled (410 Gone, `disabled_at_redis_ms`), "
        "`paused`, the failing record, attempts; the requests' marks (`controls_done`, `replays_done`) and "
        "outcomes (`last_request`, `last_replay`); `from` and the endpoint's `origin`; "
        "`dead_letters_dropped`, `dropped_at_ms`, `dropped_by`, `dropped_before` (WEBHOOKS.md)",
    ),
    "requests": (
        "stream", "a webhook job's operator requests (replay, enable, pause, resume, with `by`), carried "
        "out by its leader",
    ),
    "attempts": (
        "stream", "a webhook job's recent delivery attempts (the last 200 or so; every failed one, a "
        "delivered one at most once a second): `record`, `outcome`, `status`, `latency_ms`, `error`, "
        "`answer`, `replay`",
    ),
    "replayed": (
        "hash", "a webhook job's dead letters replayed: record id -> when (Unix ms); a dead letter "
        "not in it is held (its source record kept from retention) until replayed or dropped",
    ),
    "watch": (
        "set", "a job's watch list when `watch_set = true`: addresses; edited with `ingestion watchlist` "
        "(CONSUMING.md)",
    ),
    "watch:version": (
        "integer", "moved after every edit that changed the watch set: the leader reloads the set when "
        "it moves",
    ),
    "watch:editing": (
        "string", "set while `ingestion watchlist add|remove` edits the watch set (in short commands); "
        "left by an edit that was cut off, so that the next edit moves the version",
    ),
    "backfill": (
        "hash", "an rpc or lake job's backfill plan (BACKFILL.md): `first`, `last`, `ranges`, `state` "
        "(`running`, `done` once every range is done, `cancelled`), `created_at`, `created_by` (and "
        "`finished_at`, `cancelled_at`, `resumed_at`, `resumed_by`), written and moved only by "
        "`ingestion/backfill/lua/`; for a range job `J~FIRST-LAST`, its end: `done` (its last cursor), "
        "`node`, `token`, `at`, written fenced by the range's leader",
    ),
}  # fmt: skip


@attrs.frozen
class KeyRow:
    """One key of the table: its name (for job ``J``, node id ``ID``), its Redis type, the part of
    the system that keeps it, and what it is for."""

    key: str
    kind: str
    part: str
    meaning: str


def keyspace() -> list[KeyRow]:
    """Every key, the runtime's then the application's, each with its meaning.

    Raises:
        ValueError: a key has no meaning written here (name it in the tables above).
    """
    job, watched = "J", watch_keys("J")
    application = {
        **{name: ("webhook", key) for name, key in webhook_keys(job).items()},
        "watch": ("watch list", watched["watch"]),
        "watch:version": ("watch list", watched["version"]),
        "watch:editing": ("watch list", watched["editing"]),
        "backfill": ("backfill", backfill_key(job)),
        **{name: ("audit", key) for name, key in audit_keys(job).items()},
    }
    unexplained = sorted(
        (set(JOB_KEY_NAMES) - set(JOB_KEY_MEANINGS)) | (set(application) - set(APP_KEY_MEANINGS))
    )
    if unexplained:
        raise ValueError(f"give these Redis keys a meaning in ingestion/common/keyspace.py: {unexplained}")
    rows = [KeyRow(key, JOB_KEY_MEANINGS[name][0], "runtime", JOB_KEY_MEANINGS[name][1])
            for name, key in job_keys(job).items()]  # fmt: skip
    rows += [
        KeyRow(NODE_REGISTRY_KEY, REGISTRY_MEANING[0], "runtime", REGISTRY_MEANING[1]),
        KeyRow(NODE_HOSTS_KEY, HOSTS_MEANING[0], "runtime", HOSTS_MEANING[1]),
        KeyRow(DEPLOYMENT_KEY, DEPLOYMENT_MEANING[0], "runtime", DEPLOYMENT_MEANING[1]),
        KeyRow(PRESENCE_KEY, "hash", "console", PRESENCE_MEANING),
        KeyRow(PRESENCE_CHANNEL, "pub/sub channel", "console", PRESENCE_CHANNEL_MEANING),
        KeyRow(instance_key("ID"), "string, PX expiry", "node", CLAIM_MEANING),
    ]
    rows += [KeyRow(key, APP_KEY_MEANINGS[name][0], part, APP_KEY_MEANINGS[name][1])
             for name, (part, key) in application.items()]  # fmt: skip
    return rows
