"""``python -m ingestion watchlist`` as a subprocess against a real redis-server: the edits a
running job's leader applies from its next batch (the set and its version, in one transaction)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis
import trio

from ingestion.events.watch import watch_keys
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import child_env

G1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
G2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"
C1 = "CA3D5KRYM6CB7OWQ6TWYRR3Z4T7GNZLKERYNZGGA5SOAOPIFY6YQGAXE"


async def watchlist(
    redis_url: str, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "ingestion", "watchlist", "--redis", redis_url, *args],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(), stdin=stdin,
        )  # fmt: skip


async def test_add_count_show_remove_and_each_edit_moves_the_version(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    keys = watch_keys(job)
    added = await watchlist(redis_server.url, "add", job, G1, C1)
    assert added.returncode == 0, added.stderr
    assert added.stdout.decode().startswith("2 added (0 unchanged)")
    assert redis_client.get(keys["version"]) == "1"
    listing = tmp_path / "watch.txt"
    listing.write_text(f"# deposit accounts\n{G2}   # the second\n\n{G1}\n")
    more = await watchlist(redis_server.url, "add", job, "--file", str(listing))
    assert more.returncode == 0, more.stderr
    assert more.stdout.decode().startswith("1 added (1 unchanged)")
    assert (await watchlist(redis_server.url, "count", job)).stdout == b"3\n"
    shown = await watchlist(redis_server.url, "show", job)
    assert shown.stdout.decode().split() == sorted([G1, G2, C1])
    removed = await watchlist(redis_server.url, "remove", job, "-", "--file", "-", stdin=f"{C1}\n".encode())
    assert removed.returncode == 2  # "-" is not an address: nothing written
    removed = await watchlist(redis_server.url, "remove", job, "--file", "-", stdin=f"{C1}\n".encode())
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
