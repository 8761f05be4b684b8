"""`seedq compare`'s results: one row per run, the per-config table, the plots.

A row is built from what the run and the comparison recorded: summary.json
(frames, wall time, policy lag), the actors' statistics (their steady-state
counters after a warm-up: frames, CPU, bytes, time split, parameter pulls),
the comparison's own measurements of each segment of the run (a resumed run
has several: CPU seconds of its processes, energy and where it came from) and
the evaluations of its kept checkpoints (seedq.bench.parity).
"""

from __future__ import annotations

import os

import numpy as np

from seedq.bench.parity import parity_columns
from seedq.config import TrainConfig

SPLIT = ("env", "inference", "communication", "pull", "load")
# Shown where a SEED configuration has no value: its actors hold no parameters.
NO_PULLS = "n/a (central inference: no pulls)"


def actor_totals(actor_stats: list[dict]) -> dict:
    """Sums over actors of their steady-state counters (whole run where missing),
    and `whole_cpu_seconds`: their CPU over the whole run (start-up included)."""
    keys = ("frames", "seconds", "cpu_seconds", "bytes_sent", "bytes_received", "pulls", "params_pulled",
            "pull_bytes") + tuple(
        f"{k}_seconds" for k in SPLIT
    )
    totals = dict.fromkeys(keys, 0.0)
    for stats in actor_stats:
        source = stats.get("steady") or stats
        for k in keys:
            totals[k] += float(source.get(k, 0.0))
    totals["whole_cpu_seconds"] = sum(float(s.get("cpu_seconds", 0.0)) for s in actor_stats)
    return totals


def segment_totals(segments: list[dict]) -> dict:
    """The actor totals and the comparison's measurements summed over a run's segments."""
    totals = actor_totals([a for s in segments for a in s.get("actors", [])])
    totals["cpu_seconds_total"] = sum(s["cpu_seconds_total"] for s in segments)
    totals["energy_joules"] = sum(s["energy_joules"] for s in segments)
    cpu_joules = [s.get("energy_cpu_joules") for s in segments]
    totals["energy_cpu_joules"] = None if None in cpu_joules else sum(cpu_joules)
    sources = sorted({s["energy_source"] for s in segments})
    totals["energy_source"] = "+".join(sources)
    totals["energy_detail"] = "; ".join(dict.fromkeys(s.get("energy_detail", "") for s in segments))
    totals["load_avg_1m_at_start"] = segments[0].get("load_avg_1m") if segments else None
    return totals


def _per(value: float, count: float, scale: float = 1.0) -> float | None:
    return value * scale / count if count else None


def steady_fps(curve: list[dict]) -> float | None:
    """Learner-side throughput between the first and last progress tick (no start-up)."""
    if len(curve) >= 2 and curve[-1]["seconds"] > curve[0]["seconds"]:
        return (curve[-1]["frames"] - curve[0]["frames"]) / (curve[-1]["seconds"] - curve[0]["seconds"])
    return None


def tidy_row(name: str, config: TrainConfig, summary: dict, segments: list[dict], curve: list[dict],
             evaluations: dict[str, dict], *, random: float | None, reference: float | None,
             grams_co2_per_kwh: float) -> dict:
    """One results.csv row: what the run reached, how fast, at what cost, where actor time went."""
    t = segment_totals(segments)
    frames = max(t["frames"], 1.0)  # actor frames (steady state)
    run_frames = summary["frames"]
    impala = config.architecture == "impala"
    learner_cpu = max(t["cpu_seconds_total"] - t["whole_cpu_seconds"], 0.0) if segments else None
    timed = sum(t[f"{k}_seconds"] for k in SPLIT)
    energy_wh = t["energy_joules"] / 3600.0 if segments else None
    row = {
        "config": name, "architecture": config.architecture, "precision": config.precision,
        "actor_precision": config.actor_precision, "seed": config.seed, "env": config.env,
        "num_actors": config.num_actors, "envs_per_actor": config.envs_per_actor,
        "actor_cores": config.actor_cores or None, "segments": len(segments),
        "wall_seconds": summary["wall_seconds"], "frames": run_frames,
        "return": summary["mean_return_last100"],
        "reached_target": summary["reached_target"], "seconds_to_target": summary["seconds_to_target"],
        "frames_to_target": summary["frames_to_target"],
        "frames_per_second": _per(run_frames, summary["wall_seconds"]),
        "steady_frames_per_second": steady_fps(curve),
        "actor_cpu_seconds": t["cpu_seconds"],
        "frames_per_actor_cpu_second": _per(t["frames"], t["cpu_seconds"]),
        # Learner process CPU (inference, training, serving; start-up included) per env frame.
        "learner_cpu_seconds": learner_cpu,
        "learner_cpu_us_per_frame": None if learner_cpu is None else _per(learner_cpu, run_frames, 1e6),
        "bytes_sent_per_frame": t["bytes_sent"] / frames,
        "bytes_received_per_frame": t["bytes_received"] / frames,
        # IMPALA only (SEED actors pull nothing: empty, not 0).
        "param_pulls": int(t["pulls"]) if impala else None,
        "param_pull_every_unrolls": config.param_pull_every if impala else None,
        # Per pull that brought parameters (a pull answered "nothing newer" carries none).
        "param_pulls_with_params": int(t["params_pulled"]) if impala else None,
        "param_pull_bytes_mean": _per(t["pull_bytes"], t["params_pulled"]) if impala else None,
        "param_pull_ms_mean": _per(t["pull_seconds"], t["pulls"], 1e3) if impala else None,
        "param_load_ms_mean": _per(t["load_seconds"], t["params_pulled"], 1e3) if impala else None,
        "policy_lag_mean": summary.get("policy_lag_mean"),
        **{f"{k}_us_per_frame": 1e6 * t[f"{k}_seconds"] / frames for k in SPLIT},
        # Actor wall time outside the five timed parts (bookkeeping, unroll assembly).
        "other_us_per_frame": 1e6 * max(t["seconds"] - timed, 0.0) / frames,
        "cpu_seconds_total": t["cpu_seconds_total"] if segments else None,
        "energy_wh": energy_wh,
        "energy_cpu_wh": None if t["energy_cpu_joules"] is None or not segments else t["energy_cpu_joules"] / 3600,
        "energy_j_per_1k_frames": None if energy_wh is None else _per(t["energy_joules"], run_frames, 1e3),
        "energy_source": t["energy_source"] or None,
        "energy_detail": t["energy_detail"] or None,
        "co2_g_estimate": None if energy_wh is None else energy_wh / 1000.0 * grams_co2_per_kwh,
        "grams_co2_per_kwh_assumed": grams_co2_per_kwh,
        "load_avg_1m_at_start": t["load_avg_1m_at_start"],
        "random_return": random, "reference_return": reference,
        **parity_columns(evaluations, random, reference),
        "logdir": config.logdir,
    }
    return row


HEADLINE = (
    "steady_frames_per_second", "frames_per_second", "frames_per_actor_cpu_second", "learner_cpu_us_per_frame",
    "bytes_sent_per_frame", "bytes_received_per_frame", "param_pull_bytes_mean", "param_pull_ms_mean",
    "param_load_ms_mean", "policy_lag_mean", "energy_wh", "energy_j_per_1k_frames", "return",
    "final_eval_return", "final_normalized", "best_normalized", "final_over_best",
    "seconds_to_target", "frames_to_target",
)


def _median(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(np.median(values)) if values else None


def summarize(rows: list[dict]) -> list[dict]:
    """Per env and configuration: medians over seeds of the headline columns
    (rows of older layouts: the columns they have), the energy sources, and the
    min and max over seeds of the final evaluated return."""
    out = []
    for env_id, name in dict.fromkeys((r.get("env"), r["config"]) for r in rows):
        group = [r for r in rows if r.get("env") == env_id and r["config"] == name]
        finals = [r.get("final_eval_return") for r in group if r.get("final_eval_return") is not None]
        out.append({
            "env": env_id, "config": name, "seeds": len(group),
            "architecture": group[0].get("architecture"),
            "reached_target": sum(bool(r.get("reached_target")) for r in group),
            "energy_source": "+".join(sorted({str(r["energy_source"]) for r in group if r.get("energy_source")})) or None,
            "final_eval_min": min(finals) if finals else None, "final_eval_max": max(finals) if finals else None,
            **{k: _median(r.get(k) for r in group) for k in HEADLINE},
        })
    return out


def _fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _span(low, high) -> str:
    """A min-max cell: one value where they are equal (one seed); "to" between
    two, since a dash between negative returns (Pong) reads as a minus."""
    if low is None or high is None or low == high:
        return _fmt(low, ".1f")
    return f"{low:.1f} to {high:.1f}"


def _pull(s: dict) -> str:
    if s.get("architecture") == "seed":
        return NO_PULLS
    if s.get("param_pull_bytes_mean") is None:
        return "–"
    return f"{s['param_pull_bytes_mean'] / 1e3:,.1f} KB in {_fmt(s['param_pull_ms_mean'], '.2f')} ms " \
           f"(+{_fmt(s['param_load_ms_mean'], '.2f')} ms load)"


def format_table(summary: list[dict]) -> str:
    """Markdown, one table per env: medians over seeds of `summarize`."""
    blocks = []
    for env_id in dict.fromkeys(s["env"] for s in summary):
        lines = [
            f"**{env_id or 'env not recorded'}**",
            "",
            "| config | seeds | frames/s (steady) | frames per actor CPU-s | learner CPU µs/frame | "
            "bytes/frame sent / recv | parameter pull (mean) | policy lag | energy J per 1k frames (source) | "
            "final eval (min to max) | final normalised | final / best |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for s in (s for s in summary if s["env"] == env_id):
            fps = s["steady_frames_per_second"] if s["steady_frames_per_second"] is not None else s["frames_per_second"]
            lines.append(
                f"| {s['config']} | {s['seeds']} | {_fmt(fps, ',.0f')} | "
                f"{_fmt(s['frames_per_actor_cpu_second'], ',.0f')} | {_fmt(s['learner_cpu_us_per_frame'], ',.0f')} | "
                f"{_fmt(s['bytes_sent_per_frame'], ',.1f')} / {_fmt(s['bytes_received_per_frame'], ',.1f')} | "
                f"{_pull(s)} | {_fmt(s['policy_lag_mean'], '.2f')} | "
                f"{_fmt(s['energy_j_per_1k_frames'], ',.1f')} ({s['energy_source'] or '–'}) | "
                f"{_span(s['final_eval_min'], s['final_eval_max'])} | "
                f"{_fmt(s['final_normalized'], '.2f')} | {_fmt(s['final_over_best'], '.2f')} |"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def plot(rows: list[dict], curves: list[dict], out: str, evaluations: list[dict] = ()) -> list[str]:
    """Writes the PNGs into `out` (the fifth, the kept checkpoints' normalised
    evaluations, where there are any); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["config"] for r in rows))
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    paths = []

    def save(fig, filename):
        fig.tight_layout()
        paths.append(os.path.join(out, filename))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    for x, label, filename in (("frames", "env frames", "return_vs_frames.png"),
                               ("seconds", "wall seconds", "return_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for name in names:
            for i, seed in enumerate(dict.fromkeys(c["seed"] for c in curves if c["config"] == name)):
                points = [c for c in curves if c["config"] == name and c["seed"] == seed]
                ax.plot([p[x] for p in points], [p["return"] for p in points], color=colors[name],
                        alpha=0.8, label=name if i == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("mean return (last 100 episodes)")
        if ax.get_legend_handles_labels()[0]:  # (no finished episode yet: no curve)
            ax.legend(loc="lower right")
        save(fig, filename)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, name in enumerate(names):
        values = [r.get("steady_frames_per_second") or r.get("frames_per_second") or 0.0
                  for r in rows if r["config"] == name]
        ax.bar(i, np.median(values), color=colors[name])
        ax.plot([i] * len(values), values, "k.", alpha=0.6)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("env frames/s (learner, steady state)")
    save(fig, "frames_per_second.png")

    fig, ax = plt.subplots(figsize=(7.5, 4))
    bottom = np.zeros(len(names))
    for j, part in enumerate(SPLIT + ("other",)):
        values = np.array([
            _median(r.get(f"{part}_us_per_frame") for r in rows if r["config"] == name) or 0.0 for name in names
        ])
        ax.bar(range(len(names)), values, bottom=bottom, label=part, color=f"C{j}")
        bottom += values
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("actor time per env frame (µs)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    save(fig, "time_split.png")

    if any(e.get("normalized") is not None for e in evaluations):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for name in names:
            for i, seed in enumerate(dict.fromkeys(e["seed"] for e in evaluations if e["config"] == name)):
                points = [e for e in evaluations if e["config"] == name and e["seed"] == seed]
                ax.plot([p["frames"] for p in points], [p["normalized"] for p in points], "o-", color=colors[name],
                        alpha=0.8, label=name if i == 0 else None)
        ax.set_xlabel("env frames (kept checkpoints)")
        ax.set_ylabel("greedy evaluation, normalised")
        ax.legend(loc="lower right")
        save(fig, "evaluations.png")
    return paths
