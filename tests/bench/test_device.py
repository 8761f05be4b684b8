"""`seedq bench device`: every stage bounded by its share of the budget, and
device.json written whatever each stage managed."""

import json

import pytest

from seedq import cli
from seedq.bench import device


@pytest.mark.e2e
def test_a_stage_past_its_share_is_stopped_and_says_so(tmp_path):
    stage = device.run_stage(["bench", "learner", "--env", "CartPole-v1", "--seconds", "600", "--json"],
                             timeout=3.0, log_path=str(tmp_path / "learner.log"))
    assert stage["error"] == "stopped at its 3 s share of the budget"


@pytest.mark.e2e
def test_a_stage_that_fails_names_its_log(tmp_path):
    stage = device.run_stage(["bench", "learner", "--env", "CartPole-v1", "--vtrace.reuse", "0"],
                             timeout=60.0, log_path=str(tmp_path / "learner.log"))
    assert stage["error"] == "exited with status 1 (log: learner.log)"
    assert "vtrace.reuse" in (tmp_path / "learner.log").read_text()


@pytest.mark.e2e
def test_device_check_on_this_cpu_writes_device_json(tmp_path, capsys):
    out = tmp_path / "check"
    assert cli.main(["bench", "device", "--minutes", "1", "--out", str(out)]) == 0
    report = json.loads((out / "device.json").read_text())
    assert report["backend"] == "cpu" and report["devices"][0]["platform"] == "cpu"
    assert sorted(report["stages"]) == ["inference", "learner", "throughput", "training"]
    for stage in report["stages"].values():
        assert ("result" in stage) != ("error" in stage)
    learner = report["stages"]["learner"].get("result")
    if learner:  # the pixel defaults, as `seedq train` resolves them
        assert learner["vtrace.reuse"] == 1 and learner["network"] == "nature_cnn"
    assert (out / "summary.md").read_text() == capsys.readouterr().out


@pytest.mark.unit
def test_the_summary_shows_each_stage_or_why_it_has_no_result():
    report = {
        "minutes": 2, "jax_version": "0", "backend": "gpu", "cpu_count": 8,
        "devices": [{"id": 0, "platform": "gpu", "kind": "H100"}],
        "stages": {
            "inference": {"result": {"results": [
                {"net": "nature_cnn", "batch": 64, "precision": "bf16", "samples_per_second": 12345.6}]}},
            "learner": {"error": "stopped at its 14 s share of the budget"},
        },
    }
    text = device.summary_markdown(report)
    assert "gpu:0 H100" in text and "| nature_cnn | 64 | bf16 | 12,346 |" in text
    assert "- learner: stopped at its 14 s share of the budget" in text


@pytest.mark.unit
def test_a_budget_too_short_for_training_goes_to_the_other_stages():
    assert sum(device.stage_seconds(120).values()) == pytest.approx(120)
    long = device.stage_seconds(1200)
    assert long == {name: pytest.approx(share * 1200) for name, share in device.SHARES.items()}


@pytest.mark.unit
def test_a_budget_under_ten_minutes_times_batch_64_only():
    shares = device.stage_seconds(120)
    small = device.stage_commands(shares, 2, 2, "out")["inference"]
    large = device.stage_commands(shares, 30, 2, "out")["inference"]
    assert small[small.index("--batch") + 1] == "64"
    assert large[large.index("--batch") + 1] == "64,256,1024"
