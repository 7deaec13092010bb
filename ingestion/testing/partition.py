"""Network partitions of one node from Redis, with a cut that holds what was sent, not drops it.

Each node runs under a group id of its own (``spawn(..., group=GID)``, root only). :meth:`Links.route`
gives a group its own transparent :class:`~ingestion.testing.tcp_proxy.TcpProxy` and adds an
nftables rule that redirects every TCP connection a socket of that group opens to the given ports
(the Redis servers and the sentinels) to that proxy, which carries it on to where it was headed
(``SO_ORIGINAL_DST``). The node needs no setting of its own: Sentinel names the real primary, and
the kernel sends the node's connections through its proxy anyway.

:meth:`Links.cut` turns the proxy to ``blackhole``: no byte moves either way, the node's calls
time out, and what it sent meanwhile is held (closing its socket does not take it back).
:meth:`Links.heal` forwards again, held bytes first: a command sent before the lease expired
lands after another node has taken over, the delayed write a fence must refuse (TCP
retransmitting a segment after a partition heals does the same). ``heal(drop=True)`` resets the
held connections instead, as a partition that outlived TCP's patience would.

Needs root and the ``nft`` command with NAT (Debian's ``nftables``); :func:`available` tells, by
trying. Everything lives in one table of this process's own, deleted by :meth:`Links.close`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

import trio

from ingestion.testing.tcp_proxy import TcpProxy

TIMEOUT = 10.0  # seconds for one nft command
NAT_CHAIN = "{ type nat hook output priority -100 ; }"


def _nft(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], capture_output=True, text=True, timeout=TIMEOUT)


def available() -> str | None:
    """None when partitions can be made here; else why not, in one line."""
    if os.geteuid() != 0:
        return "partitions need root (a group id per process and the packet filter)"
    if shutil.which("nft") is None:
        return "partitions need the nft command (Debian: apt-get install -y nftables)"
    table = f"ingestion_probe_{os.getpid()}"
    try:
        for args in (("add", "table", "ip", table), ("add", "chain", "ip", table, "out", NAT_CHAIN)):
            made = _nft(*args)
            if made.returncode != 0:
                return f"nft cannot redirect connections here: {made.stderr.strip() or made.returncode}"
    finally:
        _nft("delete", "table", "ip", table)
    return None


class Links:
    """Every routed node's link to Redis (see the module docstring)."""

    def __init__(self) -> None:
        self.table = f"ingestion_links_{os.getpid()}"
        for args in (
            ("add", "table", "ip", self.table),
            ("add", "chain", "ip", self.table, "out", NAT_CHAIN),
        ):
            done = _nft(*args)
            if done.returncode != 0:
                raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip()}")
        self.proxies: dict[int, TcpProxy] = {}

    async def route(self, nursery: trio.Nursery, gid: int, ports: Iterable[int]) -> TcpProxy:
        """Send every connection group ``gid`` opens to ``ports`` through a proxy of its own."""
        proxy: TcpProxy = await nursery.start(TcpProxy(None).serve)
        listed = ", ".join(str(p) for p in sorted(set(ports)))
        args = ("add", "rule", "ip", self.table, "out", "meta", "skgid", str(gid), "tcp", "dport",
                f"{{ {listed} }}", "redirect", "to", f":{proxy.port}")  # fmt: skip
        done = await trio.to_thread.run_sync(lambda: _nft(*args))
        if done.returncode != 0:
            raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip()}")
        self.proxies[gid] = proxy
        return proxy

    def cut(self, gid: int) -> None:
        self.proxies[gid].set_mode("blackhole")

    def heal(self, gid: int, *, drop: bool = False) -> int:
        """Forward again; returns how many chunks were held (with ``drop``, reset instead)."""
        proxy = self.proxies[gid]
        held = proxy.held
        if drop:
            proxy.set_mode("refuse")
        proxy.held_chunks.clear()
        proxy.set_mode("forward")
        return held

    def close(self) -> None:
        _nft("delete", "table", "ip", self.table)
