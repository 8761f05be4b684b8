"""`python -m seedq` is the `seedq` command."""

from seedq.cli.__main__ import run_command

if __name__ == "__main__":
    run_command()
