"""The inference/training device split and data-parallel training (seedq.devices).

The split is a pure function of a device list, tested here on stand-in
devices. The data-parallel checks need several JAX devices: they run in one
subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (8 CPU
devices), because other test modules have already started JAX in this process
with one. Run as a script (`python tests/test_devices.py`), this file is
that subprocess and prints its measurements as JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest

from seedq import cli
from seedq.config import DevicesConfig, R2D2Config, TrainConfig, VTraceConfig
from seedq.devices import split_devices

FORCED_DEVICES = 8
TRAINING_DEVICES = 4
TOLERANCE = 1e-5
# Adam's epsilon in the parity configs. The all-reduced gradient differs from
# the single-device one only in float32 summation order (about 5e-8 of the
# gradient norm), but Adam's first step g / (|g| + eps) turns that into a
# difference of a few percent of the learning rate on a component whose
# gradient is itself near eps: at eps 1e-8, a CartPole kernel entry of
# 1.2e-8 against 1.3e-8 moved the parameters 2.3e-5 apart. At 1e-5 (the pixel
# defaults' eps) one step changes by at most |dg| / eps of the rate, far below
# TOLERANCE, so the comparison tests the data-parallel update, not Adam's
# conditioning.
PARITY_ADAM_EPS = 1e-5


class FakeDevice(NamedTuple):
    platform: str
    id: int


def devices(n: int) -> list[FakeDevice]:
    return [FakeDevice("tpu", i) for i in range(n)]


def ids(split) -> tuple[list[int], list[int], list[int]]:
    return [d.id for d in split.inference], [d.id for d in split.training], [d.id for d in split.idle]


# --- the split ---


@pytest.mark.unit
def test_one_device_is_shared_by_inference_and_training():
    for wanted in (DevicesConfig(), DevicesConfig(inference=1, training=1)):
        split = split_devices(devices(1), wanted, batch_size=16)
        assert split.shared and ids(split) == ([0], [0], [])


@pytest.mark.unit
@pytest.mark.parametrize("n, batch_size, expected", [
    (8, 16, ([0], [1, 2, 3, 4], [5, 6, 7])),  # v5e-8, V-trace's default batch
    (8, 32, ([0], [1, 2, 3, 4], [5, 6, 7])),  # v5e-8, R2D2's default batch
    (8, 14, ([0], [1, 2, 3, 4, 5, 6, 7], [])),  # a batch divisible by 7 uses them all
    (4, 16, ([0], [1, 2], [3])),  # v4-8
    (4, 12, ([0], [1, 2, 3], [])),
    (2, 16, ([0], [1], [])),
])
def test_auto_split_gives_one_device_to_inference_and_a_divisor_of_the_batch_to_training(n, batch_size, expected):
    split = split_devices(devices(n), DevicesConfig(), batch_size)
    assert not split.shared
    assert ids(split) == expected
    assert batch_size % len(split.training) == 0


@pytest.mark.unit
@pytest.mark.parametrize("n, wanted, expected", [
    (8, DevicesConfig(inference=2, training=4), ([0, 1], [2, 3, 4, 5], [6, 7])),
    (8, DevicesConfig(inference=4), ([0, 1, 2, 3], [4, 5, 6, 7], [])),
    (8, DevicesConfig(training=4), ([0], [1, 2, 3, 4], [5, 6, 7])),
    (4, DevicesConfig(inference=1, training=2), ([0], [1, 2], [3])),
    (4, DevicesConfig(inference=3), ([0, 1, 2], [3], [])),
])
def test_explicit_split(n, wanted, expected):
    split = split_devices(devices(n), wanted, batch_size=16)
    assert ids(split) == expected
    assert split.describe() == {"inference": expected[0], "training": expected[1]}


@pytest.mark.unit
@pytest.mark.parametrize("n, wanted, asked", [
    (4, DevicesConfig(inference=2, training=4), "asks for 6 devices"),
    (8, DevicesConfig(inference=8), "asks for 9 devices"),
    (1, DevicesConfig(training=2), "asks for more devices than exist"),
])
def test_a_split_asking_for_more_devices_than_exist_names_the_devices_found(n, wanted, asked):
    with pytest.raises(ValueError) as error:
        split_devices(devices(n), wanted, batch_size=16)
    message = str(error.value)
    assert "\n" not in message and asked in message
    assert f"found {n}: " + ", ".join(f"tpu:{i}" for i in range(n)) in message


@pytest.mark.unit
def test_a_training_count_that_does_not_divide_the_batch_is_refused_naming_both():
    with pytest.raises(ValueError) as error:
        split_devices(devices(8), DevicesConfig(training=3), batch_size=16, batch_name="vtrace.batch_size")
    message = str(error.value)
    assert "\n" not in message
    assert "devices.training=3" in message and "vtrace.batch_size=16" in message


@pytest.mark.unit
def test_config_refuses_a_training_count_that_does_not_divide_the_agents_batch():
    TrainConfig(devices=DevicesConfig(training=4)).validate()
    with pytest.raises(ValueError, match=rf"devices\.training=3 .* r2d2\.batch_size={R2D2Config().batch_size}"):
        TrainConfig(agent="r2d2", devices=DevicesConfig(training=3)).validate()
    with pytest.raises(ValueError, match=r"devices\.inference=-1: must be >= 0"):
        TrainConfig(devices=DevicesConfig(inference=-1)).validate()


@pytest.mark.unit
def test_the_flags_exist_and_a_bad_split_is_one_line_on_the_command_line(capsys):
    assert cli.main(["train", "--devices.inference", "2", "--devices.training", "4", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == {"inference": 2, "training": 4}
    assert cli.main(["train", "--devices.training", "3", "--vtrace.batch-size", "16", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "devices.training=3" in err and "vtrace.batch_size=16" in err


# --- the learner on a device split, 8 forced CPU devices ---


@pytest.mark.e2e
def test_a_local_run_trains_on_a_device_split_and_records_it(tmp_path):
    """`seedq train` on 2 inference + 4 training devices at int8 (every
    quantizable layer): batches of inference are split across two devices with
    the int8 parameters copied to both, updates are data-parallel over four, and
    the run records the split. Bounded by frames (learning on a split is measured
    in docs/devices.md: CartPole reaches 475 there)."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={FORCED_DEVICES}"}
    logdir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "train", "--env", "CartPole-v1", "--devices.inference", "2",
         "--devices.training", "4", "--precision", "int8", "--quant.force-int8", "--max-frames", "20000",
         "--target-return", "none", "--eval-episodes", "2", "--logdir", str(logdir),
         "--log-every-seconds", "0.5"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["devices"] == {"inference": [0, 1], "training": [2, 3, 4, 5]}
    assert summary["train_steps"] > 0 and summary["frames"] >= 20000
    assert "| devices 2+4" in done.stdout


# --- data-parallel training, on 8 forced CPU devices in a subprocess ---


# Its tests share xdist_group("devices_measured"), so one worker builds it once
# (--dist loadgroup in pyproject.toml), not each worker that runs one of them.
@pytest.fixture(scope="module")
def measured():
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={FORCED_DEVICES}",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.xdist_group("devices_measured")
def test_the_split_of_real_forced_devices(measured):
    assert measured["num_devices"] == FORCED_DEVICES
    assert measured["split"] == {"inference": [0], "training": [1, 2, 3, 4]}


@pytest.mark.e2e
@pytest.mark.xdist_group("devices_measured")
@pytest.mark.parametrize("agent", ["vtrace", "r2d2"])
def test_data_parallel_update_on_4_devices_equals_the_single_device_update(measured, agent):
    result = measured[agent]
    # The batch really was split: each training device held B / 4 rows.
    assert result["rows_per_device"] == [result["batch_size"] // TRAINING_DEVICES] * TRAINING_DEVICES
    assert result["state_devices"] == TRAINING_DEVICES
    # Two updates in a row: parameters moved, and moved the same on 1 and on 4 devices.
    assert result["param_change"] > 100 * TOLERANCE
    assert result["max_param_diff"] < TOLERANCE, result
    assert result["max_opt_state_diff"] < TOLERANCE, result
    assert result["loss_diff"] < TOLERANCE, result
    if agent == "r2d2":
        # target_update_period=1: the target network copied the new parameters on both.
        assert result["max_target_diff"] < TOLERANCE, result
        # Per-sequence priorities come back whole and in batch order.
        assert result["priorities_shape"] == [result["batch_size"]]
        assert result["max_priority_diff"] < TOLERANCE, result
        assert result["priority_spread"] > 100 * TOLERANCE  # not all equal: order matters


@pytest.mark.e2e
@pytest.mark.parametrize("agent", ["vtrace", "r2d2"])
def test_the_update_all_reduces_gradients_and_gathers_no_activations(measured, agent):
    collectives = measured[agent]["collectives"]
    assert collectives["gradient_all_reduces"] > 0
    # Only per-sequence outputs ([B], R2D2's priorities) may be gathered.
    assert all(len(shape) == 1 for shape in collectives["gathered_shapes"]), collectives


# --- the subprocess ---


def _collectives(compiled_text: str) -> dict:
    """The cross-device operations in compiled HLO: the result shapes of every
    all-gather, and how many all-reduces carry arrays (gradients), not scalars."""
    gathered, array_reduces = [], 0
    for line in compiled_text.splitlines():
        match = re.search(r"= (.*?) (all-gather|all-reduce)(-start)?\(", line)
        if not match:
            continue
        shapes = [[int(d) for d in dims.split(",") if d] for dims in re.findall(r"\w+\[([\d,]*)\]", match[1])]
        if match[2] == "all-gather":
            gathered.extend(shapes)
        elif any(shapes):
            array_reduces += 1
    return {"gathered_shapes": gathered, "gradient_all_reduces": array_reduces}



def _random_batch(agent, spec, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """Sequences with random observations, actions, rewards and behaviour
    outputs, and episode ends (with the next step `first`) scattered inside."""
    from seedq import schema

    rng = np.random.default_rng(seed)
    fields = schema.stored_sequence_shapes(agent, spec)
    batch = {}
    for name, f in fields.items():
        shape = (batch_size, *f.shape)
        if np.dtype(f.dtype) == np.bool_:
            batch[name] = np.zeros(shape, bool)
        elif np.issubdtype(f.dtype, np.integer):
            batch[name] = rng.integers(0, spec.num_actions, shape).astype(f.dtype)
        else:
            batch[name] = rng.normal(size=shape).astype(f.dtype)
    length = batch["reward"].shape[1]
    for b in range(batch_size):
        t = int(rng.integers(1, length - 1))
        batch["terminated" if b % 2 else "truncated"][b, t] = True
        batch["first"][b, t + 1] = True
    if isinstance(agent.config, R2D2Config):
        # What prioritized replay adds to a sampled batch.
        batch["weights"] = rng.uniform(0.2, 1.0, batch_size).astype(np.float32)
        batch["indices"] = np.arange(batch_size, dtype=np.int32)
    return batch


def _max_diff(a, b) -> float:
    import jax

    diffs = jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b))
    return max(diffs, default=0.0)


def parity_config(agent_name: str, **overrides) -> TrainConfig:
    """The config both parity checks update with: `agent_name` on CartPole's
    defaults, Adam's epsilon PARITY_ADAM_EPS, R2D2's target copied every step."""
    return TrainConfig(agent=agent_name, vtrace=VTraceConfig(adam_eps=PARITY_ADAM_EPS),
                       r2d2=R2D2Config(target_update_period=1, adam_eps=PARITY_ADAM_EPS), **overrides)


def _compare(agent_name: str, split) -> dict:
    import jax

    from seedq.agents import make_agent
    from seedq.devices import data_parallel
    from seedq.schema import EnvSpec

    spec = EnvSpec("float32", (4,), num_actions=2)  # CartPole's
    config = parity_config(agent_name)
    _, batch_size = config.training_batch
    agent = make_agent(config, spec)
    initial = jax.jit(agent.init)(jax.random.PRNGKey(0))
    batches = [_random_batch(agent, spec, batch_size, seed) for seed in (1, 2)]

    single_update = jax.jit(agent.update)
    single = initial
    for batch in batches:
        single, single_metrics = single_update(single, batch)

    parallel = data_parallel(agent, split.training[:TRAINING_DEVICES])
    state = parallel.place_state(initial)
    for batch in batches:
        placed = parallel.place_batch(batch)
        state, metrics = parallel.update(state, placed)

    compiled = parallel.update.lower(state, placed).compile().as_text()
    result = {
        "collectives": _collectives(compiled),
        "batch_size": batch_size,
        "rows_per_device": [s.data.shape[0] for s in placed["reward"].addressable_shards],
        "state_devices": len(jax.tree.leaves(state.params)[0].sharding.device_set),
        "param_change": _max_diff(initial.params, single.params),
        "max_param_diff": _max_diff(single.params, state.params),
        "max_opt_state_diff": _max_diff(single.opt_state, state.opt_state),
        "loss_diff": abs(float(single_metrics["loss/total"]) - float(metrics["loss/total"])),
    }
    if agent_name == "r2d2":
        priorities = np.asarray(metrics["priorities"])
        result.update(
            max_target_diff=_max_diff(single.target_params, state.target_params),
            priorities_shape=list(priorities.shape),
            max_priority_diff=float(np.max(np.abs(np.asarray(single_metrics["priorities"]) - priorities))),
            priority_spread=float(np.ptp(priorities)),
        )
    return result


def _subprocess_main() -> None:
    import jax

    from seedq.devices import resolve_split
    from seedq.process import jax_setup

    jax_setup.configure()  # the compile cache, as a learner process has it

    split = resolve_split(TrainConfig())
    out = {"num_devices": len(jax.local_devices()), "split": split.describe()}
    for agent_name in ("vtrace", "r2d2"):
        out[agent_name] = _compare(agent_name, split)
    print(json.dumps(out))


if __name__ == "__main__":
    _subprocess_main()
