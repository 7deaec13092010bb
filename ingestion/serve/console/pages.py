"""The console's pages: the cluster and a job rendered as HTML, every value escaped (pure)."""

from __future__ import annotations

import html
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ingestion.serve.api_section import api_section
from ingestion.serve.backfill_section import backfill_section
from ingestion.serve.completeness_section import completeness_section
from ingestion.serve.console.reader import WEBHOOK_ACTIONS, json_object
from ingestion.serve.console.view import MAX_JOBS
from ingestion.webhook.admin import outcome_text, outcome_words

# -- rendering ------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _num(value: Any, unit: str = "") -> str:
    if value is None or value == "":
        return ""
    return f"{value}{unit}"


def _page(title: str, node: str, body: str, job: str = "") -> bytes:
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><link rel=\"stylesheet\" href=\"/console/console.css\">"
        "<script src=\"/console/app.js\" defer></script></head>"
        f"<body data-page-job=\"{_e(job)}\"><header><a href=\"/\">ingestion</a> "
        f"<span class=\"muted\">served by {_e(node)}</span>"
        "<span id=\"live\" class=\"muted\"></span></header>"
        f"<main>{body}</main></body></html>\n"
    ).encode()


JOB_COLUMNS = ("job", "kind", "leader", "token", "since", "lease", "cursor", "rate", "lag", "why")


def job_row(job: dict[str, Any]) -> str:
    cells = [
        f"<a href=\"/console/job/{_e(urllib.parse.quote(job['job'], safe=''))}\">{_e(job['job'])}</a>",
        _e(job["kind"]), _e(job["leader"] or "(none)"), _e(job["token"]), _e(_when(job["leader_since_ms"])),
        _e(_num(job["lease_ttl_ms_left"], " ms")), _e(job["cursor"]), _e(_num(job.get("rate"), "/s")),
        _e(_num(job.get("lag_seconds"), " s")), _e(job.get("why", "")),
    ]  # fmt: skip
    tds = "".join(f"<td data-col=\"{n}\">{c}</td>" for n, c in zip(JOB_COLUMNS, cells, strict=True))
    leaderless = "" if job["leader"] else " class=\"leaderless\""
    return f"<tr data-job=\"{_e(job['job'])}\" data-leader=\"{_e(job['leader'])}\"{leaderless}>{tds}</tr>"


def node_row(node: dict[str, Any]) -> str:
    health = ", ".join(f"{j}: {h}" for j, h in node["health"].items())
    held = ", ".join(f"{j}: {r}" for j, r in node["held_off"].items())
    return (
        f"<tr data-node=\"{_e(node['node'])}\" data-live=\"{'yes' if node['live'] else 'no'}\">"
        f"<td>{_e(node['node'])}</td><td data-col=\"live\">{'live' if node['live'] else 'down'}</td>"
        f"<td data-col=\"heartbeat\">{_e(str(node['heartbeat_ms_ago']) + ' ms ago')}</td>"
        f"<td data-col=\"leads\">{_e(', '.join(node['leads']))}</td>"
        f"<td data-col=\"share\">{_e(node['share'])}</td>"
        f"<td data-col=\"health\">{_e(health)}</td><td data-col=\"held\">{_e(held)}</td>"
        f"<td data-col=\"version\">{_e(node['version'])}</td></tr>"
    )


def _table(table_id: str, heads: Sequence[str], rows: str) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in heads)
    return f"<table id=\"{table_id}\"><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>"


JOB_HEADS = ("job", "kind", "leader", "token", "leader since (UTC)", "lease left", "committed cursor",
             "records/s", "lag", "why no leader")  # fmt: skip
NODE_HEADS = ("node", "state", "last report", "leads", "share", "source health", "held off", "version")


def overview(state: dict[str, Any]) -> bytes:
    error = f"<p class=\"error\" id=\"error\">{_e(state['error'])}</p>" if state["error"] else (
        "<p class=\"error\" id=\"error\" hidden></p>"
    )
    more = f"<p>Showing the first {MAX_JOBS} jobs.</p>" if state["truncated"] else ""
    body = (
        f"{error}<h1>Jobs</h1>{more}"
        + _table("jobs", JOB_HEADS, "".join(job_row(j) for j in state["jobs"]))
        + "<h1>Nodes</h1>"
        + _table("nodes", NODE_HEADS, "".join(node_row(n) for n in state["nodes"]))
        + f"<section id=\"api-section\">{api_section(state.get('api'))}</section>"
    )
    return _page("ingestion: cluster", state["node"], body)


def _rows(
    items: Sequence[dict[str, Any]], cols: Sequence[str], fmt: Mapping[str, Callable[[Any], str]]
) -> str:
    out = []
    for item in items:
        cells = []
        for c in cols:
            value = fmt[c](item.get(c)) if c in fmt else item.get(c, "")
            cells.append(f"<td data-col=\"{_e(c)}\">{_e(value)}</td>")
        out.append(f"<tr>{''.join(cells)}</tr>")
    return "".join(out)


AUDIT_COLS = (
    "at_ms", "event", "node", "token", "previous_node", "previous_token", "takeover_ms", "reason", "by",
    "action", "result",
)  # fmt: skip
REJECTION_COLS = ("at_ms", "node", "token", "current_token", "rejection", "checked_by", "cursor")
ATTEMPT_COLS = ("at_ms", "record", "outcome", "status", "latency_ms", "error", "answer", "replay")
DEAD_COLS = ("at_ms", "record", "attempts", "status", "error", "answer", "replayed")
def _yes(value: Any) -> str:
    """A flag as an operator reads it (``1``/true: yes, ``0``/false: no, nothing: unknown)."""
    if value is None or value == "":
        return "unknown"
    return "yes" if value is True or value == "1" else "no"


def _result(value: Any) -> str:
    """An operator request's result as the audit keeps it (a JSON object), in words."""
    found = json_object(value) if isinstance(value, str) else None
    return outcome_words(found) if found is not None else str(value or "")


def _request(value: Any) -> str:
    return outcome_text(value) if isinstance(value, dict) else "none yet"


WHEN = {"at_ms": _when}
FLAGS = {"live": _yes, "source_up": _yes}
# A webhook endpoint's fields as its page shows them: (field, label, in words); the failure's
# own fields only while the endpoint is failing (after a recovery they name a past failure).
ENDPOINT_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("state", "state", str),
    ("position", "delivered through", str),
    ("lag_seconds", "delivery lag", lambda v: _num(v, " s") or "none"),
    ("dead_letters", "dead letters", str),
    ("dead_letters_replayed", "dead letters replayed", str),
    ("failing_record", "failing record", str),
    ("last_error", "last error", str),
    ("last_status", "last HTTP status", str),
    ("last_request", "last request", _request),
    ("last_replay", "last replay", _request),
)
FAILURE_ONLY = frozenset({"failing_record", "last_error"})


def job_sections(job: dict[str, Any]) -> str:
    """The parts of a job's page below its row (the events feed replaces them when they change)."""
    hook = job["webhook"]
    # A webhook job's source is another job's store, not a service it probes: no source health.
    host_cols = ("node", "live", "role", *(() if hook else ("source_up",)), "held_off")
    host_heads = [c.replace("_", " ") for c in host_cols]
    healthy = "" if hook else (
        f"<p>Healthy for this job by Redis's record (source answered within a minute): "
        f"<span id=\"healthy\">{_e(', '.join(job['healthy']) or 'none recorded')}</span></p>"
    )
    parts = [
        f"<p id=\"why\">{_e(job['why'])}</p>" if job["why"] else "", healthy,
        "<h2>Hosts</h2>", _table("hosts", host_heads, _rows(job["hosts"], host_cols, FLAGS)),
        "<h2>Takeover audit (newest first)</h2>",
        _table("audit", ("when (UTC)", "event", "node", "token", "previous leader", "previous token",
                         "leaderless ms", "reason", "by", "request", "result"),
               _rows(job["audit"], AUDIT_COLS, {**WHEN, "result": _result})),
        "<h2>Recent fencing rejections</h2>",
        _table("rejections", ("when (UTC)", "node", "token", "current token", "why", "checked by", "cursor"),
               _rows(job["rejections"], REJECTION_COLS, WHEN)),
    ]  # fmt: skip
    parts += [completeness_section(job), backfill_section(job.get("backfill"))]
    if hook is not None:
        shown = [row for row in ENDPOINT_ROWS if row[0] not in FAILURE_ONLY or hook["state"] == "failing"]
        parts += [
            "<h2>Webhook endpoint</h2><table id=\"endpoint\"><tbody>",
            *(f"<tr><th>{_e(label)}</th><td data-col=\"{_e(k)}\">{_e(words(hook.get(k)))}</td></tr>"
              for k, label, words in shown),
            "</tbody></table><h2>Recent attempts (newest first)</h2>",
            _table("attempts", ("when (UTC)", "record", "outcome", "status", "latency ms", "error", "answer",
                                "replay"), _rows(hook["attempts"], ATTEMPT_COLS, {**WHEN, "replay": _yes})),
            "<h2>Dead letters (newest first)</h2>",
            _table("dead", ("when (UTC)", "record", "attempts", "status", "error", "answer", "replayed"),
                   _rows(hook["dead"], DEAD_COLS, {**WHEN, "replayed": _yes})),
        ]  # fmt: skip
    return "".join(parts)


def job_page(node: str, job: dict[str, Any], token_set: bool) -> bytes:
    actions = ["handover"] + (list(WEBHOOK_ACTIONS) if job["webhook"] is not None else [])
    labels = {"handover": "Hand over", "pause": "Pause delivery", "resume": "Resume delivery",
              "replay-dead-letters": "Replay dead letters"}  # fmt: skip
    buttons = "".join(f"<button type=\"button\" data-action=\"{a}\">{labels[a]}</button>" for a in actions)
    guard = (
        "<label>Console token <input type=\"password\" id=\"token\" autocomplete=\"off\"></label> "
        "<label>Your name <input type=\"text\" id=\"operator\" maxlength=\"60\"></label>"
        if token_set else "<p class=\"muted\">Read-only: observe.console_token is not set on this node.</p>"
    )
    body = (
        f"<h1>Job {_e(job['job'])}</h1>" + _table("jobs", JOB_HEADS, job_row(job))
        + f"<section id=\"actions\">{guard}<div>{buttons}</div>"
        + "<p id=\"result\" role=\"status\"></p></section>"
        + f"<div id=\"detail\">{job_sections(job)}</div>"
    )
    return _page(f"ingestion: {job['job']}", node, body, job["job"])
