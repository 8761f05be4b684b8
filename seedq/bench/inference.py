"""`seedq bench inference`: jitted policy inference in fp32, bf16 and int8, side by side.

For every (network, batch size) all requested precisions are compiled first
and then timed in interleaved rounds (fp32, bf16, int8, fp32, ...), so load
changes on a shared machine hit every precision alike; the reported time per
call is the median over rounds.

The networks are the agents' own (`NETS`): V-trace's policy/value network with
the MLP, Nature CNN or IMPALA ResNet torso, and R2D2's recurrent Q-network
(torso -> LSTM -> dueling head), each built by its agent from the default
config and run for one step of a batch of envs as the server runs it. Atari
inputs come from the actors' env preprocessing and the learner's frame
stacking (`seedq.envs`, `seedq.agents.frames`).

int8 runs as the learner runs it: each layer in int8 only at the batch sizes
where int8 timed faster than fp32 for it (the per-layer plan of
`seedq.quant.plan`, measured here at the requested batch sizes; every
quantizable layer with `--quant.force-int8`); each int8 row reports the share
of the network's multiply-accumulates that ran in int8.

Accuracy is measured per (network, precision, set of int8 layers) on a fixed
evaluation set (real Atari frames for the CNNs, Gaussian vectors for the MLPs)
against fp32, on the scores the greedy action is taken from (V-trace's
logits, R2D2's Q-values):
  * max_rel_logit_error = max over states and actions of |l_p - l_fp32|,
    divided by the largest |l_fp32| in the set
  * argmax_agreement = fraction of states whose greedy action equals fp32's.

`--profile` adds a per-layer table (each Dense/Conv timed alone at fp32,
bf16 and int8, and every int8 convolution implementation), which is what
explains a network whose int8 speed-up is missing.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from seedq import quant
from seedq.quant import conv_choice, int8_conv
from seedq.quant import layers as qlayers
from seedq.quant import quantize as quant_lib
from seedq.quant.timing import time_interleaved

DEFAULT_ATARI_ENV = "ALE/Pong-v5"
# The benchmarked networks, each the one an agent builds from its default config:
# V-trace's policy/value network with each torso, R2D2's recurrent Q-network.
NETS = ("mlp", "nature_cnn", "impala_cnn", "r2d2_mlp", "r2d2_nature_cnn")


def collect_atari_frames(n: int, env_id: str = DEFAULT_ATARI_ENV, seed: int = 0, stack: int = 4) -> np.ndarray:
    """`n` network inputs [n, 84, 84, stack] uint8 from uniformly random play, as the
    learner sees them: the actors' preprocessing (`seedq.envs.make_vector_env`) and
    the learner's frame stacking (`seedq.agents.frames.FrameStacker`)."""
    from seedq.agents.frames import FrameStacker
    from seedq.envs import make_vector_env

    env = make_vector_env(env_id, 1, seed=seed)
    stacker = FrameStacker(stack, env.single_observation_space.shape)
    act = jax.jit(stacker.act)
    core = stacker.initial_core_state(1)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    first = np.ones(1, bool)
    states = []
    while len(states) < n:
        stacked, core = act(core, obs, first)
        states.append(np.asarray(stacked[0]))
        obs, _, terminated, truncated, _ = env.step(rng.integers(0, env.single_action_space.n, 1))
        first = terminated | truncated
    env.close()
    return np.stack(states)


class AgentNet:
    """An agent's network as the server runs it for one step of N envs:
    `scores(outputs)` picks the greedy-action scores [N, A] (V-trace's logits,
    R2D2's Q-values) from the module's outputs."""

    def __init__(self, module, recurrent_q: bool):
        self.module = module
        self.recurrent_q = recurrent_q

    def inputs(self, obs, first=None, carry=None) -> tuple:
        """The module's time-major inputs for one step: (obs [1, N, ...], first [1, N], carry)."""
        n = obs.shape[0]
        first = jnp.zeros((n,), bool) if first is None else first
        carry = self.module.initial_carry(n) if carry is None else carry
        return obs[None], first[None], carry

    def scores(self, outputs) -> jax.Array:
        return outputs[0][0] if self.recurrent_q else outputs[0]["logits"][0]

    @staticmethod
    def carry(outputs):
        return outputs[-1]


def agent_net(name: str, num_actions: int, *, mlp_hidden=(256, 256, 256), mlp_input: int = 64) -> AgentNet:
    """The production network called `name` (NETS), built by its agent from the
    agent's default config (V-trace nets: `mlp_hidden` for the MLP torso)."""
    from seedq import config as config_lib
    from seedq.schema import EnvSpec

    if name not in NETS:
        raise ValueError(f"network {name!r}: choose from {', '.join(NETS)}")
    r2d2 = name.startswith("r2d2_")
    torso = name.removeprefix("r2d2_")
    spec = (EnvSpec("float32", (mlp_input,), num_actions=num_actions) if torso == "mlp"
            else EnvSpec("uint8", (84, 84), num_actions=num_actions))  # frames, stacked 4 by the agent
    if r2d2:
        from seedq.agents.r2d2.agent import R2D2Agent

        config = dataclasses.replace(config_lib.R2D2Config(), network=torso)
        return AgentNet(R2D2Agent(spec, config, num_envs=config.eval_envs + 1).network, recurrent_q=True)
    from seedq.agents.vtrace.agent import VTraceAgent

    config = dataclasses.replace(config_lib.VTraceConfig(), network=torso, hidden_sizes=tuple(mlp_hidden))
    return AgentNet(VTraceAgent(spec, config).network, recurrent_q=False)


def eval_inputs(name: str, n: int, *, frames: str, seed: int, mlp_input: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if name.endswith("mlp"):
        return rng.standard_normal((n, mlp_input)).astype(np.float32)
    if frames == "atari":
        return collect_atari_frames(n, seed=seed)
    return rng.integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


class NetBench:
    """One production network at every precision: published params and jitted
    forward passes (one step of a batch of envs, fresh recurrent state).

    int8 runs as the server runs it: with the per-layer plan measured at
    `batches` (`seedq.quant.plan`; every quantizable layer with `force_int8`),
    each batch size with its own set of int8 layers.
    """

    def __init__(self, name: str, precisions, *, num_actions: int, seed: int, example: np.ndarray,
                 mlp_hidden=(256, 256, 256), batches=(), force_int8: bool = False):
        self.name = name
        self.agent_net = agent_net(name, num_actions, mlp_hidden=mlp_hidden, mlp_input=example.shape[-1])
        self.net = self.agent_net.module
        inputs = self.agent_net.inputs(jnp.asarray(example[:1]))
        self.params = self.net.init(jax.random.PRNGKey(seed), *inputs)
        self.layers = quant.find_layers(self.net, *inputs)
        paths = quant.quantizable_paths(self.layers)
        self.plan = None
        if "int8" in precisions and batches:
            self.plan = quant.make_plan(self.layers, self.params, batches, force=force_int8)
            paths = self.plan.publish_layers()
        self.published = {p: quant.publish(self.params, p, paths) for p in precisions}
        self.forward = {
            p: jax.jit(lambda params, obs, int8_layers=None, p=p: self.agent_net.scores(quant.apply(
                self.net, params, p, *self.agent_net.inputs(obs), int8_layers=int8_layers)),
                static_argnames="int8_layers")
            for p in precisions
        }

    def int8_layers(self, precision: str, batch: int):
        """The layers run in int8 at `batch` (None: all published ones)."""
        return self.plan.layers_for(batch) if precision == "int8" and self.plan is not None else None

    def call(self, precision: str, obs, batch: int | None = None):
        layers = None if batch is None else self.int8_layers(precision, batch)
        return self.forward[precision](self.published[precision], obs, int8_layers=layers)

    def logits(self, precision: str, obs: np.ndarray, batch: int | None = None) -> np.ndarray:
        """Greedy-action scores [N, A] with the int8 layers of `batch` (the largest planned one by default)."""
        if batch is None and self.plan is not None:
            batch = max(self.plan.int8)
        return np.asarray(self.call(precision, obs, batch))


# --- agreement on a trained policy ----------------------------------------------------


def rollout_scores(steps_fns: dict, env_id: str, mode: str, *, steps: int, num_envs: int, seed: int,
                   env_options=None) -> dict[str, np.ndarray]:
    """Greedy-action scores [steps * num_envs, A] of each precision's policy along one
    rollout driven by the fp32 policy: "greedy" (argmax), "sample" (softmax of the
    logits, V-trace's behaviour policy) or "eps" (greedy with 20 % random actions,
    like R2D2's exploration). `steps_fns[p](obs, first, carry) -> (scores, carry)`;
    each precision keeps its own recurrent state along the same observations, as it
    would serving them."""
    from seedq.envs import make_vector_env

    env = make_vector_env(env_id, num_envs, **({"options": env_options} if env_options else {}))
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    first = np.ones(num_envs, bool)
    carries = {p: None for p in steps_fns}
    scores: dict[str, list] = {p: [] for p in steps_fns}
    for _ in range(steps):
        obs = np.asarray(obs, np.float32)
        for p, step in steps_fns.items():
            out, carries[p] = step(obs, first, carries[p])
            scores[p].append(np.asarray(out, np.float64))
        ref = scores["fp32"][-1]
        if mode == "greedy":
            actions = ref.argmax(-1)
        elif mode == "sample":
            prob = np.exp(ref - ref.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            actions = (prob.cumsum(-1) > rng.random((num_envs, 1))).argmax(-1)
        elif mode == "eps":
            actions = np.where(rng.random(num_envs) < 0.2,
                               rng.integers(0, ref.shape[-1], num_envs), ref.argmax(-1))
        else:
            raise ValueError(f"mode {mode!r}: choose greedy, sample or eps")
        obs, _, terminated, truncated, _ = env.step(actions)
        first = np.asarray(terminated | truncated)  # next-step autoreset: the next obs starts an episode
    env.close()
    return {p: np.concatenate(s) for p, s in scores.items()}


def _step_fn(net: AgentNet, published, precision: str):
    @jax.jit
    def step(obs, first, carry):
        outputs = quant.apply(net.module, published, precision, *net.inputs(obs, first, carry))
        return net.scores(outputs), net.carry(outputs)

    return lambda obs, first, carry: step(obs, first, carry if carry is not None else
                                          net.module.initial_carry(len(obs)))


def trained_policy_agreement(run_dir: str, *, steps: int = 300, num_envs: int = 16, seed: int = 0,
                             modes=None) -> dict:
    """Greedy-action agreement of bf16/int8 with fp32 for the trained policy (V-trace
    or R2D2) in a run directory.

    States come from rolling out the fp32 policy in each `mode` (default: greedy,
    sample, eps for V-trace; greedy, eps for R2D2, whose behaviour is ε-greedy).
    Both agents publish through the server's precision mode
    (`seedq.quant.mode.InferencePrecision`) with every quantizable layer in
    int8 (R2D2: the LSTM gates and all four dueling-head layers; only layers
    fed the float observation, and V-trace's `policy`/`value` outputs, stay
    fp32), listed under "int8_layers". Also reports the share of states whose
    fp32 score gap (best - second best) is below 0.01 / 0.05, where a tiny
    error already flips the greedy action.
    """
    from seedq import checkpoint
    from seedq import config as config_lib
    from seedq.agents import make_agent
    from seedq.envs import env_spec
    from seedq.quant.mode import InferencePrecision

    config_path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(config_path):  # ValueError: the CLI prints it as one line
        raise ValueError(f"--policy-run {run_dir}: not a seedq run directory (no config.json)")
    cfg = config_lib.load(config_path)
    spec = env_spec(cfg.env, cfg.env_options)
    agent = make_agent(cfg, spec)
    like = agent.init(jax.random.PRNGKey(0))
    snapshot, step_dir = checkpoint.restore(run_dir, like, jax.random.PRNGKey(0), env=cfg.env)
    params = agent.inference_params(snapshot.state)
    precisions = {p: InferencePrecision(agent, spec, p) for p in quant.PRECISIONS}
    published = {p: mode.publish(params) for p, mode in precisions.items()}
    paths = quant.quantizable_paths(precisions["int8"].layers)
    net = AgentNet(agent.network, recurrent_q=agent.q_network)
    modes = modes or agent.evaluation_modes
    steps_fns = {p: _step_fn(net, published[p], p) for p in quant.PRECISIONS}
    out = {"run_dir": run_dir, "checkpoint": step_dir, "env": cfg.env, "agent": cfg.agent, "modes": {}}
    out["int8_layers"] = sorted("/".join(path) for path in paths)
    for mode in modes:
        scores = rollout_scores(steps_fns, cfg.env, mode, steps=steps, num_envs=num_envs, seed=seed,
                                env_options=cfg.env_options)
        ref = scores["fp32"]
        top2 = np.sort(ref, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        row = {"states": int(len(ref)),
               "gap_below_0.01": float(np.mean(gap < 0.01)),
               "gap_below_0.05": float(np.mean(gap < 0.05))}
        for p in ("bf16", "int8"):
            same = scores[p].argmax(-1) == ref.argmax(-1)
            row[p] = {"argmax_agreement": float(np.mean(same)),
                      "agreement_gap_above_0.05": float(np.mean(same[gap >= 0.05])) if np.any(gap >= 0.05) else None,
                      **accuracy(ref, scores[p])}
        out["modes"][mode] = row
    return out


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


def time_side_by_side(fns: dict, rounds: int, budget_s: float) -> dict[str, float]:
    """Median seconds per call of each zero-argument function, timed in interleaved
    rounds by the one timing helper (`seedq.quant.timing.time_interleaved`)."""
    for f in fns.values():
        jax.block_until_ready(f())  # compiled before the first timed call
    return time_interleaved(fns, (), budget_s, rounds=rounds, statistic=statistics.median)


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
                impls += list(int8_conv.CONV_IMPLS)
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
            "ms": {k: v * 1e3 for k, v in timing.items()},
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
        if name not in NETS:
            raise ValueError(f"network {name!r}: choose from {', '.join(NETS)}")
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
            base = timing["fp32"]
            for p in precisions:
                t = timing[p]
                acc = accuracy_of(p, batch)
                share = bench.plan.mac_share(batch) if p == "int8" else None
                results.append({
                    "net": name,
                    "batch": batch,
                    "precision": p,
                    "ms_per_call": t * 1e3,
                    "samples_per_second": batch / t,
                    "ratio_to_fp32": base / t,
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
        "conv_policy": conv_choice.default_conv_policy(),
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
            for k, c in conv_choice.conv_choices().items()
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
