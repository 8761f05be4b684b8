"""A save stopped at any stage - before the new step is written, while it is
written, once it is written but before older steps and replays are pruned,
while they are pruned, between the two renames of a final save - leaves a
run that `--resume auto` continues from the newest complete step, replay
included.

The stop is in-process: a fault hook (or a patched orbax handler, for "while
it is written") raises an exception that nothing in seedq catches, and the
writer is then abandoned without `close()`, as a killed process would leave
it. The resume is what `--resume auto` does: `has_checkpoint`, `restore`
with the replay, and a new writer that saves the next step.
"""

from __future__ import annotations

import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from seedq import checkpoint

pytestmark = pytest.mark.unit

LIKE_STATE = {"w": np.zeros(3, np.float32)}
LIKE_RNG = np.zeros(2, np.uint32)


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so no `except Exception` handles it."""


def snapshot(step: int, frames: int) -> checkpoint.Snapshot:
    """A snapshot whose parameters and replay both record its frame count."""
    return checkpoint.Snapshot(
        state={"w": np.full(3, frames, np.float32)}, rng=LIKE_RNG,
        counters={"train_steps": step, "frames": frames}, episode_window={"returns": [], "lengths": []},
        target={}, config={}, replay=({"obs": np.full(5, frames, np.int64)}, {"size": 5, "frames": frames}),
    )


def kill_at(stage: str):
    def hook(name: str) -> None:
        if name == stage:
            raise Killed(stage)
    return hook


def kill_while_writing(monkeypatch) -> None:
    """The meta item's handler dies after the state item started: orbax's
    temporary step directory is left half written."""
    def die(self, *args, **kwargs):
        raise Killed("writing")
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "async_save", die)


# (save kind, stage) pairs that a save of that kind passes through.
FINAL_STAGES = ["before_write", "writing", "staged", "written"]
PERIODIC_STAGES = ["before_write", "writing", "written", "pruning"]


def _saves_until_killed(run: str, keep: int, kind: str, stage: str, monkeypatch) -> int:
    """Saves steps 1 and 2 (frames 10, 20), then the faulted save: for `final`,
    step 2 again with frames 25 (no train step since); for `periodic`, step 3
    (frames 30) and step 4 (frames 40, whose start prunes step 3's elders'
    replays). Returns the frames of the newest save that returned."""
    writer = checkpoint.CheckpointWriter(run, keep, asynchronous=False)
    writer.save(snapshot(1, 10))
    writer.save(snapshot(2, 20))
    done = 20
    if stage == "writing":
        kill_while_writing(monkeypatch)
    else:
        writer.fault_hook = kill_at(stage)
    with pytest.raises(Killed):
        if kind == "final":
            writer.save(snapshot(2, 25), wait=True, replace=True)
            done = 25
        else:
            writer.save(snapshot(3, 30))
            done = 30
            writer.save(snapshot(4, 40))
    monkeypatch.undo()
    return done


# With one step kept orbax deletes the older step whole: no replay is left to prune.
CASES = [(keep, "final", stage) for keep in (1, 3) for stage in FINAL_STAGES] + [
    (keep, "periodic", stage) for keep in (1, 3) for stage in PERIODIC_STAGES
    if not (keep == 1 and stage == "pruning")]


@pytest.mark.parametrize("keep, kind, stage", CASES)
def test_a_save_killed_at_any_stage_resumes_from_the_newest_complete_step(tmp_path, keep, kind, stage, monkeypatch):
    run = str(tmp_path / "run")
    returned = _saves_until_killed(run, keep, kind, stage, monkeypatch)

    assert checkpoint.has_checkpoint(run)  # `--resume auto` resumes rather than starting afresh
    restored, _ = checkpoint.restore(run, LIKE_STATE, LIKE_RNG, with_replay=True)
    frames = restored.counters["frames"]
    # The newest complete step: every save that returned is on disk (the one
    # killed after its step was complete may be too).
    assert frames >= returned, (frames, returned)
    assert restored.replay is not None, f"step of {frames} frames lost its replay"
    assert restored.replay[1]["frames"] == frames and (restored.replay[0]["obs"] == frames).all()
    assert (restored.state["w"] == frames).all()

    # The resumed run saves on; the next resume reads that step.
    writer = checkpoint.CheckpointWriter(run, keep)
    writer.save(snapshot(9, 90), wait=True)
    writer.close()
    restored, step_dir = checkpoint.restore(run, LIKE_STATE, LIKE_RNG, with_replay=True)
    assert restored.counters["frames"] == 90 and restored.replay[1]["frames"] == 90
    root = os.path.dirname(step_dir)
    assert not os.path.exists(os.path.join(root, checkpoint.STAGING))
    assert not os.path.exists(os.path.join(root, checkpoint.TRASH))
    assert len(checkpoint._steps_in(root)) <= keep


def test_a_final_save_killed_between_its_renames_is_read_from_staging_and_installed(tmp_path, monkeypatch):
    """The swap of a final save is two renames; stopped after the first, the
    step is absent under its name but complete in .staging/."""
    run = str(tmp_path / "run")
    writer = checkpoint.CheckpointWriter(run, 1, asynchronous=False)
    writer.save(snapshot(2, 20))
    real_rename = os.rename
    trash = os.path.join(run, checkpoint.DIRNAME, checkpoint.TRASH)

    def rename(src, dst):
        real_rename(src, dst)
        if os.path.dirname(str(dst)) == trash:  # the old step moved aside, the new one not yet in
            raise Killed("between the renames")

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(Killed):
        writer.save(snapshot(2, 25), wait=True, replace=True)
    monkeypatch.undo()
    assert checkpoint._steps_in(os.path.join(run, checkpoint.DIRNAME)) == []  # the old step is gone
    restored, _ = checkpoint.restore(run, LIKE_STATE, LIKE_RNG, with_replay=True)
    assert restored.counters["frames"] == 25 and restored.replay[1]["frames"] == 25
    checkpoint.CheckpointWriter(run, 1).close()  # installs it
    assert checkpoint._steps_in(os.path.join(run, checkpoint.DIRNAME)) == [2]

