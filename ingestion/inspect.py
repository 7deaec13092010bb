"""``python -m ingestion inspect``: the job's state as read from Redis, as a table or JSON."""

from __future__ import annotations

import json
import sys

import attrs

from ingestion.config import Settings, redact_url
from ingestion.lease_store import LeaseStore, RedisUnavailable, connect


async def inspect_job(settings: Settings, as_json: bool, audit_count: int = 10) -> int:
    client = connect(settings.redis.url, timeout=max(settings.redis.timeout_ms / 1000, 2.0))
    try:
        state = await LeaseStore(client, settings.node.job).state(audit_count)
    except RedisUnavailable as exc:
        print(
            f"ingestion: cannot read job {settings.node.job!r} from redis.url "
            f"{redact_url(settings.redis.url)}: {exc}",
            file=sys.stderr,
        )
        return 1
    finally:
        client.close()
    doc = attrs.asdict(state)
    doc.pop("cursor_token")
    if as_json:
        print(json.dumps(doc))
        return 0
    rows = [
        ("job", state.job),
        ("leader", state.leader or "(none)"),
        ("token", str(state.token)),
        ("lease ttl left", f"{state.lease_ttl_ms_left} ms" if state.lease_ttl_ms_left is not None else "-"),
        ("cursor", state.cursor or "(nothing committed)"),
        ("written by token", str(state.cursor_token) if state.cursor_token is not None else "-"),
        ("events", str(state.events)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\naudit (oldest first):")
    for entry in state.audit:
        extra = ""
        if entry.get("event") == "became-leader" and entry.get("previous_node"):
            extra = (
                f" after {entry['previous_node']} (token {entry['previous_token']}),"
                f" leaderless {entry['takeover_ms']} ms"
            )
        print(f"  {entry['id']}  {entry.get('event', '?'):<14} {entry.get('node', '')} token {entry.get('token', '')}{extra}")
    return 0
