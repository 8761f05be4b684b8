"""`seedq bench inference`: jitted policy inference in fp32, bf16 and int8, side by side.

For every (network, batch size) all requested precisions are compiled first
and then timed in interleaved rounds (fp32, bf16, int8, fp32, ...), so load
changes on a shared machine hit every precision alike; the reported time per
call is the median over rounds (the best round is reported too).

int8 runs as the learner runs it: each layer in int8 only at the batch sizes
where int8 timed faster than fp32 for it (the per-layer plan of
`seedq.quant.plan`, measured here at the requested batch sizes; every
quantizable layer with `--quant.force-int8`); each int8 row reports the share
of the network's multiply-accumulates that ran in int8.

Accuracy is measured per (network, precision, set of int8 layers) on a fixed
evaluation set (real Atari frames for the CNNs, Gaussian vectors for the MLP)
against fp32:
  * max_rel_logit_error = max over states and actions of |l_p - l_fp32|,
    divided by the largest |l_fp32| in the set
  * argmax_agreement = fraction of states whose greedy action equals fp32's.

`--profile` adds a per-layer table (each Dense/Conv timed alone at fp32,
bf16 and int8, and every int8 convolution implementation), which is what
explains a network whose int8 speed-up is missing.
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from seedq import quant
from seedq.agents import networks
from seedq.quant import layers as qlayers
from seedq.quant import quantize as quant_lib

DEFAULT_ATARI_ENV = "ALE/Pong-v5"


def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights averaging each output cell's input interval (area resampling)."""
    edges = np.arange(n_out + 1) * (n_in / n_out)
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        lo, hi = edges[o], edges[o + 1]
        for i in range(int(np.floor(lo)), int(np.ceil(hi))):
            m[o, i] = min(hi, i + 1) - max(lo, i)
    return m / (n_in / n_out)


class AtariFrames:
    """DQN-style preprocessing without OpenCV: 4-frame action repeat, max over the
    last two raw frames, grey, area-resized to 84x84, last 4 results stacked
    channels-last -> [84, 84, 4] uint8."""

    def __init__(self, env_id: str = DEFAULT_ATARI_ENV, seed: int = 0, frame_skip: int = 4,
                 size: int = 84, stack: int = 4, noop_max: int = 30):
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        self.env = gym.make(env_id, obs_type="grayscale", frameskip=1)
        self.frame_skip, self.stack, self.noop_max = frame_skip, stack, noop_max
        h, w = self.env.observation_space.shape
        self._rows, self._cols = _area_matrix(h, size), _area_matrix(w, size).T
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.num_actions = int(self.env.action_space.n)
        self._frames: list[np.ndarray] = []

    def _process(self, raw: np.ndarray) -> np.ndarray:
        small = self._rows @ raw.astype(np.float64) @ self._cols
        return np.clip(np.rint(small), 0, 255).astype(np.uint8)

    def reset(self) -> np.ndarray:
        raw, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
        for _ in range(int(self.rng.integers(self.noop_max + 1))):
            raw, _, terminated, truncated, _ = self.env.step(0)
            if terminated or truncated:
                raw, _ = self.env.reset()
        self._frames = [self._process(raw)] * self.stack
        return self.observation()

    def observation(self) -> np.ndarray:
        return np.stack(self._frames[-self.stack:], axis=-1)

    def step(self, action: int) -> tuple[np.ndarray, bool]:
        """Returns (stacked observation, episode over)."""
        last = []
        done = False
        for _ in range(self.frame_skip):
            raw, _, terminated, truncated, _ = self.env.step(action)
            last = (last + [raw])[-2:]
            if terminated or truncated:
                done = True
                break
        self._frames = (self._frames + [self._process(np.maximum.reduce(last))])[-self.stack:]
        return self.observation(), done

    def close(self) -> None:
        self.env.close()


def collect_atari_frames(n: int, env_id: str = DEFAULT_ATARI_ENV, seed: int = 0) -> np.ndarray:
    """`n` preprocessed Atari states [n, 84, 84, 4] uint8 from uniformly random play."""
    env = AtariFrames(env_id, seed)
    obs = env.reset()
    states = []
    while len(states) < n:
        obs, done = env.step(int(env.rng.integers(env.num_actions)))
        states.append(obs)
        if done:
            obs = env.reset()
    env.close()
    return np.stack(states)


def policy_states(greedy_logits, env_id: str, mode: str, *, steps: int, num_envs: int,
                  seed: int) -> np.ndarray:
    """Observations visited by a policy: "greedy" (argmax), "sample" (softmax, the
    behaviour policy the server runs) or "eps" (greedy with 20% random actions)."""
    from seedq.envs import make_vector_env

    env = make_vector_env(env_id, num_envs)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(steps):
        obs = np.asarray(obs, np.float32)
        states.append(obs)
        logits = np.asarray(greedy_logits(obs), np.float64)
        if mode == "greedy":
            actions = logits.argmax(-1)
        elif mode == "sample":
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            actions = (p.cumsum(-1) > rng.random((num_envs, 1))).argmax(-1)
        elif mode == "eps":
            actions = np.where(rng.random(num_envs) < 0.2,
                               rng.integers(0, logits.shape[-1], num_envs), logits.argmax(-1))
        else:
            raise ValueError(f"mode {mode!r}")
        obs, *_ = env.step(actions)
    env.close()
    return np.concatenate(states)


def trained_policy_agreement(run_dir: str, *, steps: int = 300, num_envs: int = 16, seed: int = 0,
                             modes=("greedy", "sample", "eps")) -> dict:
    """Greedy-action agreement of bf16/int8 with fp32 for the V-trace policy in a run directory.

    States come from rolling out the fp32 policy in each `mode`. Also reports
    the share of states whose fp32 logit gap (best - second best) is below
    0.01 / 0.05, where a tiny logit error already flips the greedy action.
    """
    from seedq import config as config_lib
    from seedq import checkpoint
    from seedq.agents.vtrace.agent import VTraceAgent
    from seedq.envs import env_spec
    from seedq.quant.mode import InferencePrecision

    cfg = config_lib.load(os.path.join(run_dir, "config.json"))
    spec = env_spec(cfg.env)
    agent = VTraceAgent(spec, cfg.vtrace, frame_stack=cfg.frame_stack)
    like = agent.init(jax.random.PRNGKey(0))
    snapshot, step_dir = checkpoint.restore(run_dir, like, jax.random.PRNGKey(0), env=cfg.env)
    net = agent.network
    forward = {}
    for p in quant.PRECISIONS:
        mode = InferencePrecision(agent, spec, p)
        published = mode.publish(agent.inference_params(snapshot.state))
        # One time step of a feed-forward policy: obs [N, D] -> logits [N, A].
        forward[p] = jax.jit(lambda o, p=p, published=published: quant.apply(
            net, published, p, o[None], jnp.zeros((1, len(o)), bool), None)[0]["logits"][0])
    out = {"run_dir": run_dir, "checkpoint": step_dir, "env": cfg.env, "modes": {}}
    for mode in modes:
        states = policy_states(forward["fp32"], cfg.env, mode, steps=steps, num_envs=num_envs, seed=seed)
        ref = np.asarray(forward["fp32"](states))
        top2 = np.sort(ref, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        row = {"states": int(len(states)),
               "gap_below_0.01": float(np.mean(gap < 0.01)),
               "gap_below_0.05": float(np.mean(gap < 0.05))}
        for p in ("bf16", "int8"):
            logits = np.asarray(forward[p](states))
            same = logits.argmax(-1) == ref.argmax(-1)
            row[p] = {"argmax_agreement": float(np.mean(same)),
                      "agreement_gap_above_0.05": float(np.mean(same[gap >= 0.05])),
                      **accuracy(ref, logits)}
        out["modes"][mode] = row
    return out


def make_net(name: str, num_actions: int, mlp_hidden=(256, 256, 256)):
    return networks.PolicyValueNet(networks.make_torso(name, mlp_hidden), num_actions)


def eval_inputs(name: str, n: int, *, frames: str, seed: int, mlp_input: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if name == "mlp":
        return rng.standard_normal((n, mlp_input)).astype(np.float32)
    if frames == "atari":
        return collect_atari_frames(n, seed=seed)
    return rng.integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


class NetBench:
    """One network at every precision: published params and jitted forward passes.

    int8 runs as the server runs it: with the per-layer plan measured at
    `batches` (`seedq.quant.plan`; every quantizable layer with `force_int8`),
    each batch size with its own set of int8 layers.
    """

    def __init__(self, name: str, precisions, *, num_actions: int, seed: int, example: np.ndarray,
                 mlp_hidden=(256, 256, 256), batches=(), force_int8: bool = False):
        self.name = name
        self.net = make_net(name, num_actions, mlp_hidden)
        self.params = self.net.init(jax.random.PRNGKey(seed), example[:1])
        self.layers = quant.find_layers(self.net, example[:1])
        paths = quant.quantizable_paths(self.layers)
        self.plan = None
        if "int8" in precisions and batches:
            self.plan = quant.make_plan(self.layers, self.params, batches, force=force_int8)
            paths = self.plan.publish_layers()
        self.published = {p: quant.publish(self.params, p, paths) for p in precisions}
        self.forward = {
            p: jax.jit(lambda params, obs, int8_layers=None, p=p: quant.apply(
                self.net, params, p, obs, int8_layers=int8_layers), static_argnames="int8_layers")
            for p in precisions
        }

    def int8_layers(self, precision: str, batch: int):
        """The layers run in int8 at `batch` (None: all published ones)."""
        return self.plan.layers_for(batch) if precision == "int8" and self.plan is not None else None

    def call(self, precision: str, obs, batch: int | None = None):
        layers = None if batch is None else self.int8_layers(precision, batch)
        return self.forward[precision](self.published[precision], obs, int8_layers=layers)

    def logits(self, precision: str, obs: np.ndarray, batch: int | None = None) -> np.ndarray:
        """Logits with the int8 layers of `batch` (the largest planned one by default)."""
        if batch is None and self.plan is not None:
            batch = max(self.plan.int8)
        return np.asarray(self.call(precision, obs, batch)[0])


def accuracy(reference: np.ndarray, logits: np.ndarray) -> dict:
    """Errors of `logits` against fp32 `reference` ([N, A]) over a set of states.

    Relative errors are normalised by the largest |fp32 logit| in the set (a
    per-state normalisation explodes on states whose logits are all ~0).
    """
    scale = max(float(np.max(np.abs(reference))), 1e-30)
    err = np.max(np.abs(logits - reference), axis=-1)
    return {
        "max_rel_logit_error": float(np.max(err) / scale),
        "mean_rel_logit_error": float(np.mean(err) / scale),
        "argmax_agreement": float(np.mean(np.argmax(logits, -1) == np.argmax(reference, -1))),
        "states": int(len(reference)),
    }


def time_side_by_side(fns: dict, rounds: int, budget_s: float) -> dict[str, dict]:
    """Median and best seconds per call of each compiled zero-argument function, interleaved."""
    single = {}
    for name, f in fns.items():
        jax.block_until_ready(f())  # warm
        started = time.perf_counter()
        jax.block_until_ready(f())
        single[name] = max(time.perf_counter() - started, 1e-6)
    calls = {name: max(1, int(budget_s / rounds / len(fns) / t)) for name, t in single.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            started = time.perf_counter()
            for _ in range(calls[name]):
                out = f()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - started) / calls[name])
    return {
        name: {"median_s": statistics.median(s), "best_s": min(s), "calls_per_round": calls[name]}
        for name, s in samples.items()
    }


def _layer_params(tree: dict, path: tuple[str, ...]) -> dict:
    node = tree["params"]
    for key in path:
        node = node[key]
    return node


def profile_layers(bench: NetBench, batch: int, precisions, *, rounds: int, budget_s: float,
                   seed: int = 0) -> list[dict]:
    """Each Dense/Conv of `bench.net` timed alone at `batch` (fp32 vs bf16 vs int8 impls)."""
    rng = np.random.default_rng(seed)
    rows = []
    for layer in bench.layers:
        shape = (batch,) + tuple(layer.input.shape[1:])
        if layer.pixels:
            x = jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8))
        else:  # post-ReLU-like activations
            x = jnp.asarray(np.abs(rng.standard_normal(shape)).astype(np.float32))
        variants = {}
        for p in precisions:
            if p == "int8" and not layer.quantizable:
                continue
            impls = [None]
            if p == "int8" and layer.kind == "conv":
                impls += list(qlayers.CONV_IMPLS)
            for impl in impls:
                label = p if impl is None else f"int8:{impl}"
                f = jax.jit(qlayers.layer_fn(layer, p, impl))
                lp = _layer_params(bench.published[p], layer.path)
                if p == "int8" and quant_lib.QKERNEL not in lp:  # kept fp32 by the plan
                    lp = quant_lib.quantize_layer(lp, equalize=not layer.pixels)
                variants[label] = (lambda f=f, lp=lp: f(lp, x))
        if "int8" in precisions and layer.quantizable and not layer.pixels:
            qf = jax.jit(quant.quantize_rows)
            variants["int8:quantize_input"] = (lambda qf=qf: qf(x))
        timing = time_side_by_side(variants, rounds, budget_s)
        kernel = _layer_params(bench.params, layer.path)["kernel"].shape
        row = {
            "net": bench.name,
            "batch": batch,
            "layer": "/".join(layer.path),
            "kind": layer.kind,
            "input": list(shape),
            "input_dtype": str(layer.input.dtype) if not layer.pixels else "uint8 (pixels)",
            "kernel": list(kernel),
            "ms": {k: v["median_s"] * 1e3 for k, v in timing.items()},
        }
        if layer.kind == "conv" and "int8" in precisions and layer.quantizable:
            row["int8_auto_impl"] = qlayers.auto_conv_impl(layer, batch, kernel)
        rows.append(row)
    return rows


def run(
    nets=("mlp", "nature_cnn", "impala_cnn"),
    precisions=("fp32", "bf16", "int8"),
    batches=(1, 16, 64, 256),
    *,
    num_actions: int = 6,
    seed: int = 0,
    rounds: int = 7,
    budget_s: float = 1.5,
    frames: str = "atari",
    eval_states: int = 512,
    mlp_hidden=(256, 256, 256),
    mlp_input: int = 64,
    profile: bool = False,
    profile_batches=(64,),
    force_int8: bool = False,
    log=None,
) -> dict:
    precisions = tuple(precisions)
    if "fp32" not in precisions:
        precisions = ("fp32",) + precisions  # the reference for ratios and errors
    for p in precisions:
        if p not in quant.PRECISIONS:
            raise ValueError(f"precision {p!r}: choose from {', '.join(quant.PRECISIONS)}")
    results, accuracy_rows, profile_rows, plans = [], [], [], {}
    for name in nets:
        if name not in networks.NETWORKS:
            raise ValueError(f"network {name!r}: choose from {', '.join(networks.NETWORKS)}")
        states = eval_inputs(name, eval_states, frames=frames, seed=seed, mlp_input=mlp_input)
        started = time.perf_counter()
        bench = NetBench(name, precisions, num_actions=num_actions, seed=seed, example=states,
                         mlp_hidden=mlp_hidden, batches=batches, force_int8=force_int8)
        if bench.plan is not None:
            plans[name] = {**bench.plan.to_dict(), "seconds_to_plan": time.perf_counter() - started}
            if log:
                log(f"{name:>10} {bench.plan.describe()}")
        reference = bench.logits("fp32", states)
        accuracy_cache: dict = {}

        def accuracy_of(p: str, batch: int) -> dict:
            # The error of the layers int8 at `batch`, on the whole evaluation set.
            key = (p, bench.int8_layers(p, batch))
            if key not in accuracy_cache:
                accuracy_cache[key] = accuracy(reference, bench.logits(p, states, batch))
            return accuracy_cache[key]

        for p in precisions:
            row = {"net": name, "precision": p, **accuracy(reference, bench.logits(p, states))}
            accuracy_rows.append(row)
        for batch in batches:
            obs = jnp.asarray(np.resize(states, (batch,) + states.shape[1:]))
            fns = {p: (lambda p=p: bench.call(p, obs, batch)) for p in precisions}
            timing = time_side_by_side(fns, rounds, budget_s)
            base = timing["fp32"]["median_s"]
            for p in precisions:
                t = timing[p]
                acc = accuracy_of(p, batch)
                share = bench.plan.mac_share(batch) if p == "int8" else None
                results.append({
                    "net": name,
                    "batch": batch,
                    "precision": p,
                    "ms_per_call": t["median_s"] * 1e3,
                    "best_ms_per_call": t["best_s"] * 1e3,
                    "samples_per_second": batch / t["median_s"],
                    "ratio_to_fp32": base / t["median_s"],
                    "max_rel_logit_error": acc["max_rel_logit_error"],
                    "argmax_agreement": acc["argmax_agreement"],
                    "int8_mac_share": share,
                })
                if log:
                    r = results[-1]
                    log(f"{name:>10} batch {batch:>4} {p:>4}: {r['ms_per_call']:9.3f} ms "
                        f"{r['samples_per_second']:10.0f}/s  x{r['ratio_to_fp32']:.2f} vs fp32"
                        + ("" if share is None else f"  int8 MACs {100 * share:.0f}%"))
        if profile:
            for batch in profile_batches:
                profile_rows += profile_layers(bench, batch, precisions, rounds=max(3, rounds // 2),
                                               budget_s=budget_s / 3, seed=seed)
    out = {
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "conv_policy": qlayers.default_conv_policy(),
        "frames": frames,
        "force_int8": force_int8,
        "results": results,
        "accuracy": accuracy_rows,
        # Per net: the measured int8 plan (MAC share and int8 layers per batch size).
        "int8_plans": plans,
        "conv_choices": [
            {"x_shape": list(k[1]), "input": k[2], "pads": [list(p) for p in k[3]], "kernel": list(k[4]),
             "strides": list(k[5]),
             "impl": c.impl, "reason": c.reason,
             "ms": {i: (None if s is None else s * 1e3) for i, s in c.seconds.items()}}
            for k, c in qlayers.conv_choices().items()
        ],
    }
    if profile:
        out["profile"] = profile_rows
    return out


def format_table(result: dict) -> str:
    """Human-readable version of `run`'s result."""
    lines = [f"backend {result['backend']}, jax {result['jax_version']}, {result['cpu_count']} CPUs, "
             f"conv policy {result['conv_policy']}, frames {result['frames']}"]
    lines.append(f"{'net':>10} {'batch':>5} {'prec':>5} {'ms/call':>9} {'samples/s':>10} "
                 f"{'x fp32':>6} {'max rel err':>11} {'argmax agree':>12} {'int8 MACs':>9}")
    for r in result["results"]:
        share = "" if r.get("int8_mac_share") is None else f"{100 * r['int8_mac_share']:8.0f}%"
        lines.append(
            f"{r['net']:>10} {r['batch']:>5} {r['precision']:>5} {r['ms_per_call']:9.3f} "
            f"{r['samples_per_second']:10.0f} {r['ratio_to_fp32']:6.2f} "
            f"{r['max_rel_logit_error']:11.4f} {r['argmax_agreement']:12.4f} {share:>9}"
        )
    if result.get("profile"):
        lines.append("")
        lines.append("per-layer profile (ms per call, median):")
        for row in result["profile"]:
            times = "  ".join(f"{k} {v:.3f}" for k, v in row["ms"].items())
            auto = f"  [auto: {row['int8_auto_impl']}]" if row.get("int8_auto_impl") else ""
            lines.append(f"  {row['net']} b{row['batch']} {row['layer']} {row['input']} "
                         f"k{row['kernel']}: {times}{auto}")
    return "\n".join(lines)
