"""Where a run's scalars go besides TensorBoard: Weights & Biases."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases (the `wandb` extra; seedq.reporting.wandb_sink): off
    unless `project` is set. WANDB_MODE=offline writes the W&B run into the
    run directory without an account."""

    # The W&B project the run logs to ("": no W&B).
    project: str = ""
    # The W&B entity (user or team) owning the project ("": your default entity).
    entity: str = ""
    # The W&B run's display name ("": the run directory's name).
    name: str = ""
