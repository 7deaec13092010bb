"""The reference, generated from the code: ``python -m ingestion.cli.reference > docs/REFERENCE.md``.

Every table is read from where the thing is defined, so the reference cannot drift from it:

- commands and flags from the argparse parsers (:func:`ingestion.cli.parser_of`);
- settings from the settings schema (:data:`ingestion.config.schema.SCHEMA`, ``JOB_SCHEMA`` and
  ``FLAGS``);
- Redis keys from :func:`actors.lease_store.keys.job_keys` and the registry key (only their
  meanings are written here, and a key without one is an error);
- log events by reading the source of ``actors/`` and ``ingestion/`` (``ast``, no import): every
  ``<logger>.<level>("event-name", field=...)`` call whose receiver is a logger (its expression
  names a ``log``), and every pure core's ``Note(level, "event-name", {...})`` that its shell logs;
- metrics from a node's own Prometheus registry (:class:`ingestion.metrics.NodeMetrics`), fed a
  made-up node whose every gauge has a value, so that each metric shows its labels, with the
  webhook jobs' collector (:class:`ingestion.webhook.metrics.WebhookCollector`) and the
  backfills' (:class:`ingestion.backfill.metrics.BackfillCollector`) registered as a node
  hosting a webhook job, or running a backfill, registers them.

``tests/cli/test_reference.py`` regenerates it and fails when ``docs/REFERENCE.md`` differs.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "python -m ingestion.cli.reference > docs/REFERENCE.md"

# What each of a job's Redis keys is for (the keys themselves come from ``job_keys``).
KEY_MEANINGS: dict[str, tuple[str, str]] = {
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
    "hash", "node -> the jobs it hosts, one name a line: written with a balancing node's heartbeat, "
    "removed when it leaves; a node never hands a lease back for balance to a live node that does "
    "not host the job (a node absent here counts as hosting every job)",
)
DEPLOYMENT_MEANING = (
    "string", "the deployment's own id (`id:` and 32 hex digits), set once by the first node that "
    "asks (SET NX) and replicated with the data: the election domain a PostgreSQL job's fence "
    "records (POSTGRES.md)",
)
# Keys of the application's own job features, beside the lease store's (same hash tag)
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

LEVELS = ("debug", "info", "warning", "error", "exception", "critical")
EVENT_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
# The tail ``ingestion.cli.setting_help`` gives a flag's help.
SETTING_SUFFIX = re.compile(
    r"\s*\(default: (?P<default>.*); env (?P<env>[A-Z0-9_ or]+); setting (?P<setting>[a-z_.]+)\)$"
)


def cell(value: object) -> str:
    """A value as a Markdown table cell."""
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text or " "


def code(value: object) -> str:
    return f"`{value}`" if str(value) != "" else "(empty)"


def show_default(value: Any) -> str:
    if isinstance(value, list):
        return code(",".join(value)) if value else "(empty)"
    return code(value)


# Commands and flags


def flag_rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(action.option_strings) or (action.metavar or action.dest)
        if action.choices:
            value = "|".join(map(str, action.choices))
        elif action.nargs == 0:
            value = ""
        else:
            value = str(action.metavar or action.dest.upper())
        if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
            value += " (repeatable)" if action.option_strings else " ..."
        text = (action.help or "").replace("%%", "%")
        default, env, setting = "", "", ""
        found = SETTING_SUFFIX.search(text)
        if found:
            text = text[: found.start()]
            default, env, setting = found["default"], found["env"], found["setting"]
            default = "(empty)" if default == "none" else code(default)
            env = " or ".join(code(e) for e in env.split(" or "))
            setting = code(setting)
        elif action.nargs != 0 and not any(action.default is v for v in (None, argparse.SUPPRESS)):
            default = code(action.default)
        yield (
            f"| {cell(code(names))} | {cell(value)} | {cell(default)} | {cell(env)} | "
            f"{cell(setting)} | {cell(text)} |"
        )


def commands_section() -> Iterator[str]:
    from ingestion.cli import COMMANDS, parser_of, top_help

    yield "## Commands"
    yield ""
    yield "`ingestion --help`:"
    yield ""
    yield "```"
    yield top_help()
    yield "```"
    yield ""
    yield (
        "Exit status, every command: 0 success, 2 a usage or configuration error (one line per "
        "problem on stderr), 1 a runtime failure, 130 interrupted while starting (143: SIGTERM). A flag's "
        "environment variable and setting, where it has them, follow the precedence defaults < "
        "`config.toml` < environment < flags."
    )
    for command, (_, summary) in COMMANDS.items():
        yield ""
        yield f"### `ingestion {command}`"
        yield ""
        parser = parser_of(command)
        if parser is None:
            yield f"{summary[0].upper()}{summary[1:]}; takes no flags (also `ingestion --version`)."
            continue
        yield (parser.description or summary).replace("%%", "%")
        yield ""
        yield "| flag | value | default | environment | setting | meaning |"
        yield "| --- | --- | --- | --- | --- | --- |"
        yield from flag_rows(parser)


# Settings


def settings_section() -> Iterator[str]:
    from ingestion.cli.usage import env_name
    from ingestion.config.schema import FLAGS, JOB_SCHEMA, SCHEMA

    yield "## Settings"
    yield ""
    yield (
        "Each setting is `key` in the `[section]` of `config.toml`, the environment variable "
        "`INGESTION_<SECTION>_<KEY>` and, for some, a flag of `ingestion run`. A list's "
        "environment variable is comma-separated (`INGESTION_RPC_TOPICS`: `;`). Durations are in "
        "milliseconds (`*_ms`); `0` or `-1` marked auto is derived from `lease.ttl_ms` "
        "(`ingestion check-config` shows the value in force)."
    )
    for section, keys in SCHEMA.items():
        yield ""
        yield f"### `[{section}]`"
        yield ""
        yield "| setting | type | default | environment | flag | meaning |"
        yield "| --- | --- | --- | --- | --- | --- |"
        for key, (kind, default, text) in keys.items():
            kind_name = kind if isinstance(kind, str) else kind.__name__
            flag = FLAGS.get((section, key), "")
            yield (
                f"| {cell(code(f'{section}.{key}'))} | {cell(kind_name)} | {cell(show_default(default))} | "
                f"{cell(code(env_name(section, key)))} | {cell(code(flag) if flag else '')} | {cell(text)} |"
            )
    yield ""
    yield "### `[jobs.NAME]`"
    yield ""
    yield (
        "One table per job a node hosts (used when `node.job` is empty); a missing key takes the "
        "`[horizon]` (for an RPC job, `[rpc]`) setting of the same meaning."
    )
    yield ""
    yield "| key | type | meaning |"
    yield "| --- | --- | --- |"
    for key, (kind, text) in JOB_SCHEMA.items():
        kind_name = kind if isinstance(kind, str) else kind.__name__
        yield f"| {cell(code(key))} | {cell(kind_name)} | {cell(text)} |"


# Redis keys


def redis_section() -> Iterator[str]:
    from actors.lease_store.keys import DEPLOYMENT_KEY, NODE_HOSTS_KEY, NODE_REGISTRY_KEY, job_keys

    keys = job_keys("J")
    unexplained = sorted(set(keys) - set(KEY_MEANINGS))
    if unexplained:
        raise SystemExit(f"ingestion.cli.reference: give these Redis keys a meaning: {unexplained}")
    yield "## Redis keys"
    yield ""
    yield (
        "For job `J` (every key of a job carries the hash tag `{J}`, so a job lives in one Redis "
        "Cluster slot), from `actors/lease_store/keys.py`:"
    )
    yield ""
    yield from _key_table(keys, KEY_MEANINGS)
    kind, meaning = REGISTRY_MEANING
    yield f"| {cell(code(NODE_REGISTRY_KEY))} | {cell(kind)} | {cell(meaning)} |"
    kind, meaning = HOSTS_MEANING
    yield f"| {cell(code(NODE_HOSTS_KEY))} | {cell(kind)} | {cell(meaning)} |"
    kind, meaning = DEPLOYMENT_MEANING
    yield f"| {cell(code(DEPLOYMENT_KEY))} | {cell(kind)} | {cell(meaning)} |"
    from ingestion.serve.presence import PRESENCE_CHANNEL, PRESENCE_KEY

    for key, kind, meaning in (
        (PRESENCE_KEY, "hash", "node -> `at_ms|JSON`: its last presence report (what it hosts, leads and "
         "sees, at Redis time at_ms; every 2 s or a lease TTL while it leads a job, every TTL (at "
         "most 10 s) while it leads none, and at once after an election event; "
         "removed when it stops gracefully): the console's picture of the cluster"),
        (PRESENCE_CHANNEL, "pub/sub channel", "`node|at_ms|JSON`, each presence report as it is written "
         "(an empty report: the node left); the console follows it"),
    ):
        yield f"| {cell(code(key))} | {cell(kind)} | {cell(meaning)} |"
    from ingestion.node.claim import instance_key

    yield f"| {cell(code(instance_key('ID')))} | {cell('string, PX expiry')} | {cell(CLAIM_MEANING)} |"
    from ingestion.audit.job import audit_keys
    from ingestion.backfill.plan import backfill_key
    from ingestion.watchlist.edits import watch_keys
    from ingestion.webhook.source import webhook_keys

    watched = watch_keys("J")
    app = {**webhook_keys("J"), "watch": watched["watch"], "watch:version": watched["version"],
           "watch:editing": watched["editing"], "backfill": backfill_key("J"), **audit_keys("J")}  # fmt: skip
    yield ""
    yield ("The application's own, for job `J` (`ingestion/webhook/source.py`, "
           "`ingestion/watchlist/edits.py`, `ingestion/backfill/plan.py`, "
           "`ingestion/audit/job.py`):")  # fmt: skip
    yield ""
    yield from _key_table(app, APP_KEY_MEANINGS)


def _key_table(keys: dict[str, str], meanings: dict[str, tuple[str, str]]) -> Iterator[str]:
    yield "| key | type | meaning |"
    yield "| --- | --- | --- |"
    for name, key in keys.items():
        kind, meaning = meanings[name]
        yield f"| {cell(code(key))} | {cell(kind)} | {cell(meaning)} |"


# Log events


def _is_logger(expr: ast.expr) -> bool:
    return "log" in ast.unparse(expr).lower()


def _fields(call: ast.Call, given: ast.expr | None) -> tuple[set[str], bool]:
    """The field names a log call passes, and whether it passes more than can be read here."""
    names = {k.arg for k in call.keywords if k.arg is not None}
    more = any(k.arg is None for k in call.keywords)
    if given is not None:
        if isinstance(given, ast.Dict):
            for key in given.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    names.add(key.value)
                else:
                    more = True
        else:
            more = True
    return names, more


def log_events(roots: tuple[str, ...] = ("actors", "ingestion")) -> dict[str, dict[str, Any]]:
    """Event name -> ``levels``, ``fields``, ``more`` (fields passed in a mapping) and ``where``
    (modules), read from the source."""
    events: dict[str, dict[str, Any]] = {}
    for path in sorted(p for root in roots for p in (ROOT / root).rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), module)):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func, first = node.func, node.args[0]
            if isinstance(func, ast.Attribute) and func.attr in LEVELS and _is_logger(func.value):
                level, name, given = func.attr, first, None
            elif isinstance(func, ast.Name) and func.id == "Note" and len(node.args) >= 2:
                level = str(first.value) if isinstance(first, ast.Constant) else "?"
                name, given = node.args[1], (node.args[2] if len(node.args) > 2 else None)
            else:
                continue
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                where = f"{module}:{node.lineno}"
                raise SystemExit(f"ingestion.cli.reference: {where}: log event names must be literal strings")
            if not EVENT_NAME.fullmatch(name.value):
                continue
            entry = events.setdefault(
                name.value, {"levels": set(), "fields": set(), "more": False, "where": set()}
            )
            fields, more = _fields(node, given)
            entry["levels"].add(level)
            entry["fields"] |= fields
            entry["more"] = entry["more"] or more
            entry["where"].add(module)
    return events


def logs_section() -> Iterator[str]:
    yield "## Log events"
    yield ""
    yield (
        "JSON lines on stdout (or a console rendering on a terminal), each with `event`, "
        "`timestamp`, `level`, `node` and (from a job's actors) `job`; `--log-level` hides the "
        "levels below it. Read from the source: every literal event name passed to a logger, with "
        "the fields the call names (`+` when it also passes a mapping built elsewhere). What the "
        'election events mean: [FAILOVER.md](FAILOVER.md), "Log events".'
    )
    yield ""
    yield "| event | level | fields | logged by |"
    yield "| --- | --- | --- | --- |"
    order = {level: i for i, level in enumerate(LEVELS)}
    for name, entry in sorted(log_events().items()):
        levels = ", ".join(sorted(entry["levels"], key=lambda lv: order.get(lv, 99)))
        fields = ", ".join(f"`{f}`" for f in sorted(entry["fields"]))
        if entry["more"]:
            fields = f"{fields} +" if fields else "+"
        where = ", ".join(f"`{m}`" for m in sorted(entry["where"]))
        yield f"| {cell(code(name))} | {cell(levels)} | {cell(fields)} | {cell(where)} |"


# Metrics


def metric_families() -> list[tuple[str, str, list[str], str]]:
    """``(exposed name, type, labels, help)`` of every ``ingestion_*`` metric a node serves."""
    import trio

    from actors.lease_store import GroupInfo, StreamInfo
    from actors.observe import NodeObserver
    from ingestion.backfill.metrics import BackfillCollector
    from ingestion.backfill.plan import Plan, range_states
    from ingestion.backfill.status import Snapshot
    from ingestion.serve.metrics import NodeMetrics
    from ingestion.webhook.metrics import WebhookCollector
    from ingestion.webhook.source import WebhookStats

    observer = NodeObserver(
        node="n", job="J", role="leader", token=1, ingest_deadline=1.0, source_lag_seconds=0.0,
        source_up=True, losses={"released": 1}, complete_through_ledger=1, source_latest_ledger=1,
    )  # fmt: skip

    async def stream() -> StreamInfo:
        return StreamInfo(1, 1, "0-1", "0-1", (GroupInfo("g", 1, 0, 0, "0-1"),))

    metrics = NodeMetrics(observer, clock=lambda: 0.0, stream_info={"J": stream}, ttl=1.0)
    metrics.registry.register(WebhookCollector({"J": WebhookStats(state="ok", dead_letters_held=0)}))
    from ingestion.audit.job import AuditStats
    from ingestion.audit.metrics import AuditCollector

    metrics.registry.register(AuditCollector({"J": AuditStats(ledger=1)}))  # the audit jobs'
    plan = Plan("J", 1, 100, 2)
    progress = range_states(plan, ["10", None], [False, False], ["n", ""])
    metrics.registry.register(BackfillCollector(lambda: {"J": Snapshot(progress, 10)}, "n"))
    from ingestion.api.server import ApiMetrics

    api = ApiMetrics()
    api.observe("getEvents", "ok", 0.001)
    api.oldest, api.latest = 1, 2
    from ingestion.api.streaming import StreamCollector, StreamStats

    api.streams = StreamCollector(StreamStats())  # the subscriptions' (docs/API.md, "Streaming")
    metrics.registry.register(api)
    trio.run(metrics.refresh)
    rows = []
    for family in metrics.registry.collect():
        if not family.name.startswith("ingestion_"):
            continue
        exposed = family.name + ("_total" if family.type == "counter" else "")
        labels: list[str] = []
        for sample in family.samples:
            labels += [label for label in sample.labels if label not in labels and label != "le"]
        rows.append((exposed, family.type, labels, family.documentation))
    metrics.close()
    return sorted(rows)


def metrics_section() -> Iterator[str]:
    yield "## Metrics"
    yield ""
    yield (
        "Served on `--metrics-port` at `/metrics` (Prometheus text format), from each node's own "
        "registry (`ingestion/serve/metrics.py`; the `ingestion_webhook_*` metrics, from "
        "`ingestion/webhook/metrics.py`, on a node hosting a webhook job; the `ingestion_backfill_*` "
        "metrics, from `ingestion/backfill/metrics.py`, while a backfill of a job the node hosts "
        "runs and after it is done (its final figures): the same on every such node, so "
        "aggregate them with `max`; the `ingestion_api_*` metrics, from `ingestion/api/server.py`, "
        "on a node serving the events API (`api.port`), and at `/metrics` on the port of "
        "`ingestion api`). The per-job label is "
        "`ingestion_job`. Besides these, "
        "the standard collectors' `process_*`, `python_info` and `python_gc_*`. The probes "
        "`/livez`, `/readyz` and `/healthz` share the port (docs/OPERATIONS.md)."
    )
    yield ""
    yield "| metric | type | labels | help |"
    yield "| --- | --- | --- | --- |"
    for name, kind, labels, text in metric_families():
        shown = ", ".join(f"`{label}`" for label in labels)
        yield f"| {cell(code(name))} | {cell(kind)} | {cell(shown)} | {cell(text)} |"


def render() -> str:
    """The whole of docs/REFERENCE.md."""
    parts = [
        "# Reference",
        "",
        f"Generated from the code by `{REFRESH}` (module `ingestion/cli/reference.py`); "
        "`tests/cli/test_reference.py` fails when this file is stale. Do not edit it by hand: change "
        "the code (a parser's help, the settings schema, a log call, a metric) and regenerate.",
        "",
        "- [Commands](#commands)",
        "- [Settings](#settings)",
        "- [Redis keys](#redis-keys)",
        "- [Log events](#log-events)",
        "- [Metrics](#metrics)",
        "",
    ]
    for section in (commands_section, settings_section, redis_section, logs_section, metrics_section):
        parts += [*section(), ""]
    return "\n".join(parts)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
