"""What the benchmarks measure of their processes: /proc accounting (CPU, memory), percentiles.

The processes themselves (nodes, the simulator) are the testing kit's
(:mod:`ingestion.testing.processes`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command: state is field 3; utime and stime are fields 14 and 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _processes() -> tuple[dict[int, int], dict[int, float]]:
    """Every process's parent and CPU seconds, its reaped children's included (``/proc``)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        pid = int(entry)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(v) for v in fields[11:15]) / CLK_TCK
    return parents, times


def _below(root: int, pid: int, parents: dict[int, int]) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = parents.get(pid, 0)
    return False


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every process below it so far: each live one's user + system,
    plus the children each has reaped (``cutime``/``cstime``: a node's finished decode workers)."""
    parents, times = _processes()
    return sum(t for pid, t in times.items() if _below(root, pid, parents))


def pin_tree(root: int, cores: set[int]) -> None:
    """Pin ``root`` and every process below it now to ``cores`` (their children inherit it)."""
    parents, _ = _processes()
    for pid in parents:
        if _below(root, pid, parents):
            try:
                os.sched_setaffinity(pid, cores)
            except ProcessLookupError:
                pass  # gone meanwhile


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


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]
