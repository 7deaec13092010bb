"""What the demo (:mod:`ingestion.cli.demo`) prints: a line per step or chosen node log event,
with the time, who, what and the detail, each process in a color of its own on a terminal."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import TextIO

import attrs

from ingestion.testing.launch import LogLine

SHOWN = (
    "node-starting",
    "became-leader",
    "standby",
    "lost-leadership",
    "fencing-token-rejected",
    "ingestion-stopped-at-deadline",
    "releasing-orphaned-lease",
    "lease-released",
    "redis-state-lost",
    "redis-unavailable",
    "ingestion-fatal",
    "handing-back",
    "node-stopped",
    "worker-died",
)
FIELDS = {
    "node-starting": ("lease_ttl_ms", "renew_interval_ms", "safety_margin_ms", "pid"),
    "worker-died": ("worker_pid", "signal", "leases_released", "release_ms"),
    "became-leader": ("token", "cursor", "previous_node", "previous_token", "takeover_ms"),
    "standby": ("leader", "token"),
    "lost-leadership": ("token", "reason"),
    "handing-back": ("handed_job", "share", "leading", "live"),
    "fencing-token-rejected": ("token", "current_token", "cursor"),
}
COLORS = ("\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[91m", "\033[96m")
BOLD, RESET = "\033[1m", "\033[0m"


@attrs.define
class Screen:
    """The demo's output: ``names`` gives the processes running now (each keeps its color)."""

    out: TextIO
    color: bool
    names: Callable[[], Iterable[str]] = lambda: ()
    many: bool = False  # several jobs: each node event names its job

    def say(self, who: str, what: str, detail: str = "", *, bold: bool = False) -> None:
        clock = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        color = ""
        if self.color:
            names = sorted(self.names()) or [who]
            color = COLORS[names.index(who) % len(COLORS)] if who in names else ""
            color += BOLD if bold else ""
        reset = RESET if color else ""
        print(f"{clock}  {color}{who:<8}  {what:<24}{reset} {detail}".rstrip(), file=self.out)
        self.out.flush()

    def show(self, line: LogLine) -> None:
        """A node's log line, when it is one of the events shown."""
        if line.event not in SHOWN:
            return
        keys = FIELDS.get(line.event) or tuple(
            k for k in line.fields if k not in ("timestamp", "level", "node", "job")
        )
        detail = " ".join(f"{k}={line.fields.get(k)}" for k in keys if k in line.fields)
        if self.many and line.event not in ("node-starting", "node-stopped", "handing-back"):
            detail = f"job={line.fields.get('job')} {detail}"
        self.say(line.node, line.event, detail, bold=line.event == "became-leader")
