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

Entries are strkeys, checked in full (:mod:`ingestion.watchlist.addresses`), so a mistyped character
is refused instead of silently watching nothing.

Three sources (:class:`WatchSource`): a list in the job's config (:class:`InlineWatch`), a file
(:class:`FileWatch`, reloaded when its (mtime_ns, size, inode) changes) and a Redis set
(:class:`RedisWatch`, ``ingestion:{JOB}:watch``, reloaded when its version counter moves). The
Redis source and the operator's edits to the set live in :mod:`ingestion.watchlist.edits`.
"""


from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import structlog
import trio

from ingestion.watchlist.addresses import (
    InvalidAddress,
    account_of_muxed,
    address_problem,
    check_address,
    every_valid,
    is_address,
)

log = structlog.get_logger()

class WatchFileError(ValueError):
    """A watch file that cannot be used: the message names the file and the line."""


class WatchUnavailable(Exception):
    """A source has no list to give: its first load (or a reload after which the old list was
    dropped) failed. The caller retries at its next batch; committing unfiltered would leak
    records the job must not keep, and committing nothing would lose the ones it must."""


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
            if every_valid(_entries(text)):
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
