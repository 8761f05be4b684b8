"""config.json, summary.json and checkpoint-adjacent files are replaced in one
rename after their data is on disk: a kill or a full disk mid-write leaves
the previous file, and a power loss after the rename cannot leave an empty one."""

from __future__ import annotations

import json
import os
import stat

import pytest

from seedq.process import atomic_files
from seedq.reporting import sinks

pytestmark = pytest.mark.unit


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text('{"old": 1}')

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        sinks.write_json_atomically(str(path), {"new": 2}, indent=2)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": 1}
    assert os.listdir(tmp_path) == ["summary.json"]  # no temporary file left behind


def test_the_data_and_the_rename_are_fsynced_before_it_returns(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    synced, replaced = [], []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src, dst):
        replaced.append(len(synced))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    sinks.write_json_atomically(str(path), {"stop_reason": "target_reached"}, indent=2)
    assert replaced == [1] and synced[0].endswith(".tmp")  # the data, before the rename
    assert synced[1:] == [str(tmp_path)]  # then the directory holding the rename
    assert json.loads(path.read_text()) == {"stop_reason": "target_reached"}


def test_live_status_skips_the_fsync(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fsync", calls.append)
    atomic_files.write_json_atomically(str(tmp_path / "stats.json"), {"frames": 1}, durable=False)
    assert calls == [] and json.loads((tmp_path / "stats.json").read_text()) == {"frames": 1}


def test_config_json_survives_a_write_that_fails_midway(tmp_path, monkeypatch):
    """`--resume` reads config.json: a failed rewrite (full disk, kill) must leave the previous one."""
    from seedq import config as config_lib

    path = str(tmp_path / "config.json")
    config_lib.save(config_lib.TrainConfig(env="CartPole-v1"), path)

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json.JSONEncoder, "iterencode", full_disk)
    with pytest.raises(OSError, match="No space left"):
        config_lib.save(config_lib.TrainConfig(env="Acrobot-v1"), path)
    monkeypatch.undo()
    assert config_lib.load(path).env == "CartPole-v1"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_config_and_summary_get_the_mode_of_every_other_run_file(tmp_path, umask):
    """One rule for a run directory's files: 0666 less the umask, as open()
    gives curves.csv and TensorBoard's events and orbax its checkpoints."""
    from seedq import config as config_lib
    from seedq.config import TrainConfig

    previous = os.umask(umask)
    try:
        with open(tmp_path / "curves.csv", "w"):
            pass
        config_lib.save(TrainConfig(env="CartPole-v1"), str(tmp_path / "config.json"))
        sinks.write_json_atomically(str(tmp_path / "summary.json"), {"stop_reason": "max_frames"}, indent=2)
    finally:
        os.umask(previous)
    modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in os.listdir(tmp_path)}
    assert modes == {"curves.csv": 0o666 & ~umask, "config.json": 0o666 & ~umask, "summary.json": 0o666 & ~umask}
