"""SIGINT and SIGTERM while ``run`` starts: held until the process can act on them, never lost.

Python runs a signal's handler between any two bytecodes, including inside a finalizer; a
``KeyboardInterrupt`` raised there is printed ("Exception ignored in ...") and dropped, and the node
then starts and runs on as if nobody had asked it to stop. So ``python -m ingestion`` blocks both
signals the moment it starts (``ingestion/__main__.py``) and releases them only where they are
received on purpose:

- every command but ``run`` releases them at once (Ctrl-C: ``KeyboardInterrupt``, exit 130);
- ``run`` asks :func:`asked` after each start-up step and exits 128 + N before the node exists;
  a step that asks a server (the Redis checks) runs in a thread through :func:`run_unless_asked`,
  so that a signal during it ends start-up at once, not when the step's questions time out;
- the node's parent (``ingestion/node/parent.py``) and the node itself release them once a trio signal
  receiver holds them: the parent forwards the signal to its worker, the node stops gracefully.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

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


POLL = 0.05  # seconds between looks at whether a start-up step running in a thread has returned


def run_unless_asked(step: Callable[[], None]) -> int | None:
    """Run the blocking start-up ``step`` while the stop signals stay held; None once it has
    returned (its exception raised here), or at once the exit status of a stop signal that
    comes first (128 + N). A step that waits on a server that does not answer (a Redis that
    accepts and never answers: 2 s per question, several questions) then does not delay the
    stop: the step runs on in a daemon thread, left to the process's exit.

    Call it before any thread of the process's own exists: the step's thread has ended by the
    time this returns None (a fork after it forks no thread).
    """
    if not hasattr(signal, "sigtimedwait"):  # (not on every platform): one check, as before
        step()
        return asked()
    if (status := asked()) is not None:
        return status
    failure: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:  # (raised again in the calling thread)
            failure.append(exc)

    # The thread inherits the held mask: a stop signal stays pending for sigtimedwait below.
    thread = threading.Thread(target=run, name="start-up step", daemon=True)
    thread.start()
    while thread.is_alive():
        got = signal.sigtimedwait(STOP_SIGNALS, POLL)
        if got is not None:
            return 128 + got.si_signo
    thread.join()
    if failure:
        raise failure[0]
    return asked()
