"""Processes the benchmarks run and watch: the simulator, node processes, /proc accounting.

Everything here is synchronous and bounded: every wait has a deadline, every child is stopped by
its own pid. A node's JSON log lines are read by a thread per process and kept with the harness's
monotonic receive time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command: state is field 3; utime and stime are fields 14 and 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


MACHINE = "machine"  # cpu_snapshot's key for the whole machine's busy CPU seconds


def machine_cpu_seconds() -> float:
    """CPU seconds every core of the machine has been busy so far (``/proc/stat``: all but
    idle and iowait), every process's included: the others' too."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def cpu_snapshot(pids: dict[str, int | None]) -> dict[str, float | None]:
    """``cpu_seconds`` of each named process now; None for one that is gone or unreadable.
    Under :data:`MACHINE`, the machine's busy seconds (:func:`machine_cpu_seconds`)."""
    out: dict[str, float | None] = {MACHINE: machine_cpu_seconds()}
    for name, pid in pids.items():
        try:
            out[name] = None if pid is None else cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            out[name] = None
    return out


def redis_pid(client: Any) -> int | None:
    """The pid of the redis-server behind ``client`` when it runs on this machine (its ``INFO
    server`` ``process_id`` is a process here running redis-server), else None."""
    try:
        pid = int(client.info("server")["process_id"])
        with open(f"/proc/{pid}/comm") as f:
            return pid if f.read().startswith("redis") else None
    except (OSError, KeyError, ValueError):
        return None


# A process above this share of a core is bound by its one (GIL-holding) thread; the machine's
# cores above this share of all of them are what bounds everyone.
ONE_CORE = 0.85
ALL_CORES = 0.85


def cpu_usage(
    before: dict[str, float | None], after: dict[str, float | None], *, wall: float, records: int,
    bound_by: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """CPU each process used in a timed window of ``wall`` seconds that handled ``records``:
    seconds, microseconds per record and cores (seconds per wall second); the cores all of them
    used together, the machine's busy cores (everyone's, from ``/proc/stat``) and the others'
    share of them; the load average and core count; and what bounds the window: ``one-core`` when
    ``bound_by`` (a name) ran at about one core, ``machine`` when the machine's cores were about
    all busy (ours or others'), both, or ``neither`` (the window waited on something)."""
    cpu = {
        name: after[name] - b  # type: ignore[operator]
        for name, b in before.items()
        if b is not None and after.get(name) is not None and name != MACHINE
    }
    cores_n = os.cpu_count() or 1
    total = sum(cpu.values()) / wall if wall > 0 else 0.0
    busy = None
    if before.get(MACHINE) is not None and after.get(MACHINE) is not None and wall > 0:
        busy = (after[MACHINE] - before[MACHINE]) / wall  # type: ignore[operator]
    one = bound_by is not None and bound_by in cpu and wall > 0 and cpu[bound_by] / wall >= ONE_CORE
    machine = max(total, busy or 0.0) >= ALL_CORES * cores_n
    return {
        "wall_s": wall,
        "records": records,
        "cpu_s": cpu,
        "us_per_record": {k: v * 1e6 / records if records else 0.0 for k, v in cpu.items()},
        "cores": {k: v / wall if wall > 0 else 0.0 for k, v in cpu.items()},
        "cores_total": total,
        # every process's on the machine, ours and the others' (tests, other benchmarks)
        "machine_busy_cores": busy,
        "others_cores": None if busy is None else max(0.0, busy - total),
        "machine_cores": cores_n,
        "load_avg": list(os.getloadavg()),
        "bound": "both" if one and machine else "one-core" if one else "machine" if machine else "neither",
    }


def cpu_line(usage: dict[str, Any]) -> str:
    """``usage`` (``cpu_usage``) in one line: per process us/record (cores), the total, the bound."""
    per = ", ".join(
        f"{k} {usage['us_per_record'][k]:.1f} us ({usage['cores'][k]:.2f})" for k in usage["cpu_s"]
    )
    load = usage["load_avg"][0]
    total, busy = usage["cores_total"], usage.get("machine_busy_cores")
    machine = "" if busy is None else f" (machine busy {busy:.2f})"
    return (
        f"CPU per record (cores): {per}; {total:.2f} cores in all{machine}, {usage['bound']}, load {load:.1f}"
    )


def wait_for_entries(client: Any, key: str, count: int, until: float) -> tuple[int, float]:
    """Poll stream ``key`` (every 5 ms) until it holds ``count`` entries or ``time.monotonic()``
    reaches ``until``: how many it held last, and when the polling stopped."""
    n = 0
    while time.monotonic() < until:
        n = int(client.xlen(key))
        if n >= count:
            break
        time.sleep(0.005)
    return n, time.monotonic()


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process, in KiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":", 1)
                out[name] = int(value.split()[0])
    return out


@attrs.define
class Simulator:
    """A ``python -m ingestion simulate`` child process."""

    process: subprocess.Popen[bytes]
    url: str

    @classmethod
    def start(
        cls,
        *,
        history_ledgers: int,
        ops_per_ledger: int,
        ledger_interval: float = 0.0,
        cache_records: int = 60_000,
        timeout: float = 120.0,
        response_delay_ms: int = 0,
    ) -> Simulator:
        args = [
            sys.executable, "-m", "ingestion", "simulate", "--port", "0",
            "--history-ledgers", str(history_ledgers),
            "--ops-per-ledger", str(ops_per_ledger),
            "--ledger-interval", str(ledger_interval),
            "--cache-records", str(cache_records),
            "--response-delay-ms", str(response_delay_ms),
        ]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        line = _readline_within(proc, timeout)
        try:
            event = json.loads(line)
            if event.get("event") != "simulator-listening":
                raise ValueError(line)
        except ValueError:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"simulator did not start: {line!r}") from None
        return cls(proc, event["url"])

    def close_ledgers(self, client: httpx.Client, count: int = 1) -> int:
        r = client.post(f"{self.url}/_simulator/ledgers", json={"count": count})
        r.raise_for_status()
        return int(r.json()["latest_ledger"])

    def stop(self) -> None:
        stop_process(self.process)


def _readline_within(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return box[0].decode() if box else ""


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@attrs.define
class LogLine:
    at: float  # harness monotonic time the line was read
    fields: dict[str, Any]


@attrs.define(eq=False)
class NodeProcess:
    """A ``python -m ingestion`` node child process with its JSON log lines collected."""

    node_id: str
    process: subprocess.Popen[bytes]
    lines: list[LogLine] = attrs.Factory(list)
    _cond: threading.Condition = attrs.Factory(threading.Condition)

    @classmethod
    def start(
        cls,
        node_id: str,
        *,
        redis_url: str,
        horizon: str | None,  # None: an RPC or lake node (--source in extra)
        ttl_ms: int,
        start_cursor: str = "0",
        job: str = "bench",
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> NodeProcess:
        args = [
            sys.executable, "-m", "ingestion", "--node-id", node_id, "--job", job,
            "--redis", redis_url, *(["--horizon", horizon] if horizon else []),
            "--lease-ttl-ms", str(ttl_ms),
            "--start-cursor", start_cursor, "--log-format", "json", "--log-level", "info",
            *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/tmp",
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        node = cls(node_id, proc)
        threading.Thread(target=node._read, daemon=True).start()
        return node

    @property
    def pid(self) -> int:
        """The node's parent process (the one started; ingestion/node/parent.py)."""
        return self.process.pid

    @property
    def worker_pid(self) -> int:
        """The node's worker process (its ``node-starting`` line's ``pid``): the one that runs
        the jobs, whose CPU and memory are the node's."""
        return int(self.event("node-starting", timeout=30).fields["pid"])

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            now = time.monotonic()
            try:
                fields = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(fields, dict):
                continue
            with self._cond:
                self.lines.append(LogLine(now, fields))
                self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, start: int = 0
    ) -> LogLine:
        """The first line from index ``start`` on that matches, waiting at most ``timeout``."""
        end = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if predicate(self.lines[i].fields):
                        return self.lines[i]
                    i += 1
                left = end - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise TimeoutError(
                        f"{self.node_id}: no matching log line within {timeout}s "
                        f"(exit status {self.process.poll()})"
                    )
                self._cond.wait(min(left, 0.5))

    def event(self, name: str, timeout: float, start: int = 0) -> LogLine:
        return self.wait_for(lambda f: f.get("event") == name, timeout, start)

    def kill(self, sig: int) -> float:
        """Send ``sig``; returns the monotonic time just before it was sent."""
        at = time.monotonic()
        self.process.send_signal(sig)
        return at

    def stop(self) -> None:
        stop_process(self.process)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]
