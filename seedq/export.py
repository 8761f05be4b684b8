"""`seedq export`: a trained policy as one self-contained program.

An export directory holds `policy.json` (the observation and action spec, the
env id and options that preprocess observations, the state the program
carries, the precision) and the program itself, greedy actions only:

* `policy.stablehlo`: a serialised `jax.export` program; it loads with JAX
  alone (plus flatbuffers, which JAX's deserialiser imports):
  `jax.export.deserialize(bytearray(data)).call(obs)`;
* `policy.onnx`: one ONNX model (its graph written by `seedq.export_onnx`
  from the network's parameters, computed in float32); it loads with
  onnxruntime alone: `session.run(None, {"obs": obs})[0]`.

The batch dimension is dynamic. A feed-forward policy takes one input, the
observations `[n, *obs_shape]` exactly as the env returns them, and gives the
actions. A policy with state across steps (a pixel env's frame stack, an
LSTM) takes `(obs, first, *state)` and gives `(actions, *state)`, the state
arrays in the order `policy.json` lists them; `first` marks episode starts.
The network's parameters, its observation normalisation and its inference
precision are inside the program.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from seedq.schema import EnvSpec

FORMATS = ("stablehlo", "onnx")
EXPORT_PRECISIONS = ("fp32", "int8")
META_FILE = "policy.json"
PROGRAM_FILES = {"stablehlo": "policy.stablehlo", "onnx": "policy.onnx"}
# Bumped when policy.json or the programs' signature change incompatibly.
EXPORT_LAYOUT = 1


def is_export_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, META_FILE))


def _greedy_program(precision, params):
    """(program, state names, state example): the pure function an export
    holds. Feed-forward: obs -> actions; with state: (obs, first, *state) ->
    (actions, *state)."""
    import jax
    import jax.numpy as jnp

    agent = precision.agent
    example_state = agent.initial_core_state(1)
    names = sorted(example_state)
    example_inputs = agent.actor_inputs(np.arange(1))

    def act(obs, first, state):
        n = obs.shape[0]
        # Per-env actor inputs (R2D2's exploration epsilons) do not change greedy actions.
        inputs = {k: jnp.zeros((n, *np.shape(v)[1:]), np.asarray(v).dtype) for k, v in example_inputs.items()}
        actions, _, state, _ = precision.greedy_act(params, jax.random.PRNGKey(0), obs, first, state, inputs)
        return actions, state

    if not names:
        def feed_forward(obs):
            return act(obs, jnp.ones(obs.shape[0], bool), {})[0]

        return feed_forward, names, example_state

    def with_state(obs, first, *state):
        actions, new_state = act(obs, first, dict(zip(names, state)))
        return (actions, *(new_state[k] for k in names))

    return with_state, names, example_state


def _input_specs(spec: EnvSpec, names, example_state, batch):
    import jax

    obs = jax.ShapeDtypeStruct((batch, *spec.obs_shape), np.dtype(spec.obs_dtype))
    if not names:
        return [obs]
    first = jax.ShapeDtypeStruct((batch,), np.dtype(bool))
    state = [jax.ShapeDtypeStruct((batch, *example_state[k].shape[1:]), example_state[k].dtype) for k in names]
    return [obs, first, *state]


def _write_stablehlo(program, specs, path: str) -> None:
    import jax

    exported = jax.export.export(jax.jit(program))(*specs)
    with open(path, "wb") as f:
        f.write(exported.serialize())


def output_names(state_names) -> list[str]:
    """The program's outputs: the actions, then each state array as the next
    step takes it ("next_<name>": an ONNX graph's names are unique across its
    inputs and outputs)."""
    return ["actions", *(f"next_{name}" for name in state_names)]


def state_meta(names, example_state) -> list[dict]:
    """policy.json's description of the state arrays a program carries, in its argument order."""
    return [{"name": k, "shape": list(example_state[k].shape[1:]), "dtype": str(example_state[k].dtype)}
            for k in names]


def _spec_dict(spec: EnvSpec) -> dict:
    return dataclasses.asdict(spec)


def export(path: str, out: str, *, format: str = "stablehlo", precision: str = "fp32") -> dict:
    """Writes the policy at `path` (a run directory or checkpoint) to the
    export directory `out`; returns its policy.json."""
    if format not in FORMATS:
        raise ValueError(f"--format {format}: choose one of {', '.join(FORMATS)}")
    if precision not in EXPORT_PRECISIONS:
        raise ValueError(f"--precision {precision}: choose one of {', '.join(EXPORT_PRECISIONS)}")
    if format == "onnx" and precision == "int8":
        # The ONNX graph is written in float32 (seedq.export_onnx).
        raise ValueError("--format onnx --precision int8: the ONNX graph is float32; export int8 as stablehlo, "
                         "or fp32 to ONNX (onnxruntime's quantizer makes int8 of it)")
    if format == "onnx":
        from seedq.extras import missing

        if missing("onnx"):
            raise ValueError("--format onnx needs the onnx package: pip install 'seedq[export]'")
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"--out {out}: exists and is not empty")
    import jax

    from seedq import __version__, config as config_lib
    from seedq import evaluation

    loaded = evaluation.load_policy(path, precision=precision)
    run_precision = loaded.policy.precision
    spec = run_precision.spec
    program, names, example_state = _greedy_program(run_precision, loaded.policy.params)
    if format == "onnx":  # built before `out` is made: a network the writer does not cover leaves nothing
        from seedq.export_onnx import policy_model

        model = policy_model(run_precision.agent, loaded.policy.params, names, example_state)
    os.makedirs(out, exist_ok=True)
    program_path = os.path.join(out, PROGRAM_FILES[format])
    if format == "stablehlo":
        (batch,) = jax.export.symbolic_shape("B")
        _write_stablehlo(program, _input_specs(spec, names, example_state, batch), program_path)
    else:
        import onnx

        onnx.save(model, program_path)
    config = loaded.config
    meta = {
        "layout": EXPORT_LAYOUT,
        "format": format,
        "program": PROGRAM_FILES[format],
        "precision": precision,
        "env": config.env,
        # How the env preprocesses observations (seedq.envs.make_env with these options).
        "env_options": config_lib.to_dict(config.env_options),
        "spec": _spec_dict(spec),
        "inputs": ["obs"] if not names else ["obs", "first", *names],
        "outputs": output_names(names),
        "state": state_meta(names, example_state),
        "checkpoint": loaded.checkpoint,
        "frames": loaded.counters.get("frames"),
        "seedq_version": __version__,
    }
    with open(os.path.join(out, META_FILE), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


# --- loading -------------------------------------------------------------


class _ExportedBackend:
    """An exported program: greedy actions, state carried as its inputs and outputs."""

    stochastic = False

    def __init__(self, meta: dict, run):
        self._meta = meta
        self._run = run  # (obs, first, *state) -> (actions, *state)
        self._names = [s["name"] for s in meta["state"]]

    def initial_state(self, n: int) -> dict[str, np.ndarray]:
        return {s["name"]: np.zeros((n, *s["shape"]), s["dtype"]) for s in self._meta["state"]}

    def act(self, obs, first, state, deterministic: bool):
        if not self._names:
            return np.asarray(self._run([obs])[0]), state
        outputs = self._run([obs, first, *(state[k] for k in self._names)])
        return np.asarray(outputs[0]), {k: np.asarray(v) for k, v in zip(self._names, outputs[1:])}


def _stablehlo_runner(path: str):
    import jax

    with open(path, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))

    def run(args):
        out = exported.call(*args)
        return out if isinstance(out, (tuple, list)) else (out,)

    return run


def _onnx_runner(path: str, input_names):
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(f"{path}: loading an ONNX policy needs onnxruntime (pip install onnxruntime)") from None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])

    def run(args):
        return session.run(None, dict(zip(input_names, args)))

    return run


def open_export(path: str, env: str | None = None) -> tuple[_ExportedBackend, dict]:
    """The backend of the export directory `path` and the fields of its
    `seedq.policy.PolicyInfo` (env, env_options, spec, source, precision).

    An export may come from anyone, so `policy.json` is data only: an env id
    that imports or calls code (`seedq.envs.names_code`) is refused unless
    the caller gives `env` (which then replaces it), and the program must be
    a file inside `path`. Both are checked before anything is imported or
    the program is read. ValueError in one line otherwise."""
    from seedq import config as config_lib
    from seedq.envs import names_code

    try:
        with open(os.path.join(path, META_FILE)) as f:
            meta = json.load(f)
        if meta.get("layout") != EXPORT_LAYOUT:
            raise ValueError(f"export layout {meta.get('layout')}, this seedq reads {EXPORT_LAYOUT}")
        if not env and names_code(str(meta["env"])):
            raise ExportRefused(
                f"{path}: its env {meta['env']!r} imports or calls code named in {META_FILE}; give the env "
                "explicitly (env= of seedq.load_policy or seedq.evaluate; the same id, if you trust it)"
            )
        program = program_path(path, meta["program"])
        spec_data = meta["spec"]
        spec = EnvSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec_data.items()})
        options = config_lib.from_dict(config_lib.EnvOptions, meta["env_options"])
        runner = (_stablehlo_runner(program) if meta["format"] == "stablehlo"
                  else _onnx_runner(program, meta["inputs"]))
    except ExportRefused:
        raise
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a readable seedq export ({e})") from None
    info = {"env": env or meta["env"], "env_options": options, "spec": spec, "source": path,
            "precision": meta["precision"]}
    return _ExportedBackend(meta, runner), info


class ExportRefused(ValueError):
    """An export that names code to run or a file outside its directory."""


def program_path(export_dir: str, program) -> str:
    """The path of `policy.json`'s `program`: a relative name of a file
    inside `export_dir`, symlinks resolved. An absolute path, a `..` or a
    symlink pointing out of the directory is refused (ExportRefused)."""
    if not isinstance(program, str) or not program:
        raise ExportRefused(f"{export_dir}: {META_FILE} names no program file")
    parts = program.replace("\\", "/").split("/")
    if os.path.isabs(program) or ".." in parts:
        raise ExportRefused(f"{export_dir}: its program {program!r} is not a file inside the export directory")
    root = os.path.realpath(export_dir)
    resolved = os.path.realpath(os.path.join(root, program))
    if os.path.commonpath([root, resolved]) != root or resolved == root:
        raise ExportRefused(f"{export_dir}: its program {program!r} points outside the export directory")
    return resolved
