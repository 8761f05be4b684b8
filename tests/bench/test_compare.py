"""`seedq compare`'s parts: energy sources, kept checkpoints and
normalised scores, resuming. (The end-to-end comparison: tests/test_impala.py;
actor pinning: tests/process/test_affinity.py.)"""

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from seedq.bench import energy, parity
from seedq.bench.jobs import finished
from seedq.config import TrainConfig


def write_rapl(root, domain: str, energy_uj: int, max_uj: int = 262_143_328_850) -> None:
    folder = root / domain
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")


@pytest.mark.unit
def test_rapl_reads_package_domains_only_and_sums_their_joules(tmp_path):
    write_rapl(tmp_path, "intel-rapl:0", 1_000_000)
    write_rapl(tmp_path, "intel-rapl:1", 5_000_000)
    write_rapl(tmp_path, "intel-rapl:0:0", 700_000)  # the core domain, part of package 0
    before = energy.read_rapl(str(tmp_path))
    assert set(before) == {"intel-rapl:0", "intel-rapl:1"}
    write_rapl(tmp_path, "intel-rapl:0", 3_500_000)
    write_rapl(tmp_path, "intel-rapl:1", 6_000_000)
    write_rapl(tmp_path, "intel-rapl:0:0", 2_000_000)
    assert energy.rapl_joules(before, energy.read_rapl(str(tmp_path))) == pytest.approx(2.5 + 1.0)


@pytest.mark.unit
def test_a_rapl_counter_that_wrapped_counts_past_its_range(tmp_path):
    write_rapl(tmp_path, "intel-rapl:0", 9_000_000, max_uj=10_000_000)
    before = energy.read_rapl(str(tmp_path))
    write_rapl(tmp_path, "intel-rapl:0", 500_000, max_uj=10_000_000)
    # 1 J up to the wrap, 0.5 J after it.
    assert energy.rapl_joules(before, energy.read_rapl(str(tmp_path))) == pytest.approx(1.5)


@pytest.mark.unit
def test_no_or_unreadable_rapl_counters_read_as_none(tmp_path):
    assert energy.read_rapl(str(tmp_path)) is None
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir(parents=True)  # open() fails, like a root-only file
    (tmp_path / "intel-rapl:0" / "max_energy_range_uj").write_text("100\n")
    assert energy.read_rapl(str(tmp_path)) is None


@pytest.mark.unit
def test_the_meter_uses_rapl_where_readable_else_the_cpu_seconds_model(tmp_path):
    write_rapl(tmp_path, "intel-rapl:0", 0)
    meter = energy.EnergyMeter(watts_per_core=10.0, rapl_root=str(tmp_path), use_codecarbon=False).start()
    write_rapl(tmp_path, "intel-rapl:0", 7_200_000)
    reading = meter.stop(cpu_seconds=100.0)
    assert (reading.source, reading.joules) == ("rapl", pytest.approx(7.2))

    meter = energy.EnergyMeter(watts_per_core=10.0, rapl_root=str(tmp_path / "none"), use_codecarbon=False).start()
    reading = meter.stop(cpu_seconds=3.0)
    assert (reading.source, reading.joules) == ("cpu_seconds_model", pytest.approx(30.0))


@pytest.mark.e2e
def test_without_rapl_codecarbon_estimates_this_process_and_its_children(tmp_path):
    pytest.importorskip("codecarbon")
    meter = energy.EnergyMeter(watts_per_core=10.0, rapl_root=str(tmp_path)).start()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    reading = meter.stop(cpu_seconds=1.0)
    assert reading.source == "codecarbon" and reading.joules > 0 and "codecarbon" in reading.detail


@pytest.mark.unit
def test_checkpoints_are_kept_every_so_many_new_frames_and_never_pruned():
    config = TrainConfig(max_frames=5_000_000)
    overrides = parity.checkpoint_overrides(config, 1_000_000)
    v = config.vtrace
    assert overrides["checkpoint_every_steps"] == round(1_000_000 / (v.batch_size * v.unroll_length / v.reuse))
    assert overrides["checkpoint_every_seconds"] == 0  # a time trigger would shift the step interval
    assert overrides["checkpoints_to_keep"] > 5


@pytest.mark.unit
def test_final_and_best_checkpoints_are_normalised_by_random_and_reference():
    evaluations = {
        "step_000000100": {"frames": 1_000_000, "episodes": 500, "mean": -15.0},
        "step_000000200": {"frames": 2_000_000, "episodes": 500, "mean": 11.0},
        "step_000000300": {"frames": 3_000_000, "episodes": 500, "mean": 5.0},
    }
    pong = parity.scale_for("ALE/Pong-v5")
    cols = parity.parity_columns(evaluations, pong.random, pong.reference)
    span = pong.reference - pong.random
    assert cols["final_eval_return"] == 5.0 and cols["best_eval_frames"] == 2_000_000
    assert cols["final_normalized"] == pytest.approx((5.0 - pong.random) / span)
    assert cols["best_normalized"] == pytest.approx((11.0 - pong.random) / span)
    assert cols["final_over_best"] == pytest.approx((5.0 - pong.random) / (11.0 - pong.random))
    assert parity.parity_columns({}, pong.random, pong.reference)["final_over_best"] is None
    # An env without a published random return is measured; one unknown has no scale.
    assert parity.scale_for("MinAtar/Breakout-v1").random is None
    assert parity.scale_for("NoSuchEnv-v0") is None


@pytest.mark.unit
def test_a_run_that_stopped_at_its_time_budget_is_finished(tmp_path):
    def with_summary(config, **summary):
        (tmp_path / "summary.json").write_text(json.dumps({"frames": 10, **summary}))
        return finished(config)

    timed = TrainConfig(logdir=str(tmp_path), max_seconds=60.0, max_frames=0)
    assert with_summary(timed, stop_reason="max_seconds")
    assert not with_summary(timed, stop_reason="terminated")
    assert not with_summary(TrainConfig(logdir=str(tmp_path), max_frames=20), stop_reason="max_frames")


@pytest.mark.unit
def test_an_evaluation_cut_at_max_steps_counts_each_episodes_return_so_far():
    from seedq.envs import env_spec
    from seedq.evaluation import RandomPolicy, evaluate

    policy = RandomPolicy(env_spec("CartPole-v1"))
    full = evaluate(policy, "CartPole-v1", 4, seed=3)
    cut = evaluate(policy, "CartPole-v1", 4, seed=3, max_steps=5)
    assert full.truncated == 0 and min(full.lengths) > 5  # random CartPole episodes outlast 5 steps
    # CartPole pays 1 per step: each episode cut at 5 steps has returned 5 so far.
    assert (cut.truncated, cut.returns, cut.lengths) == (4, [5.0] * 4, [5] * 4)


@pytest.mark.unit
def test_an_evaluation_with_more_episodes_than_envs_counts_every_episode_it_started():
    from seedq.envs import env_spec
    from seedq.evaluation import RandomPolicy, evaluate

    policy = RandomPolicy(env_spec("CartPole-v1"))
    first = evaluate(policy, "CartPole-v1", 3, seed=5, num_envs=3)
    more = evaluate(policy, "CartPole-v1", 11, seed=5, num_envs=3)
    assert len(more.returns) == len(more.lengths) == 11 and more.truncated == 0
    # CartPole pays 1 per step: a return is its episode's length, reset step excluded.
    assert more.returns == [float(n) for n in more.lengths]
    # Episodes are listed in the order they started, the envs' first episodes
    # first: those are the same episodes a one-episode-per-env evaluation plays,
    # long ones included (counting the first 11 to end would drop them).
    assert more.returns[:3] == first.returns


@pytest.mark.unit
def test_an_evaluation_reports_each_counted_episode_as_it_ends():
    from seedq.envs import env_spec
    from seedq.evaluation import RandomPolicy, evaluate

    calls = []
    result = evaluate(RandomPolicy(env_spec("CartPole-v1")), "CartPole-v1", 7, seed=2, num_envs=3,
                      on_episode=lambda ended, mean: calls.append((ended, mean)))
    assert [ended for ended, _ in calls] == list(range(1, 8))
    assert calls[-1][1] == pytest.approx(result.mean)


class _FixedLength(gym.Env):
    """Episodes of exactly `length` steps, reward 1 per step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int):
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= self.length, False, {}


@pytest.mark.unit
@pytest.mark.parametrize("length, played", [(8, 6), (30, 2)])
def test_an_env_whose_counted_episode_was_cut_counts_the_next_one_unless_it_stays_stuck(length, played):
    from seedq.envs import env_spec
    from seedq.evaluation import RandomPolicy, evaluate

    env_id = f"FixedLength{length}-v0"
    gym.register(env_id, entry_point=lambda: _FixedLength(length))
    try:
        result = evaluate(RandomPolicy(env_spec(env_id)), env_id, 6, seed=3, num_envs=2, max_steps=5)
    finally:
        gym.registry.pop(env_id)
    # Each episode is cut at 5 with 5 so far. Its env plays it on uncounted: at
    # length 8 it ends 3 steps later and the env starts a counted one (six in
    # all); at 30 both envs are still in it 5 steps after the cut, so the
    # evaluation stops with the two it has.
    assert (result.truncated, result.returns, result.lengths) == (played, [5.0] * played, [5] * played)
    assert (result.episodes, result.unplayed) == (played, 6 - played)


@pytest.mark.unit
@pytest.mark.parametrize("steps, chosen", [
    # marks at 25,005 and 50,010; a SIGTERM's checkpoint at 40,936 between them is not evaluated
    ([25005, 40936, 50010, 60000], [25005, 50010, 60000]),
    # a stop before the first mark is not a mark either; the final save is kept wherever it falls
    ([24000, 25003, 49992], [25003, 49992]),
    ([12000], [12000]),
])
def test_a_comparison_evaluates_the_step_triggers_checkpoints_and_the_final_one_only(steps, chosen):
    dirs = [f"run/checkpoints/step_{s:09d}" for s in steps]
    assert parity.scheduled_checkpoints(dirs, 25000) == [f"run/checkpoints/step_{s:09d}" for s in chosen]
    assert parity.scheduled_checkpoints(dirs, 0) == dirs


@pytest.mark.unit
@pytest.mark.parametrize("finals, cell", [([-4.71], "| -4.7 |"), ([-4.71, 0.83], "| -4.7 to 0.8 |")])
def test_the_summary_shows_one_seeds_final_return_alone_and_a_negative_range_unambiguously(finals, cell):
    from seedq.bench import compare_rows

    summary = dict.fromkeys(("steady_frames_per_second", "frames_per_second", "frames_per_actor_cpu_second",
                             "learner_cpu_us_per_frame", "bytes_sent_per_frame", "bytes_received_per_frame",
                             "policy_lag_mean", "energy_j_per_1k_frames", "energy_source", "final_normalized",
                             "final_over_best"))
    summary.update(env="ALE/Pong-v5", config="seed-int8", architecture="seed", seeds=len(finals),
                   final_eval_min=min(finals), final_eval_max=max(finals))
    assert cell in compare_rows.format_table([summary])
