"""`seedq train` end to end: real learner and actor processes on a unix socket."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

SUMMARY_KEYS = {
    "agent", "env", "architecture", "precision", "frames", "wall_seconds", "episodes",
    "mean_return_last100", "target_return", "reached_target", "seconds_to_target",
    "frames_to_target",
}


def seedq(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "seedq.cli", *args],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.e2e
def test_short_run_writes_run_directory(tmp_path):
    logdir = tmp_path / "run"
    result = seedq(
        "train", "--env", "CartPole-v1", "--max-frames", "20000", "--target-return", "none",
        "--logdir", str(logdir), "--log-every-seconds", "0.5",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["frames"] >= 20000
    assert summary["stop_reason"] == "max_frames"
    assert summary["train_steps"] > 0
    assert summary["reached_target"] is False and summary["frames_to_target"] is None
    config = json.loads((logdir / "config.json").read_text())
    assert config["env"] == "CartPole-v1" and config["max_frames"] == 20000
    assert any(p.name.startswith("events.out.tfevents") for p in logdir.iterdir())
    checkpoint = pathlib.Path(summary["checkpoint"])
    assert checkpoint.is_dir() and any(checkpoint.iterdir())
    assert "frames" in result.stdout  # progress lines


@pytest.mark.e2e
def test_many_envs_whose_unrolls_do_not_divide_into_batches_keep_training(tmp_path):
    """One actor of 250 envs finishes 250 unrolls in one inference batch; the
    learner takes 16 at a time from a queue of 256. A queue that
    let a chunk in only if it fit deadlocked: 10 left, 250 more did not fit, and the
    learner waited for 16 for ever (stuck at 5,250 frames). Bounded by frames
    alone, so a slow machine only takes longer; a stuck run never ends and
    fails on the command's timeout."""
    logdir = tmp_path / "run"
    result = seedq(
        "train", "--env", "CartPole-v1", "--num-actors", "1", "--envs-per-actor", "250",
        "--max-frames", "40000", "--max-seconds", "0", "--target-return", "none", "--logdir", str(logdir),
        timeout=500,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_frames", summary


@pytest.mark.e2e
@pytest.mark.learning
def test_cartpole_is_solved_within_a_frame_budget(tmp_path):
    """The default config learns: mean return >= 475 over 100 episodes;
    `seedq eval` of its final checkpoint reproduces the learner's greedy
    evaluation of it, far above random play (~22); and int8 inference agrees
    with fp32 on the solved policy's states.

    Bounded by frames, not seconds, so a slow or busy machine does not fail it
    (runs here need ~0.3-0.5M frames).
    """
    logdir = tmp_path / "solve"
    result = seedq(
        "train", "--agent", "vtrace", "--env", "CartPole-v1", "--max-frames", "2000000",
        "--max-seconds", "0", "--logdir", str(logdir), "--quiet", timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["reached_target"], summary
    assert summary["mean_return_last100"] >= 475
    assert summary["frames_to_target"] <= summary["frames"]
    # The run stops when its sampled policy's mean reaches 475; its greedy
    # policy then is usually solved (500 in every episode) but not always (one
    # CI run's learner evaluated it at a greedy mean of 316, returns 233-500),
    # hence the learner's own eval as the reference and a bound far below 475.
    recorded = summary["eval"]
    assert recorded["policy"] == "greedy" and recorded["checkpoint"] == summary["checkpoint"]
    evaluated = seedq("eval", str(logdir), "--json")
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    result = json.loads(evaluated.stdout)
    assert result["returns"] == recorded["returns"] and result["mean"] > 150, (result, recorded)
    assert_int8_agrees_with_fp32(logdir)


def assert_int8_agrees_with_fp32(run_dir) -> None:
    """Greedy actions of bf16/int8 against fp32 on the states the trained
    policy's softmax behaviour visits.

    Issue 4 asks for >= 99 % (int8, MLP). With the input and output layers
    kept fp32 (seedq.quant.quantizable_paths), six policies that reach 475
    agree on 99.56-99.91 % of such states and on 98.4-99.5 % of greedy-rollout
    states, where a balancing policy dwells on near-indifferent states
    (docs/benchmarks.md). The bounds are regression guards: policies at a mean
    of 150 measured bf16 99.56-99.69 %, int8 99.63-99.81 %, int8 100 % where
    the fp32 gap is >= 0.05, max relative logit error 0.009-0.013
    (bench/inference.trained_policy_agreement, sample mode).
    """
    from seedq.bench.inference import trained_policy_agreement

    row = trained_policy_agreement(str(run_dir), steps=100, num_envs=16, modes=("sample",))["modes"]["sample"]
    assert row["states"] == 1600
    assert row["bf16"]["argmax_agreement"] >= 0.99, row
    assert row["int8"]["argmax_agreement"] >= 0.96, row
    assert row["int8"]["agreement_gap_above_0.05"] >= 0.995, row
    assert row["int8"]["max_rel_logit_error"] < 0.1, row


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--vtrace.learning-rate", "fast"], "learning-rate"),
        (["--agent", "dqn"], "invalid choice: 'dqn'"),
        (["--num-actors", "0"], "num_actors=0"),
        (["--no-such-flag", "1"], "unrecognized arguments"),
    ],
)
def test_bad_overrides_fail_with_one_clear_line(args, expected):
    result = seedq("train", *args, "--max-seconds", "1", timeout=60)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_local_actors_refuse_a_port_the_learner_would_choose_when_it_starts(tmp_path):
    result = seedq("train", "--address", "127.0.0.1:0", "--logdir", str(tmp_path / "run"), timeout=120)
    assert result.returncode == 2  # a usage error: the same command fails the same way again
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--address 127.0.0.1:0" in lines[0] and "seedq learner --address 127.0.0.1:0" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before the run directory is claimed


@pytest.mark.e2e
def test_unknown_env_is_a_clear_error(tmp_path):
    result = seedq("train", "--env", "NoSuchEnv-v0", "--logdir", str(tmp_path / "x"), timeout=120)
    assert result.returncode != 0
    assert "NoSuchEnv-v0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_print_config_shows_resolved_values():
    result = seedq("train", "--vtrace.entropy-cost", "0.02", "--print-config", timeout=60)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["vtrace"]["entropy_cost"] == 0.02
    assert config["logdir"]  # resolved default
    assert os.path.sep in config["logdir"] or config["logdir"].startswith("runs")


@pytest.mark.e2e
def test_ctrl_c_stops_every_process_and_keeps_the_run(tmp_path):
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group."""
    logdir = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "train", "--max-seconds", "120", "--logdir", str(logdir)],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(logdir.glob("events.out.tfevents*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # let some frames through
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output
    assert "Traceback" not in output
    assert "compiling the policy" in output  # the first line: the run does not look hung while JAX compiles
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert pathlib.Path(summary["checkpoint"]).is_dir()
    # No process of the group survives.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.unit
@pytest.mark.parametrize("env_id, target", [
    ("CartPole-v1", 475.0), ("Acrobot-v1", -100.0), ("MountainCarContinuous-v0", 90.0),
    ("Pendulum-v1", None), ("MinAtar/Breakout-v1", None), ("dmc:cartpole-swingup", None),
])
def test_target_return_defaults_to_the_envs_registered_threshold(env_id, target):
    from seedq.envs import run_defaults

    assert run_defaults(env_id).target_return == target


@pytest.mark.unit
def test_target_return_none_is_no_target_and_zero_is_a_real_target(tmp_path):
    from seedq import config as config_lib
    from seedq.cli import build_parser
    from seedq.envs import run_defaults
    from seedq.flags import config_flags, config_from_args

    def resolved(*flags):
        args = build_parser().parse_args(["train", "--env", "Acrobot-v1", *flags])
        return config_from_args(args, base=run_defaults("Acrobot-v1"))

    assert resolved().target_return == -100.0
    assert resolved("--target-return", "none").target_return is None
    assert resolved("--target-return", "0").target_return == 0.0
    # The flags that rebuild a config in a fresh process say "none" where it differs from the env's default.
    config = resolved("--target-return", "none")
    assert config_flags(config)[config_flags(config).index("--target-return") + 1] == "none"
    assert "--target-return" not in config_flags(resolved())
    # A section's flags against its dataclass's defaults (what actors and launchers are given).
    options = config_lib.EnvOptions(atari=config_lib.AtariConfig(screen_size=64))
    assert config_flags(options, config_lib.EnvOptions) == config_flags(options) == ["--atari.screen-size", "64"]
    # config.json round trip (what --resume reads).
    config_lib.save(config, str(tmp_path / "config.json"))
    assert config_lib.load(str(tmp_path / "config.json")) == config


@pytest.mark.e2e
def test_a_run_without_target_says_so(tmp_path):
    logdir = tmp_path / "pendulum"
    result = seedq(
        "train", "--env", "Pendulum-v1", "--max-frames", "2000", "--num-actors", "1",
        "--envs-per-actor", "4", "--eval-episodes", "0", "--logdir", str(logdir), timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no target" in result.stdout and "target 475" not in result.stdout
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["target_return"] is None and summary["reached_target"] is False
    # A resumed run keeps "no target" from its config.json.
    result = seedq("train", "--resume", str(logdir), "--max-frames", "4000", "--quiet", timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((logdir / "summary.json").read_text())["target_return"] is None


@pytest.mark.e2e
def test_zero_target_stops_the_run_once_reached(tmp_path):
    """CartPole's return is >= 0 from the first episodes: a target of 0 (a real target,
    not "none") stops the run as soon as 100 episodes are in."""
    logdir = tmp_path / "zero"
    result = seedq(
        "train", "--env", "CartPole-v1", "--target-return", "0", "--max-frames", "500000",
        "--num-actors", "1", "--envs-per-actor", "8", "--eval-episodes", "0",
        "--logdir", str(logdir), "--quiet", timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return" and summary["frames"] < 500000


@pytest.mark.e2e
def test_one_train_builds_the_env_spec_and_the_agent_once_and_validates_once(tmp_path, monkeypatch):
    """The learner process of one `seedq train` resolves its config along one
    route: the env spec built once (for the env-dependent defaults and the
    learner alike), the config validated once, the agent built once and handed
    to the learner. (The actors are processes of their own; no evaluation runs.)"""
    from seedq import cli, envs
    from seedq.agents.vtrace.agent import VTraceAgent
    from seedq.config import TrainConfig

    calls = {"env spec": 0, "validate": 0, "agent": 0}

    def counting(name, fn):
        def spy(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return spy

    # env_spec ends in spec_from_spaces for every kind of env.
    monkeypatch.setattr(envs, "spec_from_spaces", counting("env spec", envs.spec_from_spaces))
    monkeypatch.setattr(TrainConfig, "validate", counting("validate", TrainConfig.validate))
    monkeypatch.setattr(VTraceAgent, "__init__", counting("agent", VTraceAgent.__init__))
    code = cli.main([
        "train", "--env", "CartPole-v1", "--max-frames", "2000", "--num-actors", "1",
        "--envs-per-actor", "4", "--eval-episodes", "0", "--logdir", str(tmp_path / "run"), "--quiet",
    ])
    assert code == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "max_frames"
    assert calls == {"env spec": 1, "validate": 1, "agent": 1}


@pytest.mark.e2e
def test_a_config_json_written_by_the_commit_before_resumes_and_is_saved_in_this_layout(tmp_path, capsys):
    """A run saved before the config recorded its layout (layout 0) resumes,
    and the resumed run saves config.json and its checkpoints in this layout."""
    from seedq import checkpoint
    from seedq import config as config_lib
    from tests.test_checkpoint import _cli, _run_saved_by_the_commit_before

    run = _run_saved_by_the_commit_before(tmp_path)
    before = json.loads((run / "config.json").read_text())
    assert "layout_version" not in before
    code, err = _cli(["train", "--resume", run, "--max-frames", "600", "--num-actors", "1",
                      "--envs-per-actor", "4", "--eval-episodes", "0", "--quiet"], capsys)
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "max_frames"
    after = json.loads((run / "config.json").read_text())
    assert after.pop("layout_version") == config_lib.LAYOUT_VERSION
    # Every field the old file held keeps its value but the flags given (fields
    # added since take their defaults).
    flat_before, flat_after = config_lib.dotted_fields(before), config_lib.dotted_fields(after)
    changed = {k for k in flat_before if flat_before[k] != flat_after.get(k)}
    assert changed == {"max_frames", "num_actors", "envs_per_actor", "eval_episodes"}, changed
    # The checkpoint written by the resumed run records the layout too.
    meta, _ = checkpoint.read_meta(str(run))
    assert meta["config"]["layout_version"] == config_lib.LAYOUT_VERSION
