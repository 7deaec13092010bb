"""The node's token memory on disk (``actors/token_memory.py``): the token floor is shared by
every deployment's file of a job (a URL spelled otherwise is still the same Redis), the commit
flag is not; writes are bounded (a lock held elsewhere or a hung disk never blocks an actor) and
the values in memory never go down."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import trio

from actors.source import SyntheticSource
from actors.token_memory import TokenMemory
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import Recorder, start_node


@contextlib.contextmanager
def locked(memory: TokenMemory) -> Iterator[None]:
    """Hold the memory's file lock, as another node on this host stuck in a write would."""
    assert memory.path is not None
    with open(memory.path.with_suffix(".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def test_the_token_floor_is_the_highest_of_every_deployment_file_and_the_legacy_one(
    tmp_path: Path,
) -> None:
    by_name = TokenMemory("j", tmp_path, deployment="redis:redis-1:6379/0")
    assert by_name.raise_to(9) and by_name.saw_commit()
    by_ip = TokenMemory("j", tmp_path, deployment="redis:10.0.0.5:6379/0")  # the same Redis
    assert by_ip.value == 9
    assert not by_ip.committed  # a commit is known only for the deployment that showed it
    (tmp_path / "j.token").write_text("12\n")  # from before deployments were named
    assert TokenMemory("j", tmp_path, deployment="sentinel:s:26379/m/0").value == 12
    assert TokenMemory("other", tmp_path, deployment="redis:redis-1:6379/0").value == 0
    assert TokenMemory("j", tmp_path, deployment="redis:redis-1:6379/0").committed


def test_a_file_of_another_deployment_that_names_another_job_is_refused(tmp_path: Path) -> None:
    TokenMemory("j", tmp_path, deployment="redis:a:1/0").raise_to(3)
    name = next(tmp_path.glob("j@*.token"))
    name.write_text('{"job": "k", "deployment": "redis:a:1/0", "token": 3, "committed": false}\n')
    with pytest.raises(ValueError, match="does not hold a fencing token of job 'j'"):
        TokenMemory("j", tmp_path, deployment="redis:b:1/0")


async def test_a_write_while_another_process_holds_the_lock_gives_up_within_its_bound(
    tmp_path: Path,
) -> None:
    memory = TokenMemory("j", tmp_path, deployment="redis:a:1/0")
    memory.write_timeout = 0.3
    with locked(memory):
        started = trio.current_time()
        with pytest.raises(TimeoutError):
            await memory.bounded(functools.partial(memory.raise_to, 5))
        assert trio.current_time() - started < 1.0
    assert memory.value == 0
    assert await memory.bounded(functools.partial(memory.raise_to, 5))
    assert memory.value == 5


def test_concurrent_writes_never_lower_the_values_in_memory(tmp_path: Path) -> None:
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the two threads as much as possible
    try:
        for round_ in range(150):
            memory = TokenMemory(f"j{round_}", tmp_path, deployment="redis:a:1/0")
            memory.raise_to(1)
            go = threading.Barrier(2)

            def raise_it(m: TokenMemory = memory, b: threading.Barrier = go) -> None:
                b.wait()
                m.raise_to(5)

            def commit_it(m: TokenMemory = memory, b: threading.Barrier = go) -> None:
                b.wait()
                m.saw_commit()

            threads = [threading.Thread(target=raise_it), threading.Thread(target=commit_it)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert (memory.value, memory.committed) == (5, True), f"round {round_}"
    finally:
        sys.setswitchinterval(switch)


async def test_a_node_whose_token_memory_is_locked_elsewhere_still_leads_and_commits(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, tmp_path: Path
) -> None:
    """The memory is an extra floor, not the guarantee: a write that cannot take the lock is
    logged (token-memory-failed) and the node goes on; it never hangs an actor."""
    state = tmp_path / "state"
    memory = TokenMemory(job, state, deployment=f"redis:127.0.0.1:{redis_server.port}/0")
    rec = Recorder()
    with locked(memory):
        async with trio.open_nursery() as nursery:
            node = await start_node(
                nursery, rec, redis_server.url, job, "a",
                SyntheticSource(total=None, batch_size=5, interval=0.05), state_dir=str(state),
            )  # fmt: skip
            with trio.fail_after(10):
                await rec.wait_for("committed", "a", count=3)
            await node.shutdown()
