"""One reader of a job's state: the commands that read it, queued on a pipeline, and their
replies parsed into a :class:`~actors.lease_store.results.JobState`.

Every reader of a job's state reads it here (``LeaseStore.state``, ``inspect``, the console, the
testing kit, the tests' helpers), so that a lease, a token counter or a cursor hash is parsed
in one place. A :class:`StateQuery` only queues commands and parses replies: many jobs' states
(and a caller's own commands beside them) go in one round trip, on the caller's pipeline; the
pipeline's ``execute`` is the caller's (blocking: run it in a thread). :func:`read_states` does
both for a list of jobs.

Replies may be text or bytes (a client with or without ``decode_responses``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from actors.lease_store.keys import job_keys, parse_lease_value
from actors.lease_store.results import JobState


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


@attrs.frozen
class StateQuery:
    """The read of job ``job``'s state, with its newest ``audit_count`` audit entries."""

    job: str
    audit_count: int = 0

    @property
    def replies(self) -> int:
        """How many replies :meth:`queue`'s commands give."""
        return 6 if self.audit_count else 5

    def queue(self, pipe: Any) -> None:
        """Queue the commands on ``pipe`` (a redis-py pipeline, not yet executed)."""
        k = job_keys(self.job)
        pipe.get(k["lease"])
        pipe.pttl(k["lease"])
        pipe.get(k["token"])
        pipe.hgetall(k["cursor"])
        pipe.xlen(k["events"])
        if self.audit_count:
            pipe.xrevrange(k["audit"], count=self.audit_count)

    def parse(self, replies: Sequence[Any]) -> JobState:
        """The state from the :attr:`replies` replies of :meth:`queue`'s commands, in order."""
        lease, ttl, token, raw_cursor, events = replies[:5]
        audit = replies[5] if self.audit_count else []
        cursor = {_text(k): _text(v) for k, v in (raw_cursor or {}).items()}
        lease_token, leader = parse_lease_value(_text(lease)) if lease else (None, None)
        return JobState(
            job=self.job,
            leader=leader,
            token=int(token or 0),
            lease_ttl_ms_left=int(ttl) if lease and int(ttl) >= 0 else None,
            cursor=cursor.get("cursor"),
            cursor_token=_number(cursor.get("token")),
            complete_through=_number(cursor.get("complete_through")),
            complete_held=cursor.get("complete_held", ""),
            events=int(events),
            audit=[
                {"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()}}
                for entry_id, fields in reversed(audit)
            ],
            lease_token=lease_token,
            cursor_fields=cursor,
        )


def parse_states(queries: Sequence[StateQuery], replies: Sequence[Any]) -> Iterator[JobState]:
    """Each query's state, from the replies of their commands queued one after the other."""
    at = 0
    for query in queries:
        yield query.parse(replies[at : at + query.replies])
        at += query.replies


def read_states(client: Any, jobs: Sequence[str], audit_count: int = 0) -> list[JobState]:
    """The state of each of ``jobs``, in one round trip (blocking: run it in a thread).

    Raises:
        redis.RedisError, OSError: Redis did not answer (the caller says what that means).
    """
    queries = [StateQuery(job, audit_count) for job in jobs]
    if not queries:
        return []
    pipe = client.pipeline(transaction=False)
    for query in queries:
        query.queue(pipe)
    return list(parse_states(queries, pipe.execute()))
