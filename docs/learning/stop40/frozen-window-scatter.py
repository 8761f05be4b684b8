"""How far a frozen policy's last 100-episode mean falls below its best one.

    seedq eval CHECKPOINT --sample --episodes 2000 --json > eval.json
    python frozen-window-scatter.py eval.json [STREAM_EPISODES] [EPISODES_PER_TICK]

Acceptance 2 of issue 11 compares a run's last progress tick's 100-episode
mean with its highest tick. For a policy that does not change at all, the
ticks still scatter with the episode returns, so the highest sits above the
last. This replays the checkpoint's episodes (one fixed policy) in random
order as a stream of STREAM_EPISODES (1000) episodes, ticks every
EPISODES_PER_TICK (5) episodes as the progress line does, and prints the
distribution of last tick / highest tick over 2000 shuffles, next to the
episode returns' mean and spread. Written for docs/learning.md, stop 40.
"""
import json
import sys

import numpy as np

returns = np.asarray(json.load(open(sys.argv[1]))["returns"], np.float64)
stream = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
per_tick = int(sys.argv[3]) if len(sys.argv) > 3 else 5
rng = np.random.default_rng(0)
ratios = []
for _ in range(2000):
    episodes = rng.choice(returns, size=stream, replace=True)
    trailing = np.convolve(episodes, np.ones(100) / 100, mode="valid")  # mean of episodes [i, i+100)
    ticks = trailing[::per_tick]
    ratios.append(ticks[-1] / ticks.max())
ratios = np.asarray(ratios)
print(f"{len(returns)} episodes: mean {returns.mean():.1f}, std {returns.std():.1f} "
      f"(a 100-episode mean scatters by {returns.std() / 10:.1f}, {returns.std() / 10 / returns.mean():.1%} of the mean)")
print(f"last / highest tick over a stream of {stream} episodes, a tick every {per_tick}: "
      f"median {np.median(ratios):.3f}, 10-90% {np.quantile(ratios, 0.1):.3f}-{np.quantile(ratios, 0.9):.3f}, "
      f"below 0.9 in {np.mean(ratios < 0.9):.0%} of 2000 shuffles")
