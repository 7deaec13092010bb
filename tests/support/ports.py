"""Ports where nothing listens, for tests that need a connection refused.

A port that was merely free a moment ago may be taken by the time the test connects. Each
:func:`closed_port` stays bound, never listening, until the test process exits: connecting to it
is refused (RST), and no other socket can bind it (ours has no SO_REUSEADDR).
"""

from __future__ import annotations

import socket

import trio

_held: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port that refuses connections for as long as the test process runs."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return int(s.getsockname()[1])


async def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connections are refused), and nothing will: the
    port stays held (:func:`closed_port`)."""
    await trio.lowlevel.checkpoint()
    return f"http://127.0.0.1:{closed_port()}"
