"""`seedq bench suite`: scoring against the references, and one real (tiny) suite run."""

import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from seedq.bench import references, suite
from seedq.config import TrainConfig, from_saved


@pytest.mark.unit
def test_normalised_score_puts_random_at_0_and_the_reference_at_1():
    assert references.normalised(-86.0, -500.0, -86.0) == pytest.approx(1.0)
    assert references.normalised(-500.0, -500.0, -86.0) == pytest.approx(0.0)
    assert references.normalised(-293.0, -500.0, -86.0) == pytest.approx(0.5)
    assert references.normalised(None, -500.0, -86.0) is None


@pytest.mark.unit
def test_every_reference_has_a_budget_and_a_source():
    for ref in references.SUITE.values():
        assert ref.frames > 0 and ref.source
    assert set(references.DEFAULT_ENVS) <= set(references.SUITE)
    assert "ALE/Pong-v5" not in references.DEFAULT_ENVS  # a GPU run


@pytest.mark.unit
def test_lunar_lander_is_a_default_env_only_where_box2d_is_installed():
    assert "LunarLander-v3" in references.default_envs(box2d_installed=True)
    without = references.default_envs(box2d_installed=False)
    assert "LunarLander-v3" not in without
    assert set(references.default_envs(True)) - set(without) == {"LunarLander-v3"}


@pytest.mark.unit
def test_result_row_counts_only_full_windows_and_the_first_tick_at_the_reference():
    config = suite.run_config(TrainConfig(), "Acrobot-v1", 2, 500_000, "/tmp/out")
    assert (config.target_return, config.max_seconds, config.max_frames) == (None, 0.0, 500_000)
    curve = [
        {"frames": 1000, "seconds": 1.0, "return": -80.0, "episodes": 5},  # window not full yet
        {"frames": 9000, "seconds": 9.0, "return": -300.0, "episodes": 100},
        {"frames": 20000, "seconds": 20.0, "return": -85.0, "episodes": 180},
        {"frames": 30000, "seconds": 30.0, "return": -90.0, "episodes": 300},
    ]
    summary = {"frames": 30000, "wall_seconds": 31.0, "mean_return_last100": -90.0, "eval": {"mean": -70.0}}
    row = suite.result_row(config, summary, curve, random=-500.0)
    assert row["best_return"] == -85.0
    assert (row["frames_to_reference"], row["seconds_to_reference"]) == (20000, 20.0)
    assert row["final_normalised"] == pytest.approx(410 / 414)
    assert row["eval_normalised"] == pytest.approx(430 / 414)


@pytest.mark.unit
def test_budget_comes_from_the_table_scaled_or_overridden():
    assert suite.budget("MinAtar/Breakout-v1") == 5_000_000
    assert suite.budget("MinAtar/Breakout-v1", frames_scale=0.1) == 500_000
    assert suite.budget("Pendulum-v1", max_frames=1234) == 1234
    with pytest.raises(ValueError, match="not in the suite's table"):
        suite.budget("MountainCar-v0")


@pytest.mark.e2e
def test_a_tiny_suite_writes_its_outputs_and_a_rerun_skips_finished_runs(tmp_path):
    """Two fresh `seedq train` processes at once (CartPole, 2000 frames each,
    --jobs 2): the suite's files, then a rerun that trains nothing."""
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "seedq.cli", "bench", "suite", "--envs", "CartPole-v1", "--seeds", "2",
           "--max-frames", "2000", "--num-actors", "1", "--envs-per-actor", "4", "--eval-episodes", "2",
           "--random-episodes", "5", "--jobs", "2", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "[1/2] CartPole-v1 seed 0: training 2,000 frames" in result.stdout
    # Both started before either finished: the second did not wait for the first.
    second_started = next(i for i, line in enumerate(lines) if line.startswith("[2/2] CartPole-v1 seed 1: training"))
    first_done = next(i for i, line in enumerate(lines) if line.startswith("[1/2] CartPole-v1 seed 0: final"))
    assert second_started < first_done
    assert (out / "runs" / "CartPole-v1-seed1.log").exists()  # each run's own output
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["seed"] for r in rows] == ["0", "1"] and all(int(r["frames"]) >= 2000 for r in rows)
    assert [r["logdir"] for r in rows] == ["runs/CartPole-v1-seed0", "runs/CartPole-v1-seed1"]
    assert float(rows[0]["reference"]) == 490.0 and rows[0]["random_return"]
    # The runs had no target and no time limit: only the frame budget stopped them.
    config = json.loads((out / "runs" / "CartPole-v1-seed1" / "config.json").read_text())
    assert (config["target_return"], config["max_seconds"], config["seed"]) == (None, 0.0, 1)
    assert list(csv.DictReader(open(out / "curves.csv")))
    assert "| CartPole-v1 | 2 | 490" in (out / "summary.md").read_text()
    assert (out / "CartPole-v1.png").stat().st_size > 0
    assert json.loads((out / "random.json").read_text())["CartPole-v1"]["episodes"] == 5

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[2/2] CartPole-v1 seed 1: finished before, skipped" in again.stdout
    assert "training" not in again.stdout
    assert list(csv.DictReader(open(out / "results.csv"))) == rows

    # A run stopped before its end (no summary.json yet) continues from its
    # checkpoint instead of starting again.
    run_dir = out / "runs" / "CartPole-v1-seed1"
    (run_dir / "summary.json").unlink()
    continued = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert continued.returncode == 0, continued.stdout + continued.stderr
    assert "[2/2] CartPole-v1 seed 1: continuing an unfinished earlier attempt" in continued.stdout
    # Its progress line names the budget as the point it trains on to, not as frames still to come.
    assert "[2/2] CartPole-v1 seed 1: training on to 2,000 frames" in continued.stdout
    assert "[1/2] CartPole-v1 seed 0: finished before, skipped" in continued.stdout
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"]
    assert [r["seed"] for r in csv.DictReader(open(out / "results.csv"))] == ["0", "1"]
    planned = suite.run_config(TrainConfig(num_actors=1, envs_per_actor=4, eval_episodes=2), "CartPole-v1", 1,
                               2000, str(out))
    assert _continues(planned)
    other = dataclasses.replace(planned, vtrace=dataclasses.replace(planned.vtrace, reuse=planned.vtrace.reuse + 1))
    assert not _continues(other)
    # The setting that differs is named (a rerun with it is refused, not started again).
    assert suite.other_settings(other) == [f"vtrace.reuse: {planned.vtrace.reuse} -> {planned.vtrace.reuse + 1}"]
    # A larger budget is no other setting: the run is extended.
    assert _continues(dataclasses.replace(planned, max_frames=planned.max_frames * 2))


@pytest.mark.unit
def test_changed_settings_names_nested_keys_and_fields_one_side_lacks():
    saved = {"env": "CartPole-v1", "vtrace": {"reuse": 4, "gone": 1}, "seed": 0}
    current = {"env": "CartPole-v1", "vtrace": {"reuse": 8, "added": True}, "seed": 0}
    assert suite.changed_settings(saved, current) == [
        "vtrace.added: (absent) -> True", "vtrace.gone: 1 -> (absent)", "vtrace.reuse: 4 -> 8"]
    assert suite.changed_settings(saved, saved) == []


@pytest.mark.e2e
def test_suite_refuses_a_single_env_flag(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "bench", "suite", "--env", "CartPole-v1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1 and "the suite takes --envs" in result.stderr
    assert "Traceback" not in result.stderr


def _processes_mentioning(text: str) -> list[int]:
    """pids whose command line contains `text`."""
    import psutil

    return [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
            if any(text in arg for arg in p.info["cmdline"] or ())]


def _suite_with_a_run_in_progress(tmp_path):
    """(the `seedq bench suite` process, its run's directory) once the run reports progress."""
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "seedq.cli", "bench", "suite", "--envs", "CartPole-v1", "--seeds", "1",
           "--max-frames", "50000000", "--num-actors", "1", "--envs-per-actor", "4",
           "--random-episodes", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = out / "runs" / "CartPole-v1-seed0"
    deadline = time.monotonic() + 240
    while not (run_dir / "stats.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return proc, run_dir


def _continues(config) -> bool:
    """Whether a rerun continues the run in config.logdir: it has a checkpoint
    and was made with these settings, budgets aside."""
    from seedq import checkpoint

    return checkpoint.has_checkpoint(config.logdir) and suite.other_settings(config) == []


def _assert_stopped_resumable(run_dir):
    assert _processes_mentioning(str(run_dir)) == []
    saved = json.loads((run_dir / "config.json").read_text())
    assert _continues(from_saved(saved))
    assert not suite.finished(from_saved(saved))


@pytest.mark.e2e
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_suite_stops_its_run_with_a_checkpoint_and_no_traceback(tmp_path, stop):
    """SIGTERM or SIGINT to the suite process alone: its training run gets the
    stop, saves a checkpoint and exits (no orphan left training); the suite
    says so in one line and exits 128 + signal; the run stays resumable."""
    proc, run_dir = _suite_with_a_run_in_progress(tmp_path)
    try:
        assert (run_dir / "stats.json").exists(), "the run never reported progress"
        proc.send_signal(stop)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + stop, stdout + stderr
    assert "Traceback" not in stderr
    assert f"stopped by {signal.Signals(stop).name}" in stderr and "resumes" in stderr
    _assert_stopped_resumable(run_dir)


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux only")
def test_a_sigkilled_suite_leaves_no_run_training_on_its_own(tmp_path):
    """SIGKILL to the suite process alone (it can pass nothing on): its training
    run, in a process group of its own, still stops cleanly — summary
    'terminated', a checkpoint — rather than training on into a directory that
    the suite's rerun would resume or clear under it."""
    proc, run_dir = _suite_with_a_run_in_progress(tmp_path)
    try:
        assert (run_dir / "stats.json").exists(), "the run never reported progress"
        proc.kill()
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 120
        while _processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left_running = _processes_mentioning(str(run_dir))
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _processes_mentioning(str(run_dir)):  # a failing test leaves nothing running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left_running == [], "the run trained on after its suite was killed"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "terminated"
    assert os.path.isdir(summary["checkpoint"])
    _assert_stopped_resumable(run_dir)


@pytest.mark.unit
def test_a_suite_stopped_after_a_run_finished_keeps_that_runs_results(tmp_path, monkeypatch):
    """The runs are faked (no training): the first finishes, then the suite is
    stopped. results.csv and summary.md already hold the finished run."""
    from seedq.bench import compare

    out = tmp_path / "suite"
    out.mkdir()
    (out / "random.json").write_text(json.dumps({"CartPole-v1": {"mean": 20.0, "episodes": 5}}))

    def first_finishes_then_stop(jobs, max_running, *, on_start, on_finish, on_progress):
        config = jobs[0].payload
        on_start(jobs[0])
        os.makedirs(config.logdir)
        with open(os.path.join(config.logdir, "summary.json"), "w") as f:
            json.dump({"stop_reason": "max_frames", "frames": config.max_frames, "wall_seconds": 3.0,
                       "mean_return_last100": 480.0}, f)
        on_finish(jobs[0])
        raise compare.Stopped("stopped by SIGTERM, passed on to every running job, which exited", 15)

    monkeypatch.setattr(compare, "run_jobs", first_finishes_then_stop)
    with pytest.raises(compare.Stopped):
        suite.run(lambda env: TrainConfig(), ["CartPole-v1"], 2, str(out), max_frames=1000, log=lambda line: None)
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["seed"], r["final_return"]) for r in rows] == [("0", "480.0")]
    assert "| CartPole-v1 | 1 | 490" in (out / "summary.md").read_text()


def _job(tmp_path, name: str, code: str):
    from seedq.bench import compare

    return compare.Job([sys.executable, "-c", code], str(tmp_path / f"{name}.log"), name, payload=name)


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_run_jobs_runs_them_side_by_side_and_a_failure_stops_the_rest(tmp_path):
    """Two jobs at once: the first to fail gets named with its output, the
    other is passed SIGTERM (and, like a training run, checkpoints and exits
    143), the third never starts."""
    from seedq.bench import compare

    both_up = tmp_path / "b.up"
    stopper = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path(r'%s').write_text('term'), sys.exit(143)))\n"
        "pathlib.Path(r'%s').write_text('up')\n"
        "time.sleep(50)\n" % (tmp_path / "b.term", both_up)
    )
    failing = ("import pathlib, sys, time\n"
               "while not pathlib.Path(r'%s').exists(): time.sleep(0.05)\n"  # b is running beside it
               "print('bad input here'); sys.exit(3)\n" % both_up)
    jobs = [_job(tmp_path, "a", failing), _job(tmp_path, "b", stopper), _job(tmp_path, "c", "pass")]
    started, finished = [], []
    with pytest.raises(RuntimeError, match=r"a failed \(exit 3\): bad input here"):
        compare.run_jobs(jobs, 2, on_start=lambda j: started.append(j.payload),
                         on_finish=lambda j: finished.append(j.payload), poll_seconds=0.05)
    assert started == ["a", "b"]  # c was never started
    assert (tmp_path / "b.term").read_text() == "term"
    assert finished == ["b"]  # it exited 143 after the stop; the caller checks whether it was done


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_run_jobs_stops_a_job_past_its_time_limit_and_kills_it_if_it_hangs_on(tmp_path, monkeypatch):
    """A job past `timeout_seconds` gets SIGTERM and is named in the error; one
    that ignores SIGTERM is killed KILL_AFTER_SECONDS later."""
    from seedq.bench import compare, jobs

    monkeypatch.setattr(jobs, "KILL_AFTER_SECONDS", 0.5)
    hangs = ("import signal, time, pathlib\n"
             "signal.signal(signal.SIGTERM, lambda *a: pathlib.Path(r'%s').write_text('term'))\n"
             "print('still here', flush=True)\n"
             "while True: time.sleep(0.05)\n" % (tmp_path / "hung.term"))
    job = _job(tmp_path, "hung", hangs)
    job.timeout_seconds = 1
    finished = []
    with pytest.raises(RuntimeError, match=r"hung ran past its limit of 1s and was stopped: still here"):
        compare.run_jobs([job], 1, on_start=lambda j: None, on_finish=finished.append, poll_seconds=0.05)
    assert (tmp_path / "hung.term").read_text() == "term"  # asked to stop first
    assert finished == []  # then killed: no clean exit


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_run_jobs_reports_a_training_jobs_progress_from_its_own_stats(tmp_path):
    """Each progress tick reads the running job's stats.json; the one an earlier
    attempt left (another pid) is not reported, the job's own frames are, with
    the rate between two ticks."""
    from seedq.bench import jobs

    config = TrainConfig(logdir=str(tmp_path / "run"), max_frames=100_000)
    os.makedirs(config.logdir)
    stats = os.path.join(config.logdir, "stats.json")
    with open(stats, "w") as f:
        json.dump({"pid": 1, "frames": 77_777, "mean_return": 1.0}, f)  # an earlier attempt's
    child = ("import json, os, time\n"
             "time.sleep(0.6)\n"
             "for i in range(1, 11):\n"
             "    tmp = %r + '.tmp'\n"
             "    json.dump({'pid': os.getpid(), 'frames': 5000 * i, 'mean_return': 0.5 * i}, open(tmp, 'w'))\n"
             "    os.replace(tmp, %r)\n"
             "    time.sleep(0.1)\n" % (stats, stats))
    job = jobs.Job([sys.executable, "-c", child], str(tmp_path / "run.log"), "[1/1] run", payload=config)
    lines: list[str] = []
    jobs.run_jobs([job], 1, on_start=lambda j: None, on_finish=lambda j: None, poll_seconds=0.02,
                  on_progress=jobs.job_progress(lines.append), progress_seconds=0.25)
    assert lines, "no progress line while the job ran"
    assert not any("77,777" in line for line in lines)
    assert all(line.startswith("[1/1] run: ") and "of 100,000 frames, mean return" in line for line in lines)
    assert any("frames/s, about" in line and "min left" in line for line in lines[1:])


@pytest.mark.e2e
def test_run_jobs_relays_the_newest_whole_line_of_another_jobs_log_once(tmp_path):
    # An evaluation job: no stats.json, its progress is the last line it printed.
    from seedq.bench import jobs

    child = ("import sys, time\n"
             "print('step_1: 10 of 500 episodes ended', flush=True); time.sleep(1.0)\n"
             "print('step_1: 70 of 500 episodes ended', flush=True)\n"
             "sys.stdout.write('step_1: 9'); sys.stdout.flush(); time.sleep(1.0)\n")
    job = jobs.Job([sys.executable, "-c", child], str(tmp_path / "run.eval.log"), "[1/1] run evaluation")
    lines: list[str] = []
    jobs.run_jobs([job], 1, on_start=lambda j: None, on_finish=lambda j: None, poll_seconds=0.02,
                  on_progress=jobs.job_progress(lines.append), progress_seconds=0.25)
    # Each line once, as it was the newest, and never the line still being written.
    assert lines == ["[1/1] run evaluation: step_1: 10 of 500 episodes ended",
                     "[1/1] run evaluation: step_1: 70 of 500 episodes ended"]


@pytest.mark.unit
def test_progress_line_gives_the_budget_the_rate_and_the_time_left():
    from seedq.bench.jobs import progress_line

    stats = {"frames": 1_200_000, "mean_return": 14.336}
    assert progress_line("[2/12] seed-int8 seed 0", stats, 5_000_000, 6_333.0) == (
        "[2/12] seed-int8 seed 0: 1,200,000 of 5,000,000 frames, mean return 14.34, 6,333 frames/s, "
        "about 10 min left")
    assert progress_line("r", {"frames": 10}, 0, None) == "r: 10 frames"
    assert progress_line("r", {"frames": 10, "mean_return": None}, 100, 0.0) == "r: 10 of 100 frames"


@pytest.mark.unit
def test_suite_refuses_jobs_below_one(tmp_path):
    with pytest.raises(ValueError, match="--jobs 0"):
        suite.run(lambda env: TrainConfig(), ["CartPole-v1"], 1, str(tmp_path), jobs=0)


@pytest.mark.unit
def test_a_rerun_extends_a_run_with_a_larger_budget_and_refuses_other_settings_even_when_finished(tmp_path):
    """The comparison and suite drivers never remove a run with a checkpoint:
    a larger budget resumes it, any other change is refused naming the setting,
    finished or not (its results were made with the settings it has)."""
    from seedq import config as config_lib
    from seedq.bench.jobs import resume_args

    config = TrainConfig(logdir=str(tmp_path / "run"), max_frames=20000)
    (tmp_path / "run" / "checkpoints" / "step_000000496").mkdir(parents=True)
    config_lib.save(config, str(tmp_path / "run" / "config.json"))
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"stop_reason": "max_frames", "frames": 20160}))
    lines = []

    assert resume_args(config, "[1/1]", lines.append) is None  # finished: skipped
    bigger = dataclasses.replace(config, max_frames=40000)
    assert resume_args(bigger, "[1/1]", lines.append) == ("--resume", config.logdir)
    assert "extending the finished run" in lines[-1]
    for changed in (dataclasses.replace(config, seed=3), dataclasses.replace(bigger, seed=3)):
        with pytest.raises(ValueError, match=r"other settings \(seed: 0 -> 3\).*new --out"):
            resume_args(changed, "[1/1]", lines.append)
    assert (tmp_path / "run" / "checkpoints" / "step_000000496").is_dir()
