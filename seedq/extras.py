"""Optional parts of seedq behind pip extras, and the one-line refusal when one is missing.

Training needs only the runtime dependencies; the tooling brings its own:
  * `bench`: the benchmarks' plots (matplotlib) and the soak's memory readings (psutil);
  * `launch`: the Kubernetes manifests (PyYAML).

A module of the tooling calls `require(extra, *modules)` at its top, before
importing them, so that `seedq bench suite` without matplotlib says which
extra to install instead of failing with an ImportError.
"""

from __future__ import annotations

import importlib.util
import sys

# First words of argv that name a command with subcommands (`seedq bench suite`).
_COMMAND_GROUPS = ("bench", "launch")


def missing(*modules: str) -> list[str]:
    """The importable names among `modules` that cannot be imported here (not installed)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            found = False
        if not found:
            out.append(name)
    return out


def command_name(argv: list[str] | None = None) -> str:
    """The seedq command being run, for messages: "seedq bench suite", "seedq compare"."""
    argv = sys.argv if argv is None else argv
    words = [w for w in argv[1:3] if not w.startswith("-")]
    if words and words[0] not in _COMMAND_GROUPS:
        words = words[:1]
    return " ".join(["seedq", *words])


def require(extra: str, *modules: str) -> None:
    """Exits with status 2 and one line on stderr naming `extra` when any of
    `modules` is not installed; returns otherwise (nothing is imported)."""
    if missing(*modules):
        print(f"{command_name()}: needs the '{extra}' extra: pip install 'seedq[{extra}]'", file=sys.stderr)
        raise SystemExit(2)
