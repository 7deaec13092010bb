"""The Sentinel harness itself, with redis-py's Sentinel client: the tests below rely on it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import trio
from redis.sentinel import Sentinel

from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.redis_ha import SERVICE, SentinelGroup
from tests.support.ports import closed_port


@pytest.mark.slow
def test_planned_failover_and_kill_move_the_primary_and_master_for_follows(
    sentinel_group: SentinelGroup,
) -> None:
    g = sentinel_group
    sentinel = Sentinel([("127.0.0.1", s.port) for s in g.sentinels], socket_timeout=1.0)
    client = sentinel.master_for(SERVICE, socket_timeout=1.0, decode_responses=True)
    client.set("k", "1")
    first = g.primary()
    g.failover()
    second = g.wait_for_new_primary(first.port)
    g.wait_is_replica(first)
    for _ in range(50):  # the first call after a switch may meet the demoted primary once
        try:
            client.set("k", "2")
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    assert g.client(second).get("k") == "2"
    killed_at = time.monotonic()
    g.kill(second)
    third = g.wait_for_new_primary(second.port)
    print(f"\nSIGKILL to a promoted replica: {time.monotonic() - killed_at:.2f} s")
    for _ in range(50):  # master_for follows the second promotion too
        try:
            client.set("k", "3")
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    assert g.client(third).get("k") == "3"
    g.restart(second)
    g.wait_is_replica(second)
    client.close()


def _node(url: str, job: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "ingestion", "--node-id", "n1", "--job", job, "--redis", url,
        "--horizon", "http://127.0.0.1:9/", "--log-format", "json", *extra,
    ]  # fmt: skip


def test_a_sentinel_url_naming_an_unknown_service_exits_2_with_one_line(
    job: str, tmp_path: Path
) -> None:
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"sentinel monitor other 127.0.0.1 {closed_port()} 1\n")
    sentinel = LocalRedis(directory=tmp_path, config_file=conf, extra_args=("--sentinel",)).start()
    try:
        done = subprocess.run(
            _node(f"redis+sentinel://u:s3cret@127.0.0.1:{sentinel.port}/ingest", job),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    finally:
        sentinel.stop()
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ingestion: configuration error: redis.url: no sentinel at 127.0.0.1:{sentinel.port} "
        "monitors a service named 'ingest' (they monitor: other)"
    ]
    assert "s3cret" not in done.stdout + done.stderr


async def test_unreachable_sentinels_make_the_node_wait_without_leading(job: str) -> None:
    ports = [closed_port(), closed_port()]
    url = f"redis+sentinel://u:s3cret@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/ingest"
    process = await trio.lowlevel.open_process(
        _node(url, job), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert process.stdout is not None
    lines: list[dict[str, object]] = []
    buffer = b""
    with trio.move_on_after(4):
        while True:
            chunk = await process.stdout.receive_some()
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines += [json.loads(x) for x in complete if x.startswith(b"{")]
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await process.wait() == 0
    events = [e["event"] for e in lines]
    assert "became-leader" not in events
    waits = [e for e in lines if e["event"] == "redis-unavailable"]
    assert len(waits) >= 2, events  # it keeps trying, with backoff
    error = str(waits[0]["error"])
    assert f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/ingest" in error and "s3cret" not in error
    assert "no sentinel named a primary" in error
