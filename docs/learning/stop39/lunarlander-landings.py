"""How a LunarLander checkpoint's episodes end, with sampled actions.

    python lunarlander-landings.py RUN/checkpoints/step_N [EPISODES]

Plays EPISODES (100) episodes, one per env of a gymnasium vector env (seed
123), with the checkpoint's sampled policy, and prints per way of ending
(rest: the +100 for coming to rest; crash; trunc: the 1,000-step limit) the
count, mean return and length, the steps spent with both legs on the ground,
and the share of each action (noop, left, main, right) taken there. The
lander comes to rest only after 25 still steps (Box2D's 0.5 s at 50 FPS), so
a policy that keeps firing on the pad is truncated instead. Written for
docs/learning.md, stop 39.
"""
import sys

import gymnasium as gym
import numpy as np

from seedq.evaluate import load_policy

path = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
policy = load_policy(path, greedy=False).policy
env = gym.make_vec("LunarLander-v3", num_envs=n, vectorization_mode="sync")
obs, _ = env.reset(seed=123)
no = np.zeros(n, bool)
result = policy.start(n, 7).step(obs, np.zeros(n, np.float32), no, no)
done = np.zeros(n, bool)
returns, lengths, down = np.zeros(n), np.zeros(n, int), np.zeros(n, int)
actions_down = np.zeros((n, 4), int)
how = np.array([""] * n, dtype=object)
while not done.all():  # each env's first episode is the one counted
    legs_down = (obs[:, 6] > 0.5) & (obs[:, 7] > 0.5)
    actions = np.asarray(result.actions)
    for i in np.where(~done & legs_down)[0]:
        down[i] += 1
        actions_down[i, actions[i]] += 1
    obs, rewards, terminated, truncated, _ = env.step(actions)
    for i in np.where(~done)[0]:
        returns[i] += rewards[i]
        lengths[i] += 1
        if terminated[i] or truncated[i]:
            done[i] = True
            how[i] = "trunc" if truncated[i] else "rest" if rewards[i] > 50 else "crash" if rewards[i] < -50 else "other"
    result = policy.step(obs, rewards.astype(np.float32), terminated, truncated)
print(path)
print("mean return %.1f  mean length %.0f" % (returns.mean(), lengths.mean()))
for kind in ("rest", "crash", "trunc", "other"):
    m = how == kind
    if m.any():
        share = np.round(actions_down[m].sum(0) / max(1, actions_down[m].sum()), 2)
        print(f"{kind:6s} {m.sum():3d} eps, return {returns[m].mean():7.1f}, length {lengths[m].mean():6.0f}, "
              f"both legs down {down[m].mean():6.0f} steps, actions there (noop,left,main,right) {share}")
