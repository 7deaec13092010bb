"""A network partition of one process from some loopback ports, by the kernel's packet filter.

Each process to cut off runs under a group id of its own (``spawn(..., group=GID)``, root only);
:meth:`Partitions.cut` adds an nftables rule that drops every TCP packet a socket of that group
sends to the given ports, on every interface (loopback included), and :meth:`Partitions.heal`
removes it. Established connections stall rather than close, as a cable cut would: what the
process sent in the meantime is retransmitted by its kernel once healed, and lands late (the
delayed write a fence must refuse). Packets to the process are untouched, but with its own
packets (its acknowledgements too) dropped nothing gets through.

Needs root and the ``nft`` command (Debian's ``nftables``); :func:`available` tells, by trying.
Everything lives in one table of this process's own, deleted by :meth:`Partitions.close`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

TIMEOUT = 10.0  # seconds for one nft command


def _nft(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], capture_output=True, text=True, timeout=TIMEOUT)


def available() -> str | None:
    """None when partitions can be made here; else why not, in one line."""
    if os.geteuid() != 0:
        return "partitions need root (a group id per process and the packet filter)"
    if shutil.which("nft") is None:
        return "partitions need the nft command (Debian: apt-get install -y nftables)"
    table = f"ingestion_probe_{os.getpid()}"
    made = _nft("add", "table", "inet", table)
    if made.returncode != 0:
        return f"nft cannot add a table here: {made.stderr.strip() or made.returncode}"
    _nft("delete", "table", "inet", table)
    return None


class Partitions:
    """The partitions of one campaign (see the module docstring)."""

    def __init__(self) -> None:
        self.table = f"ingestion_chaos_{os.getpid()}"
        made = _nft("add", "table", "inet", self.table)
        if made.returncode != 0:
            raise RuntimeError(f"nft: {made.stderr.strip()}")
        self.cut_off: set[int] = set()

    def cut(self, gid: int, ports: Iterable[int]) -> None:
        """Drop what processes of group ``gid`` send to ``ports`` (TCP, any address)."""
        chain = f"g{gid}"
        listed = ", ".join(str(p) for p in sorted(set(ports)))
        for args in (
            ("add", "chain", "inet", self.table, chain, "{ type filter hook output priority 0 ; }"),
            ("add", "rule", "inet", self.table, chain, "meta", "skgid", str(gid), "tcp", "dport",
             f"{{ {listed} }}", "drop"),
        ):  # fmt: skip
            done = _nft(*args)
            if done.returncode != 0:
                raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip()}")
        self.cut_off.add(gid)

    def heal(self, gid: int) -> None:
        chain = f"g{gid}"
        if gid in self.cut_off:
            _nft("flush", "chain", "inet", self.table, chain)
            _nft("delete", "chain", "inet", self.table, chain)
            self.cut_off.discard(gid)

    def close(self) -> None:
        _nft("delete", "table", "inet", self.table)
        self.cut_off.clear()
