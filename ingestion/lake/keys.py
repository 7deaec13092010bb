"""Where a ledger lies in a data lake: the manifest and the object keys, exactly as the Go
datastore schema derives them (stellar/go ``support/datastore/schema.go``). Pure.

A lake groups ledgers into files of ``ledgers_per_file`` (a *batch*) and files into partitions of
``files_per_partition``. Each name starts with ``0xFFFFFFFF - start`` in 8 upper-case hex digits,
so that a plain lexicographic listing shows the newest first:

- partition (only when a partition holds more than one file): ``"%08X--%d-%d/"`` of
  ``0xFFFFFFFF - partitionStart``, the partition's first and last ledger;
- file: ``"%08X--%d"`` of ``0xFFFFFFFF - fileStart`` and ``fileStart``, then ``"-%d"`` of the
  file's last ledger when it holds more than one, then ``".xdr." + extension`` (``zst``; lakes
  written before the rename use ``zstd``).

Boundaries are multiples of the file size counted from ledger 0 (ledger 64,000 starts a file of a
1-ledger lake and a partition of the public pubnet lake's 64,000 files per partition).

The manifest, ``.config.json`` at the lake's root (``support/datastore/configure.go``):
``networkPassphrase``, ``version``, ``compression``, ``ledgersPerBatch``, ``batchesPerPartition``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

MANIFEST = ".config.json"
MAX_UINT32 = 0xFFFFFFFF
EXTENSIONS = ("zst", "zstd")  # the current suffix first; "zstd" for lakes written before it
_NAME = re.compile(r"^([0-9A-F]{8})--(\d+)(?:-(\d+))?(?:\.xdr\.(zstd?))?/?$")


class ManifestError(ValueError):
    """A ``.config.json`` this reader cannot use; the message names the field."""


@attrs.frozen
class LakeSchema:
    """How a lake lays out its files (the Go ``DataStoreSchema``)."""

    ledgers_per_file: int = 1
    files_per_partition: int = 64_000
    extension: str = "zst"
    network_passphrase: str = ""
    compression: str = "zstd"

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.ledgers_per_file <= MAX_UINT32 or not 1 <= self.files_per_partition <= MAX_UINT32:
            raise ManifestError("ledgersPerBatch and batchesPerPartition must be positive")

    @classmethod
    def from_manifest(cls, raw: bytes | str, extension: str = "zst") -> LakeSchema:
        """The schema of a lake from its ``.config.json``.

        Raises:
            ManifestError: not JSON, a missing or mistyped field, or a compression other than zstd.
        """
        try:
            doc: Any = json.loads(raw)
        except ValueError as exc:
            raise ManifestError(f"{MANIFEST} is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ManifestError(f"{MANIFEST} is not a JSON object")
        per_file, per_partition = doc.get("ledgersPerBatch"), doc.get("batchesPerPartition")
        for name, value in (("ledgersPerBatch", per_file), ("batchesPerPartition", per_partition)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ManifestError(f"{MANIFEST}: {name} must be a positive integer, not {value!r}")
        compression = doc.get("compression") or "zstd"
        if compression != "zstd":
            raise ManifestError(f"{MANIFEST}: compression {compression!r} is not supported (zstd only)")
        assert isinstance(per_file, int) and isinstance(per_partition, int)
        return cls(per_file, per_partition, extension, str(doc.get("networkPassphrase") or ""), compression)

    def to_manifest(self) -> bytes:
        doc = {
            "networkPassphrase": self.network_passphrase,
            "version": "1.0",
            "compression": self.compression,
            "ledgersPerBatch": self.ledgers_per_file,
            "batchesPerPartition": self.files_per_partition,
        }
        return json.dumps(doc, indent=2).encode()

    def file_start(self, ledger: int) -> int:
        return ledger // self.ledgers_per_file * self.ledgers_per_file

    def file_end(self, ledger: int) -> int:
        return self.file_start(ledger) + self.ledgers_per_file - 1

    def partition(self, ledger: int) -> str:
        """The partition directory of ``ledger`` with its trailing ``/``; "" when a partition
        holds one file (the Go schema writes no directory then)."""
        if self.files_per_partition <= 1:
            return ""
        size = self.ledgers_per_file * self.files_per_partition
        start = ledger // size * size
        return f"{MAX_UINT32 - start:08X}--{start}-{start + size - 1}/"

    def file_name(self, ledger: int, extension: str | None = None) -> str:
        start, end = self.file_start(ledger), self.file_end(ledger)
        name = f"{MAX_UINT32 - start:08X}--{start}"
        if end != start:
            name += f"-{end}"
        return f"{name}.xdr.{extension or self.extension}"

    def object_key(self, ledger: int, extension: str | None = None) -> str:
        """The key of the object holding ``ledger`` (``GetObjectKeyFromSequenceNumber``)."""
        return self.partition(ledger) + self.file_name(ledger, extension)


@attrs.frozen
class KeyName:
    """A partition or file name read back: its first and last ledger."""

    start: int
    end: int
    extension: str | None  # None for a partition


def parse_name(name: str) -> KeyName | None:
    """A partition or file name (the last path segment) as :class:`KeyName`, or None when the
    name is not one of the schema's (its hex prefix must agree with its start)."""
    m = _NAME.match(name)
    if not m:
        return None
    start = int(m.group(2))
    end = int(m.group(3)) if m.group(3) else start
    if int(m.group(1), 16) != MAX_UINT32 - start or end < start:
        return None
    return KeyName(start, end, m.group(4))
