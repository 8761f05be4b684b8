"""`python -m seedq.cli` is the `seedq` console script."""

import sys

from seedq.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while still importing (e.g. a local actor starting up)
        sys.exit(130)
