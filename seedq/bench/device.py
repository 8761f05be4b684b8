"""`seedq bench device`: one bounded check of a machine for SEED on Atari.

Stages, each a `seedq` subprocess with its share of the time (killed with its
children when the share runs out, so the whole command stays within
`minutes`):

  1. the inference bench: Nature and IMPALA CNN, fp32 / bf16 / int8, batch
     64 to 1,024 (64 only under SMALL_BUDGET_MINUTES: a CPU check);
  2. `bench learner` on Pong with the defaults;
  3. Pong throughput with training: an actor process per CPU core, the
     learner on the accelerator (split into inference and training devices
     where there are several: `devices` auto);
  4. Pong training for the time left.

Writes OUT/device.json (every stage's result, or why it has none) and
OUT/summary.md. Installs nothing: it measures the JAX it finds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ENV = "ALE/Pong-v5"
ENVS_PER_ACTOR = 8
# Shares of the budget: the fixed stages; training gets what they leave.
SHARES = {"inference": 0.2, "learner": 0.12, "throughput": 0.3}
# Below this budget the inference bench times batch 64 only.
SMALL_BUDGET_MINUTES = 10.0
# Seconds a stage needs beyond its measurement (process start, JAX, compiles).
START_SECONDS = 20.0
# Training shorter than this shows nothing: the stage is skipped.
MIN_TRAIN_SECONDS = 30.0


def devices_report() -> dict:
    """JAX's backend and devices, as this process sees them."""
    import jax

    return {
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "devices": [{"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", "")}
                    for d in jax.devices()],
        "cpu_count": os.cpu_count(),
    }


def run_stage(argv: list[str], timeout: float, log_path: str) -> dict:
    """`seedq ARGV` with a deadline: {"result": its last stdout line as JSON}
    or {"error": why not}. The process and its children are killed at the
    deadline (they run in their own session)."""
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "seedq.cli", *argv], stdout=subprocess.PIPE,
                                stderr=log, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"stopped at its {timeout:.0f} s share of the budget", "seconds": timeout}
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return {"error": f"exited with status {proc.returncode} (log: {os.path.basename(log_path)})",
                "seconds": seconds}
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        return {"result": json.loads(lines[-1]), "seconds": seconds}
    except (IndexError, ValueError):
        return {"error": "printed no JSON result", "seconds": seconds}


def stage_seconds(total: float) -> dict[str, float]:
    """Each fixed stage's share of `total` seconds; when what they leave is
    too short for training, the fixed stages share all of it."""
    left = total * (1 - sum(SHARES.values())) - START_SECONDS
    scale = 1.0 if left >= MIN_TRAIN_SECONDS else 1 / sum(SHARES.values())
    return {name: share * scale * total for name, share in SHARES.items()}


def stage_commands(seconds: dict[str, float], minutes: float, actors: int, out_dir: str) -> dict[str, list[str]]:
    """The `seedq` arguments of each stage for its share of `seconds`."""
    batches = "64" if minutes < SMALL_BUDGET_MINUTES else "64,256,1024"
    cases = 2 * len(batches.split(","))  # two nets
    per_case = max(0.2, (seconds["inference"] - 2 * START_SECONDS) / cases / 2)
    measure = max(1.0, (seconds["throughput"] - 2 * START_SECONDS) / 2)  # raw and system phases
    return {
        "inference": ["bench", "inference", "--net", "nature_cnn,impala_cnn", "--precision", "fp32,bf16,int8",
                      "--batch", batches, "--seconds-per-case", f"{per_case:.2f}", "--rounds", "3",
                      "--frames", "random", "--eval-states", "128", "--json"],
        "learner": ["bench", "learner", "--env", ENV, "--seconds",
                    f"{max(0.5, (seconds['learner'] - START_SECONDS) / 2):.1f}", "--json"],
        "throughput": ["bench", "throughput", "--env", ENV, "--actors", str(actors), "--envs-per-actor",
                       str(ENVS_PER_ACTOR), "--seconds", f"{measure:.1f}", "--warmup-seconds", "3", "--json"],
        "training": ["train", "--env", ENV, "--num-actors", str(actors), "--envs-per-actor", str(ENVS_PER_ACTOR),
                     "--target-return", "none", "--logdir", os.path.join(out_dir, "pong"), "--overwrite", "--quiet"],
    }


def run(minutes: float, out_dir: str) -> dict:
    """Runs the stages within `minutes` and writes OUT/device.json and OUT/summary.md."""
    if minutes <= 0:
        raise ValueError(f"--minutes {minutes}: must be > 0")
    deadline = time.monotonic() + minutes * 60
    os.makedirs(out_dir, exist_ok=True)
    report = {"minutes": minutes, "env": ENV, **devices_report(), "stages": {}}
    actors = os.cpu_count() or 1
    seconds = stage_seconds(minutes * 60)
    commands = stage_commands(seconds, minutes, actors, out_dir)
    for name in ("inference", "learner", "throughput"):
        budget = min(seconds[name], deadline - time.monotonic())
        report["stages"][name] = run_stage(commands[name], budget, os.path.join(out_dir, f"{name}.log"))
        _write(report, out_dir)
    report["stages"]["training"] = train_stage(commands["training"], deadline, out_dir)
    _write(report, out_dir)
    return report


def train_stage(argv: list[str], deadline: float, out_dir: str) -> dict:
    """Pong training until the deadline (`--max-seconds`: the time left less a
    margin for start-up and shutdown); its summary.json is the result."""
    left = deadline - time.monotonic() - START_SECONDS
    if left < MIN_TRAIN_SECONDS:
        return {"error": f"skipped: {max(left, 0):.0f} s left, under {MIN_TRAIN_SECONDS:.0f} s"}
    argv = [*argv, "--max-seconds", f"{left:.0f}"]
    stage = run_stage(argv, deadline - time.monotonic(), os.path.join(out_dir, "training.log"))
    summary = _read_json(os.path.join(out_dir, "pong", "summary.json"))
    if summary is not None:
        return {"result": summary, "seconds": stage.get("seconds")}
    return stage if "error" in stage else {"error": "no summary.json", "seconds": stage.get("seconds")}


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write(report: dict, out_dir: str) -> None:
    with open(os.path.join(out_dir, "device.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(report))


def summary_markdown(report: dict) -> str:
    """The report's headline figures as a short markdown page."""
    devices = ", ".join(f"{d['platform']}:{d['id']} {d['kind']}".strip() for d in report["devices"])
    lines = [f"# seedq bench device ({report['minutes']:g} min)", "",
             f"JAX {report['jax_version']} on {report['backend']}: {devices}; {report['cpu_count']} CPUs", ""]
    stages = report["stages"]
    for name, stage in stages.items():
        if "error" in stage:
            lines.append(f"- {name}: {stage['error']}")
    inference = stages.get("inference", {}).get("result")
    if inference:
        lines += ["", "| net | batch | precision | samples/s |", "|---|---:|---|---:|"]
        lines += [f"| {r['net']} | {r['batch']} | {r['precision']} | {r['samples_per_second']:,.0f} |"
                  for r in inference["results"]]
    learner = stages.get("learner", {}).get("result")
    if learner:
        lines += ["", f"bench learner ({learner['env']}): {learner['train_steps_per_second']:.2f} train steps/s, "
                  f"{learner['learner_frames_per_second']:,.0f} learner frames/s, "
                  f"{learner['inference_frames_per_second']:,.0f} inference frames/s"]
    throughput = stages.get("throughput", {}).get("result")
    if throughput:
        lines += ["", f"throughput ({throughput['actors']} actors x {throughput['envs_per_actor']} envs): "
                  f"system {throughput['system_fps']:,.0f} frames/s, trained {throughput['trained_fps']:,.0f}, "
                  f"raw stepping {throughput['raw_env_fps']:,.0f}, bottleneck {throughput['bottleneck']}, "
                  f"rtt p99 {throughput['rtt_p99_ms']} ms"]
    training = stages.get("training", {}).get("result")
    if training:
        lines += ["", "training: " + ", ".join(f"{k} {v}" for k, v in training.items()
                                               if not isinstance(v, (dict, list)))]
    return "\n".join(lines) + "\n"
