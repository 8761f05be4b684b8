"""`seedq bench learner`: the learner's own capacity, measured on the real
jitted update and policy, with the config resolved as `seedq train` does."""

import json

import pytest

from seedq import cli
from seedq.envs import run_defaults

pytestmark = pytest.mark.e2e


def _bench(capsys, *flags):
    assert cli.main(["bench", "learner", "--seconds", "0", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_learners_work_per_frame_follows_reuse_and_lookahead(capsys):
    """MACs per trained frame come from the compiled update: four passes over
    each batch cost four times the work per frame, and 30 lookahead steps
    add 30 forward passes per unroll: the 10 trained steps cost a forward and
    a backward pass (about three forwards), the bootstrap and lookahead steps
    only set the targets and cost a forward each."""
    common = ("--env", "CartPole-v1", "--envs-per-actor", "4", "--num-actors", "1")
    once = _bench(capsys, *common, "--vtrace.reuse", "1", "--vtrace.lookahead", "0")
    four = _bench(capsys, *common, "--vtrace.reuse", "4", "--vtrace.lookahead", "0")
    far = _bench(capsys, *common, "--vtrace.reuse", "1", "--vtrace.lookahead", "30")
    assert once["frames_per_train_step"] == 16 * 10
    assert four["frames_per_train_step"] == 16 * 10 / 4
    assert four["macs_per_trained_frame"] == pytest.approx(4 * once["macs_per_trained_frame"], rel=0.01)
    # (10 x 3 + 31) / (10 x 3 + 1) forward passes' worth; the loss's own arithmetic is a small extra.
    assert far["macs_per_trained_frame"] / once["macs_per_trained_frame"] == pytest.approx(61 / 31, rel=0.2)
    for result in (once, four, far):
        assert result["learner_frames_per_second"] == pytest.approx(
            result["train_steps_per_second"] * result["frames_per_train_step"])
    # Inference runs the server's bucket for 4 envs (8) and costs one forward pass per frame.
    assert once["inference_batch"] == 8
    assert 0 < once["macs_per_inference_frame"] < once["macs_per_trained_frame"]


def test_the_config_is_resolved_as_train_resolves_it(capsys):
    """Env-dependent defaults apply (Box actions: the continuous V-trace
    section) and --vtrace.* flags pass through on top of them."""
    box = run_defaults("Pendulum-v1").vtrace
    result = _bench(capsys, "--env", "Pendulum-v1", "--envs-per-actor", "2")
    assert (result["vtrace.reuse"], result["vtrace.unroll_length"]) == (box.reuse, box.unroll_length)
    assert result["frames_per_train_step"] == box.batch_size * box.unroll_length / box.reuse
    passed = _bench(capsys, "--env", "Pendulum-v1", "--envs-per-actor", "2", "--vtrace.reuse", "2")
    assert passed["vtrace.reuse"] == 2


def test_r2d2_counts_replayed_frames_once(capsys):
    result = _bench(capsys, "--env", "CartPole-v1", "--agent", "r2d2", "--envs-per-actor", "2",
                    "--r2d2.replay-ratio", "4")
    cfg = run_defaults("CartPole-v1").r2d2
    assert result["frames_per_train_step"] == cfg.batch_size * cfg.trace_length / 4
    assert result["train_steps_per_second"] > 0 and result["macs_per_trained_frame"] > 0
    assert result["network"] == "mlp"


def test_bad_flags_are_one_line(capsys):
    assert cli.main(["bench", "learner", "--env", "CartPole-v1", "--vtrace.reuse", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("seedq bench learner: ") and "\n" not in err


def test_new_frames_per_train_step_counts_each_frame_once():
    config = run_defaults("CartPole-v1")
    vt = config.vtrace
    assert config.new_frames_per_train_step == vt.batch_size * vt.unroll_length / vt.reuse
