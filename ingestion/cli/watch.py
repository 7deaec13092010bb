"""``python -m ingestion watch URL...``: one live view of a cluster, from the nodes' status sockets.

It connects to every node's ``--status-port`` WebSocket (``ws://host:port``, or just ``host:port``),
keeps each node's latest status, and prints:

- every election event as it happens, one line each (who became leader after whom and how long
  the job was leaderless; who lost leadership and why; who stands by);
- a cluster line whenever the shape changes: who leads, who stands by, who is unreachable;
- with ``--table`` (the default on a terminal), a redrawn table of all nodes every second (with
  each leader's completeness watermark, ``complete``: ``!`` after it when a gap holds it).

A node is shown as connecting until it first answers or a connection to it first fails; one that
goes away is shown as down and reconnected with backoff; when it comes back its fresh status is
shown. :class:`WatchScreen` is the I/O-free core (messages in, lines out); the trio part
only moves messages.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from ingestion.cli.usage import OneLineParser
from ingestion.common.redact import redact

CONNECT_TIMEOUT = 2.0
SILENCE_TIMEOUT = 5.0  # a node sends a status every second; this much silence means it is gone
RETRY_BASE, RETRY_CAP = 0.2, 2.0


def _clock(at: str | None = None) -> str:
    """``HH:MM:SS.mmm`` of a status message's ISO time, or of now."""
    if at and "T" in at:
        return at.split("T", 1)[1].rstrip("Z")[:12]
    now = time.time()
    return time.strftime("%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}"


@attrs.define
class NodeView:
    url: str
    connected: bool = False
    ever_connected: bool = False
    error: str | None = None
    jobs: dict[str, dict[str, Any]] = attrs.Factory(dict)  # job -> its latest status message

    @property
    def status(self) -> dict[str, Any]:
        """The status of the node's first job (a node hosts one job unless configured otherwise)."""
        return next(iter(self.jobs.values()), {})

    @property
    def name(self) -> str:
        return str(self.status.get("node") or self.url)

    def leading(self) -> list[str]:
        return sorted(job for job, s in self.jobs.items() if s.get("role") == "leader")

    @property
    def connecting(self) -> bool:
        """Not answered yet, nor failed: neither up nor down (a node is down once a connection to
        it has failed or been lost)."""
        return not self.connected and not self.ever_connected and self.error is None


@attrs.define
class WatchScreen:
    """The cluster as the watcher sees it. Every method returns the lines to print."""

    nodes: dict[str, NodeView]
    _shape: str = ""

    @classmethod
    def of(cls, urls: Sequence[str]) -> WatchScreen:
        return cls({u: NodeView(u) for u in urls})

    def connected(self, url: str) -> list[str]:
        node = self.nodes[url]
        lines = []
        if node.ever_connected and not node.connected:
            lines.append(f"{_clock()}  {node.name}: reachable again ({redact(url)})")
        node.connected, node.ever_connected, node.error = True, True, None
        return lines

    def disconnected(self, url: str, error: str) -> list[str]:
        node = self.nodes[url]
        was = node.connected or (not node.ever_connected and node.error is None)
        node.connected, node.error = False, error
        lines = [f"{_clock()}  {node.name}: unreachable ({error}); retrying"] if was else []
        return lines + self._shape_line()

    def message(self, url: str, msg: dict[str, Any]) -> list[str]:
        node = self.nodes[url]
        if msg.get("type") == "status":
            node.jobs[str(msg.get("job", ""))] = msg
            return self._shape_line()
        if msg.get("type") == "event":
            return [f"{_clock(msg.get('time'))}  {describe_event(msg)}"]
        return []

    def leaders(self) -> list[NodeView]:
        return [n for n in self.nodes.values() if n.connected and n.status.get("role") == "leader"]

    def all_jobs(self) -> list[str]:
        return sorted({job for n in self.nodes.values() for job in n.jobs})

    def summary(self) -> str:
        if len(self.all_jobs()) > 1:
            return self._jobs_summary()
        leaders = self.leaders()
        if not leaders:
            lead = "leader: none"
        else:
            lead = ("LEADERS: " if len(leaders) > 1 else "leader: ") + ", ".join(
                f"{n.name} (token {n.status.get('token')})" for n in leaders
            )
        standby = sorted(
            n.name for n in self.nodes.values()
            if n.connected and n.status.get("role") in ("standby", "starting")
        )  # fmt: skip
        down = sorted(n.name for n in self.nodes.values() if not n.connected and not n.connecting)
        connecting = sorted(n.name for n in self.nodes.values() if n.connecting)
        stopped = sorted(
            n.name for n in self.nodes.values() if n.connected and n.status.get("role") == "stopped"
        )
        parts = [lead, "standby: " + (", ".join(standby) or "none")]
        if stopped:
            parts.append("stopped: " + ", ".join(stopped))
        if connecting:
            parts.append("connecting: " + ", ".join(connecting))
        if down:
            parts.append("down: " + ", ".join(down))
        return "cluster  " + " | ".join(parts)

    def _jobs_summary(self) -> str:
        """Several jobs: who leads how many (and which), the jobs nobody leads, any job that two
        nodes both claim."""
        claims: dict[str, list[str]] = {}
        parts = []
        for n in self.nodes.values():
            if not n.connected:
                parts.append(f"{n.name} {'connecting' if n.connecting else 'down'}")
                continue
            leading = n.leading()
            for job in leading:
                claims.setdefault(job, []).append(n.name)
            parts.append(f"{n.name} leads {len(leading)}" + (f" ({', '.join(leading)})" if leading else ""))
        unled = [job for job in self.all_jobs() if job not in claims]
        double = [f"{job}: {' and '.join(names)}" for job, names in sorted(claims.items()) if len(names) > 1]
        text = "cluster  " + " | ".join(parts) + " | unled: " + (", ".join(unled) or "none")
        if double:
            text += " | TWO LEADERS: " + "; ".join(double)
        return text

    def _shape_line(self) -> list[str]:
        shape = self.summary()
        if shape == self._shape:
            return []
        self._shape = shape
        return [f"{_clock()}  {shape}"]

    def table(self) -> str:
        header = f"{'node':<20} {'role':<9} {'token':>6} {'lease ms':>9} {'events':>9} "
        header += f"{'ev/s':>7} {'lag s':>7} {'complete':>10}  cursor"
        several = len(self.all_jobs()) > 1
        if several:
            header = f"{'job':<16} " + header
        rows = [header]
        for n in self.nodes.values():
            if not n.connected:
                job_cell = f"{'':<16} " if several else ""
                state = "connecting" if n.connecting else "DOWN"
                rows.append(f"{job_cell}{n.name:<20} {state:<10} {'':>5} {'':>9} {'':>9} {'':>7} "
                            f"{'':>7} {'':>10}  {n.error or 'not answered yet'}")  # fmt: skip
                continue
            for job, s in sorted(n.jobs.items()) if several else [("", n.status)]:
                lag = s.get("lag_seconds")
                job_cell = f"{job:<16} " if several else ""
                rows.append(
                    f"{job_cell}{n.name:<20} {s.get('role', '?'):<9} {_dash(s.get('token')):>6} "
                    f"{_dash(s.get('lease_ms_left')):>9} {_dash(s.get('events_ingested')):>9} "
                    f"{s.get('ingest_rate', 0):>7} {_dash(lag):>7} {_complete(s):>10}  "
                    f"{_dash(s.get('cursor'))}"
                )
        return "\n".join([self.summary(), "", *rows])


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _complete(status: dict[str, Any]) -> str:
    """The leader's completeness watermark: its ledger, ``!`` after it when a gap holds it."""
    through = status.get("complete_through")
    return "-" if through is None else f"{through}{'!' if status.get('complete_held') else ''}"


def describe_event(msg: dict[str, Any]) -> str:
    """One readable line for an election event message."""
    node, event = msg.get("node", "?"), msg.get("event", "?")
    if event == "became-leader":
        text = f"{node} became leader with token {msg.get('token')}"
        if msg.get("previous_node"):
            text += f", taking over from {msg['previous_node']} (token {msg.get('previous_token')})"
            if msg.get("takeover_ms") is not None:
                text += f" after {msg['takeover_ms']} ms leaderless"
        else:
            text += " (first leader of the job)"
        return text + f"; resumes at cursor {msg.get('cursor')}"
    if event == "lost-leadership":
        return f"{node} lost leadership (token {msg.get('token')}): {msg.get('reason')}"
    if event == "standby":
        return f"{node} stands by; leader {msg.get('leader')} (token {msg.get('token')})"
    if event == "fencing-token-rejected":
        return f"{node} was fenced: token {msg.get('token')} is stale"
    if event == "redis-unavailable":
        return f"{node} cannot reach Redis: {msg.get('error')}"
    if event in ("node-stopped", "stopped"):  # (stopped: a node from before the log's word)
        return f"{node} stopped"
    extra = ", ".join(f"{k}={v}" for k, v in msg.items() if k not in ("type", "event", "node",
                                                                      "job", "time"))  # fmt: skip
    return f"{node} {event} {extra}".rstrip()


def _error_text(exc: BaseException) -> str:
    """The most specific reason in an exception, its causes and groups: "connection refused"."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(sorted({_error_text(e) for e in exc.exceptions}))
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, trio.TooSlowError):
        return f"silent for {SILENCE_TIMEOUT:g} s"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        return _error_text(cause)
    return str(exc) or type(exc).__name__


def _only_connection_errors(group: BaseExceptionGroup[Any]) -> bool:
    expected = (OSError, HandshakeError, ConnectionClosed, trio.TooSlowError, ValueError)
    return all(
        _only_connection_errors(e) if isinstance(e, BaseExceptionGroup) else isinstance(e, expected)
        for e in group.exceptions
    )


async def follow(
    url: str, view: WatchScreen, emit: Callable[[list[str]], None], *,
    retry_base: float = RETRY_BASE, retry_cap: float = RETRY_CAP,
) -> None:  # fmt: skip
    """Follow one node forever: connect, feed its messages to ``view``, reconnect with backoff."""
    failures = 0
    while True:
        error: BaseException | None = None
        try:
            async with open_websocket_url(
                url, connect_timeout=CONNECT_TIMEOUT, disconnect_timeout=1.0
            ) as ws:
                failures = 0
                emit(view.connected(url))
                while True:
                    with trio.fail_after(SILENCE_TIMEOUT):
                        text = await ws.get_message()
                    emit(view.message(url, json.loads(text)))
        except (OSError, HandshakeError, ConnectionClosed, trio.TooSlowError, ValueError) as exc:
            error = exc
        except BaseExceptionGroup as group:
            if not _only_connection_errors(group):
                raise
            error = group
        emit(view.disconnected(url, _error_text(error)))
        failures += 1
        await trio.sleep(min(retry_cap, retry_base * 2 ** min(failures - 1, 10)))


def normalise_url(text: str) -> str:
    if "://" not in text:
        text = f"ws://{text}"
    if text.count("/") < 3:
        text += "/"
    return text


async def watch(
    urls: Sequence[str],
    out: TextIO,
    *,
    table: bool = False,
    duration: float = math.inf,
    task_status: trio.TaskStatus[WatchScreen] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Watch ``urls`` until cancelled (or for ``duration`` seconds), writing to ``out``."""
    view = WatchScreen.of(urls)

    def emit(lines: list[str]) -> None:
        if not table:
            for line in lines:
                print(line, file=out, flush=True)

    with trio.move_on_after(duration):
        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(follow, url, view, emit)
            task_status.started(view)
            if table:
                while True:
                    out.write("\x1b[H\x1b[2J" + view.table() + "\n")
                    out.flush()
                    await trio.sleep(1.0)


async def _main(urls: list[str], table: bool, duration: float) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_then_stop() -> None:
                await watch(urls, sys.stdout, table=table, duration=duration)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_then_stop)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion watch",
        description="Show several nodes' status sockets (--status-port) as one live cluster view.",
    )
    p.add_argument("urls", nargs="+", metavar="URL", help="ws://host:port of a node (or host:port)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--table", action="store_true", default=None,
                      help="redraw a table every second (default on a terminal)")  # fmt: skip
    mode.add_argument("--lines", dest="table", action="store_false",
                      help="print events and cluster changes as lines (default otherwise)")  # fmt: skip
    p.add_argument("--duration", type=float, default=math.inf, metavar="SECONDS",
                   help="stop after this long (default: until Ctrl-C)")  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    try:
        ns = parser().parse_args(argv)
    except SystemExit as exc:  # --help; a bad flag is a UsageError, one line from ingestion.cli
        return int(exc.code or 0)
    table = sys.stdout.isatty() if ns.table is None else ns.table
    urls = [normalise_url(u) for u in ns.urls]
    trio.run(_main, urls, table, ns.duration)
    return 0
