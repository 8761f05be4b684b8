"""The Python API: `seedq.train`, `seedq.load_policy`, `seedq.evaluate`.

`train` resolves a run exactly as `seedq train` does, without the command
line: its keyword arguments are a layer of fields over the env's defaults
and target return, after a config file (`seedq.run_setup.plan`, which the
command calls with its flags). Only then does it run the learner and its
actor processes, in this process, and return a `Run`.

Signal handlers are installed only when `train` runs on the main thread, so a
notebook cell or a worker thread can call it. Ctrl-C stops the run after its
final checkpoint and summary, like the command, and `train` then raises
KeyboardInterrupt; on a worker thread, a Ctrl-C that ends the main thread
stops the run the same way before the interpreter exits.
"""

from __future__ import annotations

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


def train_layers(config=None, overrides: Mapping[str, Any] | None = None) -> list:
    """The layers of fields (seedq.config.resolve.Layer) that `train(config,
    **overrides)` resolves, as `seedq train` resolves a `--config` file and its
    flags: `config` (a TrainConfig, a dict of fields or a config file's path),
    then the keyword arguments (sections as dicts)."""
    from seedq.config import TrainConfig, to_dict
    from seedq.config.resolve import Layer, file_layer

    layers = []
    if isinstance(config, TrainConfig):
        layers.append(Layer(to_dict(config), "config"))
    elif isinstance(config, Mapping):
        layers.append(Layer(dict(config), "config"))
    elif config is not None:
        layers.append(file_layer(os.fspath(config)))
    if overrides:
        layers.append(Layer(dict(overrides)))
    return layers


def train(config=None, *, quiet: bool = False, resume: str | None = None, overwrite: bool = False,
          **overrides: Any) -> Run:
    """Trains a policy (a learner plus `num_actors` actor processes on this
    host, as `seedq train`) and returns the finished `Run`.

    `config`: a `TrainConfig`, a dict of fields, or the path of a config file
    (`--config`); `overrides`: config fields by name, sections as dicts, e.g.
    `train(env="CartPole-v1", max_seconds=120, logdir="runs/a",
    vtrace={"learning_rate": 3e-4})` (the sections and their fields:
    `seedq.config.TrainConfig`, docs/config.md). `resume="RUN_DIR"` continues
    a run; a `logdir` that holds a run is refused unless `overwrite=True` (or
    `resume="auto"`). Defaults that depend on the env (its target return, Box
    actions, pixel frames) apply as on the command line: both resolve through
    `seedq.run_setup.plan`. `quiet`: no progress lines.
    ValueError (one line) for a bad field or value.
    """
    started = time.monotonic()
    from seedq import distributed, run_setup

    try:
        prepared, resume_dir = run_setup.plan(train_layers(config, overrides), resume=resume, overwrite=overwrite)
    except FileNotFoundError as e:
        raise ValueError(e.args[0]) from None
    if distributed.needs_supervisor(prepared.config.distributed):
        raise ValueError("a multi-host learner group runs from the command line (seedq train), not seedq.train")
    from seedq import local

    summary = local.train(prepared, quiet=quiet, started=started, with_actors=True, resume=resume_dir,
                          overwrite=overwrite, wait_for_lock=resume == "auto")
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

    policy = policy_or_path if isinstance(policy_or_path, Policy) else load_policy(policy_or_path, env=env)
    env_id = env or policy.env_id
    if env_id != policy.env_id:
        from seedq.envs import env_spec

        other = env_spec(env_id, policy.info.env_options)
        mismatch = policy.spec.describe_mismatch(other)
        if mismatch:
            raise ValueError(f"{env_id} does not fit a policy trained on {policy.env_id} ({mismatch})")
    runner = policy.episodes(greedy=deterministic)
    return evaluation.evaluate(runner, env_id, episodes, seed, policy.info.env_options)

