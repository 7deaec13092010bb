"""``python -m ingestion``: see :mod:`ingestion.cli`."""

import sys

from ingestion.cli import main

sys.exit(main())
