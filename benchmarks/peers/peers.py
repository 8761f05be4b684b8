"""Pong side by side: seedq and two peers, each run writing the same curve.csv.

    python benchmarks/peers/peers.py setup sbx|cleanrl --venv DIR
    python benchmarks/peers/peers.py run sbx|cleanrl --venv DIR --seed S --seconds T --out RUN_DIR
    python benchmarks/peers/peers.py run seedq --seed S --seconds T --out RUN_DIR
    python benchmarks/peers/peers.py summary RUN_DIR [RUN_DIR ...]
    python benchmarks/peers/peers.py plot OUT.png RUN_DIR [RUN_DIR ...]
    python benchmarks/peers/peers.py keep RUN_DIR DEST   # what docs/atari.md draws from

Each peer gets its own venv outside this repository (`setup`), so none of its
dependencies meets seedq's. `run` starts one training process, samples the
CPU time of its process tree every second, and writes RUN_DIR/curve.csv
(CURVE_COLUMNS): the 100-episode mean of whole-game returns against agent
steps and wall seconds since the process was launched. benchmarks/peers/README.md
has the settings, versions and deviations. Run it with seedq's venv (psutil).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Installed first and alone: a plain `pip install stable-baselines3` (or
# cleanrl's torch) otherwise pulls a CUDA build of several GB.
TORCH = "torch==2.13.0"
# The versions the README's runs used; pinned so a later sitting reruns the same peers.
SBX_PACKAGES = ("sbx-rl==0.28.0", "rl_zoo3==2.9.2", "stable-baselines3==2.9.2",
                "gymnasium==1.4.0", "ale-py==0.12.1",
                # The cv2 of SB3's AtariWrapper (SB3's [extra] would bring opencv-python).
                "opencv-python-headless==5.1.0.95")
CLEANRL_PACKAGES = ("envpool==0.8.4", "gym==0.23.1", "numpy==1.26.4", "tensorboard==2.21.0")
CLEANRL_WHEEL = "cleanrl==1.2.0"
CLEANRL_SCRIPT = "cleanrl/ppo_atari_envpool.py"
CLEANRL_DIFF = os.path.join(HERE, "cleanrl_ppo_atari_envpool.diff")

ENV_ID = "ALE/Pong-v5"
FRAME_SKIP = 4  # emulator frames per agent step, in every system here
RETURN_WINDOW = 100
ROW_SECONDS = 2.0  # the peers' rows are thinned to seedq's log_every_seconds
CPU_SAMPLE_SECONDS = 1.0
STOP_GRACE_SECONDS = 120.0  # a run that outlives its deadline by this is killed

EPISODE_COLUMNS = ("unix_time", "agent_steps", "return")
CURVE_COLUMNS = ("wall_seconds", "agent_steps", "episodes", "return_mean100",
                 "agent_steps_per_second", "frames_per_second", "cpu_seconds", "cpu_cores")


class UsageError(Exception):
    """Bad input: one line on stderr, exit 2."""


# --- curves (pure) ----------------------------------------------------------


def rolling_means(returns: list[float], window: int = RETURN_WINDOW) -> list[float]:
    """The mean of the last `window` returns (fewer at the start) after each one."""
    means, total = [], 0.0
    for i, r in enumerate(returns):
        total += r
        if i >= window:
            total -= returns[i - window]
        means.append(total / min(i + 1, window))
    return means


def cpu_at(samples: list[tuple[float, float]], when: float) -> float | None:
    """The process tree's CPU seconds at `when`, linear between (time, cpu) samples."""
    if not samples:
        return None
    times = [t for t, _ in samples]
    i = bisect.bisect_left(times, when)
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1


def curve_rows(points: list[dict], cpu_samples: list[tuple[float, float]], launched: float) -> list[dict]:
    """CURVE_COLUMNS rows from points {unix_time, agent_steps, episodes, return_mean100},
    with rates over the interval since the previous row."""
    rows, last = [], {"wall_seconds": 0.0, "agent_steps": 0, "cpu_seconds": 0.0}
    for p in points:
        wall = p["unix_time"] - launched
        cpu = cpu_at(cpu_samples, p["unix_time"])
        dt = wall - last["wall_seconds"]
        steps_rate = (p["agent_steps"] - last["agent_steps"]) / dt if dt > 0 else None
        row = {
            "wall_seconds": round(wall, 3),
            "agent_steps": int(p["agent_steps"]),
            "episodes": int(p["episodes"]),
            "return_mean100": round(p["return_mean100"], 3),
            "agent_steps_per_second": None if steps_rate is None else round(steps_rate, 1),
            "frames_per_second": None if steps_rate is None else round(steps_rate * FRAME_SKIP, 1),
            "cpu_seconds": None if cpu is None else round(cpu, 2),
            "cpu_cores": None if cpu is None or dt <= 0 else round((cpu - last["cpu_seconds"]) / dt, 2),
        }
        rows.append(row)
        last = {"wall_seconds": wall, "agent_steps": p["agent_steps"], "cpu_seconds": cpu or 0.0}
    return rows


def episode_points(episodes: list[dict], every_seconds: float = ROW_SECONDS) -> list[dict]:
    """Points from a peer's finished games (EPISODE_COLUMNS, in time order): the
    running 100-game mean after the last game of each `every_seconds` interval
    (counted from the first game)."""
    if not episodes:
        return []
    means = rolling_means([e["return"] for e in episodes])
    start = episodes[0]["unix_time"]

    def interval(e):
        return int((e["unix_time"] - start) // every_seconds)

    return [{"unix_time": e["unix_time"], "agent_steps": e["agent_steps"], "episodes": i + 1, "return_mean100": mean}
            for i, (e, mean) in enumerate(zip(episodes, means))
            if i + 1 == len(episodes) or interval(episodes[i + 1]) != interval(e)]


def seedq_points(curves: list[dict], started: float) -> list[dict]:
    """Points from seedq's curves.csv rows (frames are agent steps; `return` is
    the return_window mean), its wall_seconds counted from `started`."""
    return [{"unix_time": started + r["wall_seconds"], "agent_steps": r["frames"],
             "episodes": r["episodes"], "return_mean100": r["return"]}
            for r in curves if r.get("return") is not None]


def first_reaching(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r["return_mean100"] >= target), None)


def last_within(rows: list[dict], seconds: float) -> dict | None:
    within = [r for r in rows if r["wall_seconds"] <= seconds]
    return within[-1] if within else None


def run_summary(rows: list[dict], budget_seconds: float) -> dict:
    """The figures issue 64 asks of each run, from its curve.csv rows; the means
    at 15, 30 and 60 minutes only where the run's budget reached them."""
    out = {}
    for minutes in (15, 30, 60):
        r = last_within(rows, minutes * 60) if minutes * 60 <= budget_seconds else None
        out[f"mean_{minutes}min"] = None if r is None else r["return_mean100"]
        out[f"steps_{minutes}min"] = None if r is None else r["agent_steps"]
    for target in (-18, 0):
        r = first_reaching(rows, target)
        out[f"steps_to_{target}"] = None if r is None else r["agent_steps"]
        out[f"seconds_to_{target}"] = None if r is None else r["wall_seconds"]
    if rows:
        end = rows[-1]
        out["agent_steps_per_second"] = round(end["agent_steps"] / end["wall_seconds"], 1)
        out["frames_per_second"] = round(out["agent_steps_per_second"] * FRAME_SKIP, 1)
        cpu = end.get("cpu_seconds")
        out["cpu_cores"] = None if cpu is None else round(cpu / end["wall_seconds"], 2)
    return out


# --- files ------------------------------------------------------------------


def read_csv(path: str) -> list[dict]:
    """Rows as dicts of floats (None for an empty cell); `.gz` read as gzip."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()}
                for row in csv.DictReader(f)]


def write_csv(path: str, columns, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def check_outside_repo(path: str, what: str) -> str:
    path = os.path.abspath(path)
    if os.path.commonpath([path, REPO]) == REPO:
        raise UsageError(f"{what} {path} is inside the seedq repository; give a path outside it")
    return path


def check_fresh_dir(path: str, what: str) -> str:
    """An absent or empty directory, created; a non-empty one is refused, not overwritten."""
    path = os.path.abspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise UsageError(f"{what} {path} exists and is not an empty directory")
    os.makedirs(path, exist_ok=True)
    return path


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


# --- setup ------------------------------------------------------------------


def setup(peer: str, venv: str, python: str) -> None:
    venv = check_outside_repo(venv, "--venv")
    if os.path.exists(venv) and os.listdir(venv) and not os.path.exists(venv_python(venv)):
        raise UsageError(f"--venv {venv} exists and is not a venv")
    if not os.path.exists(venv_python(venv)):
        subprocess.run([python, "-m", "venv", venv], check=True)
    pip = [venv_python(venv), "-m", "pip", "install"]
    subprocess.run(pip + [TORCH], check=True)
    subprocess.run(pip + list(SBX_PACKAGES if peer == "sbx" else CLEANRL_PACKAGES), check=True)
    if peer == "cleanrl":
        install_cleanrl_script(venv)
    freeze = subprocess.run([venv_python(venv), "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    with open(os.path.join(venv, "pip-freeze.txt"), "w") as f:
        f.write(freeze)
    print(f"{peer} ready in {venv}")


def cleanrl_script(venv: str) -> str:
    return os.path.join(venv, "peer", os.path.basename(CLEANRL_SCRIPT))


def install_cleanrl_script(venv: str) -> None:
    """CleanRL's ppo_atari_envpool.py from the cleanrl wheel, with our diff applied.
    The wheel declares Python < 3.11; the script itself runs on 3.11."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([venv_python(venv), "-m", "pip", "download", CLEANRL_WHEEL, "--no-deps",
                        "--python-version", "3.10", "--only-binary=:all:", "-d", tmp], check=True)
        (wheel,) = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".whl")]
        with zipfile.ZipFile(wheel) as z:
            z.extract(CLEANRL_SCRIPT, tmp)
            z.extract("cleanrl-1.2.0.dist-info/LICENSE", tmp)
        subprocess.run(["git", "apply", "-p1", CLEANRL_DIFF], cwd=tmp, check=True)
        os.makedirs(os.path.dirname(cleanrl_script(venv)), exist_ok=True)
        shutil.copy(os.path.join(tmp, CLEANRL_SCRIPT), cleanrl_script(venv))
        shutil.copy(os.path.join(tmp, "cleanrl-1.2.0.dist-info/LICENSE"),
                    os.path.join(venv, "peer", "CLEANRL_LICENSE"))


# --- run --------------------------------------------------------------------


def peer_command(peer: str, venv: str, seed: int, deadline: float, out: str) -> tuple[list[str], dict]:
    """The training command and its extra environment variables."""
    log = os.path.join(out, "episodes.csv")
    if peer == "sbx":
        callback = [{"episode_log.EpisodeLog": {"path": log, "deadline": deadline}}]
        return ([venv_python(venv), os.path.join(HERE, "sbx_zoo_train.py"), "--algo", "ppo",
                 "--env", ENV_ID, "--env-kwargs", "frameskip:1", "--seed", str(seed),
                 "--eval-freq", "-1", "-f", os.path.join(out, "zoo"),
                 "-params", f"callback:{callback!r}"],
                {"PYTHONPATH": HERE})
    if peer == "cleanrl":
        return ([venv_python(venv), cleanrl_script(venv), "--seed", str(seed),
                 "--episode-log", log, "--deadline", f"{deadline:.3f}"], {})
    raise ValueError(peer)


def seedq_command(python: str, seed: int, seconds: float, out: str, flags: Sequence[str] = ()) -> list[str]:
    """seedq's defaults but the stop and the greedy evaluation after it (the
    peers run none either; it would outlast the deadline's grace on a slow
    machine), then `flags` (a candidate default measured the same way)."""
    return [python, "-m", "seedq", "train", "--env", ENV_ID, "--seed", str(seed),
            "--max-seconds", str(seconds), "--target-return", "none", "--eval-episodes", "0",
            "--logdir", os.path.join(out, "seedq"), *flags]


def tree_cpu_seconds(proc) -> float:
    """User + system CPU seconds of a process and its live descendants (and the
    children they have reaped)."""
    import psutil

    total = 0.0
    for p in [proc] + proc.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass  # exited between listing and reading
    return total


def supervise(cmd: list[str], env: dict, out: str, deadline: float, watch=None) -> tuple[int, list, bool]:
    """Runs `cmd` (output to out/log.txt), sampling its tree's CPU time each second;
    kills it STOP_GRACE_SECONDS past `deadline`. `watch(now)` is called each sample.
    Returns the exit code, the (unix time, CPU seconds) samples and whether
    Ctrl-C stopped it (then the command got SIGINT, to stop as at its deadline)."""
    import psutil

    samples, interrupted = [], False
    with open(os.path.join(out, "log.txt"), "w") as log:
        # A session of its own: the whole tree (seedq's actors) can be signalled at once.
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                 start_new_session=True)
        proc = psutil.Process(child.pid)
        try:
            while child.poll() is None:
                now = time.time()
                # Never less than before: an exiting descendant's time can drop out of the sum.
                samples.append((now, max(tree_cpu_seconds(proc), samples[-1][1] if samples else 0.0)))
                if watch is not None:
                    watch(now)
                if now > deadline + STOP_GRACE_SECONDS:
                    os.killpg(child.pid, signal.SIGKILL)
                    break
                time.sleep(CPU_SAMPLE_SECONDS)
        except KeyboardInterrupt:
            interrupted = True
            os.killpg(child.pid, signal.SIGINT)
            try:
                child.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        return child.wait(), samples, interrupted


class SeedqStart:
    """When seedq's run clock started, as a unix time: its curves.csv counts
    wall_seconds from the command's start, after Python's imports. Taken at the
    first row seen, so it is late by at most one sample (counted against seedq)."""

    def __init__(self, curves_path: str):
        self.path, self.started = curves_path, None

    def __call__(self, now: float) -> None:
        if self.started is None and os.path.exists(self.path):
            rows = [r for r in read_csv(self.path) if r.get("wall_seconds") is not None]
            if rows:
                self.started = now - rows[-1]["wall_seconds"]


def check_run_args(system: str, venv: str | None, seconds: float) -> str | None:
    """The peer's venv, absolute (None for seedq); UsageError for bad arguments."""
    if seconds <= 0:
        raise UsageError(f"--seconds {seconds:g}: must be > 0")
    if system == "seedq":
        return None
    if venv is None:
        raise UsageError(f"run {system} needs --venv (made by `setup {system} --venv DIR`)")
    venv = os.path.abspath(venv)
    if not os.path.exists(venv_python(venv)) or (system == "cleanrl" and not os.path.exists(cleanrl_script(venv))):
        raise UsageError(f"--venv {venv} has no {system} set up; run `peers.py setup {system} --venv {venv}`")
    return venv


def collected_points(system: str, out: str, watch, launched: float) -> tuple[list[dict], dict]:
    """The finished run's points, and what run.json adds about them."""
    if system != "seedq":
        path = os.path.join(out, "episodes.csv")
        return (episode_points(read_csv(path)) if os.path.exists(path) else []), {}
    path = os.path.join(out, "seedq", "curves.csv")
    started = watch.started if watch.started is not None else launched
    points = seedq_points(read_csv(path) if os.path.exists(path) else [], started)
    return points, {"seedq_clock_offset_seconds": round(started - launched, 3)}


def run(system: str, venv: str | None, seed: int, seconds: float, out: str, python: str,
        seedq_flags: Sequence[str] = ()) -> None:
    if seedq_flags and system != "seedq":
        raise UsageError(f"--seedq-flags is for `run seedq`, not {system}")
    venv = check_run_args(system, venv, seconds)
    out = check_fresh_dir(out, "--out")
    launched = time.time()
    deadline = launched + seconds
    if system == "seedq":
        cmd, env = seedq_command(python, seed, seconds, out, seedq_flags), {"PYTHONPATH": REPO}
        watch = SeedqStart(os.path.join(out, "seedq", "curves.csv"))
    else:
        (cmd, env), watch = peer_command(system, venv, seed, deadline, out), None
    meta = {"system": system, "seed": seed, "seconds": seconds, "command": cmd,
            "launched_unix_time": launched, "load_average_at_start": os.getloadavg(),
            "cpu_count": os.cpu_count(), "host": platform.node()}
    code, samples, interrupted = supervise(cmd, env, out, deadline, watch)
    points, about_points = collected_points(system, out, watch, launched)
    rows = curve_rows(points, samples, launched)
    write_csv(os.path.join(out, "curve.csv"), CURVE_COLUMNS, rows)
    with open(os.path.join(out, "cpu.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("unix_time", "cpu_seconds")] + [(f"{t:.3f}", f"{c:.2f}") for t, c in samples])
    meta.update(about_points, exit_code=code, interrupted=interrupted, load_average_at_end=os.getloadavg(),
                summary=run_summary(rows, seconds))
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{system} seed {seed}: exit {code}, {len(rows)} rows in {os.path.join(out, 'curve.csv')}")
    print(json.dumps(meta["summary"]))
    if interrupted:
        print(f"peers.py: interrupted; {out} holds the run up to then", file=sys.stderr)
        sys.exit(130)
    if code != 0:
        sys.exit(f"{system} exited {code}; see {os.path.join(out, 'log.txt')}")


# --- summary ----------------------------------------------------------------


def read_run(run_dir: str) -> tuple[dict, list[dict]]:
    """A run directory's run.json and curve rows (curve.csv, or curve.csv.gz as `keep` writes it)."""
    meta_path = os.path.join(run_dir, "run.json")
    curve_path = next((p for p in (os.path.join(run_dir, n) for n in ("curve.csv", "curve.csv.gz"))
                       if os.path.exists(p)), None)
    if not os.path.exists(meta_path) or curve_path is None:
        raise UsageError(f"{run_dir}: not a run directory of peers.py run (no run.json and curve.csv)")
    with open(meta_path) as f:
        return json.load(f), read_csv(curve_path)


def portable_meta(meta: dict, run_dir: str) -> dict:
    """run.json without this machine's paths and name: the command's paths
    become OUT (the run directory), VENV (a peer's venv), REPO (this
    checkout) and `python`, so the kept copy can be committed."""
    run_dir = os.path.abspath(run_dir)
    command = list(meta["command"])
    venv = os.path.dirname(os.path.dirname(command[0])) if meta["system"] != "seedq" else None
    places = [(run_dir, "OUT"), (REPO, "REPO")] + ([(venv, "VENV")] if venv else [])

    def portable(arg: str) -> str:
        for path, name in places:
            arg = arg.replace(path + os.sep, name + "/")
        return arg

    command = ["python" if meta["system"] == "seedq" else "VENV/bin/python"] + [portable(a) for a in command[1:]]
    kept = {k: v for k, v in meta.items() if k != "host"}
    kept["command"] = command
    return kept


def keep(run_dir: str, dest: str) -> None:
    """DEST/run.json (portable_meta) and DEST/curve.csv.gz: what the docs draw from."""
    meta, _ = read_run(run_dir)
    source = os.path.join(run_dir, "curve.csv")
    if not os.path.exists(source):
        raise UsageError(f"{run_dir}: a kept copy already (curve.csv.gz); keep a run directory of peers.py run")
    dest = check_fresh_dir(dest, "DEST")
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump(portable_meta(meta, run_dir), f, indent=2)
    with open(source, "rb") as src, \
            gzip.GzipFile(os.path.join(dest, "curve.csv.gz"), "wb", mtime=0) as out:
        shutil.copyfileobj(src, out)
    print(dest)


def summary(run_dirs: list[str]) -> None:
    """A markdown table of run_summary for each run directory."""
    columns = ("mean_15min", "mean_30min", "mean_60min", "steps_60min", "steps_to_-18", "seconds_to_-18",
               "steps_to_0", "seconds_to_0", "agent_steps_per_second", "frames_per_second", "cpu_cores")
    print("| run | system | seed | " + " | ".join(columns) + " |")
    print("|" + " --- |" * (len(columns) + 3))
    for d in run_dirs:
        meta, rows = read_run(d)
        s = run_summary(rows, meta["seconds"])
        cells = ["" if s.get(c) is None else f"{s[c]:g}" for c in columns]
        print(f"| {os.path.basename(os.path.normpath(d))} | {meta['system']} | {meta['seed']} | " + " | ".join(cells) + " |")


def plot(out: str, run_dirs: list[str]) -> None:
    """Return against wall minutes and against agent steps, one line per run."""
    from matplotlib.figure import Figure  # seedq's venv has it (a dependency of seedq)

    fig = Figure(figsize=(11, 4))
    by_time, by_steps = fig.subplots(1, 2)
    for d in run_dirs:
        meta, rows = read_run(d)
        # The directory's name, as summary's `run` column: two runs of one system and
        # seed (a candidate setting against the defaults) stay apart.
        label = os.path.basename(os.path.normpath(d))
        by_time.plot([r["wall_seconds"] / 60 for r in rows], [r["return_mean100"] for r in rows], label=label)
        by_steps.plot([r["agent_steps"] for r in rows], [r["return_mean100"] for r in rows], label=label)
    by_time.set_xlabel("wall minutes since launch")
    by_steps.set_xlabel("agent steps")
    for ax in (by_time, by_steps):
        ax.set_ylabel(f"mean return, last {RETURN_WINDOW} games")
        ax.grid(alpha=0.3)
    by_time.legend(fontsize="small")
    fig.suptitle(f"{ENV_ID}: whole-game returns")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(out)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="peers.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="make a peer's venv (outside this repository) and install it")
    s.add_argument("peer", choices=("sbx", "cleanrl"))
    s.add_argument("--venv", required=True, help="the venv directory to create (or complete)")
    s.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from (3.11)")
    r = sub.add_parser("run", help="one training run, writing OUT/curve.csv")
    r.add_argument("system", choices=("seedq", "sbx", "cleanrl"))
    r.add_argument("--venv", help="the peer's venv (not for seedq)")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--seconds", type=float, required=True, help="wall-clock budget from launch")
    r.add_argument("--out", required=True, help="the run directory: absent or empty")
    r.add_argument("--python", default=sys.executable, help="the interpreter seedq runs with")
    r.add_argument("--seedq-flags", default="", type=shlex.split,
                   help="more `seedq train` flags, one quoted string (a candidate default against the defaults)")
    m = sub.add_parser("summary", help="a markdown table of the figures of run directories")
    m.add_argument("run_dirs", nargs="+")
    p = sub.add_parser("plot", help="draw return against wall time and agent steps of run directories")
    p.add_argument("out", help="the image to write (.png, .svg or .pdf)")
    p.add_argument("run_dirs", nargs="+")
    k = sub.add_parser("keep", help="a copy of a run's run.json and curve without this machine's paths, to commit")
    k.add_argument("run_dir")
    k.add_argument("dest", help="the directory to write: absent or empty")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.command == "setup":
            setup(args.peer, args.venv, args.python)
        elif args.command == "run":
            run(args.system, args.venv, args.seed, args.seconds, args.out, args.python, args.seedq_flags)
        elif args.command == "summary":
            summary(args.run_dirs)
        elif args.command == "keep":
            keep(args.run_dir, args.dest)
        else:
            plot(args.out, args.run_dirs)
    except UsageError as e:
        print(f"peers.py: {e}", file=sys.stderr)
        sys.exit(2)
    except subprocess.CalledProcessError as e:
        sys.exit(f"peers.py: {' '.join(map(str, e.cmd))} exited {e.returncode}")


if __name__ == "__main__":
    main()
