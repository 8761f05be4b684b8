"""Operating a training run: checkpoints, resume (also after SIGKILL), eval,
metrics, progress display, CLI error paths, generated docs, the notebook."""

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from tests.fake_learner import ScriptedLearner

from seedq import cli
from seedq import checkpoint
from seedq.reporting.events import read_scalars
from seedq.reporting.stats import ActorStats

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[1]

NEW_SCALARS = {
    "learner/steps_per_second", "inference/latency_ms_p50", "inference/latency_ms_p99",
    "learner/policy_lag_mean", "learner/policy_lag_max", "learner/publish_ms",
    "throughput/frames_per_second", "episode/return_mean", "episode/length_mean",
    "inference/batch_size_mean", "queue/depth_unrolls", "loss/total", "grad_norm",
    "eval/return_mean",
}


def seedq(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "seedq.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout,
    )


def seedq_json(*args, timeout=300) -> dict:
    result = seedq(*args, "--json", timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def newest_step(run: pathlib.Path) -> int:
    steps = [int(p.name[len("step_"):]) for p in (run / "checkpoints").glob("step_*")
             if p.name[len("step_"):].isdigit()]
    return max(steps, default=-1)


def checkpointed_after_first_return(run: pathlib.Path, min_step: int) -> bool:
    """A checkpoint of at least `min_step` train steps holds more frames than
    the first `episode/return_mean` point TensorBoard has on disk."""
    if newest_step(run) < min_step:
        return False
    returns = read_scalars(run).get("episode/return_mean")
    if not returns:
        return False
    try:
        meta, _ = checkpoint.read_meta(str(run))
    except checkpoint.CheckpointError:
        return False  # the newest one is still being written
    return meta["counters"]["frames"] > returns[0][0]


def assert_monotone_counters(run: pathlib.Path) -> dict:
    """TensorBoard steps (env frames) increase and counters never decrease."""
    scalars = read_scalars(run)
    for tag in ("learner/train_steps", "learner/policy_version", "episode/count", "time/elapsed_seconds"):
        points = scalars[tag]
        steps = [s for s, _ in points]
        values = [v for _, v in points]
        assert steps == sorted(steps), (tag, points)
        assert values == sorted(values), (tag, points)
    return scalars


# --- acceptance 1: SIGKILL the learner mid-run; resume; actors reconnect by themselves ---

# Frames the resumed learner trains past the killed one's checkpoint: a budget
# of work, so the test's outcome does not depend on how far a machine gets in
# a time (the learning itself is tests/test_local.py's).
RESUMED_FRAMES = 40_000


def wait_exit(proc, timeout: float) -> int | None:
    """The process's exit status, or None if it still runs after `timeout` seconds."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


# Its tests share xdist_group("operations_sigkilled_run"), so one worker builds it once
# (--dist loadgroup in pyproject.toml), not each worker that runs one of them.
@pytest.fixture(scope="module")
def sigkilled_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("sigkill")
    run = work / "run"
    address = f"unix:{work}/learner.sock"
    log1 = open(work / "learner-1.log", "w")
    first = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "learner", "--address", address, "--logdir", str(run),
         "--min-actors", "2", "--checkpoint-every-seconds", "1", "--max-seconds", "0",
         "--max-frames", "3000000", "--target-return", "none", "--eval-episodes", "5",
         "--log-every-seconds", "1"],
        stdout=log1, stderr=subprocess.STDOUT,
    )
    # Started separately (the multi-machine path); they retry forever by default.
    actors = [
        subprocess.Popen(
            [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", "CartPole-v1",
             "--num-envs", "32", "--actor-id", f"remote-{i}", "--seed", str(100 + i),
             "--stats-file", str(work / f"actor-{i}.json")],
        )
        for i in range(2)
    ]
    try:
        # Mid-run: trained for a while, far from the frame budget, and
        # checkpointed after the first return was logged, so the killed segment
        # has a curve for the resumed one to continue (150 steps can fit in the
        # first logging second on a fast machine).
        wait_for(lambda: checkpointed_after_first_return(run, min_step=150), 180,
                 "a checkpoint after 150 train steps and the first logged return")
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_meta, killed_dir = checkpoint.read_meta(str(run))
        alive_after_kill = [a.poll() is None for a in actors]
        max_frames = killed_meta["counters"]["frames"] + RESUMED_FRAMES
        second = seedq("learner", "--resume", run, "--max-frames", max_frames, "--log-every-seconds", "1",
                       timeout=420)
        (work / "learner-2.log").write_text(second.stdout + second.stderr)
        # The learner told them the run ended (docs/wire.md "The end of a run").
        exits_at_end = [wait_exit(a, 10) for a in actors]
    finally:
        for p in (first, *actors):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in actors:
            p.wait(timeout=30)
        first.wait(timeout=30)
        log1.close()
    stats = [json.loads((work / f"actor-{i}.json").read_text()) for i in range(2)]
    return SimpleNamespace(
        run=run, second=second, killed=killed_meta["counters"], killed_dir=killed_dir, max_frames=max_frames,
        alive_after_kill=alive_after_kill, exits_at_end=exits_at_end, stats=stats,
        first_log=(work / "learner-1.log").read_text(),
    )


@pytest.mark.xdist_group("operations_sigkilled_run")
def test_sigkilled_learner_resumes_and_trains_to_its_frame_budget(sigkilled_run):
    r = sigkilled_run
    out = r.second.stdout + r.second.stderr
    assert r.second.returncode == 0, out + "\n--- first learner ---\n" + r.first_log
    assert "Traceback" not in out
    assert f"resuming from {r.killed_dir}" in out
    summary = json.loads((r.run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_frames" and summary["frames"] >= r.max_frames, summary
    assert summary["resumed_from"] == r.killed_dir and summary["segments"] == 2
    # Counters continue from the checkpoint: never back to 0, never backwards.
    for key in ("train_steps", "frames", "episodes", "policy_version"):
        assert summary[key] > r.killed[key] > 0, key
    assert summary["wall_seconds"] > r.killed["elapsed_seconds"]
    # The same actor processes served both learners: never restarted, reconnected by
    # themselves, and exited 0 when the resumed learner told them the run had ended.
    assert r.alive_after_kill == [True, True] and r.exits_at_end == [0, 0]
    assert all(s["connections"] >= 2 and s["run_ended"] == "max_frames" for s in r.stats), r.stats
    scalars = assert_monotone_counters(r.run)
    frames = [s for s, _ in scalars["episode/return_mean"]]
    assert min(frames) < r.killed["frames"] < max(frames)  # the curve continues across the restart
    kept = list((r.run / "checkpoints").glob("step_*"))
    assert 1 <= len(kept) <= 3, kept


# --- acceptance 2: eval of the resumed checkpoint, with a video read back ---


@pytest.mark.xdist_group("operations_sigkilled_run")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # imageio starts ffmpeg (fork+exec)
def test_eval_of_the_resumed_checkpoint_with_video(sigkilled_run, tmp_path):
    """`seedq eval` of the resumed run's final checkpoint, with a video read
    back: the returns equal the learner's own greedy eval of that checkpoint
    (same episodes, same seed). (Eval of a solved policy:
    tests/test_local.py's learning run.)"""
    import imageio.v2 as imageio

    summary = json.loads((sigkilled_run.run / "summary.json").read_text())
    recorded = summary["eval"]
    assert recorded["policy"] == "greedy" and recorded["checkpoint"] == summary["checkpoint"]
    video = tmp_path / "cartpole.mp4"
    result = seedq_json("eval", sigkilled_run.run, "--episodes", recorded["episodes"],
                        "--seed", recorded["seed"], "--video", video)
    assert result["policy"] == "greedy" and result["checkpoint"] == recorded["checkpoint"]
    assert result["returns"] == recorded["returns"], (result, recorded)
    assert result["min"] <= result["mean"] <= result["max"]
    reader = imageio.get_reader(str(video))
    frames = [frame for frame in reader]
    reader.close()
    assert len(frames) == result["video"]["frames"] > 1
    assert frames[0].shape == (400, 600, 3) and frames[-1].std() > 0  # rendered, not blank


# --- local mode: SIGKILL `seedq train`, then `seedq train --resume` ---


# Its tests share xdist_group("operations_local_run"), so one worker builds it once
# (--dist loadgroup in pyproject.toml), not each worker that runs one of them.
@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("local") / "run"
    first = subprocess.Popen(
        # How many steps train before the kill depends on the machine's speed,
        # so the policy must not depend on them: at a learning rate of 1e-9
        # (Adam moves each parameter by ~1e-9 a step) the greedy policy stays
        # the initial network's, an unsolved one whose returns differ per
        # episode seed, which the eval test needs (a solved policy returns 500
        # in every episode, whatever the seed).
        [sys.executable, "-m", "seedq.cli", "train", "--logdir", str(run), "--max-frames", "2000000",
         "--target-return", "none", "--checkpoint-every-seconds", "1", "--eval-episodes", "5",
         "--log-every-seconds", "0.5", "--vtrace.learning-rate", "1e-9"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_for(lambda: newest_step(run) >= 60, 120, "a checkpoint after 60 train steps")
        # And one more: the first such checkpoint can come in the same poll as the
        # first progress tick with episodes, and a resume purges the points at and
        # after its frames, which would leave the first segment no curve point.
        first_step = newest_step(run)
        wait_for(lambda: newest_step(run) > first_step, 60, "the next checkpoint")
        first.send_signal(signal.SIGKILL)
        first.wait()

        def group_gone():  # its local actors exit with it
            try:
                os.killpg(first.pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(group_gone, 20, "the killed learner's local actors to exit")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    killed_meta, killed_dir = checkpoint.read_meta(str(run))
    max_frames = killed_meta["counters"]["frames"] + 20000
    second = seedq("train", "--resume", run, "--max-frames", max_frames)
    assert second.returncode == 0, second.stdout + second.stderr
    return SimpleNamespace(run=run, killed=killed_meta["counters"], killed_dir=killed_dir,
                           max_frames=max_frames, second=second,
                           summary=json.loads((run / "summary.json").read_text()))


@pytest.mark.xdist_group("operations_local_run")
def test_train_resume_continues_the_local_run(local_run):
    killed, summary = local_run.killed, local_run.summary
    assert f"resuming from {local_run.killed_dir}" in local_run.second.stdout
    assert summary["segments"] == 2 and summary["resumed_from"] == local_run.killed_dir
    assert summary["stop_reason"] == "max_frames" and summary["frames"] >= local_run.max_frames
    for key in ("train_steps", "frames", "episodes", "policy_version"):
        assert summary[key] > killed[key] > 0, key
    assert summary["wall_seconds"] > killed["elapsed_seconds"]
    config = json.loads((local_run.run / "config.json").read_text())
    assert config["max_frames"] == local_run.max_frames and config["eval_episodes"] == 5
    assert len(list(local_run.run.glob("events.out.tfevents*"))) == 2
    scalars = assert_monotone_counters(local_run.run)
    assert NEW_SCALARS <= set(scalars), NEW_SCALARS - set(scalars)
    frames = [s for s, _ in scalars["episode/return_mean"]]
    assert min(frames) < killed["frames"] < max(frames)  # the curve continues across the restart
    assert all(v >= 0 for _, v in scalars["learner/policy_lag_mean"])


@pytest.mark.xdist_group("operations_local_run")
def test_eval_reproduces_the_training_runs_evaluation(local_run, tmp_path):
    recorded = local_run.summary["eval"]
    assert recorded["policy"] == "greedy" and recorded["checkpoint"] == local_run.summary["checkpoint"]
    assert len(set(recorded["returns"])) > 1  # an unsolved policy: the returns differ per seed
    # Defaults: the run's newest checkpoint, eval_episodes and eval_seed.
    result = seedq_json("eval", local_run.run)
    assert result["checkpoint"] == recorded["checkpoint"]
    assert result["returns"] == recorded["returns"] and result["seed"] == recorded["seed"]

    # Sampled actions with a fixed seed are reproducible too (in-process); a GIF of one episode.
    from seedq import evaluation

    gif = tmp_path / "episode.gif"
    code = cli.main(["eval", recorded["checkpoint"], "--episodes", "4", "--seed", "7", "--sample",
                     "--video", str(gif)])
    assert code == 0
    loaded = evaluation.load_policy(recorded["checkpoint"], greedy=False)
    runs = [evaluation.evaluate(loaded.policy, "CartPole-v1", 4, seed=7).returns for _ in range(2)]
    assert runs[0] == runs[1]
    import imageio.v3 as iio

    assert iio.imread(gif, index=None).shape[0] >= 2


# --- acceptance 4: every CLI error path is one clear line, non-zero, no traceback ---


def run_cli(args, capsys):
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["train", "--vtrace.learning-rat", "1"], 2, "did you mean --vtrace.learning-rate"),
        (["train", "--no-such-flag", "1"], 2, "unrecognized arguments: --no-such-flag 1; see seedq train --help-all"),
        (["train", "--vtrace.hidden-sizes", "a,b"], 2, "expected comma-separated ints"),
        (["train", "--eval-episodes", "many"], 2, "invalid int value: 'many'"),
        (["train", "--checkpoints-to-keep", "0"], 2, "checkpoints_to_keep=0"),
        (["train", "--agent", "a3c"], 2, "invalid choice: 'a3c' (choose from"),
        (["train", "--vtrace.layer-norm", "yes"], 2, "invalid choice: 'yes' (choose from"),
        (["train", "--env", "Pendulum-v1", "--vtrace.min-std", "0.7"], 2,
         "vtrace.min_std=0.7: needs 0 <= min_std < exp(vtrace.initial_log_std) = 0.607"),
        (["train", "--vtrace.reuse-pool", "32"], 2,
         "vtrace.reuse_pool=32: needs server.queue_capacity_unrolls=256 >= batch_size x reuse_pool = 512"),
        (["eval", "somewhere", "--precision", "fp64"], 2, "invalid choice: 'fp64' (choose from 'fp32'"),
        (["train", "--resume", "{missing}"], 1, "no such run directory"),
        (["learner", "--resume", "{missing}"], 1, "no such run directory"),
        (["eval", "{missing}"], 1, "no such run directory or checkpoint"),
        (["bench", "throughput", "--server.batch-timeout-ms", "-1"], 1,
         "seedq bench throughput: server.batch_timeout_ms=-1.0: must be >= 0"),
        (["train", "--resume", "{empty}"], 1, "not a seedq run directory (no config.json)"),
        (["train", "--resume", "{no_checkpoint}"], 1, "no checkpoint in it"),
        # (A larger budget: resuming the finished run as it is would only name --max-frames.)
        (["train", "--resume", "{run}", "--vtrace.hidden-sizes", "32", "--max-frames", "100000000"], 1,
         "incompatible with this config (CartPole-v1): learner/params/params/MLPTorso_0/Dense_0/bias is float32[64]"),
        (["eval", "{run}", "--env", "Acrobot-v1"], 1, "trained on CartPole-v1, which Acrobot-v1 does not fit"),
    ],
)
@pytest.mark.xdist_group("operations_local_run")
def test_cli_errors_are_one_line(args, code, expected, local_run, tmp_path, capsys):
    no_checkpoint = tmp_path / "no_checkpoint"
    no_checkpoint.mkdir()
    (no_checkpoint / "config.json").write_text((local_run.run / "config.json").read_text())
    paths = {"missing": tmp_path / "missing", "empty": tmp_path, "run": local_run.run,
             "no_checkpoint": no_checkpoint}
    args = [a.format(**paths) for a in args]
    got, out, err = run_cli(args, capsys)
    assert got == code, (got, out, err)
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert json.loads((local_run.run / "config.json").read_text())["vtrace"]["hidden_sizes"] == [64, 64]


@pytest.mark.xdist_group("operations_local_run")
def test_print_config_with_resume_shows_saved_config_plus_overrides(local_run, capsys):
    code, out, _ = run_cli(["train", "--resume", local_run.run, "--max-frames", "7", "--print-config"], capsys)
    assert code == 0
    config = json.loads(out)
    assert config["max_frames"] == 7 and config["eval_episodes"] == 5
    assert config["logdir"] == str(local_run.run)


# --- progress display and metrics ---


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_display_and_scalars(terminal, tmp_path, capsys):
    from rich.console import Console

    from seedq.config import TrainConfig
    from seedq.reporting.reporter import RunReporter

    started = time.monotonic()
    learner = ScriptedLearner(started, episodes=30, mean_return=15.0, mean_length=15.0,
                              mean_inference_batch=12.5, inference_batches=1200, queue_depth=3,
                              actors=(ActorStats("a", "r", 4, 0), ActorStats("b", "r", 4, 0)))
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=terminal, width=300)
    reporter = RunReporter(TrainConfig(logdir=str(tmp_path)), learner, started, console=console)
    for _ in range(3):
        learner.advance()
        reporter.tick()
    reporter.close_display()
    reporter.close()
    stdout = capsys.readouterr().out
    if terminal:  # one line redrawn in place on the terminal, nothing on plain stdout
        assert stdout == ""
        assert " steps " in screen.getvalue() and "\x1b[" in screen.getvalue()
    else:  # plain log lines
        assert stdout.count(" steps ") == 3 and "\x1b[" not in stdout
        assert stdout.splitlines()[-1] == (
            # (The scripted learner's batch loop never waits: the actors set the pace.)
            # (max_seconds 300, the default: the time left of that budget follows the time)
            "[3s, 297s left] 15,000 fr 5.0k/s | return 15.0 | 60 steps 20/s | 2 actors | loss 0.5 | bottleneck env "
            "| batch 12.5 wait"
        )
    scalars = read_scalars(tmp_path)
    assert scalars["learner/policy_lag_mean"][-1] == (15000, 1.5)
    assert scalars["inference/latency_ms_p99"][-1][1] == pytest.approx(38.89)
    assert scalars["inference/latency_ms_p50"][-1][1] == pytest.approx(2.5)
    assert scalars["learner/publish_ms"][-1][1] == pytest.approx(1.0)
    assert scalars["learner/steps_per_second"][-1] == (15000, pytest.approx(20.0))
    assert scalars["throughput/frames_per_second"][-1] == (15000, pytest.approx(5000.0))
    assert scalars["actors/connected"][-1] == (15000, 2.0)
    assert scalars["grad_norm"][-1] == (15000, 1.25)


def test_progress_line_fits_120_columns_keeping_loss_entropy_and_the_bottleneck():
    import dataclasses

    from tests.fake_learner import learner_stats

    from seedq.config import TrainConfig
    from seedq.reporting.sinks import PROGRESS_COLUMNS, Tick, progress_line, short_count

    # Two hours of Atari on 16 actors: every everyday figure fits.
    stats = learner_stats(frames=10_000_000, train_steps=100_000, mean_return=-20.5, inference_batches=9,
                          mean_inference_batch=512.0, batching="greedy", queue_depth=64, queue_capacity=256,
                          latency_p99_seconds=0.02, actors=tuple(object() for _ in range(16)))
    metrics = {"loss/total": 0.012345, "policy/entropy": 1.234}
    tick = dataclasses.replace(Tick(stats, metrics, 7200.0, 1389.0, 13.9), bottleneck="inference")
    line = progress_line(TrainConfig(precision="int8", max_seconds=0), tick)
    assert line.startswith("[120m] 10.0M fr 1.4k/s | return -20.5 | 100k steps 14/s | 16 actors | loss 0.0123 ")
    assert "| entropy 1.234 | bottleneck inference" in line and len(line) <= PROGRESS_COLUMNS == 120, line
    # Counters past any real run's reach, a Box policy, int8 on split devices: still 120 at most.
    huge = dataclasses.replace(stats, frames=2_345_678_901, train_steps=9_876_543, mean_return=-12345.6,
                               devices={"inference": [0], "training": [1, 2, 3]})
    boxed = {"loss/total": -123.456789, "policy/entropy": -1.467, "policy/std": 0.195}
    assert len(progress_line(TrainConfig(precision="int8"), Tick(huge, boxed, 123456.0, 123456.0, 1234.0))) <= 120
    assert [short_count(n) for n in (94_112, 150_000, 12_345_678, 1_234_567_890)] == ["94,112", "150k", "12.3M", "1.23G"]


def test_progress_line_shows_entropy_and_a_box_policys_std():
    from tests.fake_learner import learner_stats

    from seedq.config import TrainConfig
    from seedq.reporting.sinks import Tick, progress_line

    def line(metrics):
        return progress_line(TrainConfig(), Tick(learner_stats(frames=100), metrics, 1.0, 100.0, 2.0))

    assert "| entropy 0.693 |" in line({"policy/entropy": 0.6931})
    assert "| entropy -1.467 std 0.195 |" in line({"policy/entropy": -1.467, "policy/std": 0.1953})
    assert "entropy" not in line({}) and "std" not in line({})


# --- docs and notebook ---


def test_docs_are_generated_from_the_code():
    from seedq import docs

    assert docs.main(["--check", "--root", str(REPO)]) == 0, "regenerate with: python -m seedq.docs"


# docs/ is reference, not history: what it may hold (issue 63).
DOCS_BYTES = 3 * 2**20
DOCS_PAGE_LINES = 400


def test_docs_stay_within_their_budget():
    """docs/ holds at most 3 MiB of tracked files and no hand-written page of
    more than 400 lines (cli.md and config.md are generated)."""
    listed = subprocess.run(["git", "ls-files", "docs"], capture_output=True, text=True, cwd=REPO, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to measure")
    files = [REPO / name for name in listed.stdout.splitlines()]
    assert sum(f.stat().st_size for f in files if f.exists()) <= DOCS_BYTES
    generated = {REPO / "docs" / "cli.md", REPO / "docs" / "config.md"}
    long_pages = {str(f.relative_to(REPO)): n for f in files if f.suffix == ".md" and f not in generated
                  and (n := len(f.read_text().splitlines())) > DOCS_PAGE_LINES}
    assert not long_pages, long_pages


def test_quickstart_notebook_executes(tmp_path, monkeypatch, run_notebook):
    # A fixed amount of work, not of time: a busy CI machine once spent 15 s
    # starting up, and the run stopped before any episode had ended.
    monkeypatch.setenv("SEEDQ_QUICKSTART_FRAMES", "20000")
    monkeypatch.setenv("SEEDQ_QUICKSTART_SECONDS", "300")
    outputs, text = run_notebook("quickstart.ipynb")
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the learning curve
    assert "10 episodes of CartPole-v1" in text
    (run,) = (tmp_path / "runs").glob("quickstart-*")
    assert (run / "summary.json").exists() and list((run / "checkpoints").glob("step_*"))


def test_throughput_bench_reports_the_learners_cost_per_message():
    """`seedq bench throughput`'s per-message figures come from the real loop:
    every answered message is one actor's vector step, and the server thread's
    CPU is part of the learner process's."""
    from seedq.bench import throughput
    from seedq.config import TrainConfig

    envs_per_actor = 4
    config = TrainConfig(env="CartPole-v1", num_actors=1, envs_per_actor=envs_per_actor)
    config.validate()
    result = throughput.system_fps(config, seconds=2.0, warmup_seconds=1.0, train=False)
    messages = result["learner_messages_per_second"]
    assert messages > 0
    # frames and messages are read a moment apart, so allow a few messages' slack
    assert messages * envs_per_actor == pytest.approx(result["system_fps"], rel=0.1)
    thread_us, process_us = result["server_thread_cpu_us_per_message"], result["learner_cpu_us_per_message"]
    assert 0 < thread_us <= process_us
    assert 0 < result["server_thread_busy_fraction"] <= 1.0
    # `auto` batching: the bench measures after the batcher has tried both rules
    # on this loop, and the rule it chose holds over the whole window.
    assert sorted(result["batching_trial_steps_per_second"]) == ["greedy", "wait"]
    # (counted from two counters read a moment apart: a batch's worth of slack at each end)
    slack = 2 / (result["inference_calls_per_second"] * 2.0)
    expected = 1.0 if result["batching"] == "greedy" else 0.0
    assert result["greedy_batch_share"] == pytest.approx(expected, abs=slack)


@pytest.mark.parametrize("busy, held, cpu, dropped, expected", [
    (0.2, 0.0, 0.3, 0, "env"),  # the loop waited for the actors' steps
    (0.9, 0.7, 0.95, 0, "training"),  # it waited for room in the unroll queue
    (0.8, 0.1, 0.9, 0, "inference"),  # running the policy took most of it
    (0.1, 0.0, 0.8, 0, "transport"),  # busy with the messages themselves
    (0.1, 0.0, 0.1, 60, "training"),  # drop_oldest: most unrolls dropped unseen
])
def test_the_progress_tick_and_the_summary_name_the_bottleneck(busy, held, cpu, dropped, expected):
    import dataclasses

    from tests.fake_learner import learner_stats

    from seedq.reporting.sinks import Tick

    # Two snapshots 10 s apart; the second's counters grew by the shares above.
    before = learner_stats(time=100.0, inference_batches=10, server_thread_cpu_seconds=5.0, queue_put_unrolls=100)
    after = dataclasses.replace(
        before, time=110.0, inference_batches=500, inference_busy_seconds=10 * busy, queue_held_seconds=10 * held,
        server_thread_cpu_seconds=5.0 + 10 * cpu, queue_put_unrolls=200, queue_dropped_unrolls=dropped)
    assert Tick.after(before, before.time, after, {}, 10.0).bottleneck == expected
    assert Tick.after(learner_stats(), 0.0, learner_stats(time=1.0), {}, 1.0).bottleneck is None  # no batch yet
