"""Checkpoints whose parameter layout no longer fits the code: `seedq train --resume`
and `seedq eval` fail with one line that says so and which seedq wrote it.

The checkpoints are real ones (orbax, `CheckpointWriter`) of a real agent's
state. "The code changed since" is made by writing the parameters of one
layout (hidden sizes 64, 64) under a saved config whose layout differs
(hidden size 32): resuming or evaluating rebuilds the network from the saved
config, exactly as it would after a code change, and finds other shapes.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import pytest

import seedq
from seedq import cli
from seedq import config as config_lib
from seedq.envs import env_spec
from seedq import checkpoint
from seedq.learner.learner import make_agent

pytestmark = pytest.mark.unit


def _write_run(run: pathlib.Path, *, saved_hidden: tuple[int, ...], trained_hidden: tuple[int, ...],
               base: config_lib.TrainConfig | None = None) -> str:
    """A run directory whose checkpoint holds parameters of `trained_hidden` while
    its config (config.json and the checkpoint's meta) says `saved_hidden`."""
    base = base or config_lib.defaults_for(False, 475.0)
    trained = dataclasses.replace(base, env="CartPole-v1", vtrace=dataclasses.replace(
        base.vtrace, hidden_sizes=trained_hidden))
    saved = dataclasses.replace(trained, logdir=str(run), vtrace=dataclasses.replace(
        trained.vtrace, hidden_sizes=saved_hidden))
    state = make_agent(trained, env_spec("CartPole-v1")).init(jax.random.PRNGKey(0))
    run.mkdir()
    config_lib.save(saved, str(run / "config.json"))
    writer = checkpoint.CheckpointWriter(str(run), keep=1)
    counters = {"train_steps": 3, "trained_frames": 0, "frames": 100, "episodes": 1,
                "policy_version": 3, "elapsed_seconds": 1.0}
    step_dir = writer.save(checkpoint.Snapshot(
        state=jax.device_get(state), rng=jax.random.PRNGKey(1), counters=counters,
        episode_window={"returns": [10.0], "lengths": [10]}, target={},
        config=config_lib.to_dict(saved)), wait=True)
    writer.close()
    return step_dir


def _cli(args, capsys):
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _meta_file(step_dir: str) -> pathlib.Path:
    files = [p for p in (pathlib.Path(step_dir) / "meta").iterdir() if p.is_file()]
    (meta,) = [p for p in files if "counters" in p.read_text()]
    return meta


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_checkpoint_of_another_layout_is_one_line_naming_the_seedq_that_wrote_it(command, tmp_path, capsys):
    run = tmp_path / "run"
    step_dir = _write_run(run, saved_hidden=(32,), trained_hidden=(64, 64))
    assert json.loads(_meta_file(step_dir).read_text())["seedq_version"] == seedq.__version__
    args = ["eval", run] if command == "eval" else ["train", "--resume", run, "--max-frames", "10"]
    code, err = _cli(args, capsys)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"written by seedq {seedq.__version__}" in err, err
    assert "is incompatible with this config (CartPole-v1)" in err, err
    # The first differing array, with both layouts.
    assert "MLPTorso_0/Dense_0/bias is float32[64] in the checkpoint, float32[32] in this config" in err, err
    assert "parameter layout" in err, err
    assert not (run / "summary.json").exists()  # nothing started


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_checkpoint_from_before_the_version_was_recorded_says_an_older_seedq(command, tmp_path, capsys):
    run = tmp_path / "run"
    step_dir = _write_run(run, saved_hidden=(32,), trained_hidden=(64, 64))
    meta_file = _meta_file(step_dir)
    meta = json.loads(meta_file.read_text())
    del meta["seedq_version"]  # as checkpoints written before it was stored
    meta_file.write_text(json.dumps(meta))
    args = ["eval", run] if command == "eval" else ["train", "--resume", run, "--max-frames", "10"]
    code, err = _cli(args, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "written by an older seedq" in err, err


def test_a_matching_checkpoint_restores_and_a_meta_of_another_format_is_refused(tmp_path):
    run = tmp_path / "run"
    step_dir = _write_run(run, saved_hidden=(64, 64), trained_hidden=(64, 64))
    config = config_lib.load(str(run / "config.json"))
    agent = make_agent(config, env_spec("CartPole-v1"))
    like = agent.init(jax.random.PRNGKey(5))
    snapshot, restored_from = checkpoint.restore(str(run), like, jax.random.PRNGKey(0), env="CartPole-v1")
    assert restored_from == step_dir and snapshot.step == 3
    assert checkpoint.written_by(checkpoint.read_meta(str(run))[0]) == f"seedq {seedq.__version__}"

    meta_file = _meta_file(step_dir)
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "format_version": 99}))
    with pytest.raises(checkpoint.CheckpointError, match=r"format 99 \(written by seedq .*\) is not the supported"):
        checkpoint.read_meta(str(run))


@pytest.mark.parametrize("field, former, named", [
    ("layer_norm", "none", "first_layer"),  # older runs had no LayerNorm
    ("anneal_entropy_cost", False, True),  # a constant entropy bonus
    ("lookahead", 0, 20),  # targets cut at the unroll's end
    ("grow_lookahead", False, True),
])
def test_a_run_saved_before_a_field_existed_resumes_and_evaluates_as_it_ran(tmp_path, field, former, named):
    """config.json and the checkpoint's config of older runs (layout 0: no
    layout recorded) lack the field; they ran with its former value, which the
    migration to layout 1 fills in, whatever today's default is."""
    from seedq.evaluation import load_policy

    run = tmp_path / "run"
    base = config_lib.defaults_for(False, 475.0)
    as_ran = dataclasses.replace(base, vtrace=dataclasses.replace(base.vtrace, **{field: former}))
    step_dir = _write_run(run, saved_hidden=(64, 64), trained_hidden=(64, 64), base=as_ran)
    assert getattr(base.vtrace, field) != former  # else this test would pass without the migration
    saved = json.loads((run / "config.json").read_text())
    del saved["vtrace"][field], saved["layout_version"]
    (run / "config.json").write_text(json.dumps(saved))
    meta_file = _meta_file(step_dir)
    meta = json.loads(meta_file.read_text())
    del meta["config"]["vtrace"][field]
    meta_file.write_text(json.dumps(meta))

    assert getattr(config_lib.load(str(run / "config.json")).vtrace, field) == former
    policy = load_policy(str(run))  # rebuilds the network from the checkpoint's config and restores it
    assert getattr(policy.config.vtrace, field) == former
    # A config that names the field keeps it.
    saved["vtrace"][field] = named
    assert getattr(config_lib.from_saved(saved).vtrace, field) == named
    # In today's layout a missing field takes today's default.
    current = {**saved, "layout_version": config_lib.LAYOUT_VERSION}
    del current["vtrace"][field]
    assert getattr(config_lib.from_saved(current).vtrace, field) == getattr(base.vtrace, field)


def _run_saved_by_the_commit_before(tmp_path) -> pathlib.Path:
    """A run directory whose config.json is the one the code before the layout
    version wrote for `seedq train --env CartPole-v1` (tests/data), with a
    checkpoint of that config."""
    run = tmp_path / "run"
    _write_run(run, saved_hidden=(64, 64), trained_hidden=(64, 64))
    fixture = pathlib.Path(__file__).parent / "data" / "config_layout0_cartpole.json"
    (run / "config.json").write_text(fixture.read_text().replace("RUN_DIR", str(run)))
    return run


@pytest.mark.parametrize("layout, says", [
    (config_lib.LAYOUT_VERSION + 1, "is newer than this seedq's"),
    ("1", "expected a layout number"),
])
def test_a_config_of_a_layout_this_seedq_cannot_read_is_refused_in_one_line(tmp_path, capsys, layout, says):
    run = _run_saved_by_the_commit_before(tmp_path)
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**saved, "layout_version": layout}))
    code, err = _cli(["train", "--resume", run, "--max-frames", "600"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "config.json cannot be read" in err and says in err, err
    assert not (run / "summary.json").exists()  # nothing started


def test_a_config_layout_without_a_migration_step_is_refused(monkeypatch):
    from seedq.config import layout

    monkeypatch.setattr(layout, "MIGRATIONS", {})
    with pytest.raises(ValueError, match="config layout 0 is too old for this seedq"):
        config_lib.from_saved({"env": "CartPole-v1"})
    assert config_lib.from_saved({"env": "Acrobot-v1", "layout_version": layout.LAYOUT_VERSION}).env == "Acrobot-v1"


def test_a_run_config_json_given_as_config_file_is_read_in_this_layout(tmp_path):
    """`--config RUN/config.json` takes a run's saved config (its layout key
    and all) as well as a file of some fields written by hand."""
    saved = tmp_path / "config.json"
    config_lib.save(config_lib.TrainConfig(env="Acrobot-v1", seed=7), str(saved))
    assert config_lib.updated(config_lib.TrainConfig(), config_lib.read_json(str(saved))) == \
        config_lib.TrainConfig(env="Acrobot-v1", seed=7)
    by_hand = tmp_path / "some.json"
    by_hand.write_text(json.dumps({"seed": 3}))
    assert config_lib.read_json(str(by_hand)) == {"seed": 3}


def test_eval_of_a_checkpoint_whose_env_names_code_asks_for_env(tmp_path, capsys, monkeypatch):
    """A checkpoint may come from anyone: `factory:<module>:<function>` in its
    config is not imported or called unless the user names the env."""
    import seedq.envs

    run = tmp_path / "run"
    step_dir = _write_run(run, saved_hidden=(64, 64), trained_hidden=(64, 64))
    meta = _meta_file(step_dir)
    saved = json.loads(meta.read_text())
    saved["config"]["env"] = "factory:os:abort"
    meta.write_text(json.dumps(saved))
    resolved = []
    monkeypatch.setattr(seedq.envs, "_factory", lambda env_id: resolved.append(env_id))
    code, err = _cli(["eval", run, "--episodes", "1"], capsys)
    assert code == 1 and resolved == []
    assert len(err.strip().splitlines()) == 1 and "'factory:os:abort'" in err and "--env" in err, err
    code, err = _cli(["eval", run, "--episodes", "1", "--env", "CartPole-v1"], capsys)
    assert code == 0, err
