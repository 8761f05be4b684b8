"""`--deterministic`: two runs with the same seed give the same curves.csv
(every column but wall_seconds) and the same parameters in their final checkpoints."""

import csv
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def final_state(run_dir):
    """The learner state (host arrays) of the run's newest checkpoint and its counters."""
    import jax

    from seedq import checkpoint, config as config_lib
    from seedq.agents import make_agent
    from seedq.envs import env_spec

    meta, _ = checkpoint.read_meta(str(run_dir))
    config = config_lib.from_saved(meta["config"])
    agent = make_agent(config, env_spec(config.env, config.env_options))
    like = jax.jit(agent.init)(jax.random.PRNGKey(0))
    snapshot, _ = checkpoint.restore(str(run_dir), like, jax.random.PRNGKey(0))
    return snapshot


def curves_without_wall_time(run_dir):
    with open(run_dir / "curves.csv") as f:
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(f)]


def train(run_dir, *extra):
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "train", "--deterministic", "--seed", "3", "--env", "CartPole-v1",
         "--max-frames", "12000", "--target-return", "none", "--eval-episodes", "2", "--logdir", str(run_dir),
         "--quiet", *extra],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_deterministic_runs_with_one_seed_match_in_curves_and_parameters(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(a)
    # A busier learner thread changes the timing, not the result.
    train(b, "--log-every-seconds", "0.3", "--stats-every-seconds", "0.1")
    rows = curves_without_wall_time(a)
    assert len(rows) > 10 and rows == curves_without_wall_time(b)
    first, second = final_state(a), final_state(b)
    assert first.counters["frames"] == second.counters["frames"] >= 12000
    import jax

    leaves_a = jax.tree_util.tree_leaves_with_path(first.state.params)
    leaves_b = dict(jax.tree_util.tree_leaves_with_path(second.state.params))
    assert leaves_a and len(leaves_a) == len(leaves_b)
    for path, value in leaves_a:
        np.testing.assert_array_equal(value, leaves_b[path], err_msg=jax.tree_util.keystr(path))


def test_deterministic_runs_one_actor_and_refuses_what_would_reorder_batches():
    def printed(*args):
        return subprocess.run([sys.executable, "-m", "seedq.cli", "train", "--deterministic", *args,
                               "--print-config"], capture_output=True, text=True, timeout=120)

    import json

    ok = printed()
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_actors"] == 1
    refused = printed("--num-actors", "2")
    assert refused.returncode == 2 and "deterministic=true needs num_actors=1" in refused.stderr
