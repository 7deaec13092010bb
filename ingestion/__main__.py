"""``python -m ingestion`` and the ``ingestion`` console script: see :mod:`ingestion.cli`.

Imports nothing heavy before it can catch Ctrl-C: an interrupt while the modules load exits 130
without a traceback, like one at any later moment of start-up.
"""

import sys


def entry() -> int:
    try:
        from ingestion.cli import main

        return main()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(entry())
