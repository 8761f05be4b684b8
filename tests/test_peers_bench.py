"""benchmarks/peers/peers.py: the curve every side-by-side run writes, and its
usage errors (the peers' own venvs and training runs are not needed here)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "peers", "peers.py")


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_rolling_means_average_the_last_window_returns(peers):
    returns = [-21.0, -20.0, -19.0, -15.0, -10.0, 3.0]
    means = peers.rolling_means(returns, window=3)
    assert means == pytest.approx([np.mean(returns[max(0, i - 2): i + 1]) for i in range(len(returns))])


@pytest.mark.unit
def test_episode_points_keep_the_last_game_of_each_interval_and_the_final_game(peers):
    times = [0.0, 0.5, 1.5, 4.0, 4.2, 9.0]
    episodes = [{"unix_time": 100 + t, "agent_steps": 800 * (i + 1), "return": -21.0 + i}
                for i, t in enumerate(times)]
    points = peers.episode_points(episodes, every_seconds=2.0)
    kept = [p["episodes"] for p in points]
    # 0..2 s: games 1-3 (the row after game 3); 4..6 s: games 4-5; game 6 is the last.
    assert kept == [3, 5, 6]
    means = peers.rolling_means([e["return"] for e in episodes])
    assert [p["return_mean100"] for p in points] == pytest.approx([means[k - 1] for k in kept])
    assert [p["agent_steps"] for p in points] == [episodes[k - 1]["agent_steps"] for k in kept]


@pytest.mark.unit
def test_curve_rows_rate_each_interval_and_interpolate_cpu(peers):
    launched = 1000.0
    points = [{"unix_time": launched + 10, "agent_steps": 4000, "episodes": 2, "return_mean100": -21.0},
              {"unix_time": launched + 30, "agent_steps": 10000, "episodes": 9, "return_mean100": -20.5}]
    cpu = [(launched, 0.0), (launched + 20, 30.0), (launched + 40, 70.0)]
    first, second = peers.curve_rows(points, cpu, launched)
    assert first["wall_seconds"] == 10 and second["wall_seconds"] == 30
    assert first["agent_steps_per_second"] == pytest.approx(4000 / 10)
    assert second["agent_steps_per_second"] == pytest.approx(6000 / 20)
    assert second["frames_per_second"] == pytest.approx(6000 / 20 * peers.FRAME_SKIP)
    assert first["cpu_seconds"] == pytest.approx(15.0) and second["cpu_seconds"] == pytest.approx(50.0)
    assert second["cpu_cores"] == pytest.approx((50.0 - 15.0) / 20)


@pytest.mark.unit
def test_seedq_points_shift_its_clock_and_skip_rows_before_any_game(peers):
    curves = [{"frames": 512, "episodes": 0, "return": None, "wall_seconds": 2.0},
              {"frames": 9000, "episodes": 4, "return": -20.25, "wall_seconds": 4.0}]
    (point,) = peers.seedq_points(curves, started=500.0)
    assert point == {"unix_time": 504.0, "agent_steps": 9000, "episodes": 4, "return_mean100": -20.25}


@pytest.mark.unit
def test_run_summary_finds_the_first_crossings_and_the_means_at_each_mark(peers):
    rows = [{"wall_seconds": 60.0 * m, "agent_steps": 10000 * m, "return_mean100": -21.0 + 0.5 * m,
             "cpu_seconds": 90.0 * m} for m in range(1, 61)]
    s = peers.run_summary(rows, budget_seconds=3600)
    first_18 = next(r for r in rows if r["return_mean100"] >= -18)
    first_0 = next(r for r in rows if r["return_mean100"] >= 0)
    assert (s["steps_to_-18"], s["seconds_to_-18"]) == (first_18["agent_steps"], first_18["wall_seconds"])
    assert (s["steps_to_0"], s["seconds_to_0"]) == (first_0["agent_steps"], first_0["wall_seconds"])
    assert s["mean_15min"] == rows[14]["return_mean100"] and s["mean_60min"] == rows[59]["return_mean100"]
    assert s["cpu_cores"] == pytest.approx(rows[-1]["cpu_seconds"] / rows[-1]["wall_seconds"])
    assert peers.run_summary(rows[:5], budget_seconds=300)["steps_to_-18"] is None
    short = peers.run_summary(rows[:20], budget_seconds=1200)
    assert short["mean_15min"] == rows[14]["return_mean100"]
    assert short["mean_30min"] is None and short["mean_60min"] is None


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.unit
def test_seedq_flags_follow_the_defaults_command_word_by_word(peers):
    base = peers.seedq_command("py", 1, 60.0, "OUT")
    with_flags = peers.seedq_command("py", 1, 60.0, "OUT", ["--vtrace.entropy-cost", "0.003"])
    assert with_flags == base + ["--vtrace.entropy-cost", "0.003"]
    parsed = peers.parse_args(["run", "seedq", "--seed", "1", "--seconds", "60", "--out", "OUT",
                               "--seedq-flags=--vtrace.normalize-advantages true --vtrace.entropy-cost 0.003"])
    assert parsed.seedq_flags == ["--vtrace.normalize-advantages", "true", "--vtrace.entropy-cost", "0.003"]


@pytest.mark.e2e
@pytest.mark.parametrize("args, says", [
    (("run", "sbx", "--seed", "0", "--seconds", "60", "--out", "{tmp}/out"), "needs --venv"),
    (("run", "cleanrl", "--venv", "{tmp}/nothing", "--seed", "0", "--seconds", "60", "--out", "{tmp}/out"),
     "has no cleanrl set up"),
    (("run", "seedq", "--seed", "0", "--seconds", "0", "--out", "{tmp}/out"), "must be > 0"),
    (("run", "seedq", "--seed", "0", "--seconds", "5", "--out", "{tmp}/full"), "is not an empty directory"),
    (("setup", "sbx", "--venv", os.path.join(os.path.dirname(SCRIPT), "venv")), "inside the seedq repository"),
    (("summary", "{tmp}"), "not a run directory"),
    (("run", "cleanrl", "--venv", "{tmp}/nothing", "--seed", "0", "--seconds", "60", "--out", "{tmp}/out",
      "--seedq-flags=--vtrace.entropy-cost 0"), "is for `run seedq`"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "results.csv").write_text("kept\n")
    result = run_script(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "full" / "results.csv").read_text() == "kept\n"
    assert not os.path.exists(os.path.join(os.path.dirname(SCRIPT), "venv"))


@pytest.mark.e2e
def test_keep_writes_a_copy_without_the_machines_paths_that_summary_reads_alike(peers, tmp_path):
    run_dir, venv = tmp_path / "runs" / "cleanrl-0", tmp_path / "venvs" / "cleanrl"
    run_dir.mkdir(parents=True)
    rows = [{"wall_seconds": 60.0 * m, "agent_steps": 1000 * m, "episodes": m, "return_mean100": -21.0 + 0.1 * m,
             "agent_steps_per_second": 16.7, "frames_per_second": 66.7, "cpu_seconds": 100.0 * m,
             "cpu_cores": 1.67} for m in range(1, 61)]
    peers.write_csv(str(run_dir / "curve.csv"), peers.CURVE_COLUMNS, rows)
    command, _ = peers.peer_command("cleanrl", str(venv), 0, 1e9, str(run_dir))
    meta = {"system": "cleanrl", "seed": 0, "seconds": 3600, "command": command, "host": "build-vm-17"}
    (run_dir / "run.json").write_text(json.dumps(meta))

    assert run_script("keep", str(run_dir), str(tmp_path / "kept")).returncode == 0
    kept_json = (tmp_path / "kept" / "run.json").read_text()
    assert str(tmp_path) not in kept_json and "build-vm-17" not in kept_json
    assert json.loads(kept_json)["command"][:2] == ["VENV/bin/python", "VENV/peer/ppo_atari_envpool.py"]
    assert "OUT/episodes.csv" in json.loads(kept_json)["command"]
    original, copy = run_script("summary", str(run_dir)), run_script("summary", str(tmp_path / "kept"))
    assert original.returncode == copy.returncode == 0
    # The same figures; only the run's name (the directory's) differs.
    assert original.stdout.replace("cleanrl-0", "kept") == copy.stdout
    refused = run_script("keep", str(run_dir), str(tmp_path / "kept"))
    assert refused.returncode == 2 and "is not an empty directory" in refused.stderr
    again = run_script("keep", str(tmp_path / "kept"), str(tmp_path / "again"))
    assert again.returncode == 2 and "a kept copy already" in again.stderr and len(again.stderr.splitlines()) == 1
