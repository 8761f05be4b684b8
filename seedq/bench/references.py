"""The learning suite's envs, frame budgets and published reference returns.

A reference is the return a well-known implementation reaches on the env
with its own tuned hyperparameters, within about the same budget; `source`
says whose figure it is. Budgets are env steps (agent steps: for ALE ids,
one step is `atari.frame_skip` emulator frames).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Reference:
    env: str
    frames: int  # the suite's budget, env steps
    reference: float  # the published return the normalised score calls 1
    spread: str  # as published (± std over seeds, or a range)
    source: str


SUITE = {r.env: r for r in (
    Reference("CartPole-v1", 500_000, 490.0, "± 6", "CleanRL PPO (ppo.py, 500k steps)"),
    Reference("Acrobot-v1", 500_000, -86.0, "± 1", "CleanRL PPO; rl-baselines3-zoo A2C -83"),
    Reference("LunarLander-v3", 1_000_000, 242.0, "± 32",
              "rl-baselines3-zoo PPO (LunarLander-v2 figures); needs gymnasium[box2d]"),
    Reference("Pendulum-v1", 1_000_000, -163.0, "± 103", "rl-baselines3-zoo A2C"),
    Reference("MinAtar/Breakout-v1", 5_000_000, 17.5, "≈", "MinAtar paper (Young & Tian 2019), AC(λ)"),
    Reference("MinAtar/SpaceInvaders-v1", 5_000_000, 165.0, "145–185",
              "MinAtar paper (Young & Tian 2019), AC(0)–AC(0.8)"),
    Reference("dmc:cartpole-swingup", 1_000_000, 641.0, "± 11", "CleanRL PPO (dm_control)"),
    Reference("dmc:walker-walk", 3_000_000, 393.0, "± 56 (at 1M)", "CleanRL PPO (dm_control)"),
    Reference("ALE/Pong-v5", 10_000_000, 20.0, "≈", "rl-baselines3-zoo / CleanRL PPO; GPU only"),
)}

# The suite's default envs: everything but Pong (a GPU run); LunarLander only
# where Box2D is installed (the `seedq[box2d]` extra).
DEFAULT_ENVS = (
    "CartPole-v1", "Acrobot-v1", "LunarLander-v3", "Pendulum-v1", "MinAtar/Breakout-v1",
    "MinAtar/SpaceInvaders-v1", "dmc:cartpole-swingup", "dmc:walker-walk",
)
NEEDS_BOX2D = ("LunarLander-v3",)


def default_envs(box2d_installed: bool) -> tuple[str, ...]:
    return tuple(e for e in DEFAULT_ENVS if box2d_installed or e not in NEEDS_BOX2D)


def normalised(value: float | None, random: float | None, reference: float) -> float | None:
    """(value - random) / (reference - random): 0 is the random policy, 1 the reference."""
    if value is None or random is None or reference == random:
        return None
    return (value - random) / (reference - random)
