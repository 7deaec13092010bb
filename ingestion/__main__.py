"""``python -m ingestion`` and the ``ingestion`` console script: see :mod:`ingestion.cli`.

Imports nothing heavy before it can catch Ctrl-C: an interrupt while the modules load exits 130
without a traceback, like one at any later moment of start-up. SIGINT and SIGTERM are blocked
before anything else runs, so that none is lost in between (``ingestion/node/stop_signals.py``).
"""

import os
import sys


def entry() -> int:
    try:
        from ingestion.node import stop_signals  # lazy: inside the try: a Ctrl-C while it loads exits 130

        stop_signals.hold()  # first of all (it imports only the standard signal module)
        from ingestion.cli import main  # lazy: once the signals are held

        status = main()
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`ingestion check-config | head`): what was left to print has no
        # reader. Not a traceback; stdout is pointed at /dev/null so that the interpreter's own
        # final flush does not fail again. 141: killed by SIGPIPE, as a shell pipeline expects.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(entry())
