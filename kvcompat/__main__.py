"""``python -m kvcompat``: the same command line as ``kvcompat``."""

from __future__ import annotations

import sys

from kvcompat.cli import main

if __name__ == "__main__":
    sys.exit(main())
