"""The timing and logging added to the sbx run: an SB3 callback (rl-zoo loads
it by name from its `callback` hyperparameter) that appends one CSV row per
finished game and stops training at a wall-clock deadline.

Runs in the sbx venv. The returns are those of SB3's Monitor, which rl-zoo
puts under the AtariWrapper: whole games (not lives) with unclipped rewards.
"""

import csv
import time

from stable_baselines3.common.callbacks import BaseCallback

HEADER = ("unix_time", "agent_steps", "return")


class EpisodeLog(BaseCallback):
    def __init__(self, path: str, deadline: float):
        super().__init__()
        self.path = path
        self.deadline = deadline

    def _on_training_start(self) -> None:
        self._file = open(self.path, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(HEADER)

    def _on_step(self) -> bool:
        now = time.time()
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                # num_timesteps counts agent steps of all envs together.
                self._writer.writerow((f"{now:.3f}", self.num_timesteps, episode["r"]))
                self._file.flush()
        return now < self.deadline

    def _on_training_end(self) -> None:
        if hasattr(self, "_file"):  # training may fail before it starts
            self._file.close()
