"""``python -m ingestion tail``: print a job's events stream, one record per line.

Each line is the record's JSON as Horizon sent it, with the line breaks between its tokens removed
(a raw line break can only sit between JSON tokens, never inside a string, so nothing else
changes): ``jq`` and other line tools read the output directly.

Two ways to read:

- **Plain** (``--from ID|0|$``): entries after stream id ``ID``; ``0`` from the first entry; ``$``
  (the default) only entries added from now on. Nothing is written to Redis.
- **As a consumer group** (``--group G [--consumer C]``): the group is created at ``--from``
  (default: the start of the stream) when missing, and reading resumes where the group left off.
  Each record is printed, stdout is flushed, and only then is it acknowledged (``XACK``): delivery
  is at least once. A record printed but not yet acknowledged when ``tail`` was killed is printed
  again by the next ``tail`` with the same group and consumer (its pending entries come first), so
  consumers deduplicate by ``paging_token``. The default consumer name is ``tail``, the same on
  every run, so that a restarted ``tail`` finds what its predecessor left pending.

A job whose sink is PostgreSQL (``--sink``, ``sink.url`` or its ``[jobs.NAME] sink``) is read from
its ``events`` rows instead, in ``seq`` order (``--from SEQ``: after that ``seq``; ``0``: from the
first row; ``$``: only new ones). While following, ``tail`` ``LISTEN``s on the commits' ``NOTIFY``
channel and reads as soon as one of the job's commits is notified, waiting at most ``BLOCK_MS``
before it reads anyway. The record is the text as committed (``json`` keeps it as sent).
PostgreSQL has no consumer groups: a reader keeps its last ``seq`` itself.

Without ``--count`` it follows the stream live until SIGINT or SIGTERM (exit 0); with ``--count N``
it exits 0 after N records, waiting for them when the stream has fewer. Errors are one line on
stderr: 2 for a usage error or a job that does not exist, 1 when Redis cannot be reached (a
connection lost while following is retried for ``RECONNECT_FOR`` seconds first).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import orjson
import redis

from actors.lease_store import describe_redis_error, job_keys
from ingestion.cli.usage import OneLineParser
from ingestion.config import Settings, load, redact_url

BLOCK_MS = 1000  # each blocking read waits at most this long before it is re-issued
READ_COUNT = 500  # entries asked for per read
RECONNECT_FOR = 30.0  # seconds a lost connection is retried while following, then exit 1
_ENTRY_ID = re.compile(r"^\d+(-\d+)?$")
_BREAKS = re.compile(r"\r?\n[ \t\r\n]*")


class TailError(Exception):
    """Ends ``tail`` with one line on stderr and ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Stop(Exception):
    """SIGTERM: stop like SIGINT does."""


def one_line(record: str) -> str:
    """The record's JSON on one line: the line breaks (and the indentation after them) between its
    tokens removed. JSON strings cannot hold a raw line break, so the record is otherwise as sent."""
    return _BREAKS.sub("", record).strip()


def transfer_line(record: str) -> str | None:
    """The record's transfer view as one tab-separated line (``--transfers``): id, kind, amount
    (in the asset's smallest unit: stroops), asset (``native``, ``CODE:ISSUER``, or the token's
    contract id), from, to and the destination's muxed id (``-`` where the view has none); None
    for a record that moves nothing. A webhook job's dead letter is read as the record it names
    (under its ``record``)."""
    try:
        doc = orjson.loads(record)
    except orjson.JSONDecodeError:
        return None
    if isinstance(doc, dict) and "webhook_id" in doc and isinstance(doc.get("record"), dict):
        doc = doc["record"]
    view = doc.get("transfer") if isinstance(doc, dict) else None
    if not isinstance(view, dict):
        return None
    asset = view.get("asset") or doc.get("contractId") or "-"
    fields = (doc.get("id"), view.get("kind"), view.get("amount"), asset, view.get("from"),
              view.get("to"), view.get("to_muxed_id"))  # fmt: skip
    return "\t".join("-" if f in (None, "") else str(f) for f in fields)


def render(record: str, transfers: bool) -> str | None:
    """What ``tail`` prints for ``record``: its JSON on one line, or with ``transfers`` its transfer
    line (None: nothing to print)."""
    return transfer_line(record) if transfers else one_line(record)


def _check_from(value: str) -> str:
    if value in ("0", "$") or _ENTRY_ID.match(value):
        return value
    raise TailError(
        f"--from: must be 0, $ or a stream entry id such as 1700000000000-0, got {value!r}", 2
    )


class Tail:
    """The reading loop, on a blocking redis-py client (``tail`` is a foreground command)."""

    def __init__(
        self, client: redis.Redis, job: str, out: TextIO, where: str, transfers: bool = False
    ) -> None:
        self.client = client
        self.job = job
        self.key = job_keys(job)["events"]
        self.out = out
        self.where = where
        self.transfers = transfers
        self.printed = 0

    def check_job(self) -> None:
        k = job_keys(self.job)
        if not self.client.exists(k["events"], k["cursor"], k["token"]):
            raise TailError(
                f"no job {self.job!r} at {self.where}: nothing was ever elected or committed for it "
                "(check --job and --redis)",
                2,
            )

    def _emit(self, entries: Sequence[tuple[str, dict[str, str] | None]]) -> list[str]:
        """Print the entries' records; returns the ids of the entries handled."""
        ids = []
        for entry_id, fields in entries:
            ids.append(entry_id)
            if not fields or "record" not in fields:
                # A pending entry deleted from the stream (XDEL by someone): nothing to print.
                print(f"ingestion: entry {entry_id} is gone from the stream; skipped", file=sys.stderr)
                continue
            line = render(fields["record"], self.transfers)
            if line is not None:
                self.out.write(line + "\n")
                self.printed += 1
        self.out.flush()  # before any acknowledgement: at least once, never at most once
        return ids

    def _want(self, count: int | None) -> int:
        return READ_COUNT if count is None else min(READ_COUNT, count - self.printed)

    def plain(self, start: str, count: int | None) -> None:
        after = [start]  # the last entry read (a list: the read below sees each new value)
        if start == "$":
            newest: Any = self.client.xrevrange(self.key, count=1)
            after[0] = newest[0][0] if newest else "0-0"
        for entries in self._reads(count, lambda want: self.client.xread(
            {self.key: after[0]}, count=want, block=BLOCK_MS
        )):
            self._emit(entries)
            after[0] = entries[-1][0]

    def group(self, group: str, consumer: str, start: str, count: int | None) -> None:
        try:
            self.client.xgroup_create(self.key, group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # First what this consumer was given but never acknowledged (a tail that was stopped
        # between printing and acknowledging), then new entries.
        pending_from = "0"
        while count is None or self.printed < count:
            reply: Any = self.client.xreadgroup(
                group, consumer, {self.key: pending_from}, count=self._want(count)
            )
            entries = reply[0][1] if reply else []
            if not entries:
                break
            entries = entries[: self._want(count)]
            self.client.xack(self.key, group, *self._emit(entries))
            pending_from = entries[-1][0]
        for entries in self._reads(count, lambda want: self.client.xreadgroup(
            group, consumer, {self.key: ">"}, count=want, block=BLOCK_MS
        )):
            self.client.xack(self.key, group, *self._emit(entries))

    def _reads(self, count: int | None, read: Any) -> Iterator[list[tuple[str, dict[str, str]]]]:
        """Non-empty reads until ``count`` records are printed (forever without it); a lost
        connection is retried for ``RECONNECT_FOR`` seconds."""
        lost_since: float | None = None
        while count is None or self.printed < count:
            try:
                reply: Any = read(self._want(count))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                now = time.monotonic()
                lost_since = lost_since if lost_since is not None else now
                if now - lost_since > RECONNECT_FOR:
                    raise TailError(
                        f"lost Redis for {RECONNECT_FOR:g} s: "
                        + describe_redis_error(exc, where=self.where),
                        1,
                    ) from exc
                time.sleep(0.5)
                continue
            lost_since = None
            if reply:
                yield reply[0][1]


class PostgresTail:
    """The reading loop for a job whose sink is PostgreSQL (blocking, a foreground command)."""

    def __init__(self, url: str, schema: str, job: str, out: TextIO, transfers: bool = False) -> None:
        from ingestion.postgres.connection import redact  # lazy: CLI start-up (psycopg, ~140 ms)
        from ingestion.postgres.readers import EventsFollower  # lazy: CLI start-up (psycopg, ~140 ms)

        self.follower = EventsFollower(url, schema, job, timeout=5.0)
        self.url = url
        self.where = f"{redact(url)} (schema {schema})"
        self.job = job
        self.out = out
        self.transfers = transfers
        self.printed = 0

    def run(self, ns: argparse.Namespace) -> int:
        import psycopg  # lazy: CLI start-up (~140 ms)

        from ingestion.postgres.connection import describe  # lazy: CLI start-up (psycopg, ~140 ms)
        from ingestion.postgres.readers import job_known, job_state  # lazy: CLI start-up (psycopg, ~140 ms)

        if ns.group:
            raise TailError(
                "--group: a PostgreSQL job has no consumer groups: keep the last seq you read and "
                "give it to --from", 2,
            )  # fmt: skip
        start = ns.start if ns.start is not None else "$"
        if start != "$" and not start.isdigit():
            raise TailError(f"--from: for a PostgreSQL job, a seq (0: from the first) or $, got {start!r}", 2)
        try:
            if not job_known(job_state(self.url, self.follower.schema, self.job)):
                raise TailError(
                    f"no job {self.job!r} at {self.where}: nothing was ever committed for it "
                    "(check --job and --sink)", 2,
                )  # fmt: skip
            after = self.follower.last_seq() if start == "$" else int(start)
            self._follow(after, ns.count)
        except psycopg.Error as exc:
            raise TailError(describe(exc, self.url), 1) from exc
        finally:
            self.follower.close()
        return 0

    def _follow(self, after: int, count: int | None) -> None:
        import psycopg  # lazy: CLI start-up (~140 ms)

        from ingestion.postgres.connection import describe  # lazy: CLI start-up (psycopg, ~140 ms)

        lost_since: float | None = None
        while count is None or self.printed < count:
            want = READ_COUNT if count is None else min(READ_COUNT, count - self.printed)
            try:
                rows = self.follower.read(after, want)
                if not rows:
                    self.follower.wait(BLOCK_MS / 1000)  # a commit's NOTIFY, or read again anyway
            except psycopg.OperationalError as exc:
                self.follower.close()
                now = time.monotonic()
                lost_since = lost_since if lost_since is not None else now
                if now - lost_since > RECONNECT_FOR:
                    lost = f"lost PostgreSQL for {RECONNECT_FOR:g} s: {describe(exc, self.url)}"
                    raise TailError(lost, 1) from exc
                time.sleep(0.5)
                continue
            lost_since = None
            for _seq, _paging_token, _token, record in rows:
                line = render(record, self.transfers)
                if line is not None:
                    self.out.write(line + "\n")
                    self.printed += 1
            if rows:
                self.out.flush()
                after = rows[-1][0]


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion tail",
        description="Print a job's events stream, one record (Horizon's JSON) per line.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help="the Redis the nodes use (default: from the config)")
    p.add_argument(
        "--sink", metavar="URL",
        help="a PostgreSQL sink: read the job's rows there, following its NOTIFY channel "
        "(default: from the config; env INGESTION_SINK_URL)",
    )
    p.add_argument(
        "--job", help="the job to read (default: the configured one: horizon, or rpc with "
        "INGESTION_NODE_SOURCE=rpc; env INGESTION_NODE_JOB)"
    )
    p.add_argument(
        "--from", dest="start", metavar="ID|0|$",
        help="after this stream entry id (a PostgreSQL job: after this seq); 0: from the first; "
        "$: only new ones (default: $, or 0 when a --group is created)",
    )
    p.add_argument("--count", type=int, metavar="N", help="exit after N records (default: follow)")
    p.add_argument(
        "--transfers", action="store_true",
        help="print each record's transfer view instead, one tab-separated line per transfer: id, "
        "kind, amount, asset, from, to, muxed id (records that move nothing are skipped; --count "
        "counts transfers; a webhook job's dead letters: the records they name)",
    )
    p.add_argument("--group", metavar="G", help="read as consumer group G and acknowledge")
    p.add_argument(
        "--consumer", metavar="C", default="tail", help="consumer name within --group (default: tail)"
    )
    return p


def run(ns: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if ns.count is not None and ns.count <= 0:
        raise TailError(f"--count: must be positive, got {ns.count}", 2)
    if ns.consumer != "tail" and not ns.group:
        raise TailError("--consumer: only with --group", 2)
    from ingestion.postgres.readers import configured_sink  # lazy: CLI start-up (psycopg, ~140 ms)

    sink = configured_sink(settings, settings.node.job)
    if sink:
        return PostgresTail(sink, settings.sink.schema, settings.node.job, out, ns.transfers).run(ns)
    start = _check_from(ns.start if ns.start is not None else ("0" if ns.group else "$"))
    r = settings.redis
    where = redact_url(r.url)
    bound = max(r.timeout_ms / 1000, 2.0)
    try:
        client = r.connect(timeout=bound + BLOCK_MS / 1000, connect_timeout=bound)
    except redis.RedisError as exc:  # a cluster's client reads the slot map when built
        raise TailError(describe_redis_error(exc, where=where, secret=None), 1) from exc
    tail = Tail(client, settings.node.job, out, where, ns.transfers)
    try:
        tail.check_job()
        if ns.group:
            tail.group(ns.group, ns.consumer, start, ns.count)
        else:
            tail.plain(start, ns.count)
    except redis.RedisError as exc:
        raise TailError(describe_redis_error(exc, where=where, secret=None), 1) from exc
    finally:
        client.close()
    return 0


def main(argv: Sequence[str]) -> int:
    """Run ``tail`` with these flags; returns the exit status.

    Raises:
        ConfigError: a bad setting (the CLI prints it and exits 2).
    """
    ns = parser().parse_args(list(argv))
    flags: dict[str, dict[str, Any]] = {}
    if ns.redis is not None:
        flags["redis"] = {"url": ns.redis}
    if ns.job is not None:
        flags["node"] = {"job": ns.job}
    if ns.sink is not None:
        flags["sink"] = {"url": ns.sink}
    settings = load(ns.config, os.environ, flags)

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(ns, settings, sys.stdout)
    except TailError as exc:
        print(f"ingestion: tail: {exc}", file=sys.stderr)
        return exc.status
    except (KeyboardInterrupt, _Stop):
        return 0
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
