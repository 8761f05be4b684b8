"""Weights & Biases as a sink of a run's scalars (`--wandb.project`; the `wandb` extra).

The same scalars as TensorBoard (`seedq.reporting.sinks.tensorboard_scalars`),
plotted against env frames: every record carries `frames`, which W&B uses as
the x axis (`define_metric`), so a resumed segment that restarts from its
checkpoint's frames draws over what a killed segment logged after it instead
of being refused as a step going backwards.

The W&B run id is kept in `<logdir>/wandb-run-id`: a resumed seedq run
continues the same W&B run. `WANDB_MODE=offline` writes it under
`<logdir>/wandb/` for `wandb sync` later.
"""

from __future__ import annotations

import dataclasses
import os
import secrets

from seedq import run_dirs

RUN_ID_FILE = run_dirs.WANDB_RUN_ID


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise ValueError("--wandb.project needs the wandb package: pip install 'seedq[wandb]'") from None
    return wandb


def run_id(logdir: str, new_id) -> str:
    """The W&B run id of the seedq run in `logdir`: the one it used before, else `new_id()` (saved)."""
    path = os.path.join(logdir, RUN_ID_FILE)
    if os.path.exists(path):
        with open(path) as f:
            saved = f.read().strip()
        if saved:
            return saved
    value = new_id()
    with open(path, "w") as f:
        f.write(value + "\n")
    return value


class WandbSink:
    def __init__(self, config):
        wandb = _import_wandb()
        options = config.wandb
        try:
            self._run = wandb.init(
                project=options.project,
                entity=options.entity or None,
                name=options.name or os.path.basename(os.path.normpath(config.logdir)),
                id=run_id(config.logdir, lambda: secrets.token_hex(6)),
                resume="allow",
                dir=config.logdir,
                config=dataclasses.asdict(config),
            )
        except wandb.Error as e:  # no login, no network, a bad entity: one line, not a traceback
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"--wandb.project {options.project}: W&B refused the run ({first_line}); "
                             "WANDB_MODE=offline logs without an account") from None
        self._run.define_metric("frames")
        self._run.define_metric("*", step_metric="frames")

    def tick(self, tick) -> None:
        from seedq.reporting.sinks import tensorboard_scalars

        scalars = {k: float(v) for k, v in tensorboard_scalars(tick).items() if v is not None}
        self._run.log({**scalars, "frames": tick.stats.frames})

    def evaluation(self, result: dict, step: int) -> None:
        scalars = {f"eval/return_{k}": result[k] for k in ("mean", "std", "min", "max")}
        self._run.log({**scalars, "eval/length_mean": result["mean_length"], "frames": step})

    def flush(self) -> None:
        pass  # wandb sends in its own process

    def close(self) -> None:
        self._run.finish()
