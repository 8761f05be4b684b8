"""Run directories never mix: a fresh run refuses a directory that holds one
(--overwrite replaces it, --resume auto is exempt), and resuming a finished
run names the flag that extends it."""

import json
import subprocess
import sys

import pytest

from seedq import run_dirs

pytestmark = pytest.mark.e2e


def seedq(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "seedq.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def finished_run(tmp_path, name="run", frames=20224):
    """A run directory as a finished CartPole run leaves it (config.json from
    the resolved config, a summary that met max_frames=20000)."""
    run = tmp_path / name
    printed = seedq("train", "--env", "CartPole-v1", "--max-frames", "20000", "--logdir", str(run),
                    "--print-config")
    assert printed.returncode == 0, printed.stderr
    run.mkdir()
    (run / "config.json").write_text(printed.stdout)
    (run / "summary.json").write_text(json.dumps({"stop_reason": "max_frames", "frames": frames,
                                                  "mean_return_last100": 500.0}))
    return run


@pytest.mark.parametrize("marker", ["config.json", "checkpoints"])
def test_a_second_train_in_a_run_directory_exits_2_with_one_line_and_leaves_it_as_it_was(tmp_path, marker):
    run = tmp_path / "run"
    run.mkdir()
    (run / marker).mkdir() if marker == "checkpoints" else (run / marker).write_text("{}")
    (run / "summary.json").write_text('{"mean_return_last100": 500.0}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    result = seedq("train", "--env", "CartPole-v1", "--logdir", str(run), "--max-seconds", "5")

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "--overwrite" in lines[0], result.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in run.iterdir()) == sorted([marker, "summary.json"])


def test_overwrite_clears_the_old_run_and_resume_auto_is_not_refused(tmp_path):
    from seedq import cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "summary.json").write_text("{}")
    (run / "checkpoints").mkdir()

    def resolve(*flags):
        args = cli.build_parser().parse_args(["train", "--env", "CartPole-v1", "--logdir", str(run), *flags])
        return cli.run_config(args)

    with pytest.raises(ValueError, match="--overwrite"):
        resolve()
    # --resume auto on a directory without a checkpoint starts fresh there, as launchers need.
    prepared, resume = resolve("--resume", "auto")
    assert resume is None and prepared.config.logdir == str(run) and (run / "summary.json").exists()
    prepared, resume = resolve("--overwrite")
    assert resume is None and list(run.iterdir()) == []


def test_resuming_a_finished_run_names_the_flag_that_extends_it(tmp_path):
    run = finished_run(tmp_path)

    result = seedq("train", "--resume", str(run))

    assert result.returncode == 0
    assert "--max-frames" in result.stderr and "20224" in result.stderr, result.stderr
    # With a larger budget there is something left to do: no hint.
    summary = json.loads((run / "summary.json").read_text())
    assert run_dirs.finished_hint(summary, max_frames=40000, max_seconds=0, target_return=None) is None


def test_finished_hint_per_stop_reason():
    assert "--max-seconds" in run_dirs.finished_hint(
        {"stop_reason": "max_seconds", "wall_seconds": 61.0}, max_frames=0, max_seconds=60, target_return=None)
    assert "--target-return none" in run_dirs.finished_hint(
        {"stop_reason": "target_return"}, max_frames=0, max_seconds=0, target_return=475.0)
    assert run_dirs.finished_hint({"stop_reason": "target_return"}, max_frames=0, max_seconds=0,
                                  target_return=None) is None
    assert run_dirs.finished_hint({"stop_reason": "interrupted"}, max_frames=10, max_seconds=0,
                                  target_return=None) is None


def test_an_actor_without_a_learner_says_it_waits_and_gives_up_on_stderr(tmp_path):
    result = seedq("actor", "--server", f"unix:{tmp_path}/nothing.sock", "--env", "CartPole-v1",
                   "--num-envs", "2", "--retry-max-seconds", "2", timeout=120)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert "waiting for the learner" in lines[0] and "nothing.sock" in lines[0], result.stderr
    assert "giving up" in lines[-1], result.stderr
