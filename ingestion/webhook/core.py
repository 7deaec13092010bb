"""Push delivery's rules, pure: what a POST carries and how it is signed, what an endpoint's answer
means, when to try again, and which delivered prefix may be committed.

Nothing here does I/O or reads a clock: times and uniform random numbers are arguments.

The wire format is Standard Webhooks' (https://www.standardwebhooks.com): a JSON body
``{"type", "timestamp", "id", "fencing_token", "data"}`` (a JSON array of them with ``batch`` > 1),
headers ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (``v1,`` + base64
HMAC-SHA256 of ``id.timestamp.body`` under each configured secret, space separated). Two fields are
ours: ``id``, the record's own id (its ``webhook-id`` when it is sent alone), by which a receiver
de-duplicates records whatever batch they came in; and ``fencing_token``, the deliverer's fencing
token, for receivers that keep the highest one they accepted beside their own write
(docs/WEBHOOKS.md). Both are inside the body, so the signature covers them. The
``webhook-fencing-token`` header repeats the token for convenience, unsigned: anyone who captured a
delivery can change it, so it decides nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Sequence

import attrs

SECRET_PREFIX = "whsec_"
# Svix's schedule (immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h): 8 attempts over
# about 27.6 hours. Each delay is jittered by +-JITTER so that endpoints recovering at once are not
# hit in lockstep.
DEFAULT_SCHEDULE = ("5s", "5m", "30m", "2h", "5h", "10h", "10h")
JITTER = 0.2
ON_EXHAUSTED = ("dead-letter", "block")
EXCERPT_BYTES = 512  # of an endpoint's answer, kept with a failure (logs, dead letters, status)
RETRY_AFTER_CAP = 24 * 3600.0  # a Retry-After longer than this is taken as this
# Between the schedule's attempts a failing record is probed: first PROBE_FIRST after a failure,
# then after PROBE_SHARE of how long it has been failing (a 60 s outage is seen within ~6 s of its
# end), never more than the probe cap apart (`retry_probe_max_ms`, default PROBE_MAX).
PROBE_FIRST = 1.0
PROBE_SHARE = 0.1
PROBE_MAX = 30.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"500ms"``, ``"5s"``, ``"5m"``, ``"2h"`` or ``"1d"``.

    Raises:
        ValueError: anything else, in an operator's words.
    """
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration such as 500ms, 5s, 5m, 2h or 1d: {text!r}")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def parse_secrets(text: str) -> tuple[bytes, ...]:
    """The signing keys of ``whsec_...`` secrets: one, or two separated by spaces during a rotation
    (each delivery is then signed with both).

    Raises:
        ValueError: a secret that is empty, lacks the ``whsec_`` prefix or is not base64. The
            message never contains the secret itself.
    """
    parts = text.split()
    if not parts:
        raise ValueError("no secret given (a whsec_... secret, from the Standard Webhooks tooling)")
    if len(parts) > 2:
        raise ValueError(f"at most two secrets (during a rotation), got {len(parts)}")
    keys = []
    for n, part in enumerate(parts, 1):
        if not part.startswith(SECRET_PREFIX):
            raise ValueError(f"secret {n} does not start with {SECRET_PREFIX!r}")
        body = part[len(SECRET_PREFIX) :]
        try:
            key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"secret {n} is not base64 after {SECRET_PREFIX!r}") from None
        if len(key) < 16:
            raise ValueError(f"secret {n} is too short: {len(key)} bytes, at least 16 are needed")
        keys.append(key)
    return tuple(keys)


def sign(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,<base64>`` for each key, space separated."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in keys
    )


def message_id(source_job: str, first: str, last: str | None = None) -> str:
    """``webhook-id``: the same for a record (or a batch) across retries, failovers and replays.

    Derived from the source job and the record's id (a batch: its first and last), so that two
    webhook jobs delivering one source job send one id per record, and a receiver that
    de-duplicates by id never takes a replay for a new record."""
    return f"{source_job}:{first}" if last is None or last == first else f"{source_job}:{first}:{last}"


def event_type(source_kind: str, record: dict[str, object]) -> str:
    """Standard Webhooks' ``type``: ``stellar.horizon.<record type>`` (Horizon: ``payment``,
    ``create_account``, ... or the resource's own name), ``stellar.<contract|system>.event``
    (Stellar RPC and the data lake), ``ingestion.scheduled.run``."""
    kind = record.get("type")
    if source_kind == "horizon":
        return f"stellar.horizon.{kind if isinstance(kind, str) and kind else 'record'}"
    if source_kind in ("rpc", "lake"):
        return f"stellar.{kind if isinstance(kind, str) and kind else 'contract'}.event"
    return f"ingestion.{source_kind}.run"


def event_time(record: dict[str, object]) -> str | None:
    """When the record happened, as the source says: Horizon's ``created_at``, Stellar RPC's
    ``ledgerClosedAt`` (None: neither; the deliverer then uses the record's commit time)."""
    for key in ("created_at", "ledgerClosedAt", "closed_at"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def envelope(kind: str, timestamp: str, record_id: str, fencing_token: int, record_json: str) -> str:
    """One Standard Webhooks payload, with ``data`` the committed record exactly as stored (its
    bytes are not re-encoded), ``id`` the record's own id (:func:`message_id` of it alone) and
    ``fencing_token`` the sending term's: signed with the body, unlike a header."""
    return (
        f'{{"type":{json.dumps(kind)},"timestamp":{json.dumps(timestamp)},"id":{json.dumps(record_id)},'
        f'"fencing_token":{int(fencing_token)},"data":{record_json}}}'
    )


def post_body(payloads: Sequence[tuple[str, str, str, str]], fencing_token: int, *, as_batch: bool) -> bytes:
    """A POST's body: the :func:`envelope` of each (type, timestamp, record id, record JSON) under
    the sending term's token, a JSON array when ``as_batch``. Made per POST, not per record read:
    the token is the term's that sends it."""
    bodies = [envelope(kind, when, rid, fencing_token, data) for kind, when, rid, data in payloads]
    return f"[{','.join(bodies)}]".encode() if as_batch else bodies[0].encode()


# -- what an answer means ------------------------------------------------------------------------

DELIVERED = "delivered"
FAILED = "failed"
GONE = "gone"


def judge(status: int | None) -> str:
    """``delivered`` (2xx), ``gone`` (410: the endpoint asks to be disabled) or ``failed``
    (anything else: 3xx included, since redirects are not followed, and no answer at all)."""
    if status is not None and 200 <= status < 300:
        return DELIVERED
    if status == 410:
        return GONE
    return FAILED


def outcome_label(status: int | None, error: str) -> str:
    """The ``outcome`` label of an attempt (metrics): ``2xx``, ``3xx``, ``4xx``, ``5xx``, ``429``,
    ``timeout`` or ``connect``/``error`` when no answer came."""
    if status is None:
        return "timeout" if "timeout" in error.lower() or "timed out" in error.lower() else "error"
    if status == 429:
        return "429"
    return f"{status // 100}xx"


@attrs.frozen
class RetrySchedule:
    """When to try a record again after its ``failures``-th failed attempt (a delivery probes
    between these steps: :class:`RetryPacing`).

    ``delays[n - 1]`` (jittered by +-``jitter``) after the n-th failure; after ``len(delays)``
    failures the schedule is exhausted. A ``Retry-After`` (429, 503) is honoured: the next attempt
    comes no earlier than it asks (capped at a day). ``max_age`` (seconds, 0: none) exhausts the
    schedule early once the record has been failing that long.
    """

    delays: tuple[float, ...]
    jitter: float = JITTER
    max_age: float = 0.0

    @classmethod
    def parse(cls, texts: Sequence[str], max_age: float = 0.0) -> RetrySchedule:
        """From durations as written in config (``["5s", "5m", ...]``).

        Raises:
            ValueError: a duration that does not parse.
        """
        return cls(tuple(parse_duration(t) for t in texts), max_age=max_age)

    @property
    def span(self) -> float:
        """Seconds from the first failure to the last attempt, before jitter."""
        return sum(self.delays)

    def delay(self, failures: int, u: float, retry_after: float | None = None) -> float | None:
        """Seconds before the next attempt, or None when the schedule is exhausted.

        ``failures`` >= 1 counts the failed attempts so far; ``u`` is uniform in [0, 1)."""
        if failures > len(self.delays):
            return None
        base = self.delays[failures - 1] * (1.0 - self.jitter + 2.0 * self.jitter * u)
        if retry_after is not None:
            base = max(base, min(retry_after, RETRY_AFTER_CAP))
        return base

    def exhausted(self, failures: int, failing_for: float) -> bool:
        """Whether a record that failed ``failures`` times, the first ``failing_for`` seconds ago,
        goes no further (dead letter, or blocking)."""
        return failures > len(self.delays) or (self.max_age > 0 and failing_for >= self.max_age)


@attrs.define
class RetryPacing:
    """One record's retries: when to try it again after a failure, and when it is given up.

    The schedule decides when a record is given up: its n-th step is the first attempt made at
    least ``delays[n - 1]`` (jittered) after the step before, and the record is exhausted when the
    step after the last delay fails (or it has failed for ``max_age``), about ``schedule.span``
    after its first failure. Between the steps the record is *probed*, soon and often at first
    and then further apart: ``PROBE_FIRST`` after a failure, then ``PROBE_SHARE`` of how long it
    has been failing, at most ``probe_max`` (0: no probes, the schedule alone), each jittered like
    the schedule. An ordered endpoint waits behind its first record, so an outage of a few seconds
    costs a few seconds, not the schedule's next step (5 minutes with the default one). A
    ``Retry-After`` still wins: the next attempt comes no earlier than it asks.

    Times are seconds on any monotonic clock, passed in; ``u`` is uniform in [0, 1).
    """

    schedule: RetrySchedule
    probe_max: float = PROBE_MAX
    failures: int = attrs.field(default=0, init=False)  # every failed attempt, probes included
    first_failure: float = attrs.field(default=0.0, init=False)
    exhausted: bool = attrs.field(default=False, init=False)
    _steps: int = attrs.field(default=0, init=False)  # the schedule's steps failed (the first attempt is one)
    _due: float = attrs.field(default=0.0, init=False)  # when the schedule's next step is due

    def failed(self, now: float, u: float, retry_after: float | None = None) -> float:
        """An attempt failed at ``now``: seconds until the next one. Sets :attr:`exhausted` when
        the schedule is over (the caller then dead-letters, or, blocking, waits as told)."""
        self.failures += 1
        if self.failures == 1:
            self.first_failure = now
        failing_for = now - self.first_failure
        if self.failures == 1 or now >= self._due:  # a step of the schedule
            self._steps += 1
            step = self.schedule.delay(self._steps, u)
            if step is not None:
                self._due = now + step
        self.exhausted = self.schedule.exhausted(self._steps, failing_for)
        if self.exhausted:  # blocking: on at the schedule's last interval (or probing faster)
            wait = self.schedule.delays[-1] if self.schedule.delays else 1.0
        else:
            wait = self._due - now
        if self.probe_max > 0:
            probe = min(max(PROBE_FIRST, PROBE_SHARE * failing_for), self.probe_max)
            wait = min(wait, probe * (1.0 - self.schedule.jitter + 2.0 * self.schedule.jitter * u))
        if retry_after is not None:
            wait = max(wait, min(retry_after, RETRY_AFTER_CAP))
        return max(wait, 0.0)

    def paused(self, seconds: float) -> None:
        """Delivery was paused that long: the schedule's age and its next step move with it."""
        self.first_failure += seconds
        self._due += seconds


# -- which delivered prefix may be committed ---------------------------------------------------------


@attrs.define
class Window:
    """Units (a record, or a batch of records) in flight, in source order, and what became of them.

    With ``concurrency`` > 1 units finish out of order; the delivery position may move only over a
    finished prefix: :meth:`take_done` returns it (each unit with its outcome, ``delivered`` or
    ``dead``) and forgets it. Pure bookkeeping: the deliverer feeds it.
    """

    order: list[str] = attrs.Factory(list)  # unit keys (the first record's paging token), in order
    done: dict[str, str] = attrs.Factory(dict)

    def opened(self, key: str) -> None:
        self.order.append(key)

    def finished(self, key: str, outcome: str) -> None:
        if key not in self.order:
            raise KeyError(f"unit {key!r} is not in flight")
        self.done[key] = outcome

    def take_done(self) -> list[tuple[str, str]]:
        out = []
        while self.order and self.order[0] in self.done:
            key = self.order.pop(0)
            out.append((key, self.done.pop(key)))
        return out

    def __len__(self) -> int:
        return len(self.order)
