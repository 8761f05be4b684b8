"""Checkpoints of the learner state with orbax-checkpoint."""

from __future__ import annotations

import os

import jax
import numpy as np


def save(logdir: str, learner) -> str:
    """Writes the learner state (params, optimiser state, step) and counters.

    Returns the checkpoint directory. orbax writes to a temporary directory
    and renames it when complete, so a crash never leaves a half checkpoint.
    """
    import orbax.checkpoint as ocp

    path = os.path.abspath(os.path.join(logdir, "checkpoints", f"step_{learner.train_steps:09d}"))
    state = {
        "learner": learner.state,
        "counters": {
            "train_steps": np.int64(learner.train_steps),
            "frames": np.int64(learner.table.frames),
            "policy_version": np.int64(learner.version),
        },
    }
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, jax.device_get(state), force=True)
    checkpointer.wait_until_finished()
    return path


def restore(path: str, like) -> dict:
    """Restores a checkpoint written by `save` into the structure of `like`."""
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer().restore(os.path.abspath(path), jax.device_get(like))
