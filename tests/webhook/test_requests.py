"""The operators' requests to a webhook job's leader (``ingestion webhooks replay|enable|pause|
resume``), in-process against a real Redis, a real PostgreSQL and a real HTTP receiver: a request
never takes a node down, replays run beside everything else on a short schedule of their own and
honour a pause and a 410, and the command says what came of each request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
import trio

from actors.lease_store import job_keys
from actors.source import SyntheticSource
from ingestion.common.keyspace import webhook_keys
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook import admin
from ingestion.webhook.core import RetrySchedule, parse_secrets
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.support.webhooks import SECRET, at_position, commit_source_records, delivering, seqs, webhook

SLOW = RetrySchedule((60.0,))  # the job's own schedule: a replay must not follow it


def endpoint(client: redis.Redis, job: str) -> dict[str, Any]:
    return admin.status(client, job, f"{job.removesuffix('-hook')}-src", "x")


def operator_requests(client: redis.Redis, job: str) -> list[dict[str, str]]:
    return [f for _id, f in client.xrange(job_keys(job)["audit"]) if f["event"] == "operator-request"]


async def test_a_request_that_fails_is_recorded_done_with_its_error_and_never_served_again(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """A request whose bounds no store can locate raised out of the term and took the node down
    (and every node after it: the request was never marked done). Now it is recorded done with
    its error, delivery goes on, and the next leader does not serve it again."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    src = open_store(redis_server.url, source_job)
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        _hook, a, port = await delivering(nursery, open_store, redis_server.url, job, receiver, 3)
        admin.request_replay(redis_client, hook_job, "not-a-record-id")  # (the command refuses it)
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the request recorded done")  # fmt: skip
        last = endpoint(redis_client, hook_job)["last_request"]
        assert last["action"] == "replay" and "not a paging token" in last["error"], last
        await commit_source_records(src, 4, 5)
        await receiver.wait_for(5, 10)  # delivery went on
        await a.shutdown()
        hook_b, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        b = await start_node(nursery, Recorder(), redis_server.url, hook_job, "b", hook_b)
        await commit_source_records(src, 6, 6)
        await receiver.wait_for(6, 10)
        await trio.sleep(1.5)  # (the leader looks at the requests every second)
        await b.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3, 4, 5, 6]
    asked = operator_requests(redis_client, hook_job)
    assert [(f["action"], f["node"]) for f in asked] == [("replay", "a")]  # served once, by a


async def test_a_request_that_is_not_even_text_is_carried_out(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """``redis-cli`` writes any bytes to the requests stream: a field that is not UTF-8 ended the
    term (and every term after it) before the request was even looked at."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    src = open_store(redis_server.url, source_job)
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        hook, node, _port = await delivering(nursery, open_store, redis_server.url, job, receiver, 2)
        redis_client.xadd(webhook_keys(hook_job)["requests"], {"action": "pause", "by": b"\xff\xfe ops"})
        await wait_until(lambda: hook.stats.state == "paused", 5, what="the pause carried out")
        admin.request_pause(redis_client, hook_job, False)
        await commit_source_records(src, 3, 3)
        await receiver.wait_for(3, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    asked = operator_requests(redis_client, hook_job)[0]
    assert asked["action"] == "pause" and asked["by"] == "\ufffd\ufffd ops"


async def test_a_replay_from_a_time_of_a_postgres_sourced_job_is_refused_not_fatal(
    pg: LocalPostgres, redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """The reproduction: ``replay --from <ISO time>`` on a job whose source writes to PostgreSQL
    raised ValueError in the leader and the node exited. Now the leader refuses it, says why,
    and goes on delivering."""
    from ingestion.postgres.sink import PostgresSink
    from ingestion.webhook.records import PostgresRecords

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    sink = PostgresSink(pg.url, source_job, call_timeout=5)
    src = SyntheticSource(total=None)
    records = [src.record(i) for i in range(1, 11)]
    assert await sink.open_term("a", 1)
    await sink.commit("a", 1, None, records[:5])
    receiver = Receiver(SECRET)
    store = open_store(redis_server.url, hook_job, timeout=1.0)
    rows = PostgresRecords(pg.url, "ingestion", source_job, timeout=2.0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook = WebhookSource(
            job=hook_job, from_job=source_job, from_kind="scheduled", records=rows, store=store,
            url=f"http://127.0.0.1:{port}/in", keys=parse_secrets(SECRET),
            schedule=RetrySchedule((0.05,)), log=structlog.get_logger(),
        )  # fmt: skip
        a = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook, store=store)
        await receiver.wait_for(5, 10)
        admin.request_replay(redis_client, hook_job, admin.replay_bound("2026-12-04T00:00:00Z"))
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the request recorded done")  # fmt: skip
        await sink.commit("a", 1, records[4].paging_token, records[5:])
        await receiver.wait_for(10, 10)
        await a.shutdown()
        nursery.cancel_scope.cancel()
    sink.close()
    rows.close()
    assert seqs(receiver) == list(range(1, 11)) and receiver.duplicates == 0
    last = endpoint(redis_client, hook_job)["last_request"]
    assert "PostgreSQL" in last["refused"] and last["sent"] == 0, last


async def test_a_replayed_record_retries_on_a_short_schedule_of_its_own(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """The job's schedule may wait an hour; a replayed record failed before and an operator is
    watching: its retry comes within seconds (``REPLAY_SCHEDULE``)."""
    hook_job = f"{job}-hook"
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        _hook, node, _ = await delivering(nursery, open_store, redis_server.url, job, receiver, 3,
                                         schedule=SLOW)  # fmt: skip
        posts = receiver.posts
        receiver.fault = Fault(status=503)
        token = SyntheticSource.token_of(2)
        admin.request_replay(redis_client, hook_job, token, token)
        await wait_until(lambda: receiver.posts > posts, 5, what="the replay's first attempt")
        receiver.fault = None
        failed_at = trio.current_time()
        await wait_until(lambda: receiver.duplicates == 1, 5, what="the replayed record's retry")
        retried_after = trio.current_time() - failed_at
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the replay recorded done")  # fmt: skip
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert retried_after < 3.0
    assert endpoint(redis_client, hook_job)["last_replay"]["sent"] == 1


async def test_pause_resume_and_enable_are_served_beside_a_replay_which_honours_them(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """A replay that waits on a failing record held every later request up (one at a time): a
    pause waited for it. Now the pause is carried out at once, and the replay stops there and
    says where; a replay that meets a 410 disables the endpoint and stops (it POSTed to a gone
    endpoint once a record before); an enable is carried out beside it all."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    src = open_store(redis_server.url, source_job)
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        hook, node, _ = await delivering(nursery, open_store, redis_server.url, job, receiver, 5,
                                         schedule=SLOW)  # fmt: skip
        receiver.fault = Fault(status=500)
        posts = receiver.posts
        admin.request_replay(redis_client, hook_job, "0")
        await wait_until(lambda: receiver.posts > posts, 5, what="the replay's first attempt")
        admin.request_pause(redis_client, hook_job, True, by="alice")
        paused_by = trio.current_time() + 3.0
        await wait_until(lambda: redis_client.hget(webhook_keys(hook_job)["endpoint"], "paused") == "1", 3,
                         what="the pause carried out beside the replay")  # fmt: skip
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 3,
                         what="the replay stopped by the pause")  # fmt: skip
        assert trio.current_time() < paused_by
        stopped = endpoint(redis_client, hook_job)["last_replay"]
        assert "paused at record" in stopped["stopped"] and stopped["sent"] == 0, stopped
        # a replay meeting a 410: the endpoint disabled, the replay stopped after one POST
        admin.request_pause(redis_client, hook_job, False)
        await wait_until(lambda: hook.stats.state == "ok", 3, what="resumed")
        receiver.fault = Fault(status=410)
        posts = receiver.posts
        admin.request_replay(redis_client, hook_job, "0")
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the replay stopped by the 410")  # fmt: skip
        gone = endpoint(redis_client, hook_job)
        assert gone["state"] == "disabled" and "410" in gone["last_replay"]["stopped"], gone
        await trio.sleep(0.5)
        assert receiver.posts == posts + 1
        receiver.fault = None
        admin.request_enable(redis_client, hook_job)
        await commit_source_records(src, 6, 6)
        await receiver.wait_for(6, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3, 4, 5, 6]


async def test_an_enable_after_a_410_is_honoured_whatever_the_nodes_wall_clock_said(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The 410 was stamped with the deliverer's wall clock and the enable with another's (or the
    same one after an NTP step back): an enable asked after the 410 was ignored. Both are now
    Redis's clock."""
    from ingestion.webhook import source as source_module

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 3)
    receiver = Receiver(SECRET, fault=Fault(status=410))
    real_now_ms = source_module._now_ms
    monkeypatch.setattr(source_module, "_now_ms", lambda: real_now_ms() + 3_600_000)  # an hour fast
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: hook.stats.state == "disabled", 10, what="the endpoint disabled")
        await wait_until(lambda: redis_client.hget(webhook_keys(hook_job)["endpoint"], "state") == "disabled",
                         5, what="the endpoint disabled in Redis")  # fmt: skip
        monkeypatch.undo()  # the clock stepped back
        receiver.fault = None
        admin.request_enable(redis_client, hook_job)
        await receiver.wait_for(3, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3]


def cli(config: Path | None, *args: str) -> int:
    from ingestion.cli import main

    return main(["webhooks", *args, *(["--config", str(config)] if config else [])])


def config_file(tmp_path: Path, redis_url: str, job: str, **source: str) -> Path:
    path = tmp_path / "config.toml"
    extra = "".join(f'{k} = "{v}"\n' for k, v in source.items())
    path.write_text(
        f'[redis]\nurl = "{redis_url}"\n[jobs.{job}-src]\nkind = "scheduled"\n'
        f'action = "ingestion.jobs:heartbeat"\nperiod_ms = 100\n{extra}[jobs.{job}-hook]\nkind = "webhook"\n'
        f'from = "{job}-src"\nurl = "http://127.0.0.1:9/in"\nsecret = "{SECRET}"\n'
    )
    return path


async def test_the_command_refuses_what_it_can_see_is_refused_and_status_says_every_outcome(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--config`` after the action; ``--to LEDGER`` takes that ledger whole; an inverted span, a
    paused endpoint: refused in one line, exit 2; ``status`` says what came of the last request
    in words, and ``--json`` has it as an object."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    config = config_file(tmp_path, redis_server.url, job)
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        hook, node, port = await delivering(nursery, open_store, redis_server.url, job, receiver, 8)
        # ledgers 3 to 5 (the synthetic record i is in ledger i): three records, 5 included
        assert await trio.to_thread.run_sync(cli, config, "replay", hook_job, "--from", "3", "--to", "5") == 0
        await wait_until(lambda: receiver.duplicates == 3, 5, what="ledgers 3 to 5 replayed")
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the replay recorded done")  # fmt: skip
        capsys.readouterr()
        assert await trio.to_thread.run_sync(cli, config, "replay", hook_job, "--from", "6", "--to", "5") == 2
        assert "--from 6 is after --to 5" in capsys.readouterr().err
        both = ("replay", hook_job, "--dead-letters", "--to", "5")
        assert await trio.to_thread.run_sync(cli, config, *both) == 2
        assert "--dead-letters replays them all" in capsys.readouterr().err  # (not a --to ignored)
        assert await trio.to_thread.run_sync(cli, config, "pause", hook_job) == 0
        await wait_until(lambda: hook.stats.state == "paused", 5, what="paused")
        capsys.readouterr()
        assert await trio.to_thread.run_sync(cli, config, "replay", hook_job, "--dead-letters") == 2
        refused = capsys.readouterr().err
        assert f"{hook_job} is paused: resume it first" in refused and len(refused.splitlines()) == 1
        assert await trio.to_thread.run_sync(cli, config, "status") == 0
        text = capsys.readouterr().out
        assert await trio.to_thread.run_sync(cli, config, "status", "--json") == 0
        (shown,) = json.loads(capsys.readouterr().out)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert receiver.duplicates == 3
    assert shown["last_request"]["action"] == "pause" and shown["last_request"]["by"].startswith("cli ")
    assert (
        shown["last_replay"]["sent"] == 3 and shown["last_replay"]["to"] == f"{(6 << 32) - 1}-{(1 << 32) - 1}"
    )
    assert " pause by cli " in text and "sent 3, failed 0" in text
    # what only the leader can refuse (a replay asked while paused, by another way than this
    # command) is said in words, as are its figures
    admin.request_replay(redis_client, hook_job, dead_letters=True)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "b", hook)
        await wait_until(lambda: endpoint(redis_client, hook_job)["requests_pending"] == 0, 5,
                         what="the replay refused")  # fmt: skip
        await node.shutdown()
        nursery.cancel_scope.cancel()
    capsys.readouterr()
    assert await trio.to_thread.run_sync(cli, config, "status") == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  last request ")]
    assert "replay-dead-letters by cli " in line and "refused: the endpoint is paused" in line, line


async def test_the_command_finds_webhook_jobs_in_redis_where_no_configuration_names_them(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``webhooks --redis URL status`` where there is no configuration said there was no webhook
    job although that Redis held one; and ``--redis`` is taken after the action too."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as nursery:
        _hook, node, port = await delivering(nursery, open_store, redis_server.url, job, receiver, 2)
        await at_position(redis_client, hook_job, 2)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    monkeypatch.chdir(tmp_path)  # no config.toml here
    capsys.readouterr()
    assert await trio.to_thread.run_sync(cli, None, "--redis", redis_server.url, "status", "--json") == 0
    shown = {s["job"]: s for s in json.loads(capsys.readouterr().out)}
    assert shown[hook_job]["from"] == source_job and shown[hook_job]["url"] == f"http://127.0.0.1:{port}/..."
    assert shown[hook_job]["undelivered"] == 0
    assert await trio.to_thread.run_sync(cli, None, "status", "--redis", redis_server.url) == 0
    assert f"{hook_job}: idle -> http://127.0.0.1:{port}/..." in capsys.readouterr().out
    assert await trio.to_thread.run_sync(cli, None, "pause", hook_job, "--redis", redis_server.url) == 0
    asked = redis_client.xrange(webhook_keys(hook_job)["requests"])
    assert [f["action"] for _id, f in asked] == ["pause"]
    assert await trio.to_thread.run_sync(cli, None, "pause", "nosuch", "--redis", redis_server.url) == 2
    assert "'nosuch' is not a webhook job here" in capsys.readouterr().err


async def test_postgres_sourced_replays_from_a_time_are_refused_by_the_command(
    redis_server: LocalRedis, job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, redis_server.url, job, sink="postgresql://127.0.0.1:9/none")
    assert await trio.to_thread.run_sync(
        cli, config, "replay", f"{job}-hook", "--from", "2026-12-04T00:00:00Z"
    ) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--from TIME needs the source job's Redis stream" in err and len(err.splitlines()) == 1
