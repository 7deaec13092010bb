"""``python -m ingestion watch``: driven against real nodes (in-process, real Redis, real status
sockets), checking what it prints; and its I/O-free view."""

from __future__ import annotations

import io
import subprocess
import sys

import structlog
import trio

from actors.observe import NodeObserver
from actors.source import SyntheticSource
from actors.supervisor import NodeHandle, NodeSpec, run_node
from ingestion.cli.watch import WatchScreen, describe_event, normalise_url, watch
from ingestion.serve.status import serve_status
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from tests.support.nodes import FAST_TIMING, Recorder, lease_store
from tests.support.ports import closed_port

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)


class Screen(io.StringIO):
    """What watch prints, with a way to wait (bounded) for a line without polling."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def write(self, text: str) -> int:
        self.changed.set()
        self.changed = trio.Event()
        return super().write(text)


async def wait_for_line(out: Screen, text: str, within: float = 10.0) -> str:
    with trio.fail_after(within):
        while True:
            for line in out.getvalue().splitlines():
                if text in line:
                    return line
            await out.changed.wait()


async def start_node_with_status(
    nursery: trio.Nursery, rec: Recorder, url: str, job: str, name: str, proxy: TcpProxy
) -> tuple[NodeHandle, trio.CancelScope]:
    """A node and its status socket (on a port of its own, behind ``proxy``, which forwards to it
    from now on), in a scope the test can cancel to make the node vanish."""
    observer = NodeObserver(name, job)
    observer.listeners.append(rec.listener(name))
    log = structlog.get_logger().bind(node=name, job=job)
    spec = NodeSpec(name, job, int(FAST_TIMING.ttl * 1000), FAST_TIMING, 0.01, "0")

    async def node(*, task_status: trio.TaskStatus[tuple[NodeHandle, trio.CancelScope]]) -> None:
        with trio.CancelScope() as scope, lease_store(url, job) as store:
            async with trio.open_nursery() as inner:
                proxy.target_port = await inner.start(serve_status, "127.0.0.1", 0, observer, log)
                proxy.set_mode("forward")
                handle = await inner.start(run_node, store, LIVE, spec, log, observer)
                task_status.started((handle, scope))

    result: tuple[NodeHandle, trio.CancelScope] = await nursery.start(node)
    return result


async def test_watch_shows_the_leader_the_standby_a_failover_and_a_node_coming_back(
    redis_server: LocalRedis, job: str
) -> None:
    rec = Recorder()
    out = Screen()
    async with trio.open_nursery() as nursery:
        # watch's URLs are proxies listening for the whole test (no port to lose to another
        # process while a node is down); a refusing proxy is a node that is not there.
        proxies = {n: TcpProxy(0) for n in ("a", "b")}
        for proxy in proxies.values():
            proxy.set_mode("refuse")
            await nursery.start(proxy.serve)
        urls = [f"ws://127.0.0.1:{proxies[n].port}/" for n in ("a", "b")]
        await nursery.start(lambda *, task_status: watch(urls, out, task_status=task_status))
        await wait_for_line(out, "unreachable")  # nothing listens yet: shown, and retried

        _, kill_a = await start_node_with_status(nursery, rec, redis_server.url, job, "a", proxies["a"])
        # (the tokens the grants named: on a loaded machine a cold first acquire that timed out
        # may have been applied, and its token released as orphaned: a then leads with token 2)
        ta = (await rec.wait_for("became-leader", "a")).fields["token"]
        await start_node_with_status(nursery, rec, redis_server.url, job, "b", proxies["b"])
        await rec.wait_for("standby", "b")
        await wait_for_line(out, f"cluster  leader: a (token {ta}) | standby: b")
        kill_a.cancel()  # node a vanishes (its process dies; the lease is released on the way out)
        proxies["a"].set_mode("refuse")  # and its address with it
        tb = (await rec.wait_for("became-leader", "b")).fields["token"]
        took = await wait_for_line(out, f"b became leader with token {tb}, taking over from a (token {ta})")
        assert "ms leaderless" in took
        await wait_for_line(out, "a: unreachable")
        await wait_for_line(out, f"cluster  leader: b (token {tb}) | standby: none | down: a")

        await start_node_with_status(nursery, rec, redis_server.url, job, "a", proxies["a"])
        await wait_for_line(out, "a: reachable again")
        await wait_for_line(out, f"cluster  leader: b (token {tb}) | standby: a")
        nursery.cancel_scope.cancel()
    text = out.getvalue()
    assert "LEADERS" not in text  # never two leaders at once, as far as the nodes reported


def test_view_flags_two_nodes_that_both_claim_to_lead() -> None:
    view = WatchScreen.of(["ws://x/", "ws://y/"])
    for url, node, token in (("ws://x/", "x", 1), ("ws://y/", "y", 2)):
        view.connected(url)
        view.message(url, {"type": "status", "node": node, "role": "leader", "token": token})
    assert view.summary().startswith("cluster  LEADERS: x (token 1), y (token 2)")
    table = view.table()
    assert "x" in table and "leader" in table


def test_a_node_not_yet_answered_is_connecting_not_down() -> None:
    """Live nodes used to show as down until watch had connected to them."""
    view = WatchScreen.of(["ws://x/", "ws://y/"])
    assert view.summary() == "cluster  leader: none | standby: none | connecting: ws://x/, ws://y/"
    assert "DOWN" not in view.table() and "connecting" in view.table()
    view.connected("ws://x/")
    view.message("ws://x/", {"type": "status", "node": "x", "role": "leader", "token": 1})
    view.disconnected("ws://y/", "connection refused")  # its first failure: down from now on
    assert view.summary() == "cluster  leader: x (token 1) | standby: none | down: ws://y/"
    assert "connection refused" in view.table() and "DOWN" in view.table()
    view.disconnected("ws://x/", "connection reset")  # lost after answering: down, not connecting
    assert view.summary().endswith("| down: ws://y/, x")
    several = WatchScreen.of(["ws://x/", "ws://y/"])
    several.connected("ws://x/")
    for job in ("j1", "j2"):
        several.message("ws://x/", {"type": "status", "node": "x", "job": job, "role": "leader"})
    assert "ws://y/ connecting" in several.summary() and "down" not in several.summary()


def test_a_stopped_node_reads_as_stopped_under_the_logs_word() -> None:
    assert describe_event({"event": "node-stopped", "node": "a"}) == "a stopped"


def test_event_lines_are_readable() -> None:
    assert describe_event(
        {"event": "lost-leadership", "node": "a", "token": 3, "reason": "lease-expired"}
    ) == "a lost leadership (token 3): lease-expired"
    assert describe_event(
        {"event": "became-leader", "node": "a", "token": 1, "previous_node": None, "cursor": "0"}
    ) == "a became leader with token 1 (first leader of the job); resumes at cursor 0"
    assert normalise_url("127.0.0.1:9000") == "ws://127.0.0.1:9000/"


def test_watch_cli_needs_a_url_and_exits_cleanly_after_duration() -> None:
    cmd = [sys.executable, "-m", "ingestion", "watch"]
    no_url = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert no_url.returncode == 2 and "URL" in no_url.stderr
    port = closed_port()
    timed = subprocess.run(
        [*cmd, "--lines", "--duration", "0.5", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert timed.returncode == 0, timed.stderr
    assert f"ws://127.0.0.1:{port}/: unreachable (" in timed.stdout
    assert "connection refused); retrying" in timed.stdout


def test_view_of_nodes_hosting_several_jobs_says_who_leads_which() -> None:
    view = WatchScreen.of(["ws://a", "ws://b"])
    for url, node in (("ws://a", "a"), ("ws://b", "b")):
        view.connected(url)
        for job in ("j1", "j2", "j3"):
            leads = (node == "a" and job in ("j1", "j2")) or (node == "b" and job == "j3")
            view.message(url, {"type": "status", "node": node, "job": job,
                               "role": "leader" if leads else "standby", "token": 1})  # fmt: skip
    assert view.summary() == "cluster  a leads 2 (j1, j2) | b leads 1 (j3) | unled: none"
    view.message("ws://b", {"type": "status", "node": "b", "job": "j1", "role": "leader", "token": 2})
    assert view.summary().endswith("| TWO LEADERS: j1: a and b")
    view.message("ws://a", {"type": "status", "node": "a", "job": "j2", "role": "standby"})
    assert "unled: j2" in view.summary()
    table = view.table()
    assert table.splitlines()[2].split()[0] == "job" and len(table.splitlines()) == 3 + 6


def test_the_table_shows_each_leader_s_completeness_watermark_and_a_gap_that_holds_it() -> None:
    """Issue 49: ``complete``, the ledger the leader's status says, ``!`` when a gap holds it."""
    view = WatchScreen.of(["ws://x/", "ws://y/"])
    for url in ("ws://x/", "ws://y/"):
        view.connected(url)
    view.message("ws://x/", {"type": "status", "node": "x", "role": "leader", "token": 1,
                             "complete_through": 4711, "complete_held": ""})  # fmt: skip
    view.message("ws://y/", {"type": "status", "node": "y", "role": "standby", "token": 1,
                             "complete_through": None, "complete_held": ""})  # fmt: skip
    header, x, y = view.table().splitlines()[2:]
    assert header.split()[-2:] == ["complete", "cursor"]
    assert x.split()[-2] == "4711" and y.split()[-2] == "-"
    view.message("ws://x/", {"type": "status", "node": "x", "role": "leader", "token": 1,
                             "complete_through": 4711, "complete_held": "history gap"})  # fmt: skip
    assert view.table().splitlines()[3].split()[-2] == "4711!"
