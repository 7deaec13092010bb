"""``python -m ingestion tail`` as a subprocess against a real redis-server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import redis
import trio

from actors.lease_store import Acquired, LeaseStore, connect, job_keys
from actors.source import Record
from ingestion.cli.tail import one_line
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import child_env, wait_until


def body(i: int) -> str:
    # Pretty-printed, as Horizon sends its records.
    return json.dumps(
        {"id": str(i << 32), "paging_token": str(i << 32), "type": "payment", "memo": "a\nb {x}"},
        indent=2,
    )


class Writer:
    def __init__(self, url: str, job: str) -> None:
        self.store = LeaseStore(connect(url, timeout=2.0), job)
        self.cursor: str | None = None
        self.next = 1

    async def commit(self, count: int) -> None:
        if self.cursor is None:
            grant = await self.store.acquire("writer", 60_000)
            assert isinstance(grant, Acquired)
        records = [Record(str(i << 32), body(i)) for i in range(self.next, self.next + count)]
        await self.store.commit("writer", 1, self.cursor, records)
        self.cursor, self.next = records[-1].paging_token, self.next + count


async def tail(*args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "ingestion", "tail", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(),
        )  # fmt: skip


def numbers(stdout: bytes) -> list[int]:
    return [int(json.loads(line)["paging_token"]) >> 32 for line in stdout.decode().splitlines()]


def test_one_line_removes_only_the_breaks_between_tokens() -> None:
    text = body(7)
    assert "\n" in text
    line = one_line(text)
    assert "\n" not in line and json.loads(line) == json.loads(text)
    assert '"memo": "a\\nb {x}"' in line  # the escaped break inside the string is untouched


async def test_from_zero_with_count_prints_the_first_records_in_order(
    redis_server: LocalRedis, job: str
) -> None:
    w = Writer(redis_server.url, job)
    await w.commit(12)
    done = await tail("--redis", redis_server.url, "--job", job, "--from", "0", "--count", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert numbers(done.stdout) == [1, 2, 3, 4, 5]
    assert json.loads(lines[0]) == json.loads(body(1))  # the record as Horizon sent it


async def test_a_group_prints_each_record_once_across_restarts_and_acknowledges(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis
) -> None:
    w = Writer(redis_server.url, job)
    await w.commit(10)
    common = ("--redis", redis_server.url, "--job", job, "--group", "billing")
    first = await tail(*common, "--count", "4")
    second = await tail(*common, "--count", "4")
    await w.commit(5)
    third = await tail(*common, "--count", "7")
    for done in (first, second, third):
        assert done.returncode == 0, done.stderr
    assert numbers(first.stdout) + numbers(second.stdout) + numbers(third.stdout) == list(range(1, 16))
    key = job_keys(job)["events"]
    assert redis_client.xpending(key, "billing")["pending"] == 0
    assert redis_client.xinfo_groups(key)[0]["lag"] == 0


async def test_a_group_first_prints_what_its_consumer_left_unacknowledged(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis
) -> None:
    w = Writer(redis_server.url, job)
    await w.commit(6)
    key = job_keys(job)["events"]
    redis_client.xgroup_create(key, "g", id="0")
    # A tail that printed 1..3 and was killed before acknowledging them.
    redis_client.xreadgroup("g", "tail", {key: ">"}, count=3)
    done = await tail("--redis", redis_server.url, "--job", job, "--group", "g", "--count", "6")
    assert done.returncode == 0, done.stderr
    assert numbers(done.stdout) == [1, 2, 3, 4, 5, 6]
    assert redis_client.xpending(key, "g")["pending"] == 0


class Follower:
    """A ``tail`` that keeps running: its output read line by line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = b""

    async def numbers(self, count: int, within: float = 15.0) -> list[int]:
        assert self.proc.stdout is not None
        with trio.fail_after(within):
            while self.buffer.count(b"\n") < count:
                chunk = await self.proc.stdout.receive_some()
                assert chunk, "tail exited"
                self.buffer += chunk
        lines = self.buffer.split(b"\n")
        self.buffer = b"\n".join(lines[count:])
        return numbers(b"\n".join(lines[:count]))

    async def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        with trio.fail_after(10):
            return await self.proc.wait()


async def follow(*args: str) -> Follower:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ingestion", "tail", *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(),
    )  # fmt: skip
    return Follower(proc)


def client_ids(url: str) -> set[str]:
    """The ids of the clients connected to this Redis now."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {c["id"] for c in client.client_list()}
    finally:
        client.close()


async def blocked_in_xread(url: str, before: set[str], within: float = 15.0) -> None:
    """Until a client of this Redis that was not connected ``before`` (the follower's: other
    tests' clients may be there too) is blocked (flag ``b``) in an XREAD."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        await wait_until(
            lambda: any(
                c["id"] not in before and c.get("cmd") == "xread" and "b" in c.get("flags", "")
                for c in client.client_list()
            ),
            within,
            what="the follower blocked in XREAD",
        )
    finally:
        client.close()


async def test_follows_new_records_live_until_sigint(redis_server: LocalRedis, job: str) -> None:
    w = Writer(redis_server.url, job)
    await w.commit(3)
    before = client_ids(redis_server.url)
    follower = await follow("--redis", redis_server.url, "--job", job)
    try:
        await blocked_in_xread(redis_server.url, before)  # started, at "$": the three are not printed
        await w.commit(4)
        assert await follower.numbers(4) == [4, 5, 6, 7]
        assert await follower.stop(signal.SIGINT) == 0
    finally:
        follower.proc.kill()


async def test_sigterm_stops_a_follower_with_status_zero(redis_server: LocalRedis, job: str) -> None:
    w = Writer(redis_server.url, job)
    await w.commit(1)
    follower = await follow("--redis", redis_server.url, "--job", job, "--group", "g")
    try:
        assert await follower.numbers(1) == [1]
        assert await follower.stop(signal.SIGTERM) == 0
    finally:
        follower.proc.kill()


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (("--job", "no-such-job-anywhere"), 2, "no job 'no-such-job-anywhere'"),
        (("--from", "yesterday"), 2, "--from: must be 0, $ or a stream entry id"),
        (("--count", "0"), 2, "--count: must be positive"),
        (("--consumer", "x"), 2, "--consumer: only with --group"),
    ],
)
async def test_usage_errors_are_one_line_and_exit_2(
    redis_server: LocalRedis, job: str, args: tuple[str, ...], status: int, says: str
) -> None:
    await Writer(redis_server.url, job).commit(1)
    done = await tail("--redis", redis_server.url, "--job", job, *args)
    assert done.returncode == status
    err = done.stderr.decode().strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert done.stdout == b""


async def test_an_unreachable_redis_is_one_line_and_exit_1(job: str) -> None:
    done = await tail("--redis", "redis://:secret@127.0.0.1:1/0", "--job", job)
    assert done.returncode == 1
    err = done.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "127.0.0.1:1" in err and "secret" not in err, err


async def test_transfers_prints_one_line_per_transfer_and_skips_what_moves_nothing(
    redis_server: LocalRedis, job: str
) -> None:
    """``--transfers``: each record's transfer view (the events stage's, from a real payment
    record) as a tab-separated line; records that move nothing are skipped and not counted."""
    from ingestion.decode.payments import payment_record_text

    g1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
    g2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"

    def payment(i: int, amount: str) -> str:
        record = {"id": str(i << 32), "paging_token": str(i << 32), "type": "payment",
                  "transaction_successful": True, "from": g1, "to": g2, "amount": amount,
                  "asset_type": "credit_alphanum4", "asset_code": "USDC", "asset_issuer": g1,
                  "to_muxed_id": "7"}  # fmt: skip
        return payment_record_text(json.dumps(record, separators=(",", ":")))[0]

    def other(i: int) -> str:
        record = {"id": str(i << 32), "paging_token": str(i << 32), "type": "set_options"}
        return payment_record_text(json.dumps(record, separators=(",", ":")))[0]

    store = LeaseStore(connect(redis_server.url, timeout=2.0), job)
    assert isinstance(await store.acquire("writer", 60_000), Acquired)
    bodies = [payment(1, "1.5000000"), other(2), payment(3, "0.0000001")]
    await store.commit("writer", 1, None, [Record(str(i << 32), b) for i, b in enumerate(bodies, 1)])
    done = await tail("--redis", redis_server.url, "--job", job, "--from", "0", "--count", "2", "--transfers")
    assert done.returncode == 0, done.stderr
    lines = [line.split("\t") for line in done.stdout.decode().splitlines()]
    assert lines == [
        [str(1 << 32), "transfer", "15000000", f"USDC:{g1}", g1, g2, "7"],
        [str(3 << 32), "transfer", "1", f"USDC:{g1}", g1, g2, "7"],
    ]


async def test_transfers_of_a_webhook_jobs_dead_letters_are_those_of_the_records_they_name(
    redis_server: LocalRedis, job: str
) -> None:
    """A dead letter keeps the record it names under ``record`` (with ``webhook_id``, the
    attempts, ...): ``--transfers`` on the webhook job's stream shows that record's transfer."""
    from ingestion.decode.payments import payment_record_text
    from ingestion.webhook.records import Stored
    from ingestion.webhook.source import Unit, _commit_batch

    g1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
    g2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"
    record = {"id": str(5 << 32), "paging_token": str(5 << 32), "type": "payment",
              "transaction_successful": True, "from": g1, "to": g2, "amount": "2.5000000",
              "asset_type": "native"}  # fmt: skip
    body = payment_record_text(json.dumps(record, separators=(",", ":")))[0]
    stored = Stored("1-1", 1, Record(str(5 << 32), body))
    letter = _commit_batch([(Unit((stored,), f"src:{5 << 32}", b""), "dead", {"attempts": 8, "status": 500})])
    store = LeaseStore(connect(redis_server.url, timeout=2.0), job)
    assert isinstance(await store.acquire("writer", 60_000), Acquired)
    await store.commit("writer", 1, None, list(letter.records))
    done = await tail("--redis", redis_server.url, "--job", job, "--from", "0", "--count", "1", "--transfers")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\t") == [str(5 << 32), "transfer", "25000000", "native", g1, g2, "-\n"]
