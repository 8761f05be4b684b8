"""What every subcommand's parser shares: one-line argument errors, help
texts that show defaults, the walk over subcommands, comma-separated lists."""

from __future__ import annotations

import argparse
import sys

from seedq.config import TrainConfig
from seedq.flags import show_env_defaults


class Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr (no usage block), exit status 2.

    Abbreviated flags are not accepted: a typo in an override must fail, not
    silently match a longer flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class SectionHelp(argparse.Action):
    """`-h/--help [SECTION]` and `--help-all` of a command whose flags are
    grouped by config section (seedq.flags.help_group): the everyday flags by
    default, one section, or every flag. (argparse prints all groups at once;
    its formatter is reused here to print some.)"""

    def __init__(self, option_strings, dest, everything: bool = False, **kwargs):
        self.everything = everything
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0 if everything else "?", metavar="SECTION", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        sections = parser.__dict__.get("help_sections", {})
        wanted = "all" if self.everything else (values or "common")
        if wanted != "all" and wanted not in sections:
            parser.error(f"--help {wanted}: no such section; choose one of {', '.join(sections)} or all")
        # The given --env's (given before --help) env-dependent defaults, else the default env's.
        show_env_defaults(parser, getattr(namespace, "env", None) or TrainConfig.env)
        parser._print_message(section_help(parser, sections, wanted), sys.stdout)  # help goes to stdout
        parser.exit(0)


def section_help(parser: argparse.ArgumentParser, sections: dict, wanted: str) -> str:
    """The help text of `parser` limited to the group `wanted` (`common`: the
    command's everyday flags and the list of sections; `all`: every group)."""
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    formatter.add_text(parser.description)
    shown = [g for name, g in sections.items() if wanted in ("all", name)]
    for group in shown:
        formatter.start_section(f"{group.title} options")
        formatter.add_text(group.description)
        formatter.add_arguments(group._group_actions)
        formatter.end_section()
    if wanted == "common":
        others = [name for name in sections if name != "common"]
        formatter.add_text(
            f"More flags by section: {parser.prog} --help SECTION, SECTION one of {', '.join(others)}; "
            f"every flag: {parser.prog} --help-all. Defaults marked env-dependent are resolved by "
            f"{parser.prog} --print-config --env ENV."
        )
    return formatter.format_help()


def add_section_help(parser: argparse.ArgumentParser) -> None:
    """`-h/--help [SECTION]` and `--help-all` on a parser made with add_help=False."""
    group = parser.__dict__.setdefault("help_sections", {}).get("common") or parser
    group.add_argument("-h", "--help", action=SectionHelp,
                       help="show the everyday flags, or the flags of one SECTION, and exit")
    group.add_argument("--help-all", action=SectionHelp, everything=True, help="show every flag and exit")


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
    """One line: the unknown arguments and their close matches (not the list of
    every flag: `seedq train` has over a hundred)."""
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
        + f"; see {prog} --help"
        + ("-all" if "help_sections" in target.__dict__ else "")
    )


def default_config(env: str | None) -> TrainConfig:
    return _run_defaults(env or TrainConfig.env)


def csv_of(kind):
    def parse(text: str):
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    return parse


def _run_defaults(env_id: str):
    from seedq.envs import run_defaults  # (gymnasium: only when a command needs an env's defaults)

    return run_defaults(env_id)
