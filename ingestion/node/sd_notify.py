"""systemd's readiness protocol: one datagram to ``$NOTIFY_SOCKET`` per state change.

Under a ``Type=notify`` unit systemd sets ``NOTIFY_SOCKET`` to a unix datagram socket (a path, or
an abstract name written with a leading ``@``) and considers the service started only once it
receives ``READY=1``; ``STOPPING=1`` tells it a shutdown has begun. That is the whole protocol this
node needs (sd_notify(3)), so it is written here rather than taken from a library: the small pure
Python ones are unmaintained, and systemd-python needs libsystemd's headers and a compiler.

The socket is non-blocking: a notification that cannot be sent at once is dropped and reported,
never waited for, so a stuck or absent service manager cannot stall the event loop.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``"READY=1"``, ``"STOPPING=1"``, newline-separated assignments) to the
    service manager.

    Returns:
        True once sent; False when no service manager listens (``NOTIFY_SOCKET`` unset).

    Raises:
        OSError: ``NOTIFY_SOCKET`` is set but the datagram could not be sent (no such socket,
            not a unix address, the manager's queue full).
    """
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # the abstract namespace
    elif not address.startswith("/"):
        raise OSError(f"NOTIFY_SOCKET={address!r}: only unix socket addresses are supported")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        sock.sendto(state.encode(), address)
    return True
