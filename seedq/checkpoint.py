"""Checkpoints of a training run with orbax-checkpoint.

Layout: `<logdir>/checkpoints/step_<train steps, 9 digits>/`, two items each
and a third in the newest:

  * `state`: the learner state (parameters, optimiser state, update count)
    as a nested dict of arrays, plus the inference RNG key;
  * `meta`: JSON with the seedq version that wrote it, the counters (train
    steps, frames, episodes, policy version, elapsed seconds of all segments
    so far), the recent episode window, the target bookkeeping and the run
    config (and, with a replay, its counters, field specs and RNG state under
    "replay");
  * `replay` (replay agents, `--r2d2.checkpoint-replay`): the stored
    sequences and their priorities. Only the newest checkpoint keeps it:
    once a checkpoint with a replay is complete, the replay of every older
    step is deleted (`prune_replays`), so a crash while the next checkpoint
    is written still leaves one complete replay on disk.

That is everything `seedq train --resume` needs to continue a run and
`seedq eval` needs to rebuild the policy.

Durability: a kill at any moment of any save leaves the newest complete step
readable, replay included.

  * orbax writes each step into a temporary directory and renames it when
    complete, so a half-written step never carries a step name;
  * deletions (orbax's pruning of steps beyond `checkpoints_to_keep`, the
    replays of older steps) first rename what they delete into `.trash/`,
    so a half-deleted step never carries a step name either;
  * the final save of a step that is already on disk (no train step since
    the last save, newer counters) writes the whole replacement under
    `.staging/` first and swaps it in by two renames; a kill between them
    leaves the complete replacement in `.staging/`, which `locate` reads and
    the next writer installs (`recover`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import numpy as np

from seedq import run_dirs
from seedq.config.state_layout import STATE_LAYOUT_KEY, STATE_LAYOUT_VERSION, migrated_state, saved_state_layout

FORMAT_VERSION = 1
# Meta key of the `seedq.__version__` that wrote a checkpoint (absent before it was recorded).
WRITER_KEY = "seedq_version"
DIRNAME = run_dirs.CHECKPOINTS
REPLAY_ITEM = "replay"
# Subdirectories of the checkpoints directory (no step names: orbax ignores them).
TRASH = ".trash"  # what a save deletes, renamed here first and removed after
STAGING = ".staging"  # a final save's replacement of an existing step, complete before the swap
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or does not fit the config (one-line message)."""


@dataclasses.dataclass
class Snapshot:
    """Everything a checkpoint holds."""

    state: Any  # the agent's learner state (host arrays)
    rng: np.ndarray  # the inference server's PRNG key
    counters: dict  # train_steps, trained_frames, frames, episodes, policy_version, elapsed_seconds, ...
    episode_window: dict  # {"returns": [...], "lengths": [...]}: the recent episodes, oldest first
    target: dict  # {"seconds_to_target", "frames_to_target", "mean_return_at_target": value | None}
    config: dict  # the run config (seedq.config.to_dict)
    # (arrays, scalars) of the learner's replay (`PrioritizedBatches.checkpoint_state`), or None.
    replay: tuple[dict, dict] | None = None

    @property
    def step(self) -> int:
        return int(self.counters["train_steps"])

    def meta(self) -> dict:
        import seedq

        meta = {
            "format_version": FORMAT_VERSION,
            STATE_LAYOUT_KEY: STATE_LAYOUT_VERSION,
            WRITER_KEY: seedq.__version__,
            "counters": self.counters,
            "episode_window": self.episode_window,
            "target": self.target,
            "config": self.config,
        }
        if self.replay is not None:
            meta["replay"] = self.replay[1]
        return meta


def _options(**kwargs):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManagerOptions(step_prefix="step", step_format_fixed_length=9, **kwargs)


def _handlers() -> dict:
    import orbax.checkpoint as ocp

    return {
        "state": ocp.StandardCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler(),
        REPLAY_ITEM: ocp.StandardCheckpointHandler(),
    }


def _state_tree(state, rng) -> dict:
    from flax import serialization

    return {"learner": serialization.to_state_dict(jax.device_get(state)), "rng": np.asarray(rng)}


def _step_name(step: int) -> str:
    return f"step_{step:09d}"


def _fsync_directory(path: str) -> None:
    """Makes the renames inside `path` durable (POSIX: a rename is in the directory's data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_primary() -> bool:
    """Whether this process renames and deletes (one process of a group does; orbax's rule)."""
    return jax.process_index() == 0


def _steps_in(root: str) -> list[int]:
    """The complete steps directly under `root` (orbax's temporary directories excluded)."""
    if not os.path.isdir(root):
        return []
    return sorted(
        int(m.group(1))
        for m in (_STEP_DIR.match(name) for name in os.listdir(root))
        if m and os.path.isdir(os.path.join(root, m.group(0)))
    )


def empty_trash(root: str) -> None:
    """Removes `.trash/` (what earlier saves deleted); a kill midway leaves
    only more trash, never a half step under a step name."""
    import shutil

    shutil.rmtree(os.path.join(root, TRASH), ignore_errors=True)


def move_to_trash(root: str, path: str, name: str) -> None:
    """Renames `path` into `root/.trash/<name>` (atomic: the name it had is gone at once)."""
    trash = os.path.join(root, TRASH)
    os.makedirs(trash, exist_ok=True)
    target = os.path.join(trash, name)
    if os.path.exists(target):
        import shutil

        shutil.rmtree(target)
    os.rename(path, target)


def install_staged(root: str) -> None:
    """Completes an interrupted replacement: a complete step in `.staging/`
    takes the place of the step of the same number (moved to the trash),
    then the staging and trash directories are cleared. A no-op when there
    is nothing staged."""
    import shutil

    staging = os.path.join(root, STAGING)
    for step in _steps_in(staging):
        target = os.path.join(root, _step_name(step))
        if os.path.exists(target):
            move_to_trash(root, target, f"{_step_name(step)}.replaced")
        os.rename(os.path.join(staging, _step_name(step)), target)
    if os.path.isdir(root):
        _fsync_directory(root)
    shutil.rmtree(staging, ignore_errors=True)
    empty_trash(root)


class CheckpointWriter:
    """Saves snapshots of one run; asynchronous unless asked to wait (or
    `asynchronous` is false: a multi-process learner's, whose processes call
    `save` together, the way orbax saves multi-process state)."""

    def __init__(self, logdir: str, keep: int, *, asynchronous: bool = True):
        import orbax.checkpoint as ocp

        self.directory = os.path.abspath(os.path.join(logdir, DIRNAME))
        if _is_primary():
            install_staged(self.directory)  # a final save killed between its two renames
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=_options(
                max_to_keep=keep, create=True, cleanup_tmp_directories=True,
                enable_async_checkpointing=asynchronous, todelete_subdir=TRASH,
            ),
            item_handlers=_handlers(),
        )
        self._replay_written = False  # a save with a replay has started; older ones await pruning
        # Tests set this to a function of a stage name that raises, to stop a
        # save there the way a kill would: "before_write" (nothing written),
        # "staged" (a final save's replacement complete, not swapped in),
        # "written" (the new step complete, older ones not pruned) and
        # "pruning" (between the replays of older steps as they are pruned).
        self.fault_hook = None

    def _stage(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)

    def path(self, step: int) -> str:
        return os.path.join(self.directory, _step_name(step))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, snapshot: Snapshot, *, wait: bool = False, replace: bool = False) -> str:
        """Writes `snapshot` (host arrays) as step `train_steps`; returns its directory.

        Returns at once (the files are written in the background) unless
        `wait`. A step that is already saved is kept as it is, unless
        `replace` (the final checkpoint: same parameters, newer counters),
        which writes the replacement whole before the old step goes.
        """
        step = snapshot.step
        # The previous save is complete after this (orbax would wait here anyway).
        self._manager.wait_until_finished()
        self.prune_replays()
        if _is_primary():
            empty_trash(self.directory)  # the steps orbax pruned after the previous save
        self._stage("before_write")
        exists = step in self._manager.all_steps()
        if exists and replace:
            self._replace(step, snapshot)
        elif not exists:
            if snapshot.replay is not None:
                self._replay_written = True
            self._manager.save(step, args=self._items(snapshot), force=True)
        if wait:
            self._manager.wait_until_finished()
        self._stage("written")
        if wait:
            self.prune_replays()
        return self.path(step)

    def _items(self, snapshot: Snapshot):
        import orbax.checkpoint as ocp

        items = {
            "state": ocp.args.StandardSave(_state_tree(snapshot.state, snapshot.rng)),
            "meta": ocp.args.JsonSave(snapshot.meta()),
        }
        if snapshot.replay is not None:
            items[REPLAY_ITEM] = ocp.args.StandardSave(snapshot.replay[0])
        return ocp.args.Composite(**items)

    def _replace(self, step: int, snapshot: Snapshot) -> None:
        """Rewrites an existing step without a moment where it is absent:
        the replacement is written whole under `.staging/`, then swapped in."""
        import orbax.checkpoint as ocp

        staging = os.path.join(self.directory, STAGING)
        staged = ocp.CheckpointManager(
            staging, options=_options(create=True, cleanup_tmp_directories=True, enable_async_checkpointing=False),
            item_handlers=_handlers(),
        )
        try:
            if step in staged.all_steps():
                staged.delete(step)
            staged.save(step, args=self._items(snapshot), force=True)
            staged.wait_until_finished()
        finally:
            staged.close()
        self._stage("staged")
        if _is_primary():
            install_staged(self.directory)
        _sync_processes("seedq-checkpoint-replace")
        self._manager.reload()
        if snapshot.replay is not None:
            self._replay_written = True

    def prune_replays(self) -> None:
        """Once no save is in flight and the newest step holds a replay, deletes
        the replay item of every older step (their parameters stay). Cheap
        when there is nothing to do: call it as often as convenient."""
        if not self._replay_written or self._manager.is_saving_in_progress():
            return
        self._replay_written = False
        latest = self._manager.latest_step()
        if latest is None or not os.path.isdir(os.path.join(self.path(latest), REPLAY_ITEM)):
            return  # (a final save without a replay keeps the previous one)
        if not _is_primary():
            return
        for step in self._manager.all_steps():
            path = os.path.join(self.path(step), REPLAY_ITEM)
            if step != latest and os.path.isdir(path):
                move_to_trash(self.directory, path, f"{_step_name(step)}.{REPLAY_ITEM}")
                self._stage("pruning")
        empty_trash(self.directory)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self.prune_replays()
        self._manager.close()
        if _is_primary():
            empty_trash(self.directory)


def _sync_processes(name: str) -> None:
    """Waits for every process of a learner group (no-op alone)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def process_share(snapshot: Snapshot, index: int, size: int) -> Snapshot:
    """The part of a checkpoint's counters one process of a group of `size`
    continues from: its own frames, episodes and episode window when the
    checkpoint was written by a group of that size (counters "processes"),
    else process 0 takes the whole run's and the others start at zero. Alone
    (`size` 1) the snapshot is returned as it is. Processes other than 0 also
    fold their index into the inference RNG key (their own random stream)."""
    if size == 1:
        return snapshot
    processes = snapshot.counters.get("processes")
    if processes and len(processes) == size:
        mine = processes[index]
        frames, episodes, window = mine["frames"], mine["episodes"], mine["episode_window"]
    elif index == 0:
        frames, episodes, window = snapshot.counters["frames"], snapshot.counters["episodes"], snapshot.episode_window
    else:
        frames, episodes, window = 0, 0, {"returns": [], "lengths": []}
    rng = snapshot.rng
    if index:
        rng = np.asarray(jax.random.fold_in(rng, index))
    return dataclasses.replace(
        snapshot, counters={**snapshot.counters, "frames": int(frames), "episodes": int(episodes)},
        episode_window=dict(window), rng=rng,
    )


def locate(path: str) -> tuple[str, int]:
    """(checkpoints directory, step) for a run directory or a checkpoints
    directory (their newest step) or one step directory."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such run directory or checkpoint")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a run directory or checkpoint directory")
    match = _STEP_DIR.match(os.path.basename(path))
    if match:
        return os.path.dirname(path), int(match.group(1))
    root = os.path.join(path, DIRNAME) if os.path.isdir(os.path.join(path, DIRNAME)) else path
    steps = _steps_in(root)
    # A final save killed between its two renames: its complete replacement
    # is the newest state of that step (the next writer installs it).
    staged = _steps_in(os.path.join(root, STAGING))
    if staged and (not steps or staged[-1] >= steps[-1]):
        return os.path.join(root, STAGING), staged[-1]
    if not steps:
        raise CheckpointError(f"{path}: no checkpoint in it (expected {DIRNAME}/step_*)")
    return root, steps[-1]


def step_dirs(run_dir: str) -> list[str]:
    """The complete checkpoint step directories of a run, oldest first."""
    root = os.path.join(os.path.abspath(run_dir), DIRNAME)
    return [os.path.join(root, _step_name(step)) for step in _steps_in(root)]


def has_checkpoint(path: str) -> bool:
    """Whether `locate(path)` finds a checkpoint (a run to resume)."""
    try:
        locate(path)
    except CheckpointError:
        return False
    return True


def _reader(root: str):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(root, options=_options(create=False), item_handlers=_handlers())


def written_by(meta) -> str:
    """'seedq 0.1.0' for the version recorded in a checkpoint's meta; 'an older seedq' without one."""
    version = meta.get(WRITER_KEY) if isinstance(meta, dict) else None
    return f"seedq {version}" if version else "an older seedq"


def read_meta(path: str) -> tuple[dict, str]:
    """(the checkpoint's meta dict, its step directory) for a run, checkpoints or step directory."""
    import orbax.checkpoint as ocp

    root, step = locate(path)
    step_dir = os.path.join(root, f"step_{step:09d}")
    try:
        meta = _reader(root).restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is one clear line
        raise CheckpointError(f"{step_dir}: unreadable checkpoint ({_first_line(e)})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{step_dir}: checkpoint format {meta.get('format_version') if isinstance(meta, dict) else '?'}"
            f" (written by {written_by(meta)}) is not the supported format {FORMAT_VERSION}"
        )
    return meta, step_dir


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _leaves(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """'a/b/c' -> (shape, dtype name) for every array leaf."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        out[name] = (tuple(leaf.shape), np.dtype(leaf.dtype).name)
    return out


def describe_mismatch(saved_tree, like_tree) -> str | None:
    """First difference in structure, shape or dtype between two trees of arrays, or None."""
    saved, like = _leaves(saved_tree), _leaves(like_tree)
    # Parameters first: they say most about what differs (sizes, env).
    for name in sorted(set(saved) | set(like), key=lambda n: (not n.startswith("learner/params/"), n)):
        if name not in saved:
            return f"{name} is missing from the checkpoint"
        if name not in like:
            return f"the checkpoint has {name}, which this config does not"
        if saved[name] != like[name]:
            (s_shape, s_dtype), (l_shape, l_dtype) = saved[name], like[name]
            return (
                f"{name} is {s_dtype}{list(s_shape)} in the checkpoint, "
                f"{l_dtype}{list(l_shape)} in this config"
            )
    return None


def _in_this_layout(tree: dict, step_dir: str, meta: dict) -> dict:
    """A saved state tree (arrays or their metadata) migrated from the layout
    the checkpoint records to this code's (seedq.config.state_layout)."""
    try:
        return migrated_state(tree, saved_state_layout(meta))
    except ValueError as e:
        raise CheckpointError(f"{step_dir} (written by {written_by(meta)}): {e}") from None


def _check(reader, step: int, step_dir: str, meta: dict, like_tree, env: str | None) -> None:
    try:
        saved = reader.item_metadata(step)["state"]
        saved = getattr(saved, "tree", saved)
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is one clear line
        raise CheckpointError(f"{step_dir}: unreadable checkpoint ({_first_line(e)})") from None
    if saved is not None:
        saved = _in_this_layout(saved, step_dir, meta)
    mismatch = describe_mismatch(saved, like_tree) if saved is not None else None
    if mismatch:
        import seedq

        trained_on = (meta.get("config") or {}).get("env", "?")
        here = f" ({env})" if env else ""
        # The same config can still mean another layout when the code changed
        # since: the writer's version tells the user which seedq can read it.
        raise CheckpointError(
            f"checkpoint {step_dir} (written by {written_by(meta)}, trained on {trained_on}) "
            f"is incompatible with this config{here}: {mismatch} "
            f"(its parameter layout is not the one this seedq {seedq.__version__} builds)"
        )


def _step_of(step_dir: str) -> tuple[str, int]:
    return os.path.dirname(step_dir), int(_STEP_DIR.match(os.path.basename(step_dir)).group(1))


def check_compatible(path: str, like_state, like_rng, *, env: str | None = None) -> str:
    """Raises CheckpointError unless the checkpoint at `path` has exactly the
    structure, shapes and dtypes of `like_state` / `like_rng` (arrays or
    jax.ShapeDtypeStruct, e.g. from jax.eval_shape); returns its step directory."""
    from flax import serialization

    meta, step_dir = read_meta(path)
    root, step = _step_of(step_dir)
    like = {"learner": serialization.to_state_dict(like_state), "rng": like_rng}
    _check(_reader(root), step, step_dir, meta, like, env)
    return step_dir


def _restore_replay(reader, step: int, step_dir: str, meta: dict) -> tuple[dict, dict] | None:
    """The replay saved in this step (arrays as numpy, scalars), or None if it has none."""
    import orbax.checkpoint as ocp

    scalars = meta.get("replay")
    if scalars is None or not os.path.isdir(os.path.join(step_dir, REPLAY_ITEM)):
        return None
    try:
        restored = reader.restore(step, args=ocp.args.Composite(**{REPLAY_ITEM: ocp.args.StandardRestore()}))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{step_dir}: could not restore the replay ({_first_line(e)})") from None
    arrays = jax.tree.map(np.asarray, restored[REPLAY_ITEM])
    return arrays, scalars


def restore(
    path: str, like_state, like_rng, *, env: str | None = None, with_replay: bool = False
) -> tuple[Snapshot, str]:
    """Restores the checkpoint at `path` (run, checkpoints or step directory).

    `like_state` / `like_rng` are a freshly initialised learner state and RNG
    key of the current config: the checkpoint must have exactly their
    structure, shapes and dtypes, otherwise CheckpointError says which array
    differs. `with_replay` also reads the step's replay, if it has one
    (`Snapshot.replay`). Returns (snapshot with host arrays, step directory).
    """
    import orbax.checkpoint as ocp
    from flax import serialization

    meta, step_dir = read_meta(path)
    root, step = _step_of(step_dir)
    like = _state_tree(like_state, like_rng)
    reader = _reader(root)
    _check(reader, step, step_dir, meta, like, env)
    # A state saved in this layout restores into `like`'s shapes and
    # placement; an older one restores as saved, then migrates.
    current = saved_state_layout(meta) == STATE_LAYOUT_VERSION
    try:
        restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(like if current else None)))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{step_dir}: could not restore ({_first_line(e)})") from None
    saved = restored["state"] if current else _in_this_layout(restored["state"], step_dir, meta)
    state = serialization.from_state_dict(jax.device_get(like_state), saved["learner"])
    snapshot = Snapshot(
        state=state,
        rng=np.asarray(saved["rng"]),
        counters=dict(meta["counters"]),
        episode_window=dict(meta.get("episode_window") or {"returns": [], "lengths": []}),
        target=dict(meta.get("target") or {}),
        config=dict(meta.get("config") or {}),
        replay=_restore_replay(reader, step, step_dir, meta) if with_replay else None,
    )
    return snapshot, step_dir
