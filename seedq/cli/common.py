"""What every subcommand's parser shares: one-line argument errors, help
texts that show defaults, the walk over subcommands, comma-separated lists."""

from __future__ import annotations

import argparse

from seedq.config import TrainConfig
from seedq.flags import env_defaults


class Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr (no usage block), exit status 2.

    Abbreviated flags are not accepted: a typo in an override must fail, not
    silently match a longer flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where the help text already states one."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def subcommands(parser: argparse.ArgumentParser, prefix: str):
    """(command line, parser) for every (nested) subcommand, depth first."""
    for action in parser._actions:  # argparse has no public walk over subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                line = f"{prefix} {name}"
                yield line, sub
                yield from subcommands(sub, line)


def unknown_arguments_message(parser: argparse.ArgumentParser, args, extras: list[str]) -> str:
    """One line: the unknown arguments, close matches, and the valid options."""
    import difflib

    prog, target = parser.prog, parser
    for line, sub in subcommands(parser, parser.prog):
        words = line.split()[1:]
        if [getattr(args, d, None) for d in ("command", "bench")][: len(words)] == words:
            prog, target = line, sub
    valid = sorted(o for a in target._actions for o in a.option_strings if o.startswith("--"))
    hints = []
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], valid, n=2, cutoff=0.6)
            if close:
                hints.append(f"{extra}: did you mean {' or '.join(close)}?")
    return (
        f"{prog}: unrecognized arguments: {' '.join(extras)}"
        + (f" ({'; '.join(hints)})" if hints else "")
        + f"; valid options: {', '.join(valid)}"
    )


def default_config(env: str | None) -> TrainConfig:
    return env_defaults(env or TrainConfig.env)


def csv_of(kind):
    def parse(text: str):
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    return parse
