"""The Python API (`seedq.train`, `seedq.load_policy`, `seedq.evaluate`) and
`seedq export`: resolution like the command, policies that act as the run's
own, exports that load without seedq."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import seedq
from seedq import api, cli
from seedq.policy import Policy, PolicyInfo
from seedq.schema import EnvSpec

# A CartPole budget that trains in well under a minute here and leaves a policy
# whose actions are not all one action (the export checks compare real choices).
FRAMES = 20000


def _resolved(argv):
    args = cli.build_parser().parse_args(["train", *argv])
    prepared, _ = cli.run_config(args)
    return prepared.config


def _resolved_from_keywords(config=None, **overrides):
    from seedq import run_setup

    prepared, resume = run_setup.plan(api.train_layers(config, overrides))
    assert resume is None
    return prepared.config


@pytest.mark.e2e
def test_import_seedq_stays_free_of_jax():
    code = "import sys, seedq; assert 'jax' not in sys.modules; print(sorted(seedq.__all__))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "load_policy" in result.stdout and "train" in result.stdout


@pytest.mark.unit
def test_keyword_arguments_resolve_as_the_command_line_does():
    config = _resolved_from_keywords(env="Pendulum-v1", max_seconds=120, vtrace={"learning_rate": 3e-4},
                                     target_return=None, logdir="runs/x")
    assert config == _resolved(["--env", "Pendulum-v1", "--max-seconds", "120",
                                "--vtrace.learning-rate", "3e-4", "--target-return", "none", "--logdir", "runs/x"])
    assert config.vtrace.learning_rate == 3e-4 and config.target_return is None


@pytest.mark.unit
def test_env_dependent_defaults_apply_to_keyword_arguments():
    config = _resolved_from_keywords(env="CartPole-v1", logdir="runs/x")
    assert config.target_return == 475.0  # CartPole's registered threshold, as `seedq train --env CartPole-v1`
    assert config == _resolved(["--env", "CartPole-v1", "--logdir", "runs/x"])


@pytest.mark.unit
def test_a_config_object_resolves_to_itself(tmp_path):
    base = _resolved(["--env", "Acrobot-v1", "--num-actors", "3", "--logdir", str(tmp_path)])
    config = _resolved_from_keywords(base, seed=7)
    assert config.num_actors == 3 and config.seed == 7 and config.env == "Acrobot-v1"


@pytest.mark.unit
def test_unknown_fields_and_bad_values_are_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown field\(s\) num_actor \(did you mean num_actors"):
        _resolved_from_keywords(num_actor=2)
    with pytest.raises(ValueError, match="num_actors: expected int, got 'two'"):
        _resolved_from_keywords(num_actors="two")
    with pytest.raises(ValueError, match=r"unknown field\(s\) vtrace.learning_rat \(did you mean"):
        _resolved_from_keywords(vtrace={"learning_rat": 1e-3})
    with pytest.raises(ValueError, match=r"unknown field\(s\) print_config"):
        _resolved_from_keywords(print_config=True)
    with pytest.raises(ValueError, match="vtrace: expected a mapping of fields, got int"):
        _resolved_from_keywords(vtrace=3)


class _Recorder:
    """A backend that returns, per env, how many steps it has seen since its episode start."""

    stochastic = False

    def initial_state(self, n):
        return {"t": np.zeros(n, np.int64)}

    def act(self, obs, first, state, deterministic):
        t = np.where(first, 0, state["t"] + 1)
        return t.astype(np.int32), {"t": t}


def _recording_policy():
    spec = EnvSpec(obs_dtype="float32", obs_shape=(4,), num_actions=2)
    return Policy(_Recorder(), PolicyInfo("CartPole-v1", None, spec, "test", "fp32"))


@pytest.mark.unit
def test_predict_takes_one_observation_or_a_batch_and_keeps_state_per_env():
    policy = _recording_policy()
    assert policy.predict(np.zeros(4)).shape == ()
    assert int(policy.predict(np.zeros(4))) == 1
    policy.predict(np.zeros((3, 4)))  # a new batch size starts every env afresh
    np.testing.assert_array_equal(policy.predict(np.zeros((3, 4))), [1, 1, 1])
    policy.reset([1])
    np.testing.assert_array_equal(policy.predict(np.zeros((3, 4))), [2, 0, 2])
    policy.reset(np.array([True, False, False]))
    np.testing.assert_array_equal(policy.predict(np.zeros((3, 4))), [0, 1, 3])
    policy.reset()
    np.testing.assert_array_equal(policy.predict(np.zeros((3, 4))), [0, 0, 0])


@pytest.mark.unit
def test_predict_refuses_other_shapes_and_sampling_where_it_cannot():
    policy = _recording_policy()
    with pytest.raises(ValueError, match=r"shape \[5\]: this policy takes \[4\]"):
        policy.predict(np.zeros(5))
    with pytest.raises(ValueError, match="greedily only"):
        policy.predict(np.zeros(4), deterministic=False)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """The README's example on a frame budget, trained from a thread that is not the main one."""
    logdir = str(tmp_path_factory.mktemp("api") / "run")
    result = {}

    def train():
        try:
            result["run"] = seedq.train(env="CartPole-v1", max_frames=FRAMES, target_return=None,
                                        logdir=logdir, quiet=True, log_every_seconds=1.0)
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            result["error"] = e

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["run"]


@pytest.mark.e2e
def test_the_readme_example_trains_loads_and_plays(cartpole_run):
    import gymnasium as gym

    run = cartpole_run
    assert run.summary["frames"] >= FRAMES and run.summary["stop_reason"] == "max_frames"
    assert os.path.isfile(os.path.join(run.logdir, "curves.png"))
    curves = run.curves
    assert curves["frames"][-1] >= FRAMES and np.all(np.diff(curves["frames"]) >= 0)
    policy = seedq.load_policy(run.logdir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(policy.predict(obs)))
        total += reward
        done = terminated or truncated
    assert total >= 1
    # The run's own end-of-run evaluation, reproduced through the API.
    result = seedq.evaluate(policy, episodes=run.summary["eval"]["episodes"], seed=run.summary["eval"]["seed"])
    assert result.returns == run.summary["eval"]["returns"]


def _recorded_observations(policy, n=1000):
    env = policy.make_env()
    obs, _ = env.reset(seed=123)
    rng, recorded = np.random.default_rng(0), []
    while len(recorded) < n:
        recorded.append(np.asarray(obs))
        action = policy.predict(obs) if rng.random() < 0.7 else env.action_space.sample()
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
            policy.reset()
    return np.stack(recorded)


@pytest.mark.e2e
def test_a_stablehlo_export_acts_as_the_run_and_loads_with_jax_alone(cartpole_run, tmp_path):
    own = seedq.load_policy(cartpole_run.logdir)
    observations = _recorded_observations(own)
    own.reset()
    actions = own.predict(observations)
    assert len(np.unique(actions)) == 2
    from seedq import cli

    out = tmp_path / "stablehlo"
    assert cli.main(["export", cartpole_run.logdir, "--out", str(out), "--format", "stablehlo"]) == 0
    meta = json.loads((out / "policy.json").read_text())
    assert meta["spec"]["obs_shape"] == [4] and meta["inputs"] == ["obs"] and meta["env"] == "CartPole-v1"
    np.testing.assert_array_equal(seedq.load_policy(out).predict(observations), actions)
    np.save(tmp_path / "obs.npy", observations)
    # No seedq in the loading process: every `import seedq` fails there.
    code = (
        "import sys; sys.modules['seedq'] = None\n"
        "import jax, numpy as np\n"
        f"exported = jax.export.deserialize(bytearray(open({str(out / 'policy.stablehlo')!r}, 'rb').read()))\n"
        f"print(np.asarray(exported.call(np.load({str(tmp_path / 'obs.npy')!r}))).tolist())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == actions.tolist()


@pytest.mark.e2e
def test_an_onnx_export_acts_as_the_run_and_loads_with_onnxruntime_alone(cartpole_run, tmp_path):
    import onnx

    own = seedq.load_policy(cartpole_run.logdir)
    observations = _recorded_observations(own)
    own.reset()
    actions = own.predict(observations)
    out = tmp_path / "onnx"
    assert cli.main(["export", cartpole_run.logdir, "--out", str(out), "--format", "onnx"]) == 0
    onnx.checker.check_model(str(out / "policy.onnx"), full_check=True)
    assert sorted(os.listdir(out)) == ["policy.json", "policy.onnx"]
    np.testing.assert_array_equal(seedq.load_policy(out).predict(observations), actions)
    np.save(tmp_path / "obs.npy", observations)
    code = (
        "import sys; sys.modules['seedq'] = None; sys.modules['jax'] = None\n"
        "import numpy as np, onnxruntime as ort\n"
        f"session = ort.InferenceSession({str(out / 'policy.onnx')!r})\n"
        f"print(session.run(None, {{'obs': np.load({str(tmp_path / 'obs.npy')!r})}})[0].tolist())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == actions.tolist()


@pytest.mark.unit
def test_export_refuses_a_bad_format_or_a_used_directory(tmp_path):
    from seedq import export

    with pytest.raises(ValueError, match="--format tflite"):
        export.export(str(tmp_path), str(tmp_path / "out"), format="tflite")
    with pytest.raises(ValueError, match="onnx --precision int8"):
        export.export(str(tmp_path), str(tmp_path / "out"), format="onnx", precision="int8")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        export.export(str(tmp_path), str(tmp_path / "out"))


def _readme_example() -> str:
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.e2e
def test_the_readme_example_runs_as_written_on_a_frame_budget(tmp_path):
    code = _readme_example()
    assert "max_seconds=120" in code
    code = code.replace("max_seconds=120", f"max_frames={FRAMES}, target_return=None")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    mean = float(result.stdout.strip().splitlines()[-1].split()[-1])
    assert 8 <= mean <= 500  # CartPole's returns; what 20k frames reach is the learning tier's business
    assert (tmp_path / "runs" / "api" / "curves.csv").is_file()


@pytest.mark.unit
def test_the_package_attributes_are_the_api_functions():
    from seedq import evaluation  # the module of the evaluation code; `seedq.evaluate` stays the function

    assert seedq.evaluate is api.evaluate and seedq.train is api.train and callable(seedq.load_policy)
    assert evaluation.evaluate is not seedq.evaluate


@pytest.mark.unit
def test_a_recurrent_policy_carries_its_state_through_the_exported_program(tmp_path):
    """R2D2's LSTM state goes in and out of the StableHLO program; the policy
    keeps it per env and restarts it where `reset` says, as the agent does."""
    import jax

    from seedq import export
    from seedq.agents import make_agent
    from seedq.config import TrainConfig
    from seedq.envs import env_spec
    from seedq.policy import CheckpointBackend
    from seedq.quant.mode import InferencePrecision

    spec = env_spec("CartPole-v1")
    agent = make_agent(TrainConfig(agent="r2d2", env="CartPole-v1"), spec)
    precision = InferencePrecision(agent, spec, "fp32")
    params = agent.inference_params(jax.jit(agent.init)(jax.random.PRNGKey(3)))
    program, names, example = export._greedy_program(precision, params)
    assert names == ["c", "h"]
    (batch,) = jax.export.symbolic_shape("B")
    path = str(tmp_path / "policy.stablehlo")
    export._write_stablehlo(program, export._input_specs(spec, names, example, batch), path)
    meta = {"state": export.state_meta(names, example)}
    info = PolicyInfo("CartPole-v1", None, spec, "test", "fp32")
    exported = Policy(export._ExportedBackend(meta, export._stablehlo_runner(path)), info)
    own = Policy(CheckpointBackend(precision, params), info)
    rng = np.random.default_rng(0)
    chosen = []
    for step in range(40):
        obs = rng.normal(0, 2, (3, 4)).astype(np.float32)
        actions = own.predict(obs)
        np.testing.assert_array_equal(exported.predict(obs), actions)
        chosen.append(actions)
        if step % 7 == 6:
            for policy in (own, exported):
                policy.reset([step % 3])
    assert len(np.unique(chosen)) == 2


# --- exports hold data only (issue 60) ---


def _write_export(out, **meta_overrides):
    """A real StableHLO export of an untrained CartPole V-trace policy at `out`
    (seedq.export's own program and policy.json fields), with `meta_overrides`."""
    import dataclasses

    import jax

    from seedq import config as config_lib
    from seedq import export
    from seedq.agents import make_agent
    from seedq.config import TrainConfig
    from seedq.envs import env_spec
    from seedq.quant.mode import InferencePrecision

    config = TrainConfig(env="CartPole-v1")
    spec = env_spec(config.env)
    agent = make_agent(config, spec)
    precision = InferencePrecision(agent, spec, "fp32")
    params = agent.inference_params(jax.jit(agent.init)(jax.random.PRNGKey(0)))
    program, names, example = export._greedy_program(precision, params)
    (batch,) = jax.export.symbolic_shape("B")
    out.mkdir()
    export._write_stablehlo(program, export._input_specs(spec, names, example, batch), str(out / "policy.stablehlo"))
    meta = {"layout": export.EXPORT_LAYOUT, "format": "stablehlo", "program": "policy.stablehlo",
            "precision": "fp32", "env": config.env, "env_options": config_lib.to_dict(config.env_options),
            "spec": dataclasses.asdict(spec), "inputs": ["obs"], "outputs": ["actions"], "state": [],
            **meta_overrides}
    (out / "policy.json").write_text(json.dumps(meta))
    return out


@pytest.fixture
def code_module(tmp_path, monkeypatch):
    """A module on sys.path that leaves a file behind when it is imported."""
    imported = tmp_path / "imported"
    (tmp_path / "env_code_seedq_test.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        "def make(**kwargs):\n    import gymnasium\n    return gymnasium.make('CartPole-v1')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield imported
    sys.modules.pop("env_code_seedq_test", None)


@pytest.mark.unit
@pytest.mark.parametrize("env", ["factory:env_code_seedq_test:make", "env_code_seedq_test:Code-v0"])
def test_an_export_whose_env_names_code_is_refused_unless_the_caller_names_the_env(tmp_path, code_module, env):
    out = _write_export(tmp_path / "export", env=env)
    for load in (lambda: seedq.load_policy(out), lambda: seedq.evaluate(out, episodes=1)):
        with pytest.raises(ValueError) as refused:
            load()
        assert "imports or calls code" in str(refused.value) and "\n" not in str(refused.value)
    assert not code_module.exists() and "env_code_seedq_test" not in sys.modules
    # Named by the caller, the env replaces the export's: evaluate passes it on to load_policy.
    policy = seedq.load_policy(out, env="CartPole-v1")
    assert policy.env_id == "CartPole-v1" and policy.make_env().spec.id == "CartPole-v1"
    assert len(seedq.evaluate(out, env="CartPole-v1", episodes=1).returns) == 1
    assert not code_module.exists()


@pytest.mark.unit
def test_an_export_whose_program_lies_outside_its_directory_is_refused_unread(tmp_path, monkeypatch):
    from seedq import export

    outside = _write_export(tmp_path / "outside") / "policy.stablehlo"
    opened = []
    monkeypatch.setattr(export, "_stablehlo_runner", lambda path: opened.append(path))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "policy.json").write_text((outside.parent / "policy.json").read_text())
    (linked / "policy.stablehlo").symlink_to(outside)
    cases = {"absolute": _write_export(tmp_path / "absolute", program=str(outside)),
             "parent": _write_export(tmp_path / "parent", program="../outside/policy.stablehlo"),
             "symlink": linked}
    for name, directory in cases.items():
        with pytest.raises(ValueError) as refused:
            seedq.load_policy(directory)
        assert "export directory" in str(refused.value) and "\n" not in str(refused.value), name
    assert opened == []


CTRL_C_SCRIPT = r'''
import os, signal, sys, threading, time
import seedq

# As Python in a terminal starts: a parent that runs this in the background
# (`cmd &` in a script) hands it SIGINT ignored, and Python keeps that.
signal.signal(signal.SIGINT, signal.default_int_handler)

logdir, where = sys.argv[1], sys.argv[2]

def train():
    try:
        seedq.train(env="CartPole-v1", max_seconds=600, target_return=None, logdir=logdir, quiet=True,
                    eval_episodes=0, checkpoint_every_seconds=0)
    except KeyboardInterrupt:
        print("train raised KeyboardInterrupt", flush=True)
        raise

if where == "main":
    train()
else:
    worker = threading.Thread(target=train)
    worker.start()
    worker.join()  # Ctrl-C lands here, on the main thread
'''


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["main", "worker"])
def test_ctrl_c_stops_a_run_with_its_summary_and_raises_keyboard_interrupt(tmp_path, where):
    """Ctrl-C (SIGINT to the terminal's process group) while `seedq.train` runs on
    the main thread or on a worker thread: the run stops with its checkpoint and
    summary, and KeyboardInterrupt reaches the caller."""
    import signal
    import time

    logdir = tmp_path / "run"
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(logdir), where], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (logdir / "stats.json").exists() or json.loads((logdir / "stats.json").read_text())["frames"] == 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "train raised KeyboardInterrupt" in out, out
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["frames"] > 0, summary
    assert summary["checkpoint"] and os.path.isdir(summary["checkpoint"]), summary
    assert "Fatal" not in out and "cannot schedule new futures" not in out, out
