"""An example receiver, as a user's application would write one, that the tests and benchmarks run.

It verifies every delivery with the official ``standardwebhooks`` package (so a signature we got
wrong is refused by code no one here wrote), and writes each record in one SQLite transaction
together with the fence it carries:

- ``webhook-fencing-token`` lower than the highest token it has accepted: refused (409). A paused
  or partitioned former deliverer's late POST never lands, even after a newer one's did;
- ``webhook-id`` already stored: acknowledged (2xx) without a second write (a retry, a replay, or
  the in-flight POST of a failover);
- else the record is inserted and the highest token raised, in the same transaction.

Faults for tests (``Receiver.fault``): answer a status (with ``Retry-After``), hang past the
sender's timeout, or drop the connection without an answer.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ingestion.common.asgi import Disconnected, Receive, Scope, Send, read_body, respond, serve_lifespan


@attrs.define
class Fault:
    """What the receiver does instead of taking a delivery: ``status`` (with ``retry_after``
    seconds), ``hang`` (no answer for that many seconds), or ``drop`` (close without answering)."""

    status: int = 0
    retry_after: int | None = None
    hang: float = 0.0
    drop: bool = False


@attrs.define
class Receiver:
    secret: str
    db: sqlite3.Connection = attrs.Factory(lambda: _open_db(":memory:"))
    fault: Fault | None = None
    answer_delay: float = 0.0
    posts: int = 0  # every POST that reached the app
    peers: set[tuple[str, int]] = attrs.Factory(set)  # the senders' (host, port): their connections
    refused_stale: int = 0  # refused for a fencing token below the highest accepted
    refused_signature: int = 0
    refusals: list[str] = attrs.Factory(list)  # why, for each delivery whose signature was refused
    duplicates: int = 0  # acknowledged again without a write (same webhook-id)
    stored: int = 0  # records written (a batch counts its records)
    received_at: dict[str, float] = attrs.Factory(dict)  # webhook-id -> wall time first accepted
    _changed: trio.Event = attrs.Factory(trio.Event)
    verifier: Webhook = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.verifier = Webhook(self.secret.split()[0])

    def accept(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """One delivery: verify, then fence and write in one transaction. (status, answer)."""
        try:
            payload = self.verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            self.refused_signature += 1
            self.refusals.append(f"{headers.get('webhook-id')}: {exc}")
            return 401, f"signature: {exc}".encode()
        msg_id = headers["webhook-id"]
        token = int(headers.get("webhook-fencing-token", "0"))
        items = payload if isinstance(payload, list) else [payload]
        with self.db:  # one transaction: the fence check, the write, the fence raised
            (highest,) = self.db.execute("SELECT highest FROM fence").fetchone()
            if token < highest:
                self.refused_stale += 1
                return 409, f"stale fencing token {token} < {highest}".encode()
            cur = self.db.execute(
                "INSERT OR IGNORE INTO deliveries (webhook_id, token, body) VALUES (?, ?, ?)",
                (msg_id, token, json.dumps(items)),
            )
            self.db.execute("UPDATE fence SET highest = ?", (max(token, highest),))
        if cur.rowcount == 0:
            self.duplicates += 1
        else:
            self.stored += len(items)
            self.received_at[msg_id] = time.time()
        self._changed.set()
        self._changed = trio.Event()
        return 204, b""

    def records(self) -> list[dict[str, Any]]:
        """Every record accepted, in the order first accepted (a batch's in its order)."""
        out: list[dict[str, Any]] = []
        for (body,) in self.db.execute("SELECT body FROM deliveries ORDER BY rowid"):
            out.extend(item["data"] for item in json.loads(body))
        return out

    def ids(self) -> list[str]:
        return [r for (r,) in self.db.execute("SELECT webhook_id FROM deliveries ORDER BY rowid")]

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
            }  # fmt: skip
            await respond(send, 200, b"application/json", json.dumps(stats).encode())
            return
        try:
            body = await read_body(receive)
        except Disconnected:
            return  # the sender went away mid-request (killed, timed out): nothing to take
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
        given = {k.decode(): v.decode() for k, v in scope["headers"]}
        status, answer = self.accept(given, body)
        await respond(send, status, b"text/plain", answer)


def _open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False)  # `with db:` commits a transaction
    db.execute(
        "CREATE TABLE IF NOT EXISTS deliveries (webhook_id TEXT PRIMARY KEY, token INTEGER, body TEXT)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS fence (highest INTEGER NOT NULL)")
    if db.execute("SELECT count(*) FROM fence").fetchone()[0] == 0:
        db.execute("INSERT INTO fence VALUES (0)")
    db.commit()
    return db


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
    """``python -m ingestion.webhook.receiver --port N``: serve the example receiver (its secret
    from ``WEBHOOK_SECRET``) until interrupted; prints ``{"event": "receiver-listening", "port"}``
    once it listens, and answers ``GET /_receiver/stats``."""
    import argparse
    import os
    import sys

    parser = argparse.ArgumentParser(prog="python -m ingestion.webhook.receiver", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer-delay-ms", type=float, default=0.0)
    ns = parser.parse_args(argv)
    secret = os.environ.get("WEBHOOK_SECRET", "")
    if not secret:
        print("python -m ingestion.webhook.receiver: set WEBHOOK_SECRET (whsec_...)", file=sys.stderr)
        return 2
    receiver = Receiver(secret, answer_delay=ns.answer_delay_ms / 1000)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_receiver, receiver, ns.host, ns.port))
            print(json.dumps({"event": "receiver-listening", "port": port}), flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
