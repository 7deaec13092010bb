"""SIGINT and SIGTERM while ``run`` starts: held until the process can act on them, never lost.

Python runs a signal's handler between any two bytecodes, including inside a finalizer; a
``KeyboardInterrupt`` raised there is printed ("Exception ignored in ...") and dropped, and the node
then starts and runs on as if nobody had asked it to stop. So ``python -m ingestion`` blocks both
signals the moment it starts (``ingestion/__main__.py``) and releases them only where they are
received on purpose:

- every command but ``run`` releases them at once (Ctrl-C: ``KeyboardInterrupt``, exit 130);
- ``run`` asks :func:`asked` after each start-up step and exits 128 + N before the node exists;
- the node's parent (``ingestion/node/parent.py``) and the node itself release them once a trio signal
  receiver holds them: the parent forwards the signal to its worker, the node stops gracefully.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def hold() -> None:
    """Block SIGINT and SIGTERM: one that comes is kept pending until :func:`release`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release() -> None:
    """Unblock them: a pending one is delivered now, to whatever handles it now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def asked() -> int | None:
    """The exit status for a stop signal held pending (130 for SIGINT, 143 for SIGTERM), or None."""
    pending = signal.sigpending() & STOP_SIGNALS
    if not pending:
        return None
    return 128 + (signal.SIGINT if signal.SIGINT in pending else signal.SIGTERM)
