"""What ``ingestion webhooks`` reads and asks: each webhook job's endpoint, position, lag and dead
letters, and the requests (replay, enable) that the job's leader carries out under its token.

The command never delivers anything itself: it appends a request to the job's ``requests``
stream; the leader reads it, re-delivers with its own fencing token, and records it done in the
``endpoint`` hash (``controls_done`` and ``replays_done``, one mark for each lane of requests;
``last_request`` and ``last_replay``, what came of them: :mod:`ingestion.webhook.requests`).
Dropping dead letters is the one edit it makes itself (``lua/drop_dead_letters.lua``, which
says why that needs no leader).
"""

from __future__ import annotations

import datetime
import getpass
import json
import socket
import time
from importlib.resources import files
from typing import Any

import redis
from redis.client import NEVER_DECODE

from actors.cursor_order import InvalidPagingToken, token_key
from actors.lease_store import AUDIT_MAXLEN, job_keys, job_of_key, read_states
from ingestion.common.keyspace import webhook_keys
from ingestion.webhook.requests import stream_id_key

LEDGER_LIMIT = 2**32  # a bound below this is a ledger sequence; a record id (TOID) is far above
DROP_PAGE = 1000  # dead letters dropped by one script call (one short atomic step each)
_DROP = (files(__package__) / "lua" / "drop_dead_letters.lua").read_text(encoding="utf-8")


def iso_time_ms(text: str) -> int:
    """An ISO 8601 time (UTC when it names no zone) as Unix ms.

    Raises:
        ValueError: not such a time, in the operator's words.
    """
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (2026-12-04T10:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def drop_dead_letters(
    client: redis.Redis, job: str, before_ms: int | None = None, by: str = ""
) -> tuple[int, int]:
    """Give up ``job``'s dead letters dead-lettered before ``before_ms`` (Unix ms, Redis's clock;
    None: all of them): deleted with their replay marks, counted in the endpoint hash and audited
    with who asked. Their source records are released by the leader's next look (seconds).
    Returns (dropped, of them replayed before).

    Raises:
        redis.RedisError: the outcome of the page in flight is unknown (run it again: it goes on).
    """
    keys, own = webhook_keys(job), job_keys(job)
    script = client.register_script(_DROP)
    bound = "+" if before_ms is None else f"{before_ms}-0"
    asked = "" if before_ms is None else _iso(before_ms)
    dropped = replayed = 0
    while True:
        n, r, more = script(
            keys=[own["events"], keys["replayed"], keys["endpoint"], own["audit"]],
            args=[bound, DROP_PAGE, by or default_asker(), AUDIT_MAXLEN, asked],
        )
        dropped, replayed = dropped + int(n), replayed + int(r)
        if not int(more):
            return dropped, replayed


def replay_bound(text: str, *, end: bool = False) -> str:
    """A replay's ``--from``/``--to`` (``end``) as the leader reads it: a record id as is, a
    ledger ``N`` as the first id of that ledger (``N << 32``; as ``--to``, the last id it may
    hold: the ledger is replayed whole), an ISO 8601 time as ``time:<Unix ms>`` (the records
    committed from then on, or up to then).

    Raises:
        ValueError: none of the three, in the operator's words.
    """
    text = text.strip()
    if text.isdigit() and int(text) < LEDGER_LIMIT:
        if end:
            return f"{((int(text) + 1) << 32) - 1}-{(1 << 32) - 1}"
        return str(int(text) << 32)
    try:
        token_key(text)
        return text
    except InvalidPagingToken:
        pass
    try:
        return f"time:{iso_time_ms(text)}"
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a record id, a ledger number nor an ISO 8601 time (2026-12-04T10:00:00Z)"
        ) from None


def span_inverted(start: str, end: str) -> bool:
    """Whether a replay's bounds (as :func:`replay_bound` makes them) leave nothing between them:
    ``start`` after ``end``, both times or both record ids (a time and an id do not compare)."""
    if not start or not end or start.startswith("time:") != end.startswith("time:"):
        return False
    if start.startswith("time:"):
        return int(start[5:]) > int(end[5:])
    return token_key(start) > token_key(end)


def request_replay(
    client: redis.Redis, job: str, start: str = "", end: str = "", dead_letters: bool = False,
    by: str = "",
) -> str:  # fmt: skip
    """Ask ``job``'s leader to re-deliver records ``start``..``end`` (bounds as
    :func:`replay_bound` makes them) or its dead letters; the request's id. ``by``: who asked
    (the job's audit keeps it)."""
    bounds = {"dead_letters": "1" if dead_letters else "0", "from": start or "0", "to": end}
    return _ask(client, job, "replay", by, bounds)


def request_enable(client: redis.Redis, job: str, by: str = "") -> str:
    """Ask ``job``'s leader to deliver again to an endpoint disabled by a 410 answer."""
    return _ask(client, job, "enable", by)


def request_pause(client: redis.Redis, job: str, pause: bool, by: str = "") -> str:
    """Ask ``job``'s leader to pause delivery (records wait, in order, nothing is dropped) or to
    resume it; kept across terms and nodes until resumed."""
    return _ask(client, job, "pause" if pause else "resume", by)


def _ask(client: redis.Redis, job: str, action: str, by: str, extra: dict[str, str] | None = None) -> str:
    fields: dict[Any, Any] = {
        "action": action, "by": by or default_asker(), "requested_at_ms": str(int(time.time() * 1000)),
        **(extra or {}),
    }
    return _text(client.xadd(webhook_keys(job)["requests"], fields))


def default_asker() -> str:
    """Who asks from the command line: the user and host, as the audit shows them."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli {user}@{socket.gethostname()}"


def discover(client: redis.Redis) -> dict[str, tuple[str, str]]:
    """The webhook jobs this Redis knows, when no configuration names them: every job with an
    ``endpoint`` hash (its leaders write it), as ``job -> (source job, endpoint)``; the endpoint is
    its origin only (``https://host:port/...``: a path may hold a token), as the leader wrote it."""
    found: dict[str, tuple[str, str]] = {}
    for key in client.scan_iter(match=webhook_keys("*")["endpoint"], count=1000):
        name = job_of_key(_text(key)) or ""
        source, origin = client.hmget(key, ["from", "origin"])  # type: ignore[misc]
        found[name] = (_text(source) if source else "", f"{_text(origin)}/..." if origin else "-")
    return dict(sorted(found.items()))


def endpoint_state(client: redis.Redis, job: str) -> dict[str, str]:
    """The job's ``endpoint`` hash (state, paused, the requests' marks and outcomes)."""
    raw: Any = client.hgetall(webhook_keys(job)["endpoint"]) or {}
    return {_text(k): _text(v) for k, v in raw.items()}


def status(client: redis.Redis, job: str, source_job: str, url: str) -> dict[str, Any]:
    """One webhook job as ``webhooks status`` shows it (secrets never included)."""
    keys = webhook_keys(job)
    endpoint = endpoint_state(client, job)
    now = read_states(client, [job])[0]  # its position, leader and dead letters (its events stream)
    cursor, leader, dead = now.cursor or None, now.leader, now.events
    replayed = int(client.hlen(keys["replayed"]))  # type: ignore[arg-type]
    dropped_at = int(endpoint.get("dropped_at_ms") or 0)
    last_drop = (
        {
            "at": _iso(dropped_at),
            "by": endpoint.get("dropped_by", ""),
            "before": endpoint.get("dropped_before") or None,
        }
        if dropped_at
        else None
    )
    undelivered, lag = (
        _undelivered(client, source_job, cursor) if source_job else (None, None)
    )
    state = endpoint.get("state", "ok" if leader else "idle")
    return {
        "job": job, "from": source_job or None, "url": url, "leader": leader,
        "state": "paused" if endpoint.get("paused") == "1" and state != "disabled" else state,
        "position": cursor,
        "undelivered": undelivered, "lag_seconds": lag,
        "failing_record": endpoint.get("failing_record") if endpoint.get("state") == "failing" else None,
        "attempts": int(endpoint.get("attempts", "0") or 0),
        "last_status": endpoint.get("last_status") or None, "last_error": endpoint.get("last_error") or None,
        "dead_letters": dead, "dead_letters_replayed": replayed,
        "dead_letters_held": max(0, dead - replayed),
        "dead_letters_dropped": int(endpoint.get("dead_letters_dropped") or 0), "last_drop": last_drop,
        "requests_pending": _pending(client, job, endpoint),
        "last_request": _outcome(endpoint.get("last_request")),
        "last_replay": _outcome(endpoint.get("last_replay")),
    }  # fmt: skip


def _pending(client: redis.Redis, job: str, endpoint: dict[str, str]) -> int:
    """The requests not done yet: each lane's after its own mark (the leader's two lanes)."""
    legacy = endpoint.get("requests_done", "0-0")
    controls = stream_id_key(endpoint.get("controls_done", legacy))
    replays = stream_id_key(endpoint.get("replays_done", legacy))
    after = min(controls, replays)
    entries: Any = client.execute_command(  # (as bytes: redis-cli may have written anything)
        "XRANGE", webhook_keys(job)["requests"], f"({after[0]}-{after[1]}", "+", **{NEVER_DECODE: True}
    )
    pending = 0
    for entry_id, fields in entries:
        is_replay = fields.get(b"action") == b"replay"
        pending += stream_id_key(_text(entry_id)) > (replays if is_replay else controls)
    return pending


def _outcome(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        shown = json.loads(text)
    except ValueError:
        return {"outcome": text}
    return shown if isinstance(shown, dict) else {"outcome": text}


def outcome_text(request: dict[str, Any]) -> str:
    """What came of a request, in words (``webhooks status``): done, refused and why, stopped
    and where, failed and why; a replay's figures."""
    what = str(request.get("action", "?"))
    if request.get("from") or request.get("to"):
        what += f" {request.get('from') or 'first'}..{request.get('to') or 'newest'}"
    by = f" by {request['by']}" if request.get("by") else ""
    return f"{request.get('id', '?')} {what}{by}: {outcome_words(request)}"


def outcome_words(request: dict[str, Any]) -> str:
    """What came of a request, without what it was or who asked (the console's audit rows)."""
    words = "done"
    for key, said in (("error", "failed"), ("refused", "refused"), ("stopped", "stopped")):
        if request.get(key):
            words = f"{said}: {request[key]}"
            break
    else:
        if request.get("note"):
            words = f"done: {request['note']}"
        elif request.get("changed") is False:
            words = "done (no change)"
    figures = f"; sent {request['sent']}, failed {request['failed']}" if "sent" in request else ""
    return f"{words}{figures}"


def _undelivered(
    client: redis.Redis, source_job: str, position: str | None
) -> tuple[int | None, float | None]:
    """Records of the source job's stream after ``position`` (counted up to 10,000) and how long
    the oldest of them has waited (seconds, by its commit time)."""
    stream = job_keys(source_job)["events"]
    entries: Any = client.xrevrange(stream, "+", "-", count=10_000)
    if not entries:
        return 0, 0.0
    key = token_key(position) if position and position not in ("0", "now") else None
    waiting = [e for e in entries if key is None or token_key(_text(e[1]["paging_token"])) > key]
    if not waiting:
        return 0, 0.0
    oldest_ms = int(_text(waiting[-1][0]).partition("-")[0])
    return len(waiting), max(0.0, round(time.time() - oldest_ms / 1000, 3))


def _iso(ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
