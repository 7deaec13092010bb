"""The worker-to-parent lease pipe (ingestion/node/lease_reports.py), with no processes at all, and the
parent's exit status for each way a worker ends."""

from __future__ import annotations

import os
import signal

from ingestion.node.lease_reports import HeldLeases, LeaseReport
from ingestion.node.parent import exit_status


def test_a_report_round_trips_and_a_node_id_may_hold_spaces_and_bars() -> None:
    report = LeaseReport("acquired", "payments", 7, "host a|b")
    assert LeaseReport.parse(report.encode().rstrip(b"\n")) == report


def test_the_view_holds_the_latest_lease_per_job_until_that_lease_is_released() -> None:
    view = HeldLeases()
    data = b"".join([
        LeaseReport("acquired", "a", 1, "n1").encode(),
        LeaseReport("acquired", "b", 4, "n1").encode(),
        LeaseReport("released", "a", 1, "n1").encode(),
        LeaseReport("acquired", "a", 3, "n1").encode(),
        LeaseReport("released", "b", 2, "n1").encode(),  # an older term's release: b:4 stays
    ])  # fmt: skip
    # Any chunking: a line split across reads waits for its end.
    for i in range(0, len(data), 7):
        assert view.feed(data[i : i + 7]) == []
    assert view.leases() == [("a", 3, "n1"), ("b", 4, "n1")]


def test_a_malformed_line_is_returned_and_skipped_and_the_rest_still_applies() -> None:
    view = HeldLeases()
    bad = view.feed(b"acquired a x|n1\nhello\n" + LeaseReport("acquired", "a", 2, "n1").encode())
    assert bad == [b"acquired a x|n1", b"hello"]
    assert view.leases() == [("a", 2, "n1")]


def test_the_parent_exits_with_the_worker_s_status_or_128_plus_its_signal() -> None:
    assert exit_status(0) == (0, None, 0)
    assert exit_status(1 << 8) == (1, None, 1)
    assert exit_status(2 << 8) == (2, None, 2)
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert exit_status(status) == (137, "SIGKILL", None)
