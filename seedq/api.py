"""The Python API: `seedq.train`, `seedq.load_policy`, `seedq.evaluate`.

`train` resolves a run exactly as `seedq train` does: its keyword arguments
become the command's flags and go through the command's own parser and
resolution (`seedq.cli.run_config`): the env's defaults and target return,
a config file, `resume`. Only then does it run the learner and its actor
processes, in this process, and return a `Run`.

Signal handlers are installed only when `train` runs on the main thread, so a
notebook cell or a worker thread can call it. Ctrl-C stops the run after its
final checkpoint and summary, like the command, and `train` then raises
KeyboardInterrupt; on a worker thread, a Ctrl-C that ends the main thread
stops the run the same way before the interpreter exits.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import time
from typing import Any, Mapping

import numpy as np

from seedq.policy import Policy, load_policy

__all__ = ["Run", "train", "load_policy", "evaluate", "Policy"]


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished training run."""

    logdir: str  # the run directory: config.json, summary.json, checkpoints/, curves.csv, ...
    summary: dict  # summary.json: stop reason, frames, seconds, target, final evaluation

    @property
    def curves(self) -> dict[str, np.ndarray]:
        """curves.csv as columns (name -> array, one row per progress interval,
        keyed by `frames`); `pandas.DataFrame(run.curves)` makes a table of it."""
        return read_curves(self.logdir)

    def load_policy(self, **kwargs) -> Policy:
        """The run's final policy (`seedq.load_policy(run.logdir)`)."""
        return load_policy(self.logdir, **kwargs)


def read_curves(logdir: str) -> dict[str, np.ndarray]:
    """The columns of `<logdir>/curves.csv` (empty cells are NaN)."""
    path = os.path.join(logdir, "curves.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    return {name: np.array([float(r[name]) if r[name] != "" else np.nan for r in rows]) for name in rows[0]}


def _flag_text(value: Any) -> str:
    """A config value as its flag spells it (`seedq.flags.parser_for` reads it back)."""
    from seedq.flags import NONE_WORD

    if value is None:
        return NONE_WORD
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def _train_parser() -> argparse.ArgumentParser:
    from seedq import cli

    for line, parser in cli.subcommands(cli.build_parser(), "seedq"):
        if line == "seedq train":
            return parser
    raise RuntimeError("the seedq command has no train subcommand")


def _flags_for(fields: Mapping[str, Any], dests: set[str], prefix: str = "") -> list[str]:
    """`--section.field=value` flags for (nested) config fields; ValueError for an unknown name."""
    import difflib

    flags = []
    for name, value in fields.items():
        dest = prefix + name
        if isinstance(value, Mapping):
            if not any(d.startswith(dest + ".") for d in dests):
                raise ValueError(f"{dest}: not a config section")
            flags += _flags_for(value, dests, dest + ".")
            continue
        if dest not in dests:
            close = difflib.get_close_matches(dest, sorted(dests), n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"{dest}: not a config field{hint}")
        flags.append(f"--{prefix}{name.replace('_', '-')}={_flag_text(value)}")
    return flags


def train_args(config=None, overrides: Mapping[str, Any] | None = None) -> argparse.Namespace:
    """The parsed `seedq train` arguments that `train(config, **overrides)` stands for."""
    from seedq.config import TrainConfig
    from seedq.flags import config_flags

    parser = _train_parser()
    # The config fields' flags (seedq.flags marks them) and --resume; not the
    # command's own switches (--print-config, --parent-pid). argparse has no public list.
    dests = {a.dest for a in parser._actions if hasattr(a, "doc_class")} | {"resume"}
    argv: list[str] = []
    if isinstance(config, TrainConfig):
        argv += config_flags(config)
    elif isinstance(config, Mapping):
        argv += _flags_for(config, dests)
    elif config is not None:
        argv += [f"--config={os.fspath(config)}"]
    overrides = dict(overrides or {})
    overwrite = bool(overrides.pop("overwrite", False))  # a switch of the command, not a field
    argv += _flags_for(overrides, dests)
    parser.exit_on_error = False  # bad values raise here instead of exiting the caller
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as e:
        raise ValueError(str(e).replace("argument --", "--")) from None
    args.command = "train"
    args.overwrite = overwrite
    return args


def train(config=None, *, quiet: bool = False, **overrides: Any) -> Run:
    """Trains a policy (a learner plus `num_actors` actor processes on this
    host, as `seedq train`) and returns the finished `Run`.

    `config`: a `TrainConfig`, a dict of fields, or the path of a config file
    (`--config`); `overrides`: config fields by name, sections as dicts, e.g.
    `train(env="CartPole-v1", max_seconds=120, logdir="runs/a",
    vtrace={"learning_rate": 3e-4})`. `resume="RUN_DIR"` continues a run; a `logdir` that
    holds a run is refused unless `overwrite=True` (or `resume="auto"`).
    Defaults that depend on the env (its target return, Box-action settings)
    apply as on the command line. `quiet`: no progress lines.
    ValueError (one line) for a bad field or value.
    """
    started = time.monotonic()
    from seedq import cli, distributed

    args = train_args(config, overrides)
    try:
        prepared, resume = cli.run_config(args)  # resolved and validated, as the command does
    except FileNotFoundError as e:
        raise ValueError(e.args[0]) from None
    if distributed.needs_supervisor(prepared.config.distributed):
        raise ValueError("a multi-host learner group runs from the command line (seedq train), not seedq.train")
    from seedq import local

    summary = local.train(prepared, quiet=quiet, started=started, with_actors=True, resume=resume)
    if summary.get("stop_reason") == "terminated" and "frames" not in summary:
        raise RuntimeError("the run was stopped before it started")
    if summary.get("stop_reason") == "interrupted":
        # Ctrl-C stops the caller too (a loop of runs, a script), once the run is saved.
        raise KeyboardInterrupt(f"run stopped; checkpoint and summary in {prepared.config.logdir}")
    return Run(prepared.config.logdir, summary)


def evaluate(policy_or_path, env: str | None = None, episodes: int = 10, *, seed: int = 0,
             deterministic: bool = True):
    """Plays `episodes` episodes of `env` (default: the policy's env, with its
    preprocessing), one per env of a vector env reset with `seed` (env i gets
    seed + i), and returns a `seedq.evaluation.EvalResult` (`.mean`, `.returns`, ...).

    `policy_or_path`: a `Policy`, or anything `load_policy` reads."""
    from seedq import evaluation

    policy = policy_or_path if isinstance(policy_or_path, Policy) else load_policy(policy_or_path)
    env_id = env or policy.env_id
    if env_id != policy.env_id:
        from seedq.envs import env_spec

        other = env_spec(env_id, policy.info.env_options)
        mismatch = policy.spec.describe_mismatch(other)
        if mismatch:
            raise ValueError(f"{env_id} does not fit a policy trained on {policy.env_id} ({mismatch})")
    runner = policy.episodes(greedy=deterministic)
    return evaluation.evaluate(runner, env_id, episodes, seed, policy.info.env_options)

