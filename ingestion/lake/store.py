"""Reading a data lake's objects: the one module of the lake source that touches storage.

A lake URL is a local directory (a path, or ``file://PATH``: :class:`LocalLake`) or an S3 bucket
and prefix (``s3://BUCKET/PREFIX``: :class:`S3Lake`, through boto3, at ``lake.endpoint_url`` for an
S3-compatible store; signed with the usual AWS credential chain (environment, shared files, instance
role) when it finds credentials, else anonymous, as Stellar's public lakes are read). Every call
runs the blocking call in a worker thread (``trio.to_thread``), so a slow disk or bucket never
blocks the node's tasks; an S3 failure is an ``OSError`` like a file system's, retried the same way.

What the source needs of a lake: its manifest (``schema``), one object by ledger
(``read_ledger``, trying the current ``.xdr.zst`` and the older ``.xdr.zstd`` suffix), and its
oldest and newest ledgers (``edges``), found from the names alone: partition and file names start
with ``0xFFFFFFFF - start`` in hex, so the newest sorts first (and S3 lists it first).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import trio

from ingestion.lake.keys import EXTENSIONS, MANIFEST, LakeSchema, parse_name


def check_lake_url(url: str) -> str | None:
    """Why ``url`` cannot be a lake URL, or None."""
    if not url:
        return "no lake URL given (a directory, file://PATH, or s3://BUCKET/PREFIX)"
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return None if parts.netloc else f"{url}: an s3:// lake URL names a bucket: s3://BUCKET/PREFIX"
    if parts.scheme not in ("", "file"):
        return f"{url}: a lake URL is a directory, file://PATH or s3://BUCKET/PREFIX"
    return None


def lake_identity(url: str) -> str:
    """Which lake ``url`` names, the same however it is written: ``s3://BUCKET/PREFIX`` (no
    slash at either end of the prefix) or ``file://ABSOLUTE-PATH`` (a directory and its
    ``file://`` URL alike). What a lake job follows, with its filters (``ingestion/node/identity.py``)."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        prefix = parts.path.strip("/")
        return f"s3://{parts.netloc}/{prefix}" if prefix else f"s3://{parts.netloc}"
    return f"file://{os.path.abspath(lake_path(url))}"


def open_lake(url: str, endpoint_url: str = "") -> LocalLake | S3Lake:
    """The lake at ``url`` (``endpoint_url``: an S3-compatible endpoint for ``s3://``).

    Raises:
        ValueError: not a lake URL (see :func:`check_lake_url`).
    """
    problem = check_lake_url(url)
    if problem:
        raise ValueError(problem)
    parts = urlsplit(url)
    if parts.scheme == "s3":
        prefix = parts.path.strip("/")
        return S3Lake(parts.netloc, prefix + "/" if prefix else "", endpoint_url or None)
    return LocalLake(lake_path(url))


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
        def names(sub: str) -> list[str]:
            try:
                return os.listdir(folder / sub)
            except FileNotFoundError:
                return []

        return _edge(names, "", newest=newest)


def _edge(names: Callable[[str], list[str]], folder: str, *, newest: bool) -> int | None:
    """The newest (or oldest) ledger under ``folder`` ("" or ``"PARTITION/"``), ``names`` listing
    a folder's entries (a partition's with or without its trailing ``/``)."""
    found = sorted(
        ((k, n) for n in names(folder) if (k := parse_name(n)) is not None),
        key=lambda kn: kn[0].start,
        reverse=newest,
    )
    for key, name in found:
        if key.extension is not None:
            return key.end if newest else key.start
        inside = _edge(names, folder + name.rstrip("/") + "/", newest=newest)  # a partition
        if inside is not None:
            return inside
    return None


@attrs.frozen
class S3Lake:
    """A lake under ``prefix`` ("" or ending in ``/``) of an S3 ``bucket``; ``endpoint_url`` for an
    S3-compatible store (None: AWS). The boto3 client is made on first use, in a worker thread
    (finding credentials may ask an instance metadata service)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    _clients: list[Any] = attrs.field(factory=list, eq=False, repr=False)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _client(self) -> Any:
        if not self._clients:
            self._clients.append(_s3_client(self.endpoint_url))
        return self._clients[0]

    def _get(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: only s3:// lakes load botocore

        try:
            answer = self._client().get_object(Bucket=self.bucket, Key=self.prefix + key)
            return bytes(answer["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise OSError(f"{self}{key}: {exc}") from exc
        except BotoCoreError as exc:
            raise OSError(f"{self}{key}: {exc}") from exc

    def _names(self, folder: str, *, first_page: bool = False) -> list[str]:
        """The entries of ``folder`` (partitions with their ``/``); ``first_page``: the first
        1,000 only, enough for the newest (S3 lists in key order, newest first)."""
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: only s3:// lakes load botocore

        out: list[str] = []
        start = len(self.prefix + folder)
        try:
            pages = self._client().get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + folder, Delimiter="/"
            )
            for page in pages:
                out.extend(p["Prefix"][start:] for p in page.get("CommonPrefixes", ()))
                out.extend(o["Key"][start:] for o in page.get("Contents", ()))
                if first_page:
                    break
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"{self}{folder}: {exc}") from exc
        return out

    async def schema(self) -> LakeSchema | None:
        """As :meth:`LocalLake.schema`."""
        raw = await trio.to_thread.run_sync(self._get, MANIFEST)
        return None if raw is None else LakeSchema.from_manifest(raw)

    async def read_ledger(self, schema: LakeSchema, ledger: int) -> tuple[str, bytes | None]:
        """As :meth:`LocalLake.read_ledger`."""
        return await trio.to_thread.run_sync(self._read_ledger, schema, ledger)

    def _read_ledger(self, schema: LakeSchema, ledger: int) -> tuple[str, bytes | None]:
        for extension in (schema.extension, *(e for e in EXTENSIONS if e != schema.extension)):
            key = schema.object_key(ledger, extension)
            data = self._get(key)
            if data is not None:
                return key, data
        return schema.object_key(ledger), None

    async def edges(self) -> tuple[int, int] | None:
        """As :meth:`LocalLake.edges`."""
        oldest = await trio.to_thread.run_sync(lambda: _edge(self._names, "", newest=False))
        newest = await self.newest()
        return None if oldest is None or newest is None else (oldest, newest)

    async def newest(self) -> int | None:
        """As :meth:`LocalLake.newest`."""
        return await trio.to_thread.run_sync(
            lambda: _edge(lambda f: self._names(f, first_page=True), "", newest=True)
        )


def _s3_client(endpoint_url: str | None) -> Any:
    """A boto3 S3 client: signed when the AWS credential chain finds credentials, else anonymous."""
    import boto3  # lazy: start-up time (boto3, ~130 ms): only s3:// lakes
    from botocore import UNSIGNED  # lazy: only s3:// lakes load botocore
    from botocore.config import Config  # lazy: only s3:// lakes load botocore

    session = boto3.session.Session()
    signed = session.get_credentials() is not None
    config = Config(retries={"max_attempts": 2}, signature_version=None if signed else UNSIGNED)
    return session.client(
        "s3", endpoint_url=endpoint_url, region_name=session.region_name or "us-east-1", config=config
    )
