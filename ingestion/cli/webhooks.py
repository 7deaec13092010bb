"""``ingestion webhooks``: the webhook jobs' endpoints, positions, lag, state and dead letters
(``status``), and requests their leaders carry out under their own tokens (``replay``, ``enable``,
``pause``, ``resume``), each written to the job's audit with who asked. ``drop-dead-letters``
gives dead letters up itself (no leader needed), audited likewise.

Exit 0; 2 for a bad flag, an unknown job or a bound that does not parse; 1 when Redis cannot be
read or written. Secrets are never shown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import redis

from ingestion.cli.usage import OneLineParser, UsageError, setting_help
from ingestion.config import load, redact_url


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion webhooks",
        description="The webhook jobs: status, replay, enable, pause, resume (docs/WEBHOOKS.md). The "
        "job's leader carries out each request, fenced, and audits who asked; this command only asks.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    status = sub.add_parser("status", help="every webhook job: endpoint, position, lag, state, dead letters")
    status.add_argument("--json", action="store_true", help="print a JSON list")
    replay = sub.add_parser("replay", help="re-deliver a range of records, or the dead letters")
    replay.add_argument("job", help="the webhook job")
    replay.add_argument("--from", dest="start", metavar="ID|LEDGER|TIME", help="the first record to re-send")
    replay.add_argument(
        "--to",
        dest="end",
        metavar="ID|LEDGER|TIME",
        help="the last record, included (a LEDGER whole; default: the newest)",
    )
    replay.add_argument("--dead-letters", action="store_true", help="re-deliver the dead letters instead")
    enable = sub.add_parser("enable", help="deliver again to an endpoint disabled by 410 Gone")
    enable.add_argument("job", help="the webhook job")
    pause = sub.add_parser("pause", help="hold delivery (records wait in order; kept until resume)")
    pause.add_argument("job", help="the webhook job")
    resume = sub.add_parser("resume", help="deliver again after a pause")
    resume.add_argument("job", help="the webhook job")
    drop = sub.add_parser(
        "drop-dead-letters", help="give up dead letters: deleted, their source records no longer held"
    )
    drop.add_argument("job", help="the webhook job")
    drop.add_argument(
        "--before", metavar="TIME", help="only those dead-lettered before this ISO 8601 time (default: all)"
    )
    return p


def main(argv: Sequence[str]) -> int:
    from ingestion.webhook import admin  # lazy: CLI start-up (~150 ms)

    ns = parser().parse_args(list(argv))
    if ns.action is None:
        raise UsageError(
            "webhooks: name an action: status, replay, enable, pause, resume or drop-dead-letters"
        )
    flags: dict[str, dict[str, Any]] = {"redis": {"url": ns.redis}} if ns.redis else {}
    settings = load(ns.config, os.environ, flags)
    hooks = {j.name: j for j in settings.jobs if j.kind == "webhook" and j.webhook is not None}
    if ns.action == "replay":
        if ns.dead_letters == bool(ns.start):
            raise UsageError("webhooks replay: give --from (and maybe --to), or --dead-letters")
        if ns.dead_letters and ns.end:
            raise UsageError("webhooks replay: --to bounds a --from span; --dead-letters replays them all")
        try:
            start = admin.replay_bound(ns.start) if ns.start else ""
            end = admin.replay_bound(ns.end, end=True) if ns.end else ""
        except ValueError as exc:
            raise UsageError(f"webhooks replay: {exc}") from None
        if admin.span_inverted(start, end):
            raise UsageError(
                f"webhooks replay: --from {ns.start} is after --to {ns.end}: nothing between them"
            )
        source = hooks[ns.job].source_sink if ns.job in hooks else None
        if start.startswith("time:") and source:
            raise UsageError(
                f"webhooks replay: --from TIME needs the source job's Redis stream, and {ns.job}'s "
                "source writes to PostgreSQL: give a record id or a ledger"
            )
    before_ms = None
    if ns.action == "drop-dead-letters" and ns.before:
        try:
            before_ms = admin.iso_time_ms(ns.before)
        except ValueError as exc:
            raise UsageError(f"webhooks drop-dead-letters: --before: {exc}") from None
    known = {n: (j.webhook.source_job, _redacted(j.webhook.url)) for n, j in hooks.items() if j.webhook}
    if known and ns.action != "status" and ns.job not in known:
        _unknown(ns.action, ns.job, known)
    client = settings.redis.connect()
    try:
        if not known:  # no configuration names a webhook job: the ones this Redis knows
            known = admin.discover(client)
            if ns.action != "status" and ns.job not in known:
                _unknown(ns.action, ns.job, known)
        if ns.action == "status":
            shown = [admin.status(client, name, src, url) for name, (src, url) in known.items()]
            _print_status(
                shown, ns.json, "in this configuration" if hooks else "in this configuration nor in Redis"
            )
        elif ns.action == "replay":
            endpoint = admin.endpoint_state(client, ns.job)
            if endpoint.get("paused") == "1":
                raise UsageError(
                    f"webhooks replay: {ns.job} is paused: resume it first "
                    f"(ingestion webhooks resume {ns.job})"
                )
            if endpoint.get("state") == "disabled":
                raise UsageError(
                    f"webhooks replay: {ns.job} is disabled by a 410 answer: enable it first "
                    f"(ingestion webhooks enable {ns.job})"
                )
            rid = admin.request_replay(client, ns.job, start, end, dead_letters=ns.dead_letters)
            print(
                f"replay requested ({rid}): the leader of {ns.job} carries it out; "
                "`webhooks status` shows what came of it"
            )
        elif ns.action == "drop-dead-letters":
            dropped, replayed = admin.drop_dead_letters(client, ns.job, before_ms)
            when = f" dead-lettered before {ns.before}" if ns.before else ""
            print(
                f"dropped {dropped} dead letters of {ns.job}{when} ({replayed} of them replayed before); "
                "their source records are no longer held (the leader lets retention go within seconds)"
            )
        elif ns.action in ("pause", "resume"):
            rid = admin.request_pause(client, ns.job, ns.action == "pause")
            print(f"{ns.action} requested ({rid}): the leader of {ns.job} carries it out within a second")
        else:
            rid = admin.request_enable(client, ns.job)
            print(f"enable requested ({rid}): the leader of {ns.job} delivers again once it reads it")
    except (redis.RedisError, OSError) as exc:
        print(f"webhooks: Redis: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _unknown(action: str, job: str, known: dict[str, Any]) -> NoReturn:
    names = ", ".join(sorted(known)) or "none configured, none in Redis"
    raise UsageError(f"webhooks {action}: {job!r} is not a webhook job here ({names})")


def _redacted(url: str) -> str:
    return str(redact_url(url))


def _print_status(shown: list[dict[str, Any]], as_json: bool, where: str) -> None:
    from ingestion.webhook.admin import outcome_text  # lazy: CLI start-up (~150 ms)

    if as_json:
        print(json.dumps(shown, indent=2))
        return
    if not shown:
        print(f"no webhook job {where}")
        return
    for s in shown:
        lag = "-" if s["lag_seconds"] is None else f"{s['lag_seconds']:.1f}s"
        undelivered = "-" if s["undelivered"] is None else s["undelivered"]
        print(
            f"{s['job']}: {s['state']} -> {s['url']} (from {s['from'] or '?'}, "
            f"leader {s['leader'] or 'none'}), "
            f"position {s['position'] or '-'}, undelivered {undelivered}, lag {lag}, "
            f"dead letters held {s['dead_letters_held']} ({s['dead_letters_replayed']} replayed, "
            f"{s['dead_letters_dropped']} dropped), "
            f"requests pending {s['requests_pending']}"
        )
        if s["last_drop"]:
            d = s["last_drop"]
            before = f" (those before {d['before']})" if d["before"] else " (all of them)"
            print(f"  dead letters last dropped at {d['at']} by {d['by']}{before}")
        if s["state"] == "failing":
            print(
                f"  failing at {s['failing_record']}: {s['attempts']} attempts, "
                f"last {s['last_status'] or s['last_error']}"
            )
        last, replay = s["last_request"], s["last_replay"]
        if last:
            print(f"  last request {outcome_text(last)}")
        if replay and (not last or replay.get("id") != last.get("id")):
            print(f"  last replay {outcome_text(replay)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
