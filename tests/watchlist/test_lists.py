"""Watch lists: the strkey rules (checked against stellar-sdk), matching (muxed included), the file
source's reloads and refusals, and the Redis set source and the operator's edits on a real Redis."""

from __future__ import annotations

import base64
import binascii
import math
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from stellar_sdk import MuxedAccount
from stellar_sdk.strkey import StrKey
from structlog.testing import capture_logs

from actors.lease_store import connect
from ingestion.common.keyspace import watch_keys
from ingestion.testing.local_redis import LocalRedis
from ingestion.watchlist import addresses
from ingestion.watchlist.addresses import (
    InvalidAddress,
    account_of_muxed,
    address_problem,
    is_address,
    valid_entries,
)
from ingestion.watchlist.edits import EDIT_CHUNK, RedisWatch, add, members_count, remove
from ingestion.watchlist.lists import FileWatch, InlineWatch, WatchFileError, WatchList, WatchUnavailable

# Seeded, not os.urandom: parametrized ids hold addresses, and every xdist worker must collect the
# same ones
_RANDOM = random.Random(20261204)


def _bytes(n: int) -> bytes:
    return _RANDOM.randbytes(n)


def accounts(n: int) -> list[str]:
    return [StrKey.encode_ed25519_public_key(_bytes(32)) for _ in range(n)]


G1, G2, G3 = accounts(3)
C1 = StrKey.encode_contract(_bytes(32))
M1 = MuxedAccount(G1, 42).account_muxed
M2 = MuxedAccount(G2, 2**64 - 1).account_muxed
B1 = StrKey.encode_claimable_balance(b"\x00" + _bytes(32))
L1 = StrKey.encode_liquidity_pool(_bytes(32))


def strkey(version: int, payload: bytes) -> str:
    """A strkey with a correct checksum for any version byte (to test the version check alone)."""
    body = bytes([version]) + payload
    return base64.b32encode(body + binascii.crc_hqx(body, 0).to_bytes(2, "little")).decode().rstrip("=")


def test_every_kind_of_address_is_accepted_as_stellar_sdk_accepts_it() -> None:
    for _ in range(200):
        made = [
            StrKey.encode_ed25519_public_key(_bytes(32)), StrKey.encode_contract(_bytes(32)),
            StrKey.encode_med25519_public_key(_bytes(40)), StrKey.encode_liquidity_pool(_bytes(32)),
            StrKey.encode_claimable_balance(_bytes(33)),
        ]  # fmt: skip
        for address in made:
            assert is_address(address) and address_problem(address) is None, address
        assert valid_entries(made) == made


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (G1[:-1] + ("A" if G1[-1] != "A" else "B"), "checksum"),
        (G1[:10] + ("A" if G1[10] != "A" else "B") + G1[11:], "checksum"),
        (G1[:-1], "has 55 characters; an account address (G...) has 56"),
        (G1 + "A", "has 57 characters"),
        (M1[:56], "has 56 characters; a muxed account address"),
        (G1.lower(), "not a G, C, M, B or L"),
        ("G" + G1[1:].lower(), "not base32"),
        (G1[:5] + "1" + G1[6:], "not base32"),
        (G1[:5] + " " + G1[6:], "not base32"),
        (G1[:5] + "_" + G1[6:], "not base32"),
        (G1[:5] + "É" + G1[6:], "not base32"),
        (strkey(6 << 3 | 1, _bytes(32)), "wrong version byte for an account address"),
        (StrKey.encode_ed25519_secret_seed(_bytes(32)), "not a G, C, M, B or L"),
        (StrKey.encode_pre_auth_tx(_bytes(32)), "not a G, C, M, B or L"),
        ("", "not a G, C, M, B or L"),
        (f" {G1}"[:56], "not a G, C, M, B or L"),
    ],
)
def test_invalid_entries_are_refused_and_the_reason_named(entry: str, says: str) -> None:
    assert not is_address(entry)
    problem = address_problem(entry)
    assert problem is not None and says in problem
    with pytest.raises(InvalidAddress, match="watch\\[1\\]"):
        InlineWatch([G1, entry])
    assert valid_entries([G2, entry, G3]) == [G2, G3]


def test_a_muxed_address_with_nonzero_padding_bits_is_refused() -> None:
    # 69 characters carry 345 bits for 344: the last one must be zero, or two spellings would exist
    value = int(M1.encode().translate(addresses._TO_DIGITS), 32) | 1
    digits = "".join("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[(value >> (5 * i)) & 31] for i in reversed(range(69)))
    assert digits != M1 and not is_address(digits)
    assert not StrKey.is_valid_med25519_public_key(digits)


def test_a_bulk_chunk_with_one_bad_entry_keeps_the_rest() -> None:
    good = [*accounts(300), C1, L1]
    bad = good[7][:-1] + ("A" if good[7][-1] != "A" else "B")
    skipped = addresses.Skipped()
    assert valid_entries([*good[:7], bad, *good[8:]], skipped) == good[:7] + good[8:]
    assert skipped.count == 1 and skipped.examples == [bad]


def test_matches_a_watched_address_among_those_a_record_names() -> None:
    wl = WatchList.of([G1, C1])
    assert wl.matches((G3, G1)) and wl.matches([C1]) and wl.matches(iter([G2, C1]))
    assert not wl.matches((G2, G3)) and not wl.matches(()) and not wl.matches(("", "x"))
    assert G1 in wl and len(wl) == 2 and repr(wl) == "WatchList(2 addresses)"


def test_a_muxed_address_matches_when_it_or_its_account_is_watched() -> None:
    assert account_of_muxed(M1) == G1 and account_of_muxed(M2) == G2
    assert account_of_muxed(G1) is None and account_of_muxed("M" + G1[1:]) is None
    assert WatchList.of([G1]).matches((G3, M1))  # its G account is watched
    assert WatchList.of([M1]).matches((M1,))  # the M itself
    assert not WatchList.of([M1]).matches((G1,))  # watching one muxed id is not watching the account
    assert not WatchList.of([G1]).matches((M2, G3))
    assert not WatchList.of([MuxedAccount(G1, 7).account_muxed]).matches((M1,))


def test_of_refuses_an_invalid_entry() -> None:
    with pytest.raises(InvalidAddress, match="checksum"):
        WatchList.of([G1, G2[:-1] + ("A" if G2[-1] != "A" else "B")])


async def test_inline_list_is_given_as_is() -> None:
    source = InlineWatch([G1, M1])
    wl = await source.current()
    assert wl.addresses == {G1, M1} and await source.current() is wl
    assert "2 addresses" in source.describe()


# -- the file source


def write(path: Path, text: str) -> None:
    path.write_text(text)
    stat = path.stat()  # a rewrite within the clock's tick still differs: move mtime on explicitly
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


async def test_file_is_read_without_comments_and_blank_lines_and_reloaded_on_change(tmp_path: Path) -> None:
    path = tmp_path / "watch.txt"
    write(path, f"# treasury\n{G1}\n\n  {C1}   # the pool contract\n")
    source = FileWatch.open(path)
    first = await source.current()
    assert first.addresses == {G1, C1} and await source.current() is first
    del first
    write(path, f"{G2}\n{M1}\n")
    second = await source.current()
    assert second.addresses == {G2, M1}
    assert source.statistics().loads == 2 and source.statistics().entries == 2
    os.replace(_written(tmp_path / "new.txt", f"{G3}\n"), path)  # an editor's write-and-rename
    assert (await source.current()).addresses == {G3}


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_an_invalid_line_at_start_up_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "watch.txt"
    path.write_text(f"{G1}\n# ok\n\n{G2[:-1]}\n")
    with pytest.raises(WatchFileError, match=rf"{path}:4: .*has 55 characters"):
        FileWatch.open(path)
    with pytest.raises(WatchFileError, match="cannot read"):
        FileWatch.open(tmp_path / "absent.txt")


async def test_an_invalid_line_on_reload_keeps_the_list_and_is_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "watch.txt"
    write(path, f"{G1}\n")
    source = FileWatch.open(path)
    kept = await source.current()
    write(path, f"{G2}\nnot-an-address\n")
    with capture_logs() as logs:
        assert await source.current() is kept
        assert await source.current() is kept
    unusable = [e for e in logs if e["event"] == "watch-file-unusable"]
    assert len(unusable) == 1 and f"{path}:2:" in unusable[0]["error"]
    assert source.statistics().problem is not None and f"{path}:2:" in source.statistics().problem
    write(path, f"{G2}\n")  # fixed: the next check loads it
    assert (await source.current()).addresses == {G2}
    assert source.statistics().problem is None


async def test_a_vanished_file_keeps_the_list(tmp_path: Path) -> None:
    path = tmp_path / "watch.txt"
    write(path, f"{G1}\n")
    source = FileWatch.open(path)
    kept = await source.current()
    path.unlink()
    with capture_logs() as logs:
        assert await source.current() is kept
    assert [e["event"] for e in logs] == ["watch-file-unusable"]


async def test_a_large_file_reloads_in_bulk(tmp_path: Path) -> None:
    listed = accounts(25_000)  # 1.4 MB: two windows of FILE_WINDOW
    path = tmp_path / "watch.txt"
    write(path, "\n".join(listed) + "\n")
    source = FileWatch.open(path)
    assert (await source.current()).addresses == set(listed)
    write(path, "\n".join([*listed[:20_000], M1, B1]) + "\n")
    assert (await source.current()).addresses == {*listed[:20_000], M1, B1}


async def test_a_bad_line_far_into_a_large_file_is_named_and_keeps_the_list(tmp_path: Path) -> None:
    listed = accounts(25_000)
    path = tmp_path / "watch.txt"
    write(path, "\n".join(listed) + "\n")
    source = FileWatch.open(path)
    kept = await source.current()
    wrong = listed[23_456][:-1] + ("A" if listed[23_456][-1] != "A" else "B")
    write(path, "# header\n\n" + "\n".join([*listed[:23_456], wrong, *listed[23_457:]]) + "\n")
    with capture_logs() as logs:
        assert await source.current() is kept
    unusable = next(e for e in logs if e["event"] == "watch-file-unusable")
    assert unusable["error"] == f"{path}:23459: {address_problem(wrong)}" and "checksum" in unusable["error"]


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        (f"{G1}\r\n{C1}\r\n", {G1, C1}),  # written on Windows
        (f"{G1}\r{C1}\r", {G1, C1}),
        (f"\t{G1} \n\n   \n{M1}\t# a muxed id\n#{G2}\n", {G1, M1}),
        (f"{G1}#{G2}\n{C1}", {G1, C1}),  # no newline at the end
        ("# nothing yet\n\n", set()),
        ("", set()),
    ],
)
async def test_file_lines_are_read_as_written(tmp_path: Path, text: str, entries: set[str]) -> None:
    path = tmp_path / "watch.txt"
    write(path, G3)
    source = FileWatch.open(path)
    path.write_bytes(text.encode())
    assert FileWatch.open(path).statistics().entries == len(entries)
    os.utime(path, ns=(0, 1))  # a reload reads it the same way
    assert (await source.current()).addresses == entries


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (f"{G1}\n{G2} {G3}\n", 2, "has 113 characters"),  # two addresses on a line: not taken as two
        (f"{G1}\n{G2}\u2028{G3}\n", 2, "has 113 characters"),
        (f"{G1}\r\n\r\n{G2[:-1]}\r\n", 3, "has 55 characters"),
        (f"{G1}\n{M1[:-1]}X\n", 2, ""),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path: Path, text: str, line: int, says: str) -> None:
    path = tmp_path / "watch.txt"
    path.write_text(text, newline="")
    with pytest.raises(WatchFileError, match=rf"{path}:{line}: .*{says}"):
        FileWatch.open(path)


async def test_a_file_that_is_not_utf8_keeps_the_list_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "watch.txt"
    write(path, f"{G1}\n")
    source = FileWatch.open(path)
    kept = await source.current()
    path.write_bytes(f"{G2}\n".encode() + b"\xff\n")
    with capture_logs() as logs:
        assert await source.current() is kept
        assert await source.current() is kept
    assert [e["event"] for e in logs] == ["watch-file-unusable"] and "not UTF-8" in logs[0]["error"]
    with pytest.raises(WatchFileError, match="not UTF-8"):
        FileWatch.open(path)


# -- the Redis set source and the operator's edits


@pytest.fixture
def client(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    c = connect(redis_server.url, timeout=2.0)
    yield c
    c.close()


def test_keys_share_the_jobs_hash_tag() -> None:
    assert watch_keys("payments") == {"watch": "ingestion:{payments}:watch",
                                      "version": "ingestion:{payments}:watch:version",
                                      "editing": "ingestion:{payments}:watch:editing"}  # fmt: skip


def test_edits_validate_first_and_move_the_version_only_when_they_change_the_set(
    client: redis.Redis, job: str
) -> None:
    keys = watch_keys(job)
    assert add(client, job, [G1, C1, G1]) == 2
    assert client.get(keys["version"]) == "1"
    assert add(client, job, [G1]) == 0  # nothing new: the version stays (no node reloads)
    assert remove(client, job, [G2]) == 0 and client.get(keys["version"]) == "1"
    with pytest.raises(InvalidAddress, match="checksum"):
        add(client, job, [G2, G3[:-1] + ("A" if G3[-1] != "A" else "B")])
    assert client.smembers(keys["watch"]) == {G1, C1} and client.get(keys["version"]) == "1"
    with pytest.raises(InvalidAddress):
        remove(client, job, ["nope"])
    assert remove(client, job, [C1, G2]) == 1 and members_count(client, job) == 1
    assert client.get(keys["version"]) == "2"
    assert add(client, job, []) == 0 and client.get(keys["version"]) == "2"
    assert add(client, job, [G1, G2]) == 1 and client.get(keys["version"]) == "3"


def test_a_large_edit_goes_in_short_commands_and_moves_the_version_once_after(
    client: redis.Redis, job: str
) -> None:
    """Not one transaction: a million members in one MULTI/EXEC held every other client (the
    leases' renewals) for about a second. Each command carries at most ``EDIT_CHUNK`` members."""

    def calls() -> Counter[str]:
        stats = client.info("commandstats")
        return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})

    listed = accounts(12_345)
    before = calls()
    assert add(client, job, listed) == 12_345
    made = calls() - before
    assert made["sadd"] == math.ceil(12_345 / EDIT_CHUNK) and not made["exec"] and not made["multi"]
    assert client.get(watch_keys(job)["version"]) == "1" and not client.exists(watch_keys(job)["editing"])


def test_an_edit_cut_off_midway_is_completed_by_the_next_one(client: redis.Redis, job: str) -> None:
    """An edit cut off after some of its commands (a lost connection, a killed CLI) has told no
    node; it leaves its marker, so running it again moves the version though nothing is left to add."""
    keys = watch_keys(job)
    assert add(client, job, [G1]) == 1 and client.get(keys["version"]) == "1"
    client.set(keys["editing"], "1")  # as the cut-off edit left it, with part of its members written
    client.sadd(keys["watch"], C1, G2)
    assert add(client, job, [C1, G2]) == 0  # again: nothing left to add, but the nodes are told
    assert client.get(keys["version"]) == "2" and not client.exists(keys["editing"])
    assert add(client, job, [C1]) == 0 and client.get(keys["version"]) == "2"  # now nothing to tell


async def test_redis_set_edits_are_seen_at_the_next_current(client: redis.Redis, job: str) -> None:
    add(client, job, [G1, M1])
    source = RedisWatch(client, job)
    first = await source.current()
    assert first.addresses == {G1, M1} and await source.current() is first
    del first
    add(client, job, [C1])
    remove(client, job, [M1])
    assert (await source.current()).addresses == {G1, C1}
    assert source.statistics().loads == 2


async def test_a_redis_set_of_many_is_read_in_chunks(client: redis.Redis, job: str) -> None:
    listed = accounts(30_000)
    assert add(client, job, listed) == 30_000  # one script, the members in several chunks
    assert add(client, job, listed[::-7]) == 0 and client.get(watch_keys(job)["version"]) == "1"
    source = RedisWatch(client, job, scan_count=1000)
    assert (await source.current()).addresses == set(listed)


async def test_members_not_shaped_as_addresses_are_skipped_and_reported(
    client: redis.Redis, job: str
) -> None:
    bad = ["nope", "", G2.lower(), G2[:5] + "1" + G2[6:], M1[:60], C1 + "A", "É" + G2[1:]]
    client.sadd(watch_keys(job)["watch"], G1, M1, B1, *bad)
    with capture_logs() as logs:
        source = RedisWatch(client, job)
        wl = await source.current()
    assert wl.addresses == {G1, M1, B1}
    reloaded = next(e for e in logs if e["event"] == "watch-reloaded")
    assert reloaded["skipped"] == len(bad) and len(reloaded["skipped_examples"]) == addresses.EXAMPLES
    assert set(reloaded["skipped_examples"]) <= set(bad)
    assert source.statistics().skipped == len(bad)


async def test_a_member_with_a_wrong_checksum_is_kept_and_matches_no_record(
    client: redis.Redis, job: str
) -> None:
    # only add() writes for operators, and it checks in full; such a member can equal no valid
    # address a record names, so the reload does not pay for the checksum
    wrong = G3[:-1] + ("A" if G3[-1] != "A" else "B")
    assert not is_address(wrong) and addresses.has_address_shape(wrong)
    client.sadd(watch_keys(job)["watch"], G1, wrong)
    wl = await RedisWatch(client, job).current()
    assert wl.addresses == {G1, wrong}
    assert not wl.matches((G2, G3)) and wl.matches((G2, G1))


def test_a_client_that_does_not_decode_is_refused(redis_server: LocalRedis, job: str) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    try:
        with pytest.raises(ValueError, match="decode_responses=True"):
            RedisWatch(raw, job)
    finally:
        raw.close()


def test_the_bulk_shape_check_agrees_with_the_one_by_one() -> None:
    good = [*accounts(50), C1, L1]
    for mixed in ([], [M1], [B1], [M1, B1]):
        chunk = good + mixed
        assert addresses._all_shaped(chunk) and all(map(addresses.has_address_shape, chunk))
    for bad in ("nope", "", G1.lower(), G1[:5] + "8" + G1[6:], G1[:5] + "é" + G1[6:], M1[:56], "M" + G1[1:],
                "X" + G1[1:], B1[:57]):  # fmt: skip
        for chunk in ([*good, bad], [M1, *good, bad], [bad]):
            assert not addresses._all_shaped(chunk), (bad, chunk[-2:])
            assert not addresses.has_address_shape(bad)
        assert addresses.shaped_entries([G1, bad, M1], addresses.Skipped()) == [G1, M1]


async def test_a_failed_version_read_keeps_the_list(private_redis: LocalRedis, job: str) -> None:
    c = connect(private_redis.url, timeout=0.5)
    try:
        add(c, job, [G1])
        source = RedisWatch(c, job)
        kept = await source.current()
        private_redis.stop()
        with capture_logs() as logs:
            assert await source.current() is kept
            assert await source.current() is kept
        assert [e["event"] for e in logs] == ["watch-version-unreadable"]  # once, not per batch
        assert source.statistics().problem is not None
    finally:
        c.close()


async def test_no_list_before_the_first_load_succeeds(private_redis: LocalRedis, job: str) -> None:
    c = connect(private_redis.url, timeout=0.5)
    try:
        private_redis.stop()
        source = RedisWatch(c, job)
        with pytest.raises(WatchUnavailable):
            await source.current()
        private_redis.start()
        add(c, job, [G1])
        assert (await source.current()).addresses == {G1}
    finally:
        c.close()
