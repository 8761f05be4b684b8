"""Weights & Biases as a sink of the run's scalars (offline mode: no account, no network)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct
import types

import pytest

BLOCK = 32768  # the LevelDB log format's block size, which W&B's run files use
HEADER = 7  # ":W&B", a magic number and a version, before the first record


def read_history(path: str) -> list[dict]:
    """The history rows (`run.log` calls) of an offline W&B run file.

    Written here because wandb (0.31) no longer ships a Python reader of its
    own run files: LevelDB log records (crc, length, type; full or in
    chunks) each holding one `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending, rows = HEADER, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


@dataclasses.dataclass
class _Wandb:
    project: str = "p"
    entity: str = ""
    name: str = ""


@dataclasses.dataclass
class _Config:
    logdir: str
    wandb: _Wandb = dataclasses.field(default_factory=_Wandb)


def _tick(frames, ret):
    stats = types.SimpleNamespace(
        frames=frames, episodes=frames // 20, train_steps=frames // 640, mean_return=ret, mean_length=ret,
        mean_inference_batch=8.0, batching="greedy", latency_p50_seconds=0.001, latency_p99_seconds=0.002,
        inference_compiles=1, queue_depth=0, num_connected=2, policy_version=3, policy_lag_mean=0.5,
        policy_lag_max=1, publish_ms=0.1, batch_source={},
    )
    return types.SimpleNamespace(stats=stats, metrics={"loss/total": 0.25}, elapsed_seconds=1.0,
                                 frames_per_second=1000.0, steps_per_second=10.0)


@pytest.mark.e2e
def test_an_offline_run_holds_the_scalars_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from seedq.reporting.wandb_sink import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = _Config(str(tmp_path))
    first = WandbSink(config)
    first.tick(_tick(1000, 20.0))
    first.evaluation({"mean": 30.0, "std": 1.0, "min": 29.0, "max": 31.0, "mean_length": 30.0}, 1000)
    first.close()
    resumed = WandbSink(config)
    resumed.tick(_tick(2000, 40.0))
    resumed.close()
    import wandb

    wandb.teardown()  # the W&B service of this process writes the run files in the background
    files = sorted(glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*", "run-*.wandb")))
    assert len(files) == 2
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert all(os.path.basename(f) == f"run-{run_id}.wandb" for f in files)  # one W&B run, two segments
    rows = read_history(files[0]) + read_history(files[1])
    # The segments' folder names need not sort in the order they were written: order by frames.
    ticks = sorted((r for r in rows if "episode/return_mean" in r), key=lambda r: r["frames"])
    assert [(r["frames"], r["episode/return_mean"], r["loss/total"]) for r in ticks] == [(1000, 20.0, 0.25),
                                                                                         (2000, 40.0, 0.25)]
    assert "throughput/frames_per_second" in ticks[0] and "inference/latency_ms_p99" in ticks[0]
    assert [r["eval/return_mean"] for r in rows if "eval/return_mean" in r] == [30.0]


@pytest.mark.unit
def test_without_wandb_installed_the_flag_names_the_extra(monkeypatch):
    import sys

    from seedq.reporting import wandb_sink

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ValueError, match=r"pip install 'seedq\[wandb\]'"):
        wandb_sink.WandbSink(_Config("unused"))


@pytest.mark.e2e
def test_the_wandb_project_field_adds_the_sink_to_the_run_records(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from seedq.config import TrainConfig, WandbConfig
    from seedq.reporting.curves import CurvesSink
    from seedq.reporting.records import run_records
    from seedq.reporting.wandb_sink import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = run_records(TrainConfig(logdir=str(tmp_path / "a")), "tb", resumed_frames=None)
    assert [type(s) for s in plain.sinks[1:]] == [CurvesSink]
    config = TrainConfig(logdir=str(tmp_path / "b"), wandb=WandbConfig(project="p"))
    records = run_records(config, "tb", resumed_frames=None)
    assert [type(s) for s in records.sinks[1:]] == [CurvesSink, WandbSink]
    for sink in records.sinks[1:]:
        sink.close()


@pytest.mark.unit
def test_a_run_wandb_refuses_is_one_line_naming_offline_mode(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from seedq.reporting.wandb_sink import WandbSink

    def refuse(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.\nmore")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(ValueError, match=r"--wandb.project p: W&B refused the run \(No API key configured.*"
                                         r"WANDB_MODE=offline"):
        WandbSink(_Config(str(tmp_path)))
