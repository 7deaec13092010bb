"""Reading a data lake's objects: the one module of the lake source that touches storage.

A lake URL is a local directory (a path, or ``file://PATH``). Every call runs the blocking file
system call in a worker thread (``trio.to_thread``), so a slow disk never blocks the node's tasks.
S3 (``s3://BUCKET/PREFIX``) is not read yet: such a URL is refused with a line that says so.

What the source needs of a lake: its manifest (:meth:`LocalLake.schema`), one object by ledger
(:meth:`LocalLake.read_ledger`, trying the current ``.xdr.zst`` and the older ``.xdr.zstd``
suffix), and its oldest and newest ledgers (:meth:`LocalLake.edges`), found from the names alone:
partition and file names start with ``0xFFFFFFFF - start`` in hex, so the newest sorts first.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import attrs
import trio

from ingestion.lake.keys import EXTENSIONS, MANIFEST, LakeSchema, parse_name


def check_lake_url(url: str) -> str | None:
    """Why ``url`` cannot be a lake URL, or None."""
    if not url:
        return "no lake URL given (a directory, file://PATH, or s3://BUCKET/PREFIX)"
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        return f"{url}: s3:// lakes are not supported yet; mirror the objects to a directory"
    if scheme not in ("", "file"):
        return f"{url}: a lake URL is a directory or file://PATH"
    return None


def lake_path(url: str) -> Path:
    parts = urlsplit(url)
    return Path(unquote(parts.path) if parts.scheme == "file" else url)


@attrs.frozen
class LocalLake:
    """A lake in a local directory (``root``)."""

    root: Path

    @classmethod
    def from_url(cls, url: str) -> LocalLake:
        """Raises: ValueError: not a lake URL this reader supports (see :func:`check_lake_url`)."""
        problem = check_lake_url(url)
        if problem:
            raise ValueError(problem)
        return cls(lake_path(url))

    def __str__(self) -> str:
        return str(self.root)

    async def schema(self) -> LakeSchema | None:
        """The lake's schema from its manifest; None while there is none (a lake being created).

        Raises:
            ManifestError: a manifest this reader cannot use.
            OSError: the directory cannot be read.
        """
        path = self.root / MANIFEST
        try:
            raw = await trio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            return None
        return LakeSchema.from_manifest(raw)

    async def read_ledger(self, schema: LakeSchema, ledger: int) -> tuple[str, bytes | None]:
        """``(key, bytes)`` of the object holding ``ledger``; bytes None when it is not there
        (under either suffix; the key then is the current suffix's)."""
        return await trio.to_thread.run_sync(self._read_ledger, schema, ledger)

    def _read_ledger(self, schema: LakeSchema, ledger: int) -> tuple[str, bytes | None]:
        first = schema.object_key(ledger)
        for extension in (schema.extension, *(e for e in EXTENSIONS if e != schema.extension)):
            key = schema.object_key(ledger, extension)
            try:
                return key, (self.root / key).read_bytes()
            except FileNotFoundError:
                continue
        return first, None

    async def edges(self) -> tuple[int, int] | None:
        """``(oldest, newest)`` ledger the lake holds, from its names; None when it holds none."""
        oldest = await trio.to_thread.run_sync(lambda: self._edge(self.root, newest=False))
        newest = await self.newest()
        return None if oldest is None or newest is None else (oldest, newest)

    async def newest(self) -> int | None:
        """The newest ledger the lake holds (the last of its newest object), None for none:
        lists the root and the newest partition only."""
        return await trio.to_thread.run_sync(lambda: self._edge(self.root, newest=True))

    def _edge(self, folder: Path, *, newest: bool) -> int | None:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return None
        found = sorted(
            ((k, n) for n in names if (k := parse_name(n)) is not None),
            key=lambda kn: kn[0].start,
            reverse=newest,
        )
        for key, name in found:
            if key.extension is not None:
                return key.end if newest else key.start
            inside = self._edge(folder / name, newest=newest)  # a partition
            if inside is not None:
                return inside
        return None
