"""The I/O-free core of the Horizon source: paging/streaming decisions, validation and backoff.

:class:`HorizonFollower` is the whole state of following one Horizon collection from a cursor. The
wrapper (``ingestion/horizon/source.py``) asks it for the next :class:`Attempt` (which URL, page or
stream, from which cursor, after what delay), carries the request out, and feeds back what happened:
a page body, a stream event, the end of a stream, or a :class:`Failure`. The follower validates
every record against the last good paging token, so what it hands back is strictly increasing
across the whole run, and it decides retries, failover and when to give up. It never sleeps,
reads a clock or logs: delays are returned as numbers and jitter comes from the ``rng`` given.

Phases: catch up with ``order=asc`` pages while they come back full, then follow the SSE stream from
the last paging token. A stream that ends cleanly (``event: close``, EOF, idle) is reopened from the
last token; a stream that fails falls back to paging, which is cheaper for whatever backlog piled up
meanwhile and switches straight back to streaming when the first page is not full.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence

import attrs

from actors.source import Record, SourceFatalError
from ingestion.common.paging import token_key
from ingestion.common.retry import RetryPolicy
from ingestion.horizon.failures import (
    Failure,
    NotFoundTracker,
    fatal_message,
    is_entity_scoped,
    is_retryable_status,
)
from ingestion.horizon.pages import Malformed, PageOutcome, validate_page, validate_stream_record
from ingestion.horizon.resources import (
    MAX_PAGE_LIMIT,
    STREAM_LIMIT,
    check_cursor,
    check_resource,
    split_resource,
)


class Mode(enum.Enum):
    CATCH_UP = "catch-up"
    STREAMING = "streaming"


@attrs.frozen
class PageRequest:
    """GET ``url`` with ``params`` (``order=asc&limit=...&cursor=...``) for a JSON page."""

    base_url: str
    url: str
    cursor: str
    limit: int
    extra: tuple[tuple[str, str], ...] = ()  # the resource's own query parameters

    @property
    def params(self) -> dict[str, str]:
        return {**dict(self.extra), "order": "asc", "limit": str(self.limit), "cursor": self.cursor}


@attrs.frozen
class StreamRequest:
    """GET ``url`` as ``text/event-stream`` from ``cursor`` (also sent as Last-Event-ID)."""

    base_url: str
    url: str
    cursor: str
    extra: tuple[tuple[str, str], ...] = ()  # the resource's own query parameters

    @property
    def params(self) -> dict[str, str]:
        return {
            **dict(self.extra),
            "order": "asc",
            "limit": str(STREAM_LIMIT),
            "cursor": self.cursor,
        }

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.cursor == "now" else {"Last-Event-ID": self.cursor}


@attrs.frozen
class Attempt:
    """The next request and how long to wait before sending it."""

    request: PageRequest | StreamRequest
    delay: float


@attrs.frozen
class Retry:
    """The follower's answer to a failure: ``attempt`` is the consecutive-failure count, ``delay``
    the wait before the next request, ``failover_to`` the next URL when it switched."""

    attempt: int
    delay: float
    failover_from: str | None = None
    failover_to: str | None = None


class StreamSignal(enum.Enum):
    """What a non-record SSE frame means to the follower."""

    IGNORE = "ignore"  # open, comments, unknown events
    CLOSED = "closed"  # Horizon said byebye: reconnect from the last token
    ERROR = "error"  # Horizon sent `event: error`


class HorizonFollower:
    """The state of following one Horizon collection from a cursor; see the module docstring.

    Args:
        urls: Horizon base URLs, tried in order; the follower sticks to the one that works.
        resource: the collection path, e.g. ``/operations``.
        cursor: ``"now"``, ``"0"`` or a paging token; records strictly after it are returned.
        policy: retry and failover settings.
        page_limit: records per page (Horizon allows at most 200).
        rng: returns uniform floats in [0, 1) for jitter.

    Raises:
        SourceFatalError: the cursor is not ``"now"`` or a paging token.
        ValueError: no URL, or a page limit outside 1..200.
    """

    def __init__(
        self,
        urls: Sequence[str],
        resource: str,
        cursor: str,
        policy: RetryPolicy,
        *,
        page_limit: int = MAX_PAGE_LIMIT,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not urls:
            raise ValueError("at least one Horizon URL is needed")
        if not 1 <= page_limit <= MAX_PAGE_LIMIT:
            raise ValueError(f"page limit {page_limit} must be within 1..{MAX_PAGE_LIMIT}")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.resource = check_resource(resource)
        self.path, params = split_resource(resource)
        self._extra = tuple(params.items())
        self.cursor = check_cursor(cursor)
        self.policy = policy
        self.page_limit = page_limit
        #: The ``limit`` of the next page: ``page_limit``, halved after each 504 (a query too
        #: heavy for Horizon's timeout) and doubled back after each page that came back.
        self.limit = page_limit
        self._rng = rng
        # "now" has nothing to page through: the first page would be empty by definition.
        self.mode = Mode.STREAMING if cursor == "now" else Mode.CATCH_UP
        self.url_index = 0
        self.failures_on_url = 0
        self.consecutive_failures = 0
        self.quiet_closes = 0
        self.malformed_strikes = 0
        self._delay = 0.0
        self._not_found = NotFoundTracker(self.urls, policy.not_found_give_up)
        #: The decision taken on the latest failure or malformed input, for the wrapper to log.
        self.last_retry: Retry | None = None

    # -- what to do next

    @property
    def base_url(self) -> str:
        return self.urls[self.url_index]

    @property
    def last_token(self) -> str | None:
        """The last paging token handed out (or the start cursor); None while at ``now``."""
        return None if self.cursor == "now" else self.cursor

    def next_attempt(self) -> Attempt:
        """The request to send next, and the delay to wait before it."""
        base = self.base_url
        url = base + self.path
        request: PageRequest | StreamRequest
        if self.mode is Mode.CATCH_UP:
            request = PageRequest(base, url, self.cursor, self.limit, self._extra)
        else:
            request = StreamRequest(base, url, self.cursor, self._extra)
        return Attempt(request, self.take_delay())

    def look_request(self) -> PageRequest:
        """One record after the cursor (``limit=1``) at the URL in use: whether anything is
        pending there (the completeness look, ``ingestion/horizon/roots.py``)."""
        base = self.base_url
        return PageRequest(base, base + self.path, self.cursor, 1, self._extra)

    def take_delay(self) -> float:
        """The wait decided by the latest outcome (consumed: the next call returns 0)."""
        delay, self._delay = self._delay, 0.0
        return delay

    def switch_url(self, url: str) -> None:
        """Move to ``url`` (one of ``urls``) at once, e.g. away from a stale Horizon: page from the
        last token there, since the stale one may have held records back.

        Raises:
            ValueError: not one of the follower's URLs.
        """
        self.url_index = self.urls.index(url.rstrip("/"))
        self.failures_on_url = 0
        if self.cursor != "now":
            self.mode = Mode.CATCH_UP
        self._delay = 0.0

    def skip_to(self, cursor: str) -> None:
        """Go on after ``cursor``, a paging token after the current one (skipping a history gap
        the operator chose to skip): the next request pages from there.

        Raises:
            ValueError: ``cursor`` is not a paging token after the current cursor.
        """
        if self.cursor != "now" and token_key(cursor) <= token_key(self.cursor):
            raise ValueError(f"cannot skip back from {self.cursor!r} to {cursor!r}")
        self.cursor = cursor
        self.mode = Mode.CATCH_UP

    # -- outcomes

    def on_page(self, content: bytes | str) -> PageOutcome:
        """A 200 page arrived: validate it, advance the cursor, decide paging vs streaming."""
        outcome = validate_page(content, self.last_token, self.limit)
        if outcome.records:
            self._progress(outcome.records[-1].paging_token)
        if outcome.malformed is not None:
            self._malformed(outcome.malformed)
        else:
            self._succeeded()
            self.limit = self.grown_limit(self.limit)
            if not outcome.full:
                self.mode = Mode.STREAMING
        return outcome

    def on_stream_open(self) -> None:
        """The stream answered 200 with an event stream: the URL works."""
        self._succeeded()

    def on_stream_event(
        self, event: str, event_id: str, data: str
    ) -> Record | Malformed | StreamSignal:
        """One SSE frame. A Malformed answer means: drop the connection (the follower has already
        scheduled a reconnect from the last good token, or raised SourceFatalError)."""
        if event == "message":
            result = validate_stream_record(event_id, data, self.last_token)
            if isinstance(result, Record):
                self._progress(result.paging_token)
                self.quiet_closes = 0
            else:
                self._malformed(result)
            return result
        if event == "close":
            return StreamSignal.CLOSED
        if event == "error":
            return StreamSignal.ERROR
        return StreamSignal.IGNORE

    def on_stream_end(self, got_records: bool, open_for: float = 0.0) -> float:
        """The stream ended cleanly (``event: close``, EOF or idle): reopen it from the last token.

        Reconnects at once after a stream that delivered records or stayed open at least
        ``policy.stream_quick_close`` seconds (``open_for``: a sparse collection whose stream
        Horizon closed at its timeout; Horizon itself asks for ``retry: 10`` ms). A run of
        streams that close soon after opening with nothing backs off, so that a server that closes
        at once is not hammered. Returns the delay.
        """
        self.mode = Mode.STREAMING
        if got_records or open_for >= self.policy.stream_quick_close:
            self.quiet_closes = 0
            self._delay = 0.0
        else:
            self.quiet_closes += 1
            self._delay = self.policy.delay(self.quiet_closes, self._rng())
        return self._delay

    def on_failure(self, failure: Failure, *, url: str, now: float = 0.0) -> Retry:
        """A request failed (transport error, timeout, bad status, ``event: error``).

        Retryable failures back off and, after ``attempts_per_url`` in a row on one URL, move to
        the next URL; a failed stream falls back to paging from the last token. A 404 for an
        account-scoped collection is retried likewise until every URL has answered 404 for
        ``policy.not_found_give_up`` seconds (``now`` is the current time).

        Raises:
            SourceFatalError: Horizon rejected the request in a way retrying cannot fix.
        """
        if failure.status == 404 and is_entity_scoped(self.resource):
            if self._not_found.not_found(self.base_url, now):
                raise SourceFatalError(
                    fatal_message(404, url, failure.error)
                    + f" (every URL answered 404 for {self.policy.not_found_give_up:g} s: "
                    "horizon.not_found_give_up_ms)"
                )
            return self._retry(failure.retry_after)
        if failure.status is not None and not is_retryable_status(failure.status):
            raise SourceFatalError(fatal_message(failure.status, url, failure.error))
        if failure.status == 504 and self.mode is Mode.CATCH_UP:
            # Horizon's query timeout: ask for less, so that the query fits; grow back later.
            self.limit = max(1, self.limit // 2)
        return self._retry(failure.retry_after)

    def grown_limit(self, limit: int) -> int:
        """The page limit after a page of ``limit`` came back: doubled, up to ``page_limit``."""
        return min(self.page_limit, limit * 2)

    # -- internals

    def _progress(self, token: str) -> None:
        self.cursor = token
        self.malformed_strikes = 0

    def _succeeded(self) -> None:
        self.failures_on_url = 0
        self.consecutive_failures = 0
        self._not_found.found()

    def _malformed(self, malformed: Malformed) -> None:
        self.malformed_strikes += 1
        if self.malformed_strikes > self.policy.malformed_retries:
            raise SourceFatalError(
                f"Horizon keeps sending malformed data after paging token {self.cursor!r} "
                f"({malformed.reason}: {malformed.value}); {self.malformed_strikes} tries on "
                f"{', '.join(self.urls)}; check the Horizon servers"
            )
        self._retry(None)

    def _retry(self, retry_after: float | None) -> Retry:
        if self.mode is Mode.STREAMING and self.cursor != "now":
            self.mode = Mode.CATCH_UP
        self.consecutive_failures += 1
        self.failures_on_url += 1
        attempt = self.consecutive_failures
        if self.failures_on_url >= self.policy.attempts_per_url and len(self.urls) > 1:
            old = self.base_url
            self.url_index = (self.url_index + 1) % len(self.urls)
            self.failures_on_url = 0
            # The first lap over the other URLs is immediate: a dead URL should cost no sleep.
            first_lap = attempt < self.policy.attempts_per_url * len(self.urls)
            delay = 0.0 if first_lap else self.policy.delay(attempt, self._rng())
            if retry_after is not None and not first_lap:
                delay = max(delay, min(retry_after, self.policy.retry_after_cap))
            self._delay = delay
            self.last_retry = Retry(attempt, delay, old, self.base_url)
            return self.last_retry
        delay = self.policy.delay(attempt, self._rng())
        if retry_after is not None:
            # Honour the server's wait, but a `Retry-After: 0` storm still backs off.
            delay = max(delay, min(retry_after, self.policy.retry_after_cap))
        self._delay = delay
        self.last_retry = Retry(attempt, delay)
        return self.last_retry
