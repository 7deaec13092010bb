"""Watch lists: the accounts and contracts a job keeps records of, where the list comes from, and
the operator's edits to a list kept in Redis.

A job that watches a list commits only the records that name a watched address (the filtering
stage asks :meth:`WatchList.matches` with the addresses a record names). A list may hold up to
1,000,000 addresses, so two costs shape this module:

- Memory. The list is one ``frozenset`` of the strkey strings (about 140 MiB for 1,000,000 G
  addresses beside a node's ~85 MiB, in a 300 MiB budget) and nothing else: no list beside it, no
  decoded copy. A reload therefore *drops* the old set before it builds the new one, so the peak
  is one list, not two; the sources below arrange that, and a caller must not hold a list across
  calls to :meth:`WatchSource.current` (it asks once per batch and lets go).
- Time. A record is matched by set membership of the few strings it names (well under 2 µs). An
  ``M`` address (muxed) also matches when its underlying ``G`` account is watched: decoding one
  costs a few µs, and muxed addresses are rare, so the decoding is kept in a small bounded cache.

Entries are strkeys (SEP-23): base32 of a version byte, the payload and the CRC16-XModem of both
(little-endian). Accepted: ``G`` accounts, ``C`` contracts, ``M`` muxed accounts, ``B`` claimable
balances, ``L`` liquidity pools; each is checked in full (alphabet, length, version byte, unused
bits, checksum), so a mistyped character is refused instead of silently watching nothing.

Three sources (:class:`WatchSource`): a list in the job's config (:class:`InlineWatch`), a file
(:class:`FileWatch`, reloaded when its (mtime_ns, size, inode) changes) and a Redis set
(:class:`RedisWatch`, ``ingestion:{JOB}:watch``, reloaded when its version counter moves). The
operator's edits to the Redis set are :func:`add` and :func:`remove`: each validates first, then
changes the set in short commands (Redis goes on serving the leases between them) and, when that
changed anything, increments the version, so a node that reads the version never misses an edit,
and an edit that changes nothing reloads no node.
"""

from __future__ import annotations

import binascii
import functools
import itertools
import operator
import os
import re
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

import attrs
import redis
import structlog
import trio

from ingestion.common.strkey import (
    ACCOUNT,
    CLAIMABLE_BALANCE,
    CONTRACT,
    LIQUIDITY_POOL,
    MUXED,
    encode_account,
)

log = structlog.get_logger()

SCAN_COUNT = 10_000  # SSCAN's COUNT: no reply holds more than about this many members
EDIT_CHUNK = 1_000  # members per SADD/SREM of an edit (each a short command: Redis serves others between)
EDIT_ROUND = 50  # such commands per round trip of an edit

# The end of an edit: the version counter moved (the nodes then read the set again), the marker
# cleared (``lua/watch_edit_done.lua``).
_EDIT_DONE = (files(__package__) / "lua" / "watch_edit_done.lua").read_text(encoding="utf-8")
EXAMPLES = 5  # invalid members named in a report
MUXED_CACHE = 4096  # M addresses whose G account is kept decoded

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# base32 -> the digits int(..., 32) reads; every other byte -> "!", which int() refuses (so no
# whitespace, underscore or sign slips through as it would into int())
_DIGITS = bytearray(b"!" * 256)
for _value, _char in enumerate(_ALPHABET):
    _DIGITS[_char] = b"0123456789abcdefghijklmnopqrstuv"[_value]
_TO_DIGITS = bytes(_DIGITS)


@attrs.frozen
class _Kind:
    name: str  # with its article, as a message says it ("an account")
    version: int  # the version byte
    payload: int  # payload bytes
    chars: int  # strkey length: ceil((1 + payload + 2) * 8 / 5)
    pad: int  # unused low bits of the last character (must be zero: one canonical spelling)


def _kind(name: str, version: int, payload: int) -> _Kind:
    bits = (1 + payload + 2) * 8
    chars = -(-bits // 5)
    return _Kind(name, version, payload, chars, chars * 5 - bits)


KINDS: dict[str, _Kind] = {
    "G": _kind("an account", ACCOUNT, 32),
    "C": _kind("a contract", CONTRACT, 32),
    "M": _kind("a muxed account", MUXED, 40),  # ed25519 key (32) and id (8)
    "B": _kind("a claimable balance", CLAIMABLE_BALANCE, 33),  # type byte (0: v0) and hash (32)
    "L": _kind("a liquidity pool", LIQUIDITY_POOL, 32),
}


class InvalidAddress(ValueError):
    """A watch-list entry that is not a valid G, C, M, B or L strkey; the message names it."""


class WatchFileError(ValueError):
    """A watch file that cannot be used: the message names the file and the line."""


class WatchUnavailable(Exception):
    """A source has no list to give: its first load (or a reload after which the old list was
    dropped) failed. The caller retries at its next batch; committing unfiltered would leak
    records the job must not keep, and committing nothing would lose the ones it must."""


def _decoded(text: str, kind: _Kind) -> int | None:
    """The strkey's bits without the padding, or None when the alphabet or padding is wrong."""
    try:
        value = int(text.encode("ascii").translate(_TO_DIGITS), 32)
    except (UnicodeEncodeError, ValueError):
        return None
    if value & ((1 << kind.pad) - 1):
        return None
    return value >> kind.pad


def _checked(value: int, kind: _Kind) -> bool:
    body, checksum = value >> 16, value & 0xFFFF
    if body >> (kind.payload * 8) != kind.version:
        return False
    expected = binascii.crc_hqx(body.to_bytes(1 + kind.payload, "big"), 0)
    return expected == ((checksum & 0xFF) << 8 | checksum >> 8)  # stored little-endian


def is_address(text: str) -> bool:
    """Whether ``text`` is a valid G, C, M, B or L strkey (about 1 µs: reloads check a million)."""
    kind = KINDS.get(text[:1])
    if kind is None or len(text) != kind.chars:
        return False
    value = _decoded(text, kind)
    return value is not None and _checked(value, kind)


def address_problem(text: object) -> str | None:
    """What is wrong with ``text`` as a watch-list entry, in an operator's words, or None."""
    if not isinstance(text, str):
        return f"{text!r} is not a string"
    kind = KINDS.get(text[:1])
    if kind is None:
        return f"{text!r} is not a G, C, M, B or L address (a strkey starts with one of those letters)"
    if len(text) != kind.chars:
        return f"{text!r} has {len(text)} characters; {kind.name} address ({text[0]}...) has {kind.chars}"
    value = _decoded(text, kind)
    if value is None:
        return f"{text!r} is not base32 as a strkey spells it (upper-case A-Z and 2-7, nothing else)"
    if (value >> 16) >> (kind.payload * 8) != kind.version:
        return f"{text!r} has the wrong version byte for {kind.name} address"
    if not _checked(value, kind):
        return f"{text!r} fails its checksum (a mistyped character?)"
    return None


def check_address(text: str) -> str:
    """``text`` when it is a valid entry.

    Raises:
        InvalidAddress: it is not; the message says why.
    """
    problem = address_problem(text)
    if problem is not None:
        raise InvalidAddress(problem)
    return text


@attrs.define
class _Skipped:
    """Invalid entries met while building a list: a count and the first few."""

    count: int = 0
    examples: list[str] = attrs.Factory(list)

    def add(self, entry: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(entry)


_FIXED_CHARS = 56  # G, C and L strkeys: 35 bytes, 280 bits, no unused bits
_FIXED_VERSIONS = frozenset(KINDS[k].version for k in "GCL")


_RECORD = struct.Struct("35s")  # a G, C or L strkey decoded: version, payload 32, checksum 2
_first = operator.itemgetter(0)


def _all_valid(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` is a valid G, C or L strkey, checked all at once.

    A reload checks up to a million entries, and one at a time (:func:`is_address`) costs about
    1.3 µs each in Python calls. Here the chunk is joined and decoded as one base32 number, cut
    into 35-byte records and checksummed by ``map``: every loop is in C. Each record's checksum
    is first swapped to big-endian (two slice assignments over the chunk), because the XModem CRC
    of a message followed by its own CRC, big-endian, is 0: then one ``crc_hqx`` call per record
    says valid or not, with nothing to compare afterwards. False when any entry is of another
    kind or invalid; the caller then checks them one by one.

    ``struct.iter_unpack`` makes one short tuple per record: each is freed as soon as the next is
    made, so the count of live container objects, which is what triggers a garbage collection
    (one that would walk a million-entry set), does not grow.
    """
    if not chunk or set(map(len, chunk)) != {_FIXED_CHARS}:
        return False
    try:
        value = int("".join(chunk).encode("ascii").translate(_TO_DIGITS), 32)
    except (UnicodeEncodeError, ValueError):
        return False
    raw = bytearray(value.to_bytes(35 * len(chunk), "big"))
    if not set(raw[0::35]) <= _FIXED_VERSIONS:  # the version bytes (they fix the first letters)
        return False
    raw[33::35], raw[34::35] = raw[34::35], raw[33::35]
    return not any(map(binascii.crc_hqx, map(_first, _RECORD.iter_unpack(raw)), itertools.repeat(0)))


def _every_valid(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` is valid: the G, C and L entries in bulk, M and B (rare)
    one by one."""
    if _all_valid(chunk):
        return True
    fixed = [entry for entry in chunk if len(entry) == _FIXED_CHARS]
    if fixed and not _all_valid(fixed):
        return False
    return len(fixed) < len(chunk) and all(is_address(e) for e in chunk if len(e) != _FIXED_CHARS)


def valid_entries(chunk: list[str], skipped: _Skipped | None = None) -> list[str]:
    """The valid entries of ``chunk`` (the chunk itself when all are); the others go to ``skipped``."""
    if _every_valid(chunk):
        return chunk
    valid = []
    for entry in chunk:
        if is_address(entry):
            valid.append(entry)
        elif skipped is not None:
            skipped.add(entry)
    return valid


_SHAPES = frozenset((letter, kind.chars) for letter, kind in KINDS.items())
_FIXED_LETTERS = frozenset("GCL")


def has_address_shape(text: str) -> bool:
    """Whether ``text`` looks like a strkey: a G, C, M, B or L, that kind's length, and base32.

    The checksum is not checked: see :class:`RedisWatch` for why a reload of the Redis set
    needs no more than this.
    """
    kind = KINDS.get(text[:1])
    return (
        kind is not None and len(text) == kind.chars and text.isascii()
        and not text.encode("ascii").translate(None, _ALPHABET)
    )  # fmt: skip


def _all_shaped(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` has a strkey's shape (:func:`has_address_shape`), checked
    all at once: each step is one C loop over the chunk (lengths, first letters, and the joined
    chunk's characters against the base32 alphabet)."""
    if not chunk:
        return True
    if set(map(len, chunk)) == {_FIXED_CHARS}:
        joined = "".join(chunk)
        if not set(joined[::_FIXED_CHARS]) <= _FIXED_LETTERS:
            return False
    else:
        if "" in chunk or not set(zip(map(_first, chunk), map(len, chunk), strict=True)) <= _SHAPES:
            return False
        joined = "".join(chunk)
    # str.isascii() is a flag the string carries: free; the rest is one pass over the bytes
    return joined.isascii() and not joined.encode("ascii").translate(None, _ALPHABET)


def shaped_entries(chunk: list[str], skipped: _Skipped) -> list[str]:
    """The entries of ``chunk`` shaped as strkeys (the chunk itself when all are); the others go
    to ``skipped``."""
    if _all_shaped(chunk):
        return chunk
    shaped = []
    for entry in chunk:
        if has_address_shape(entry):
            shaped.append(entry)
        else:
            skipped.add(entry)
    return shaped


@functools.lru_cache(maxsize=MUXED_CACHE)
def account_of_muxed(text: str) -> str | None:
    """The G account under a valid M address (version, key 32, id 8, checksum 2), else None."""
    kind = KINDS["M"]
    if text[:1] != "M" or not is_address(text):
        return None
    value = _decoded(text, kind)
    assert value is not None
    key = (value >> (16 + 64)) & ((1 << 256) - 1)
    return encode_account(key.to_bytes(32, "big"))


@attrs.frozen(eq=False, repr=False)
class WatchList:
    """The watched addresses: one frozenset of valid strkeys (no other copy is kept).

    Compared by identity (a source gives the same object until it reloads); compare
    :attr:`addresses` to compare contents. Build with :meth:`of`, which validates.
    """

    addresses: frozenset[str]

    @classmethod
    def of(cls, entries: Iterable[str]) -> WatchList:
        """A list of ``entries``, each validated as it is added (a generator is not copied first).

        Raises:
            InvalidAddress: the first invalid entry, named.
        """
        return cls(frozenset(check_address(entry) for entry in entries))

    def matches(self, addresses: Iterable[str]) -> bool:
        """Whether any of ``addresses`` is watched; an M address also when its G account is."""
        if type(addresses) is not tuple:
            addresses = tuple(addresses)  # read up to three times below
        if not self.addresses.isdisjoint(addresses):  # the whole common case, in C
            return True
        # "M" sorts after every other strkey letter (B, C, G, L): no muxed address, no more to do
        if addresses and max(addresses) >= "M":
            for address in addresses:
                if address[:1] == "M" and account_of_muxed(address) in self.addresses:
                    return True
        return False

    def __len__(self) -> int:
        return len(self.addresses)

    def __contains__(self, address: object) -> bool:
        return address in self.addresses

    def __repr__(self) -> str:  # never a million addresses in a log line
        return f"WatchList({len(self.addresses)} addresses)"


EMPTY = WatchList(frozenset())


@attrs.frozen
class WatchStatistics:
    """What a source reports of itself (for status and logs)."""

    entries: int  # addresses in the current list (0 while there is none)
    loads: int  # lists built, the first included
    skipped: int = 0  # invalid entries left out of the current list
    skipped_examples: tuple[str, ...] = ()  # the first few of them
    problem: str | None = None  # why the last check or reload did not give a new list, if it did not


class WatchSource(Protocol):
    """Where a job's watch list comes from.

    :meth:`current` is called once per batch and is cheap when nothing changed (the same list
    object comes back). A reload drops the old list before it builds the new one, so the caller
    must not hold a list from an earlier call.
    """

    async def current(self) -> WatchList:
        """The list as of now.

        Raises:
            WatchUnavailable: there is no list (never loaded, or a reload failed after dropping it).
        """
        ...

    def describe(self) -> str:
        """Where the list comes from, for logs (no addresses)."""
        ...

    def statistics(self) -> WatchStatistics: ...


class InlineWatch:
    """A list written in the job's config (``watch = ["G...", ...]``): validated once, at start-up."""

    def __init__(self, entries: Sequence[str]) -> None:
        """Raises:
        InvalidAddress: an invalid entry, named with its place (``watch[3]``), so config checking fails.
        """
        for index, entry in enumerate(entries):
            problem = address_problem(entry)
            if problem is not None:
                raise InvalidAddress(f"watch[{index}]: {problem}")
        self._list = WatchList(frozenset(entries))

    async def current(self) -> WatchList:
        return self._list

    def describe(self) -> str:
        return f"the job's watch setting ({len(self._list)} addresses)"

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(entries=len(self._list), loads=1)


Signature = tuple[int, int, int]  # (mtime_ns, size, inode)


def _signature(stat: os.stat_result) -> Signature:
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


FILE_WINDOW = 1 << 20  # bytes of a watch file split and checked together (about 18,000 lines)
_COMMENT = re.compile(r"#[^\n]*")


def _entries(text: str) -> list[str]:
    """The entries of whole lines of a watch file: one address a line; blank lines and ``#``
    comments (whole lines or after an address) are not entries; spaces around an address are not
    part of it."""
    if "#" in text:
        text = _COMMENT.sub("", text)
    entries = text.split()  # in C; but it also cuts where a line has spaces inside
    if len(text) - sum(map(len, entries)) == text.count("\n"):  # newlines the only whitespace
        return entries
    return [entry for line in text.split("\n") if (entry := line.strip())]


@attrs.define
class _FileContent:
    """A watch file read whole, once: what is checked is what is built, even if the file is
    rewritten in place meanwhile (its new signature makes the next check read it again).

    Holding the bytes (about 57 MB for a million lines) beside the current list while checking is
    the price of keeping that list until the file is known good; the list of entries, by
    contrast, is never held whole beside it (each window's is checked and let go).
    """

    path: Path
    signature: Signature
    data: bytes

    @classmethod
    def read(cls, path: Path) -> _FileContent:
        """Raises:
        OSError: the file cannot be read.
        """
        with path.open("rb") as file:
            signature = _signature(os.fstat(file.fileno()))
            data = file.read()
        if b"\r" in data:  # as text mode reads it: \r\n and \r end lines too
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return cls(path, signature, data)

    def _windows(self) -> Iterator[tuple[int, str]]:
        """(offset, text) of whole lines, about :data:`FILE_WINDOW` bytes at a time.

        Raises:
            UnicodeDecodeError: the file is not UTF-8.
        """
        data, start = self.data, 0
        while start < len(data):
            end = data.find(b"\n", start + FILE_WINDOW)
            end = len(data) if end < 0 else end + 1
            yield start, data[start:end].decode("utf-8")
            start = end

    def problem(self) -> str | None:
        """``file:line: what is wrong`` for the first invalid line, or None. The full check
        (checksum included): people type these files.

        Raises:
            UnicodeDecodeError: the file is not UTF-8.
        """
        for start, text in self._windows():
            if _every_valid(_entries(text)):
                continue
            first = self.data.count(b"\n", 0, start) + 1  # only now: the line numbers, for the message
            for number, line in enumerate(text.split("\n"), first):
                entry = line.partition("#")[0].strip()
                if entry and not is_address(entry):
                    return f"{self.path}:{number}: {address_problem(entry)}"
        return None

    def build(self) -> WatchList:
        """The list of a file whose :meth:`problem` is None; the bytes are let go before the set is
        made, whose members are the strings split from them."""
        chunks = [_entries(text) for _, text in self._windows()]
        self.data = b""
        return WatchList(frozenset(itertools.chain.from_iterable(chunks)))


class FileWatch:
    """A watch file (``watch_file``): one address a line, ``#`` comments and blank lines ignored.

    :meth:`current` compares the file's (mtime_ns, size, inode) with the loaded one's: one
    ``stat`` per batch. On a change it reads the file once, whole, and checks every line in full
    (then an invalid line keeps the previous list, the error is reported once for that version of
    the file, and the node carries on); only a file known good drops the old list, and then the
    new one is built from what was read. A missing file keeps the previous list too, reported once.
    """

    def __init__(self, path: Path, watch: WatchList, signature: Signature) -> None:
        self.path = path
        self._list: WatchList | None = watch
        self._signature = signature  # of the file the list was built from
        self._refused: Signature | None = None  # a version of the file already reported unusable
        self._problem: str | None = None
        self._loads = 1

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> FileWatch:
        """Load ``path`` at start-up.

        Raises:
            WatchFileError: the file cannot be read, or a line is not a valid address (file and
                line named), so config checking fails.
        """
        where = Path(path)
        try:
            content = _FileContent.read(where)
            problem = content.problem()
        except OSError as exc:
            raise WatchFileError(f"{where}: cannot read the watch file: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise WatchFileError(f"{where}: not UTF-8 text ({exc.reason})") from exc
        if problem is not None:
            raise WatchFileError(problem)
        return cls(where, content.build(), content.signature)

    def _refuse(self, signature: Signature | None, problem: str) -> WatchList:
        assert self._list is not None
        if signature is None or signature != self._refused:
            log.warning("watch-file-unusable", file=str(self.path), error=problem, kept=len(self._list))
        self._refused, self._problem = signature, problem
        return self._list

    async def current(self) -> WatchList:
        if self._list is None:  # a reload died half-way (it cannot: kept for the type's sake)
            raise WatchUnavailable(f"{self.path}: no list loaded")
        try:
            signature = _signature(os.stat(self.path))
        except OSError as exc:
            return self._refuse(None, f"{self.path}: cannot read the watch file: {exc.strerror or exc}")
        if signature in (self._signature, self._refused):
            return self._list
        started = time.monotonic()
        try:
            content = await trio.to_thread.run_sync(_FileContent.read, self.path)
        except OSError as exc:
            return self._refuse(None, f"{self.path}: cannot read the watch file: {exc.strerror or exc}")
        try:
            problem = await trio.to_thread.run_sync(content.problem)
        except UnicodeDecodeError as exc:
            problem = f"{self.path}: not UTF-8 text ({exc.reason})"
        if problem is not None:
            return self._refuse(content.signature, problem)
        self._list = None  # drop first: one list in memory, not two
        self._list = await trio.to_thread.run_sync(content.build)
        self._signature, self._refused, self._problem = content.signature, None, None
        self._loads += 1
        log.info("watch-reloaded", source=self.describe(), entries=len(self._list),
                 seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return self._list

    def describe(self) -> str:
        return f"watch file {self.path}"

    def statistics(self) -> WatchStatistics:  # nothing skipped: a file with a bad line is refused
        return WatchStatistics(entries=len(self._list or EMPTY), loads=self._loads, problem=self._problem)


def watch_keys(job: str) -> dict[str, str]:
    """The job's watch set, its version counter and the marker of an edit in progress, beside its
    lease store's keys (same hash tag, so one cluster slot, so one script may edit two of them)."""
    prefix = f"ingestion:{{{job}}}"
    watch = f"{prefix}:watch"
    return {"watch": watch, "version": f"{watch}:version", "editing": f"{watch}:editing"}


def _text(member: str | bytes) -> str:
    return member.decode("utf-8", "replace") if isinstance(member, bytes) else member


def _sscan_replies(client: redis.Redis, key: str, count: int) -> Iterator[list[str]]:
    """The members of each SSCAN reply for the set at ``key``, in order, the scan whole.

    SSCAN's cursor comes with its reply, so the next call cannot be sent earlier; but it can be
    sent *before* the caller handles this reply's members, and then the server works on the
    next chunk while this one is checked and added (measured: the server spends about 0.57 s on
    the SSCANs of a million members, the client about 0.25 s on the checking and the set,
    which thus costs nothing). Every read is bounded by the client's socket timeout.

    A cluster client has no pool of its own to take one connection from: it is asked call by
    call (no overlap), and follows a moved slot as it does for every other command.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        cursor: Any = 0
        while True:
            cursor, members = client.sscan(key, cursor, count=count)
            yield members  # type: ignore[misc]
            if int(cursor) == 0:
                return
    connection = pool.get_connection()
    try:
        connection.send_command("SSCAN", key, 0, "COUNT", count)
        while True:
            cursor, members = connection.read_response()
            if int(cursor) != 0:
                connection.send_command("SSCAN", key, cursor, "COUNT", count)
            yield members
            if int(cursor) == 0:
                return
    except BaseException:
        connection.disconnect()  # a reply may be half read, or still to come: not reusable
        raise
    finally:
        pool.release(connection)


def _scan_list(client: redis.Redis, key: str, count: int, skipped: _Skipped) -> WatchList:
    """The set at ``key`` as a list, read with SSCAN ``count`` at a time (runs in a worker thread).

    SSCAN returns every member that is in the set for the whole scan; one added or removed during
    it may or may not be seen, but its edit moved the version, which the next check sees.

    The members are added to a ``set`` chunk by chunk, while the server prepares the next chunk,
    and frozen at the end (a copy of the hash table, about 0.06 s for a million: the strings are
    shared and their hashes kept).
    """
    building: set[str] = set()
    for members in _sscan_replies(client, key, count):
        building.update(shaped_entries(members, skipped))
    watch = WatchList(frozenset(building))
    building.clear()
    return watch


class RedisWatch:
    """A Redis set that operators edit while the node runs (``ingestion:{JOB}:watch``).

    Each :meth:`current` reads the version counter (one GET); the set is read again (SSCAN, in
    chunks) only when the version moved. A GET that fails or times out keeps the current list: a
    read changes nothing, so its ambiguity is harmless, and the next batch asks again. Failures
    are logged when they start and when they end, not once per batch.

    The first load, and a reload that fails after the old list was dropped, leave no list:
    :meth:`current` raises :class:`WatchUnavailable` until a load succeeds.

    ``client`` is a redis-py client whose calls are bounded (``actors.lease_store.connect``); its
    calls run in worker threads, one reload at a time.

    Why a reload checks each member's *shape* only (letter, length, base32: :func:`has_address_shape`),
    not its checksum: the full check costs about 0.5 s per million members, half the time a reload
    may take, and buys nothing here. The only writer the project gives operators, :func:`add` (which
    ``ingestion watchlist`` calls), checks every address in full before it writes; and a member
    whose checksum is wrong can never equal an address a record names (records carry valid
    strkeys), so it cannot make a record match. A member that is not even shaped as a strkey (a
    write around the tool) is skipped, counted and named in the reload's log line and in
    :meth:`statistics`.

    Raises:
        ValueError: ``client`` does not decode replies (``decode_responses=True``): members must
            arrive as ``str``, decoded by the reply parser (hiredis, in C), not one by one here.
    """

    def __init__(self, client: redis.Redis, job: str, *, scan_count: int = SCAN_COUNT) -> None:
        if not client.get_encoder().decode_responses:
            raise ValueError(
                "RedisWatch needs a client built with decode_responses=True "
                "(actors.lease_store.connect builds one)"
            )
        self.client, self.job, self.scan_count = client, job, scan_count
        self.keys = watch_keys(job)
        self._list: WatchList | None = None
        self._version: Any = None  # the counter's value when the current list was read
        self._unreadable = False
        self._loads, self._skipped = 0, _Skipped()
        self._problem: str | None = None
        self._limiter: trio.CapacityLimiter | None = None

    async def current(self) -> WatchList:
        try:
            version = await trio.to_thread.run_sync(
                self.client.get, self.keys["version"], abandon_on_cancel=True
            )
        except redis.RedisError as exc:
            self._problem = f"cannot read {self.keys['version']}: {exc}"
            if not self._unreadable:
                log.warning("watch-version-unreadable", key=self.keys["version"], error=str(exc),
                            kept=len(self._list or EMPTY))  # fmt: skip
            self._unreadable = True
            if self._list is None:
                raise WatchUnavailable(f"{self.describe()}: {self._problem}") from exc
            return self._list
        if self._unreadable:
            log.info("watch-version-readable", key=self.keys["version"])
            self._unreadable = False
        if self._list is not None and version == self._version:
            self._problem = None
            return self._list
        return await self._reload(version)

    async def _reload(self, version: Any) -> WatchList:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(1)  # an abandoned reload holds it until it ends
        started = time.monotonic()
        self._list, skipped = None, _Skipped()  # drop first: one list in memory, not two
        try:
            watch = await trio.to_thread.run_sync(
                _scan_list, self.client, self.keys["watch"], self.scan_count, skipped,
                limiter=self._limiter, abandon_on_cancel=True,
            )  # fmt: skip
        except redis.RedisError as exc:
            self._problem = f"cannot read {self.keys['watch']}: {exc}"
            log.warning("watch-reload-failed", key=self.keys["watch"], error=str(exc))
            raise WatchUnavailable(f"{self.describe()}: {self._problem}") from exc
        self._list, self._version, self._skipped, self._problem = watch, version, skipped, None
        self._loads += 1
        log.info("watch-reloaded", source=self.describe(), entries=len(watch), version=_text(version or "0"),
                 seconds=round(time.monotonic() - started, 3), skipped=skipped.count,
                 skipped_examples=skipped.examples)  # fmt: skip
        return watch

    def describe(self) -> str:
        return f"redis set {self.keys['watch']}"

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(
            entries=len(self._list or EMPTY), loads=self._loads, skipped=self._skipped.count,
            skipped_examples=tuple(self._skipped.examples), problem=self._problem,
        )  # fmt: skip


# The operator's edits (the CLI calls these). Blocking redis-py calls: not for a trio task.


def _validated(addresses: Iterable[str]) -> list[str]:
    entries = list(dict.fromkeys(addresses))
    for entry in entries:
        check_address(entry)
    return entries


def _edit(client: redis.Redis, job: str, addresses: Iterable[str], command: str) -> int:
    """Short commands, not one transaction: a million members in one MULTI/EXEC kept Redis from
    every other client for about a second (0.4 s when nothing changed), and with it every node's
    lease renewals, which must answer within ``redis.timeout_ms``. In chunks, the longest wait of
    another client is a few milliseconds. The version moves once the set is edited (and only if
    the edit changed it, or one before was cut off), so a node reloads once, after the edit."""
    entries = _validated(addresses)
    if not entries:
        return 0
    keys = watch_keys(job)
    interrupted = client.getset(keys["editing"], "1") is not None
    changed = 0
    step = EDIT_CHUNK * EDIT_ROUND
    for start in range(0, len(entries), step):
        pipe = client.pipeline(transaction=False)
        for at in range(start, min(start + step, len(entries)), EDIT_CHUNK):
            getattr(pipe, command)(keys["watch"], *entries[at : at + EDIT_CHUNK])
        changed += sum(int(n) for n in pipe.execute())
    done = client.register_script(_EDIT_DONE)
    done(keys=[keys["version"], keys["editing"]], args=[changed, "1" if interrupted else "0"])
    return changed


def add(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Add ``addresses`` to ``job``'s watch set; how many were not there yet.

    All are validated before anything is sent. The members go in short commands, then the version
    moves, so the leader reloads the set once, after the edit (one that loads it meanwhile for
    another reason may see part of it, and reloads after). The version moves only when something
    was new: adding what is already there makes no node read the set again (about 1 s at a million).

    Raises:
        InvalidAddress: an entry is not a valid address (named); nothing was changed.
        redis.RedisError: the edit's outcome is unknown (a timeout, a lost connection): part of it
            may be done, and no node has been told yet. Running it again is safe and completes it
            (a cut-off edit leaves a marker, so the next edit moves the version even if it finds
            nothing left to change).
    """
    return _edit(client, job, addresses, "sadd")


def remove(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Remove ``addresses`` from ``job``'s watch set; how many were there. As :func:`add`."""
    return _edit(client, job, addresses, "srem")


def members_count(client: redis.Redis, job: str) -> int:
    """How many members ``job``'s watch set has (any added other than by :func:`add` too)."""
    return int(client.scard(watch_keys(job)["watch"]))  # type: ignore[arg-type]
