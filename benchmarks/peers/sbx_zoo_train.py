"""rl-zoo's own training script with sbx's PPO (JAX) in place of SB3's (PyTorch).

This is the wiring sbx's README gives for running sbx under the RL Zoo; it runs
in the sbx venv that `peers.py setup sbx` makes. Every other choice (the
`atari` hyperparameters of rl_zoo3/hyperparams/ppo.yml, SB3's AtariWrapper,
VecFrameStack) is rl-zoo's own; peers.py adds only the flags it passes.
"""

import rl_zoo3
import rl_zoo3.exp_manager
import rl_zoo3.train
from sbx import PPO

rl_zoo3.ALGOS["ppo"] = PPO
rl_zoo3.train.ALGOS = rl_zoo3.ALGOS
rl_zoo3.exp_manager.ALGOS = rl_zoo3.ALGOS

if __name__ == "__main__":
    rl_zoo3.train.train()
