"""A trio clock that keeps counting while the host is suspended.

trio's default clock is ``time.perf_counter`` (``CLOCK_MONOTONIC`` on Linux), which stops while the
host is suspended (a laptop asleep, a VM paused by its hypervisor). Redis's lease TTLs kept running
meanwhile, so after a resume a node on that clock would believe less time had passed than Redis
does, and its ingest deadline would be late. ``CLOCK_BOOTTIME`` is monotonic *and* counts suspended
time, so every deadline computed from it can only be early. Where the platform has no
``CLOCK_BOOTTIME`` (not Linux), ``CLOCK_MONOTONIC`` is the best there is.
"""

from __future__ import annotations

import time

import trio

CLOCK_ID: int = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
CLOCK_NAME = "boottime" if hasattr(time, "CLOCK_BOOTTIME") else "monotonic"


class BootClock(trio.abc.Clock):
    """``trio.run(..., clock=BootClock())``: trio time is ``CLOCK_BOOTTIME`` seconds."""

    name = CLOCK_NAME

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.clock_gettime(CLOCK_ID)

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # The I/O wait that follows sleeps on the kernel's own clock, which may not count a
        # suspension; that only wakes trio early (it then sees the real time and sleeps again).
        return max(0.0, deadline - self.current_time())
