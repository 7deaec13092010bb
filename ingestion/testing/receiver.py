"""An example receiver, as a user's application would write one, that the tests and benchmarks run.

It refuses a body over its size limit before reading the rest or verifying anything (413), verifies
every delivery with the official ``standardwebhooks`` package (so a signature we got wrong is
refused by code no one here wrote), and writes each record in one SQLite transaction together with
the fence the body carries (``fencing_token``: signed, unlike the ``webhook-fencing-token`` header,
which it ignores):

- a ``fencing_token`` lower than the highest it has accepted: refused (409). A paused or
  partitioned former deliverer's late POST never lands, even after a newer one's did;
- each record is de-duplicated by its own ``id`` (a retry, a replay, the in-flight POST of a
  failover, or a record sent again in another batch): one already stored is acknowledged (2xx)
  without a second write;
- the highest token is raised in the same transaction, and only when a record was written (a
  duplicate never raises it).

One fence per source job (the payloads' ``id`` up to its last ``:``): each webhook job's tokens
count on their own, so two jobs delivering to one endpoint must not share a fence.

The transaction takes SQLite's write lock before it reads the fence (``BEGIN IMMEDIATE``), and the
raise is computed in SQL, so several workers (processes) on one database file cannot interleave a
read of the fence with another's write. The command keeps the database in a file (by default
``webhook-receiver.sqlite3``), so a restart keeps the fence; a new file starts it at 0 again.

Faults for tests (``Receiver.fault``): answer a status (with ``Retry-After``), hang past the
sender's timeout, or drop the connection without an answer.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ingestion.common.asgi import (
    BodyTooLarge,
    Disconnected,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    serve_lifespan,
)

DEFAULT_DB = "webhook-receiver.sqlite3"
MAX_BODY = 16 * 1024 * 1024  # bytes: a batch of 100 large Horizon records is well under 1 MiB


@attrs.define
class Fault:
    """What the receiver does instead of taking a delivery: ``status`` (with ``retry_after``
    seconds), ``hang`` (no answer for that many seconds), or ``drop`` (close without answering);
    or after taking it: ``lose_answer`` (close without answering: the acknowledgement is lost)."""

    status: int = 0
    retry_after: int | None = None
    hang: float = 0.0
    drop: bool = False
    lose_answer: bool = False


@attrs.define
class Receiver:
    """The example receiver over the SQLite database at ``path`` (``:memory:``: a private one)."""

    secret: str = attrs.field(repr=False)
    path: str = ":memory:"
    max_body: int = MAX_BODY
    fault: Fault | None = None
    answer_delay: float = 0.0
    posts: int = 0  # every POST that reached the app
    peers: set[tuple[str, int]] = attrs.Factory(set)  # the senders' (host, port): their connections
    refused_stale: int = 0  # refused for a fencing token below the highest accepted
    refused_signature: int = 0
    refused_size: int = 0  # refused for a body over max_body, before verification
    refusals: list[str] = attrs.Factory(list)  # why, for each delivery whose signature was refused
    duplicates: int = 0  # acknowledged again without a write (every record already stored)
    regrouped: int = 0  # wrote records beside some already stored (a batch cut anew after a failover)
    stored: int = 0  # records written (a batch counts its records)
    received_at: dict[str, float] = attrs.Factory(dict)  # webhook-id -> wall time first accepted
    _changed: trio.Event = attrs.Factory(trio.Event)
    verifier: Webhook = attrs.field(init=False, repr=False)
    db: sqlite3.Connection = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.verifier = Webhook(self.secret.split()[0])
        self.db = open_db(self.path)

    def accept(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """One delivery: verify, then fence and write in one transaction. (status, answer)."""
        try:
            payload = self.verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            self.refused_signature += 1
            self.refusals.append(f"{headers.get('webhook-id')}: {exc}")
            return 401, f"signature: {exc}".encode()
        items = payload if isinstance(payload, list) else [payload]
        token = _fencing_token(items)
        if token is None:
            return 400, b"each payload needs its id and the one integer fencing_token of the POST"
        written = write(self.db, headers["webhook-id"], token, items)
        if written is None:
            self.refused_stale += 1
            return 409, f"stale fencing token {token}".encode()
        if written == 0:
            self.duplicates += 1
        else:
            self.regrouped += int(written < len(items))
            self.stored += written
            self.received_at.setdefault(headers["webhook-id"], time.time())
        self._changed.set()
        self._changed = trio.Event()
        return 204, b""

    def records(self) -> list[dict[str, Any]]:
        """Every record accepted, in the order first accepted (a batch's in its order)."""
        rows = self.db.execute("SELECT payload FROM records ORDER BY rowid")
        return [json.loads(payload)["data"] for (payload,) in rows]

    def ids(self) -> list[str]:
        """The ``webhook-id`` of each delivery that wrote a record, in the order first written."""
        rows = self.db.execute("SELECT webhook_id FROM records GROUP BY webhook_id ORDER BY min(rowid)")
        return [r for (r,) in rows]

    def fence(self) -> int:
        """The highest fencing token accepted (of any source job; 0: none)."""
        return int(self.db.execute("SELECT coalesce(max(highest), 0) FROM fence").fetchone()[0])

    async def wait_for(self, count: int, within: float) -> None:
        """Until ``count`` records are stored (bounded)."""
        with trio.fail_after(within):
            while self.stored < count:
                await self._changed.wait()

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope.get("method") == "GET" and scope.get("path") == "/_receiver/stats":
            stats = {
                "posts": self.posts, "stored": self.stored, "duplicates": self.duplicates,
                "refused_stale": self.refused_stale, "refused_signature": self.refused_signature,
                "refused_size": self.refused_size, "fence": self.fence(),
            }  # fmt: skip
            await respond(send, 200, b"application/json", json.dumps(stats).encode())
            return
        given = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        declared = given.get("content-length", "0")
        try:
            if not declared.isdigit() or int(declared) > self.max_body:
                raise BodyTooLarge(declared)
            body = await read_body(receive, self.max_body)  # (chunked: cut at the limit too)
        except Disconnected:
            return  # the sender went away mid-request (killed, timed out): nothing to take
        except BodyTooLarge:
            self.refused_size += 1
            await respond(send, 413, b"text/plain", f"a body over {self.max_body} bytes".encode())
            return
        self.posts += 1
        if scope.get("client"):
            self.peers.add(tuple(scope["client"]))  # type: ignore[arg-type]
        fault = self.fault
        if fault is not None:
            if fault.hang:  # an answer that comes too late, and takes nothing
                await trio.sleep(fault.hang)
                await respond(send, 503, b"text/plain", b"hung on purpose")
                return
            if fault.drop:
                raise ConnectionAbortedError("dropped by the test")  # hypercorn closes the connection
            if fault.status:
                headers = (
                    [] if fault.retry_after is None else [(b"retry-after", str(fault.retry_after).encode())]
                )
                await respond(send, fault.status, b"text/plain", b"failing on purpose", headers)
                return
        if self.answer_delay:
            await trio.sleep(self.answer_delay)
        status, answer = self.accept(given, body)
        if fault is not None and fault.lose_answer:
            raise ConnectionAbortedError("answer lost by the test")
        await respond(send, status, b"text/plain", answer)


def _fencing_token(items: list[Any]) -> int | None:
    """The signed fencing token of a delivery's payloads (None: missing, mixed, or an id missing
    or naming another source job than the others)."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("id"), str) for i in items):
        return None
    if len({i["id"].rpartition(":")[0] for i in items}) != 1:
        return None
    tokens = {i.get("fencing_token") for i in items}
    token = tokens.pop() if len(tokens) == 1 else None
    return token if isinstance(token, int) and not isinstance(token, bool) else None


def open_db(path: str) -> sqlite3.Connection:
    """The receiver's database at ``path`` (created when new): its records and its fence."""
    # isolation_level=None: no implicit transactions; write() opens its own, write-locked.
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
    if path != ":memory:":
        db.execute("PRAGMA journal_mode=WAL")  # workers read while one writes
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL,"
        " fencing_token INTEGER NOT NULL, payload TEXT NOT NULL)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS fence (source_job TEXT PRIMARY KEY, highest INTEGER NOT NULL)")
    db.execute("COMMIT")
    return db


def write(db: sqlite3.Connection, msg_id: str, token: int, items: list[dict[str, Any]]) -> int | None:
    """Write a delivery's new records and raise the fence, in one transaction: how many records
    were new (0: a duplicate, which leaves the fence alone), or None when ``token`` is below the
    fence (nothing written).

    ``BEGIN IMMEDIATE`` takes the database's write lock before the fence is read, so no other
    worker's write comes between this read and this write; the raise is SQL's ``max``, never a
    value computed from an earlier read."""
    source_job = items[0]["id"].rpartition(":")[0]  # (a record id holds no ":")
    db.execute("BEGIN IMMEDIATE")
    try:
        row = db.execute("SELECT highest FROM fence WHERE source_job = ?", (source_job,)).fetchone()
        if row is not None and token < row[0]:
            db.execute("ROLLBACK")
            return None
        new = 0
        for item in items:
            new += db.execute(
                "INSERT OR IGNORE INTO records (id, webhook_id, fencing_token, payload) VALUES (?, ?, ?, ?)",
                (item["id"], msg_id, token, json.dumps(item)),
            ).rowcount
        if new:
            db.execute(
                "INSERT INTO fence (source_job, highest) VALUES (?, ?)"
                " ON CONFLICT (source_job) DO UPDATE SET highest = max(highest, excluded.highest)",
                (source_job, token),
            )
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return new


async def serve_receiver(
    receiver: Receiver, host: str = "127.0.0.1", port: int = 0,
    *, certfile: str | None = None, keyfile: str | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve ``receiver`` on ``host:port`` (0: a free port, told through ``task_status``), over
    TLS with ``certfile`` and ``keyfile``."""
    config = HypercornConfig()
    config.certfile, config.keyfile = certfile, keyfile
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 30
    config.graceful_timeout = 0.5
    app: Callable[[Scope, Receive, Send], Awaitable[None]] = receiver.app
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        task_status.started(int(binds[0].rsplit(":", 1)[-1]))


def main(argv: list[str] | None = None) -> int:
    """``python -m ingestion.testing.receiver --port N [--db FILE]``: serve the example receiver
    (its secret from ``WEBHOOK_SECRET``, its records and fence in FILE) until interrupted; prints
    ``{"event": "receiver-listening", "port", "db", "fence"}`` once it listens, and answers
    ``GET /_receiver/stats``."""
    parser = argparse.ArgumentParser(prog="python -m ingestion.testing.receiver", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer-delay-ms", type=float, default=0.0)
    parser.add_argument(
        "--db", default=DEFAULT_DB,
        help=f"the SQLite file of records and fence (default {DEFAULT_DB}; a new file starts the fence at 0)",
    )  # fmt: skip
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY)
    ns = parser.parse_args(argv)
    secret = os.environ.get("WEBHOOK_SECRET", "")
    if not secret:
        print("python -m ingestion.testing.receiver: set WEBHOOK_SECRET (whsec_...)", file=sys.stderr)
        return 2
    receiver = Receiver(secret, ns.db, max_body=ns.max_body_bytes, answer_delay=ns.answer_delay_ms / 1000)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_receiver, receiver, ns.host, ns.port))
                shown = {"event": "receiver-listening", "port": port, "db": ns.db, "fence": receiver.fence()}
                print(json.dumps(shown), flush=True)
                async for _ in signals:  # Ctrl-C or a service manager's stop: a clean exit
                    nursery.cancel_scope.cancel("stopped by a signal")
                    break
        receiver.db.close()

    trio.run(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
