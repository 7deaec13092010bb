"""``python -m ingestion watchlist`` as a subprocess against a real redis-server: the edits a
running job's leader applies from its next batch (the set and its version, in one transaction)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis
import trio

from actors.lease_store import job_keys
from ingestion.common.keyspace import watch_keys
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import child_env

G1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
G2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"
C1 = "CA3D5KRYM6CB7OWQ6TWYRR3Z4T7GNZLKERYNZGGA5SOAOPIFY6YQGAXE"


async def watchlist(
    redis_url: str, *args: str, stdin: bytes | None = None, config: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return await ingestion("watchlist", "--redis", redis_url, *args, stdin=stdin, config=config)


async def ingestion(
    *args: str, stdin: bytes | None = None, config: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    more = ["--config", str(config)] if config is not None else []  # (before a command's action)
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "ingestion", args[0], *more, *args[1:]],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(), stdin=stdin,
        )  # fmt: skip


def watch_set_config(path: Path, *jobs: str) -> Path:
    """A config.toml of rpc jobs ``jobs``, each watching its Redis set."""
    path.write_text("".join(f'[jobs."{job}"]\nkind = "rpc"\nwatch_set = true\n\n' for job in jobs))
    return path


async def test_add_count_show_remove_and_each_edit_moves_the_version(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    keys = watch_keys(job)
    cfg = watch_set_config(tmp_path / "config.toml", job)
    added = await watchlist(redis_server.url, "add", job, G1, C1, config=cfg)
    assert added.returncode == 0, added.stderr
    assert added.stdout.decode().startswith("2 added (0 unchanged)")
    assert redis_client.get(keys["version"]) == "1"
    listing = tmp_path / "watch.txt"
    listing.write_text(f"# deposit accounts\n{G2}   # the second\n\n{G1}\n")
    more = await watchlist(redis_server.url, "add", job, "--file", str(listing), config=cfg)
    assert more.returncode == 0, more.stderr
    assert more.stdout.decode().startswith("1 added (1 unchanged)")
    assert (await watchlist(redis_server.url, "count", job, config=cfg)).stdout == b"3\n"
    shown = await watchlist(redis_server.url, "show", job, config=cfg)
    assert shown.stdout.decode().split() == sorted([G1, G2, C1])
    removed = await watchlist(
        redis_server.url, "remove", job, "-", "--file", "-", stdin=f"{C1}\n".encode(), config=cfg
    )
    assert removed.returncode == 2  # "-" is not an address: nothing written
    removed = await watchlist(
        redis_server.url, "remove", job, "--file", "-", stdin=f"{C1}\n".encode(), config=cfg
    )
    assert removed.returncode == 0, removed.stderr
    assert redis_client.smembers(keys["watch"]) == {G1, G2}
    assert redis_client.get(keys["version"]) == "3"


async def test_a_mistyped_address_is_named_and_nothing_is_written(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis
) -> None:
    typo = G2[:-1] + ("A" if G2[-1] != "A" else "B")  # its checksum no longer holds
    done = await watchlist(redis_server.url, "add", job, G1, typo)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "argument" in err and typo[:8] in err and "Traceback" not in err
    assert redis_client.exists(*watch_keys(job).values()) == 0


async def test_an_unreachable_redis_is_one_line_and_exit_1(job: str) -> None:
    done = await watchlist("redis://127.0.0.1:1/0", "count", job)
    assert done.returncode == 1 and "Traceback" not in done.stderr.decode()
    assert len(done.stderr.decode().strip().splitlines()) == 1


async def test_a_mistyped_job_is_refused_with_the_known_names_and_leaves_no_job_behind(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """``watchlist add nosuch G...`` used to answer "1 added ... nosuch watches 1", and ``remove``
    left ``ingestion:{nosuch}:watch:version``, which inspect and the console then listed as a job
    without a leader. Every command that names a job refuses it, in one line naming the known jobs
    (the configuration's and this Redis's), with nothing written."""
    cfg = watch_set_config(tmp_path / "config.toml", f"{job}-deposits")
    elected = f"{job}-elected"
    redis_client.set(job_keys(elected)["token"], 3)  # a job this Redis knows (elected once)
    typo = f"{job}-nosuch"
    try:
        for args in (("add", typo, G1), ("remove", typo, G1), ("count", typo), ("show", typo)):
            done = await watchlist(redis_server.url, *args, config=cfg)
            line = done.stderr.decode().strip()
            assert done.returncode == 2 and len(line.splitlines()) == 1 and not done.stdout, (args, done)
            assert f"watchlist {args[0]}: no job '{typo}' in this configuration or this Redis" in line, line
            assert f"{job}-deposits" in line and elected in line, line
        handover = await ingestion("handover", typo, "--redis", redis_server.url, config=cfg)
        line = handover.stderr.decode().strip()
        assert handover.returncode == 2 and f"handover: no job '{typo}'" in line and elected in line, line
        inspected = await ingestion("inspect", "--job", typo, "--redis", redis_server.url, config=cfg)
        line = inspected.stderr.decode().strip()
        assert inspected.returncode == 2 and "jobs there: " in line and elected in line, line
        assert list(redis_client.scan_iter(match=f"ingestion:{{{typo}}}*")) == []
        listed = await ingestion("inspect", "--json", "--redis", redis_server.url, config=cfg)
        assert typo not in {d["job"] for d in json.loads(listed.stdout)}, listed.stdout
        # the configured job is accepted before any node ran it
        added = await watchlist(redis_server.url, "add", f"{job}-deposits", G1, config=cfg)
        assert added.returncode == 0 and added.stdout.decode().startswith("1 added"), added
    finally:
        redis_client.delete(job_keys(elected)["token"], *watch_keys(f"{job}-deposits").values())
