"""What ``ingestion webhooks`` reads and asks: each webhook job's endpoint, position, lag and dead
letters, and the requests (replay, enable) that the job's leader carries out under its token.

The command never delivers anything itself: it appends a request to the job's ``requests``
stream; the leader reads it, re-delivers with its own fencing token, and records it done in the
``endpoint`` hash (``requests_done``, ``last_request``). Dropping dead letters is the one edit it
makes itself (``lua/drop_dead_letters.lua``, which says why that needs no leader).
"""

from __future__ import annotations

import datetime
import getpass
import socket
import time
from importlib.resources import files
from typing import Any

import redis

from actors.cursor_order import InvalidPagingToken, token_key
from actors.lease_store import AUDIT_MAXLEN, job_keys, parse_lease_value
from ingestion.webhook.source import webhook_keys

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


def replay_bound(text: str) -> str:
    """A replay's ``--from``/``--to`` as the leader reads it: a record id as is, a ledger
    ``N`` as the first id of that ledger (``N << 32``), an ISO 8601 time as ``time:<Unix ms>``
    (the records committed from then on).

    Raises:
        ValueError: none of the three, in the operator's words.
    """
    text = text.strip()
    if text.isdigit() and int(text) < LEDGER_LIMIT:
        return str(int(text) << 32)
    try:
        token_key(text)
        return text
    except InvalidPagingToken:
        pass
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a record id, a ledger number nor an ISO 8601 time (2026-12-04T10:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return f"time:{int(when.timestamp() * 1000)}"


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


def status(client: redis.Redis, job: str, source_job: str, url: str) -> dict[str, Any]:
    """One webhook job as ``webhooks status`` shows it (secrets never included)."""
    keys, own = webhook_keys(job), job_keys(job)
    endpoint = {_text(k): _text(v) for k, v in (client.hgetall(keys["endpoint"]) or {}).items()}  # type: ignore[union-attr]
    cursor = client.hget(own["cursor"], "cursor")
    lease = client.get(own["lease"])
    leader = parse_lease_value(_text(lease))[1] if lease else None
    dead = int(client.xlen(own["events"]))  # type: ignore[arg-type]
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
    done = endpoint.get("requests_done", "0-0")
    pending = client.xrange(keys["requests"], f"({done}", "+")
    undelivered, lag = _undelivered(client, source_job, _text(cursor) if cursor else None)
    state = endpoint.get("state", "ok" if leader else "idle")
    return {
        "job": job, "from": source_job, "url": url, "leader": leader,
        "state": "paused" if endpoint.get("paused") == "1" else state,
        "position": _text(cursor) if cursor else None,
        "undelivered": undelivered, "lag_seconds": lag,
        "failing_record": endpoint.get("failing_record") if endpoint.get("state") == "failing" else None,
        "attempts": int(endpoint.get("attempts", "0") or 0),
        "last_status": endpoint.get("last_status") or None, "last_error": endpoint.get("last_error") or None,
        "dead_letters": dead, "dead_letters_replayed": replayed,
        "dead_letters_held": max(0, dead - replayed),
        "dead_letters_dropped": int(endpoint.get("dead_letters_dropped") or 0), "last_drop": last_drop,
        "requests_pending": len(pending),  # type: ignore[arg-type]
        "last_request": endpoint.get("last_request"),
    }  # fmt: skip


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
