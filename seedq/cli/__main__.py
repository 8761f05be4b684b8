"""`python -m seedq.cli` is the `seedq` console script."""

import sys

from seedq.cli import main


def run_command() -> None:
    """Runs `seedq` with this process's arguments and exits with its status."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while still importing (e.g. a local actor starting up)
        sys.exit(130)


if __name__ == "__main__":
    run_command()
