"""Node and simulator processes driven from plain threads: what the benchmarks time in real time.

The same children as :mod:`ingestion.testing.cluster` starts (``python -m ingestion`` nodes and
``python -m ingestion simulate``, their command lines, environment and stopping from
:mod:`ingestion.testing.launch`), and the same :class:`~ingestion.testing.launch.LogLine` per JSON
log line, stamped with the harness's monotonic receive time (``time.monotonic()`` here, as these
harnesses run no trio). Everything is synchronous and bounded: every wait has a deadline, every
child is stopped by its own pid.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import attrs
import httpx

from ingestion.testing.launch import (
    LogLine,
    child_env,
    listening,
    log_line,
    node_command,
    simulator_command,
    stop_process,
)


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
        args = simulator_command(
            ledger_interval=ledger_interval,
            ops_per_ledger=ops_per_ledger,
            history_ledgers=history_ledgers,
            response_delay_ms=response_delay_ms,
            cache_records=cache_records,
        )
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, env=child_env())
        line = _readline_within(proc, timeout)
        ready = log_line("simulator", line, time.monotonic())
        if ready is None or not listening(ready):
            proc.kill()
            proc.wait()
            raise RuntimeError(f"simulator did not start: {line!r}")
        return cls(proc, ready.fields["url"])

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
        args = node_command(
            node_id, jobs=[job], redis_url=redis_url, horizon=horizon, ttl_ms=ttl_ms,
            start_cursor=start_cursor, extra=["--log-level", "info", *extra],
        )  # fmt: skip
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/tmp", env=child_env(env)
        )
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
            line = log_line(self.node_id, raw, time.monotonic())
            if line is None:
                continue
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[LogLine], bool], timeout: float, start: int = 0) -> LogLine:
        """The first line from index ``start`` on that matches, waiting at most ``timeout``."""
        end = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if predicate(self.lines[i]):
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
        return self.wait_for(lambda line: line.event == name, timeout, start)

    def kill(self, sig: int) -> float:
        """Send ``sig``; returns the monotonic time just before it was sent."""
        at = time.monotonic()
        self.process.send_signal(sig)
        return at

    def stop(self) -> None:
        stop_process(self.process)
