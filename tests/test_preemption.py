"""Preemption and restarts (issue 14): `--config RUN.json` layering, `--resume
auto`, and SIGTERM to a training learner (checkpoint, exit 143) followed by a
restart with `--resume auto` that continues the run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from seedq import cli
from seedq.process import exit_codes

SEEDQ = [sys.executable, "-m", "seedq.cli"]


def printed_config(argv, capsys) -> dict:
    assert cli.main(["train", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.unit
def test_config_file_is_layered_under_the_flags(tmp_path, capsys):
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"env": "Acrobot-v1", "num_actors": 3, "vtrace": {"batch_size": 8},
                                    "server": {"keepalive_seconds": 5.0}, "logdir": str(tmp_path / "r")}))
    config = printed_config(["--config", str(run_json), "--num-actors", "4"], capsys)
    assert config["env"] == "Acrobot-v1" and config["vtrace"]["batch_size"] == 8
    assert config["server"]["keepalive_seconds"] == 5.0 and config["server"]["peer_timeout_seconds"] == 30.0
    assert config["num_actors"] == 4  # the flag wins over the file
    assert config["logdir"] == str(tmp_path / "r")


@pytest.mark.unit
def test_a_runs_own_config_json_round_trips(tmp_path, capsys):
    first = printed_config(["--env", "Acrobot-v1", "--vtrace.hidden-sizes", "32,32", "--insecure",
                            "--logdir", str(tmp_path / "r")], capsys)
    (tmp_path / "config.json").write_text(json.dumps(first))
    assert printed_config(["--config", str(tmp_path / "config.json")], capsys) == first


@pytest.mark.unit
@pytest.mark.parametrize("content, code, expected", [
    ('{"vtrace": {"batch_sise": 8}}', 2, "--config {path}: unknown field(s) vtrace.batch_sise (did you mean vtrace.batch_size?); valid in vtrace:"),
    ('{"bogus": 1}', 2, "--config {path}: unknown field(s) bogus; valid:"),
    ('[1, 2]', 2, "{path}: expected a mapping of config fields"),
    ('{"env": ', 2, "{path}: not valid JSON"),
    (None, 2, "{path}: no such file"),  # a usage error, as a malformed file
])
def test_bad_config_files_are_one_line_errors(tmp_path, capsys, content, code, expected):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["train", "--config", str(path), "--print-config"]) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert expected.format(path=path) in err, err


@pytest.mark.unit
def test_resume_auto_starts_fresh_or_resumes_the_run_directory(tmp_path, capsys):
    assert cli.main(["train", "--resume", "auto", "--print-config"]) == 2
    assert "--resume auto needs the run directory" in capsys.readouterr().err

    run = tmp_path / "run"
    fresh = printed_config(["--resume", "auto", "--logdir", str(run), "--vtrace.batch-size", "8"], capsys)
    assert fresh["logdir"] == str(run) and fresh["vtrace"]["batch_size"] == 8

    # A run directory with a checkpoint: its saved config is the base, flags still override.
    run.mkdir()
    (run / "config.json").write_text(json.dumps(fresh))
    (run / "checkpoints" / "step_000000007").mkdir(parents=True)
    resumed = printed_config(["--resume", "auto", "--logdir", str(run), "--max-frames", "123"], capsys)
    assert resumed["vtrace"]["batch_size"] == 8 and resumed["max_frames"] == 123
    assert resumed["logdir"] == str(run)


def _train_steps(log) -> int:
    found = re.findall(r"\| ([\d,]+) steps ", log.read_text())
    return int(found[-1].replace(",", "")) if found else 0


@pytest.mark.e2e
def test_sigterm_checkpoints_and_exits_143_then_resume_auto_continues(tmp_path):
    run, log = tmp_path / "run", tmp_path / "first.log"
    # No periodic checkpoints: the only checkpoint is the one SIGTERM causes.
    first = subprocess.Popen(
        [*SEEDQ, "train", "--resume", "auto", "--logdir", str(run), "--checkpoint-every-seconds", "0",
         "--max-frames", "2000000", "--max-seconds", "0", "--target-return", "none",
         "--eval-episodes", "0", "--log-every-seconds", "0.5"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while _train_steps(log) < 50:
            assert first.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert not (run / "checkpoints").exists()
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # Non-zero, so that a supervisor (a Kubernetes Job) starts the run again.
    assert first.returncode == exit_codes.TERMINATED == 143, log.read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "terminated" and summary["train_steps"] >= 50, summary
    assert summary["checkpoint"].endswith(f"step_{summary['train_steps']:09d}")

    max_frames = summary["frames"] + 20000
    second = subprocess.run(
        [*SEEDQ, "train", "--resume", "auto", "--logdir", str(run), "--max-frames", str(max_frames)],
        capture_output=True, text=True, timeout=300,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming from {summary['checkpoint']}" in second.stdout
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["segments"] == 2 and resumed["resumed_from"] == summary["checkpoint"]
    assert resumed["stop_reason"] == "max_frames" and resumed["frames"] >= max_frames
    assert resumed["train_steps"] > summary["train_steps"]
    print(f"SIGTERM at {summary['train_steps']} train steps / {summary['frames']:,} frames -> rc 143, "
          f"{os.path.basename(summary['checkpoint'])}; resumed to {resumed['frames']:,} frames, "
          f"{resumed['train_steps']} steps, segments {resumed['segments']}")


@pytest.mark.e2e
def test_a_second_ctrl_c_during_the_final_checkpoint_still_writes_the_summary(tmp_path, monkeypatch):
    """Ctrl-C stops the run; another while the final checkpoint is written
    must not cost the run its summary.json (or its checkpoint)."""
    import threading

    from seedq.reporting.reporter import RunReporter

    run = tmp_path / "run"
    real_checkpoint, second_at = RunReporter.checkpoint, []

    def checkpoint(self, *, final=False):
        if final:
            second_at.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, as the final save starts
        return real_checkpoint(self, final=final)

    monkeypatch.setattr(RunReporter, "checkpoint", checkpoint)

    def first_ctrl_c():  # once training has logged a row: a bounded wait
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_csv_rows(run / "curves.csv")) < 2:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=first_ctrl_c, daemon=True).start()
    try:
        code = cli.main(["train", "--env", "CartPole-v1", "--logdir", str(run), "--num-actors", "1",
                         "--max-seconds", "150", "--target-return", "none", "--eval-episodes", "0",
                         "--log-every-seconds", "0.5", "--quiet"])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt out of seedq train"
    assert second_at, "the final checkpoint was never written"
    assert (run / "summary.json").exists(), code
    summary = json.loads((run / "summary.json").read_text())
    assert (code, summary["stop_reason"]) == (exit_codes.INTERRUPTED, "interrupted")
    assert os.path.isdir(summary["checkpoint"])


def _csv_rows(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
