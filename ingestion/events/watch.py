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
changes the set and increments the version in one MULTI/EXEC, so a node that reads the version
never misses an edit.
"""

from __future__ import annotations

import array
import base64
import binascii
import functools
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import attrs
import redis
import structlog
import trio

log = structlog.get_logger()

SCAN_COUNT = 10_000  # SSCAN's COUNT: no reply holds more than about this many members
CHUNK = 10_000  # file lines validated together
EDIT_CHUNK = 10_000  # members per SADD/SREM inside one MULTI/EXEC
EXAMPLES = 5  # invalid members named in a report
MUXED_CACHE = 4096  # M addresses whose G account is kept decoded

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# base32 -> the digits int(..., 32) reads; every other byte -> "!", which int() refuses (so no
# whitespace, underscore or sign slips through as it would into int())
_DIGITS = bytearray(b"!" * 256)
for _value, _char in enumerate(_ALPHABET):
    _DIGITS[_char] = b"0123456789abcdefghijklmnopqrstuv"[_value]
_TO_DIGITS = bytes(_DIGITS)

ACCOUNT_VERSION = 6 << 3


@attrs.frozen
class _Kind:
    name: str
    version: int  # the version byte
    payload: int  # payload bytes
    chars: int  # strkey length: ceil((1 + payload + 2) * 8 / 5)
    pad: int  # unused low bits of the last character (must be zero: one canonical spelling)


def _kind(name: str, version: int, payload: int) -> _Kind:
    bits = (1 + payload + 2) * 8
    chars = -(-bits // 5)
    return _Kind(name, version, payload, chars, chars * 5 - bits)


KINDS: dict[str, _Kind] = {
    "G": _kind("account", 6 << 3, 32),
    "C": _kind("contract", 2 << 3, 32),
    "M": _kind("muxed account", 12 << 3, 40),  # ed25519 key (32) and id (8)
    "B": _kind("claimable balance", 1 << 3, 33),  # type byte (0: v0) and hash (32)
    "L": _kind("liquidity pool", 11 << 3, 32),
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
        return f"{text!r} has {len(text)} characters; a {kind.name} address ({text[0]}...) has {kind.chars}"
    value = _decoded(text, kind)
    if value is None:
        return f"{text!r} is not base32 as a strkey spells it (upper-case A-Z and 2-7, nothing else)"
    if (value >> 16) >> (kind.payload * 8) != kind.version:
        return f"{text!r} has the wrong version byte for a {kind.name} address"
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


def _all_valid(chunk: list[str]) -> bool:
    """Whether every entry of ``chunk`` is a valid G, C or L strkey, checked all at once.

    A reload checks up to a million entries, and one at a time (:func:`is_address`) costs about
    1.3 µs each in Python calls. Here the chunk is joined and decoded as one base32 number, cut
    into 35-byte records and checksummed by ``map``: every loop is in C. False when any entry
    is of another kind or invalid; the caller then checks them one by one.
    """
    if not chunk or set(map(len, chunk)) != {_FIXED_CHARS}:
        return False
    try:
        value = int("".join(chunk).encode("ascii").translate(_TO_DIGITS), 32)
    except (UnicodeEncodeError, ValueError):
        return False
    size = 35 * len(chunk)
    raw = value.to_bytes(size, "big")
    if not set(raw[0::35]) <= _FIXED_VERSIONS:  # the version bytes (they fix the first letters)
        return False
    # No tuple per entry (struct.iter_unpack would make 10,000): each one counts towards a
    # garbage collection, and a full one walks the frozenset being built, all million entries.
    bodies = map(raw.__getitem__, map(slice, range(0, size, 35), range(33, size, 35)))
    computed = array.array("H", map(binascii.crc_hqx, bodies, itertools.repeat(0)))
    stored = bytearray(2 * len(chunk))
    stored[0::2], stored[1::2] = raw[33::35], raw[34::35]  # each checksum little-endian
    if sys.byteorder == "big":
        computed.byteswap()
    return computed.tobytes() == stored


def valid_entries(chunk: list[str], skipped: _Skipped | None = None) -> list[str]:
    """The valid entries of ``chunk`` (the chunk itself when all are); the others go to ``skipped``."""
    if _all_valid(chunk):
        return chunk
    valid = []
    for entry in chunk:
        if is_address(entry):
            valid.append(entry)
        elif skipped is not None:
            skipped.add(entry)
    return valid


def encode_account(key: bytes) -> str:
    """The G strkey of a 32-byte ed25519 key."""
    body = bytes([ACCOUNT_VERSION]) + key
    return base64.b32encode(body + binascii.crc_hqx(body, 0).to_bytes(2, "little")).decode("ascii")


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


def _entries(lines: IO[str]) -> Iterator[list[tuple[int, str]]]:
    """(line number, entry) of a watch file, in chunks of :data:`CHUNK`: one address a line;
    blank lines and ``#`` comments (whole lines or after an address) are not entries."""
    chunk: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        entry = line.partition("#")[0].strip()
        if entry:
            chunk.append((number, entry))
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _first_problem(path: Path, lines: IO[str]) -> str | None:
    """``file:line: what is wrong`` for the first invalid line, or None."""
    for chunk in _entries(lines):
        if not _all_valid([entry for _, entry in chunk]):
            for number, entry in chunk:
                if not is_address(entry):
                    return f"{path}:{number}: {address_problem(entry)}"
    return None


def _build_from_file(lines: IO[str], skipped: _Skipped) -> WatchList:
    # An invalid line here means the file was rewritten in place since the first pass read it:
    # it is skipped, and the file's new signature makes the next check read it again.
    chunks = (valid_entries([entry for _, entry in chunk], skipped) for chunk in _entries(lines))
    return WatchList(frozenset(itertools.chain.from_iterable(chunks)))


class FileWatch:
    """A watch file (``watch_file``): one address a line, ``#`` comments and blank lines ignored.

    :meth:`current` compares the file's (mtime_ns, size, inode) with the loaded one's: one
    ``stat`` per batch. On a change it reads the file twice: once to find an invalid line (then
    the previous list stays, the error is reported once for that version of the file, and the
    node carries on), then, the old list dropped, to build the new one. A missing file keeps the
    previous list too, reported once.
    """

    def __init__(self, path: Path, watch: WatchList, signature: Signature) -> None:
        self.path = path
        self._list: WatchList | None = watch
        self._signature = signature  # of the file the list was built from
        self._refused: Signature | None = None  # a version of the file already reported unusable
        self._problem: str | None = None
        self._loads, self._skipped = 1, _Skipped()

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> FileWatch:
        """Load ``path`` at start-up.

        Raises:
            WatchFileError: the file cannot be read, or a line is not a valid address (file and
                line named), so config checking fails.
        """
        where = Path(path)
        try:
            with where.open(encoding="utf-8") as lines:
                signature = _signature(os.fstat(lines.fileno()))
                problem = _first_problem(where, lines)
                if problem is not None:
                    raise WatchFileError(problem)
                lines.seek(0)
                watch = _build_from_file(lines, _Skipped())
        except OSError as exc:
            raise WatchFileError(f"{where}: cannot read the watch file: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise WatchFileError(f"{where}: not UTF-8 text ({exc.reason})") from exc
        return cls(where, watch, signature)

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
            with self.path.open(encoding="utf-8") as lines:
                signature = _signature(os.fstat(lines.fileno()))
                problem = await trio.to_thread.run_sync(_first_problem, self.path, lines)
                if problem is not None:
                    return self._refuse(signature, problem)
                lines.seek(0)
                self._list, skipped = None, _Skipped()  # drop first: one list in memory, not two
                self._list = await trio.to_thread.run_sync(_build_from_file, lines, skipped)
        except (OSError, UnicodeDecodeError) as exc:
            if self._list is None:
                raise WatchUnavailable(f"{self.path}: the reload failed: {exc}") from exc
            return self._refuse(None, f"{self.path}: cannot read the watch file: {exc}")
        self._signature, self._refused, self._problem = signature, None, None
        self._loads, self._skipped = self._loads + 1, skipped
        log.info("watch-reloaded", source=self.describe(), entries=len(self._list),
                 seconds=round(time.monotonic() - started, 3), skipped=skipped.count)  # fmt: skip
        return self._list

    def describe(self) -> str:
        return f"watch file {self.path}"

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(
            entries=len(self._list or EMPTY), loads=self._loads, skipped=self._skipped.count,
            skipped_examples=tuple(self._skipped.examples), problem=self._problem,
        )  # fmt: skip


def watch_keys(job: str) -> dict[str, str]:
    """The job's watch set and its version counter, beside its lease store's keys (same hash tag,
    so one cluster slot, so one MULTI/EXEC may edit both)."""
    prefix = f"ingestion:{{{job}}}"
    return {"watch": f"{prefix}:watch", "version": f"{prefix}:watch:version"}


def _text(member: str | bytes) -> str:
    return member.decode("utf-8", "replace") if isinstance(member, bytes) else member


def _scan_list(client: redis.Redis, key: str, count: int, skipped: _Skipped) -> WatchList:
    """The set at ``key`` as a list, read with SSCAN ``count`` at a time (runs in a worker thread).

    SSCAN returns every member that is in the set for the whole scan; one added or removed during
    it may or may not be seen, but its edit moved the version, which the next check sees."""

    def chunks() -> Iterator[list[str]]:
        cursor: Any = 0
        while True:
            cursor, members = client.sscan(key, cursor, count=count)
            if members and not isinstance(members[0], str):  # a client without decode_responses
                members = [_text(member) for member in members]
            yield valid_entries(members, skipped)  # type: ignore[arg-type]
            if int(cursor) == 0:
                return

    return WatchList(frozenset(itertools.chain.from_iterable(chunks())))


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
    """

    def __init__(self, client: redis.Redis, job: str, *, scan_count: int = SCAN_COUNT) -> None:
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
    entries = _validated(addresses)
    if not entries:
        return 0
    keys = watch_keys(job)
    pipe = client.pipeline(transaction=True)
    for start in range(0, len(entries), EDIT_CHUNK):
        getattr(pipe, command)(keys["watch"], *entries[start : start + EDIT_CHUNK])
    pipe.incr(keys["version"])
    answers = pipe.execute()
    return sum(int(n) for n in answers[:-1])


def add(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Add ``addresses`` to ``job``'s watch set; how many were not there yet.

    All are validated before anything is sent; the SADDs and the version's INCR are one MULTI/EXEC,
    so a node sees the edit whole at its next batch. (The version moves even when nothing was
    new: nodes then read the set again, which costs a reload, never a wrong list.)

    Raises:
        InvalidAddress: an entry is not a valid address (named); nothing was changed.
        redis.RedisError: the edit's outcome is unknown (a timeout): running it again is safe.
    """
    return _edit(client, job, addresses, "sadd")


def remove(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Remove ``addresses`` from ``job``'s watch set; how many were there. As :func:`add`."""
    return _edit(client, job, addresses, "srem")


def members_count(client: redis.Redis, job: str) -> int:
    """How many members ``job``'s watch set has (any added other than by :func:`add` too)."""
    return int(client.scard(watch_keys(job)["watch"]))  # type: ignore[arg-type]
