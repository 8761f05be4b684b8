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
    # --overwrite is checked here and acts later, after every check that can refuse the command.
    prepared, resume = resolve("--overwrite")
    assert resume is None and (run / "summary.json").exists()
    run_dirs.clear(str(run))
    assert [p.name for p in run.iterdir()] == [run_dirs.LOCK]  # (--resume auto took the lock; it stays)


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


def project_folder(tmp_path):
    """A user's project folder that happens to hold a config.json of its own."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "src").mkdir()
    (proj / "config.json").write_text("{}")
    (proj / "notes.txt").write_text("mine")
    (proj / "data" / "results.csv").write_text("a,b\n1,2\n")
    (proj / "src" / "main.py").write_text("print('hello')\n")
    return proj


def tree(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else None) for p in path.rglob("*"))


@pytest.mark.parametrize("command", [
    ["learner", "--address", "0.0.0.0:50732"],  # (also refused later for want of credentials)
    ["train"],
])
def test_overwrite_never_empties_a_folder_that_holds_files_seedq_did_not_write(tmp_path, command):
    proj = project_folder(tmp_path)
    before = tree(proj)

    result = seedq(*command, "--env", "CartPole-v1", "--logdir", str(proj), "--overwrite", "--max-seconds", "5")

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not write" in lines[0] and "notes.txt" in lines[0], result.stderr
    assert tree(proj) == before


def test_overwrite_refuses_a_symlinked_logdir_and_leaves_its_target(tmp_path):
    target = tmp_path / "target"
    (target / "checkpoints" / "other").mkdir(parents=True)
    (target / "thesis.tex").write_text("chapter 1")
    (tmp_path / "link").symlink_to(target)
    before = tree(target)

    result = seedq("train", "--env", "CartPole-v1", "--logdir", str(tmp_path / "link"), "--overwrite")

    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "symlink" in result.stderr
    assert tree(target) == before


def test_overwrite_acts_after_the_checks_that_refuse_the_command(tmp_path):
    """A learner refused for want of credentials removes nothing of the finished run."""
    run = finished_run(tmp_path)
    (run / "checkpoints").mkdir()
    before = tree(run)

    result = seedq("learner", "--address", "0.0.0.0:50733", "--env", "CartPole-v1", "--logdir", str(run),
                   "--overwrite", "--max-frames", "20000")

    assert result.returncode == 2 and "authentication" in result.stderr, result.stderr
    assert tree(run) == before


def test_clear_removes_seedqs_entries_only_and_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    run = tmp_path / "run"
    (run / "checkpoints" / "10").mkdir(parents=True)
    (run / "checkpoints" / "elsewhere").symlink_to(outside)
    for name in ("config.json", "summary.json", "stats.json", "curves.csv", "events.out.tfevents.1.host",
                 "stats.json.abc123.tmp", run_dirs.MARKER):
        (run / name).write_text("x")
    (run / "actors").mkdir()

    run_dirs.clear(str(run))

    assert list(run.iterdir()) == []
    assert (outside / "keep.txt").read_text() == "keep"
    # One file seedq did not write: nothing is removed.
    (run / "config.json").write_text("{}")
    (run / "mine.txt").write_text("mine")
    with pytest.raises(ValueError, match="mine.txt"):
        run_dirs.clear(str(run))
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "mine.txt"]


def test_every_file_a_run_writes_is_on_the_run_entries_list(tmp_path):
    """A short real run: everything it leaves in its directory is seedq's own
    (a writer that forgot to put its file on run_dirs.RUN_ENTRIES fails here)."""
    run = tmp_path / "run"
    result = seedq("train", "--env", "CartPole-v1", "--max-frames", "3000", "--num-actors", "1",
                   "--envs-per-actor", "4", "--logdir", str(run), "--quiet")
    assert result.returncode == 0, result.stderr
    assert run_dirs.foreign_entries(str(run)) == []
    assert (run / run_dirs.MARKER).exists() and run_dirs.overwrite_refusal(str(run)) is None


def test_a_config_file_from_another_run_does_not_bring_its_logdir(tmp_path):
    run = finished_run(tmp_path, name="runA")

    result = seedq("train", "--config", str(run / "config.json"), "--print-config", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["logdir"] != str(run)


# --- the writer's lock ---

HOLDER = """
import sys, time
from seedq import run_dirs
run_dirs.hold(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def holder_process(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_one_blocks_nothing(tmp_path):
    run = finished_run(tmp_path)
    first = holder_process(run)
    try:
        second = seedq("train", "--resume", str(run), "--max-frames", "40000")
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "in use" in lines[0], second.stderr
        overwrite = seedq("train", "--env", "CartPole-v1", "--logdir", str(run), "--overwrite",
                          "--max-frames", "20000")
        assert overwrite.returncode == 2 and f"pid {first.pid}" in overwrite.stderr, overwrite.stderr
        assert (run / "summary.json").exists()
    finally:
        first.kill()
        first.wait()
    # SIGKILLed: the kernel dropped its lock.
    lock = run_dirs.hold(str(run))
    lock.release()


def test_a_lock_file_from_another_host_blocks_until_its_heartbeat_is_stale(tmp_path, monkeypatch):
    import time

    lock_file = tmp_path / run_dirs.LOCK
    lock_file.write_text(json.dumps({"pid": 4242, "host": "another-host", "heartbeat": time.time()}))
    with pytest.raises(run_dirs.RunDirInUse, match="pid 4242 on host another-host"):
        run_dirs.hold(str(tmp_path))
    lock_file.write_text(json.dumps({"pid": 4242, "host": "another-host",
                                     "heartbeat": time.time() - run_dirs.STALE_AFTER_SECONDS - 1}))
    lock = run_dirs.hold(str(tmp_path))
    assert json.loads(lock_file.read_text())["pid"] != 4242
    lock.release()


def test_waiting_for_a_held_lock_says_so_and_takes_it_when_the_holder_exits(tmp_path):
    import threading

    first = holder_process(tmp_path)
    lines = []
    threading.Timer(1.5, first.kill).start()
    lock = run_dirs.hold(str(tmp_path), wait=True, log=lines.append)
    first.wait()
    assert lines and f"pid {first.pid}" in lines[0] and "waiting" in lines[0]
    lock.release()
