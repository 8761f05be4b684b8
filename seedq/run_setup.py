"""A run planned once, for `seedq train|learner` and `seedq.train` alike: its
config resolved and validated, its env spec, and the run directory it
resumes or starts in.

The route of a setting to the learner:

1. the command line (`seedq.cli`) or `seedq.train`'s keyword arguments give
   layers of fields (`seedq.config.resolve.Layer`): a `--config` file, then
   the flags or keywords;
2. `plan` resolves them over the env's defaults or a resumed run's saved
   config (`seedq.config.resolve.resolve`), validates the result and checks
   the run directory: once per run;
3. `seedq.local.train` builds the agent from the config and the spec, once,
   and hands both to the `Learner`.

Nothing after `plan` reads flags or defaults again.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from seedq import config as config_lib
from seedq import run_dirs
from seedq.config import TrainConfig
from seedq.config.resolve import Layer, apply, given, resolve
from seedq.schema import EnvSpec


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A validated run config (run directory resolved) and the spec of its env."""

    config: TrainConfig
    spec: EnvSpec


def build_env_spec(config: TrainConfig) -> EnvSpec:
    """The spec of the run's env with its options (ValueError for an unknown env id)."""
    from seedq.envs import env_spec

    return env_spec(config.env, config.env_options)


def prepare(config: TrainConfig, spec: EnvSpec | None = None) -> PreparedRun:
    """`config` resolved and validated, with its env's spec (`spec`: already
    built for this env and these options). ValueError naming the first bad field."""
    config = config.resolved()
    config.validate()
    return PreparedRun(config, build_env_spec(config) if spec is None else spec)


def saved_config(run_dir: str, flag: str) -> TrainConfig:
    """The config.json of the run in `run_dir` (FileNotFoundError naming `flag` otherwise)."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{flag} {run_dir}: no such run directory")
    path = os.path.join(run_dir, run_dirs.CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{flag} {run_dir}: not a seedq run directory (no config.json)")
    try:
        return config_lib.load(path)
    except (ValueError, TypeError, KeyError) as e:
        raise FileNotFoundError(f"{flag} {run_dir}: config.json cannot be read ({e})") from None


def plan(layers: Sequence[Layer], *, resume: str | None = None, overwrite: bool = False,
         starts: bool = True) -> tuple[PreparedRun, str | None]:
    """The run `layers` describe (resolved, validated, env spec built) and the
    run directory to resume (None: a fresh run).

    `resume`: a run directory, whose saved config the layers then apply to;
    or `auto`, which resumes the run directory (the layers' `logdir`) when it
    holds a checkpoint and starts a fresh run in it otherwise. `overwrite`: a
    fresh run may replace the run in its directory (removed later, after every
    check: seedq.local). `starts`: the run will start (not `--print-config`):
    its directory is checked and, resuming, locked."""
    if resume == "auto":
        run_dir = given(layers, "logdir") or ""
        if not run_dir:
            raise ValueError("--resume auto needs the run directory: give --logdir DIR (or logdir in --config)")
        from seedq import checkpoint

        if starts and _locks_before_start(layers):
            # A restarted pod can start while the old one is still stopping:
            # wait for it, then decide from what it left.
            run_dirs.hold(run_dir, wait=True)
        if not checkpoint.has_checkpoint(run_dir):
            layers = [*layers, Layer({"logdir": run_dir})]  # a fresh run, in that directory
            return _fresh(layers, overwrite=overwrite, check_dir=False), None
        resume_dir = run_dir
    elif resume is None:
        return _fresh(layers, overwrite=overwrite, check_dir=starts), None
    else:
        resume_dir = resume
    if overwrite:
        raise ValueError("--overwrite starts a fresh run: it cannot be combined with --resume")
    logdir = given(layers, "logdir")
    if logdir is not None and os.path.abspath(logdir) != os.path.abspath(resume_dir):
        raise ValueError("--logdir cannot be combined with --resume: the run continues in its own directory")
    config, _ = resolve(layers, None, saved=saved_config(resume_dir, "--resume"))
    prepared = prepare(dataclasses.replace(config, logdir=resume_dir))
    if resume != "auto" and starts and _locks_before_start(layers):
        run_dirs.hold(resume_dir)  # a second writer is refused here, before anything is restored
    return prepared, resume_dir


def _fresh(layers: Sequence[Layer], *, overwrite: bool, check_dir: bool) -> PreparedRun:
    from seedq.envs import env_facts

    config, spec = resolve(layers, env_facts)
    if config.distributed.explicit and not config.logdir:
        # (A default run directory is named by time and pid: one per process.)
        raise ValueError("--distributed.coordinator needs --logdir: the learner group shares one run directory")
    prepared = prepare(config, spec)
    if check_dir:
        check_run_dir(prepared.config, overwrite=overwrite)
    return prepared


def _locks_before_start(layers: Sequence[Layer]) -> bool:
    return locks_before_start(apply(TrainConfig(), layers).distributed)


def locks_before_start(group) -> bool:
    """Whether this process takes its run directory's lock before the learner
    starts (`group`: its DistributedConfig): not when its supervisor holds it
    for it, not in a group's process other than 0, and not in a group JAX
    detects (its process 0 is known only once the group forms; seedq.local
    takes the lock then)."""
    from seedq import distributed

    if run_dirs.holds_lock_already() or group.process_id > 0:
        return False
    return group.explicit or not distributed.needs_supervisor(group)


def check_run_dir(config: TrainConfig, *, overwrite: bool) -> None:
    """A fresh run's directory must not hold another run (two runs' files would
    mix): ValueError naming --resume and --overwrite; with `overwrite`, one
    line when seedq may not clear it (seedq.run_dirs.overwrite_refusal). The
    old run is removed later, after every other check (seedq.local). In a
    learner group only process 0 checks, before the group forms (the others
    find the directory process 0 has started)."""
    from seedq import distributed

    if config.distributed.process_id > 0 or distributed.is_supervised_child():
        return
    if not run_dirs.holds_run(config.logdir):
        return
    if not overwrite:
        raise ValueError(run_dirs.refusal(config.logdir))
    why_not = run_dirs.overwrite_refusal(config.logdir)
    if why_not:
        raise ValueError(why_not)
