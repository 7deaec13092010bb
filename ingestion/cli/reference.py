"""The reference, generated from the code: ``python -m ingestion.cli.reference > docs/REFERENCE.md``.

Every table is read from where the thing is defined, so the reference cannot drift from it:

- commands and flags from the argparse parsers (:func:`ingestion.cli.parser_of`);
- settings from the settings schema (:data:`ingestion.config.schema.SCHEMA`, ``JOB_SCHEMA`` and
  ``FLAGS``);
- Redis keys from the keyspace's table (:func:`ingestion.common.keyspace.keyspace`: the runtime's
  keys and the application's, with their meanings; a key without one is an error);
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
    from ingestion.cli import COMMANDS, parser_of, top_help  # lazy: CLI start-up

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
    from ingestion.cli.usage import env_name  # lazy: CLI start-up
    from ingestion.config.schema import FLAGS, JOB_SCHEMA, SCHEMA  # lazy: CLI start-up

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
    from ingestion.common.keyspace import keyspace  # lazy: CLI start-up

    try:
        rows = keyspace()
    except ValueError as exc:
        raise SystemExit(f"ingestion.cli.reference: {exc}") from exc
    yield "## Redis keys"
    yield ""
    yield (
        "Every key, for job `J` and node id `ID` (every key of a job carries the hash tag `{J}`, so a "
        "job lives in one Redis Cluster slot): the runtime's from `actors/lease_store/keys.py`, the "
        "application's from `ingestion/common/keyspace.py`, where the meanings below are written too."
    )
    yield ""
    yield "| key | type | kept by | meaning |"
    yield "| --- | --- | --- | --- |"
    for row in rows:
        yield f"| {cell(code(row.key))} | {cell(row.kind)} | {cell(row.part)} | {cell(row.meaning)} |"


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
    import trio  # lazy: CLI start-up

    from actors.lease_store import GroupInfo, StreamInfo  # lazy: CLI start-up
    from actors.observe import NodeObserver  # lazy: CLI start-up
    from ingestion.backfill.metrics import BackfillCollector  # lazy: CLI start-up
    from ingestion.backfill.plan import Plan, range_states  # lazy: CLI start-up
    from ingestion.backfill.status import Snapshot  # lazy: CLI start-up
    from ingestion.serve.metrics import NodeMetrics  # lazy: CLI start-up
    from ingestion.webhook.metrics import WebhookCollector  # lazy: CLI start-up
    from ingestion.webhook.source import WebhookStats  # lazy: CLI start-up

    observer = NodeObserver(
        node="n", job="J", role="leader", token=1, ingest_deadline=1.0, source_lag_seconds=0.0,
        source_up=True, losses={"released": 1}, complete_through_ledger=1, source_latest_ledger=1,
    )  # fmt: skip

    async def stream() -> StreamInfo:
        return StreamInfo(1, 1, "0-1", "0-1", (GroupInfo("g", 1, 0, 0, "0-1"),))

    metrics = NodeMetrics(observer, clock=lambda: 0.0, stream_info={"J": stream}, ttl=1.0)
    metrics.registry.register(WebhookCollector({"J": WebhookStats(state="ok", dead_letters_held=0)}))
    from ingestion.audit.job import AuditStats  # lazy: CLI start-up
    from ingestion.audit.metrics import AuditCollector  # lazy: CLI start-up

    metrics.registry.register(AuditCollector({"J": AuditStats(ledger=1)}))  # the audit jobs'
    plan = Plan("J", 1, 100, 2)
    progress = range_states(plan, ["10", None], [False, False], ["n", ""])
    metrics.registry.register(BackfillCollector(lambda: {"J": Snapshot(progress, 10)}, "n"))
    from ingestion.api.server import ApiMetrics  # lazy: CLI start-up

    api = ApiMetrics()
    api.observe("getEvents", "ok", 0.001)
    api.oldest, api.latest = 1, 2
    from ingestion.api.streaming import StreamCollector, StreamStats  # lazy: CLI start-up

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
