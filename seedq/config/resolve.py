"""The one resolution of a run's config, for `seedq train|learner` and
`seedq.train` alike.

Layers, later ones winning: the defaults for the run's env (they depend on
its action space, pixel frames and registered reward threshold:
`defaults_for_env`) or, resuming, the run's saved config; then each `Layer`
of fields in turn: a `--config` file, then the flags or keyword arguments
given. A layer is a plain (nested) mapping of field values, so the command
line and the Python API reach the same config by the same road.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from seedq.config.files import read_json, updated
from seedq.config.run import TrainConfig, defaults_for, is_pixel_observation


@dataclasses.dataclass(frozen=True)
class Layer:
    """Some fields of a run config (sections as mappings), and where they come
    from, which prefixes its errors ("--config FILE"; "" for flags and keywords)."""

    fields: Mapping[str, Any]
    where: str = ""

    def sets(self, name: str) -> bool:
        return name in self.fields


def file_layer(path: str) -> Layer:
    """The fields of a config file as a layer. Another run's config.json gives
    its settings but not its `logdir`: a run started from it never writes
    into that run's directory."""
    fields = read_json(path)  # (its errors name the file)
    if fields.get("logdir") and _is_a_runs_own_config(path):
        fields = {k: v for k, v in fields.items() if k != "logdir"}
    return Layer(fields, f"--config {path}")


def _is_a_runs_own_config(path: str) -> bool:
    """Whether `path` is the config.json in a run directory (one that also
    holds the run's marker, checkpoints or summary; a copied config.json alone
    in a folder is just a file of fields)."""
    from seedq import run_dirs

    run_dir = os.path.dirname(os.path.abspath(path))
    return os.path.basename(path) == run_dirs.CONFIG and any(
        os.path.lexists(os.path.join(run_dir, name)) for name in (run_dirs.MARKER, run_dirs.CHECKPOINTS,
                                                                   run_dirs.SUMMARY))


def apply(base: TrainConfig, layers: Sequence[Layer]) -> TrainConfig:
    """`base` with each layer's fields set in turn (ValueError naming the field and the layer)."""
    config = base
    for layer in layers:
        try:
            config = updated(config, dict(layer.fields))
        except ValueError as e:
            raise ValueError(f"{layer.where}: {e}" if layer.where else str(e)) from None
    return config


def given(layers: Sequence[Layer], name: str) -> Any:
    """The value of the top-level field `name` the last layer that sets it gives (None: none does)."""
    for layer in reversed(layers):
        if layer.sets(name):
            return layer.fields[name]
    return None


def defaults_for_env(spec, env_id: str) -> TrainConfig:
    """The defaults the layers apply to for an env with `spec` (a
    `seedq.schema.EnvSpec`): Box actions, pixel frames and the env's
    registered reward threshold decide them (config.run.defaults_for)."""
    from seedq.envs import reward_threshold

    pixels = is_pixel_observation(spec.obs_shape, spec.obs_dtype)
    return defaults_for(not spec.discrete, reward_threshold(env_id), pixels)


def env_defaults(env_id: str) -> TrainConfig:
    """`defaults_for_env` for `env_id` with the default env options; an env
    id that cannot be built falls back to the plain defaults (the run then
    reports the env error)."""
    from seedq.envs import env_spec

    try:
        return defaults_for_env(env_spec(env_id), env_id)
    except ValueError:
        return TrainConfig()


def resolve(layers: Sequence[Layer], saved: TrainConfig | None = None):
    """(the config, the env spec it was resolved for) from `layers` over the
    env's defaults, or over `saved` (a resumed run's config; its env spec is
    built later). ValueError naming the first bad field."""
    from seedq.envs import env_spec

    if saved is not None:
        return apply(saved, layers), None
    # The env and its options come from the layers alone; every other default
    # depends on the env's spec, built here once for the run.
    chosen = apply(TrainConfig(), layers)
    spec = env_spec(chosen.env, chosen.env_options)
    config = apply(defaults_for_env(spec, chosen.env), layers)
    if config.deterministic and not any(layer.sets("num_actors") for layer in layers):
        config = dataclasses.replace(config, num_actors=1)  # one order of batches
    return config, spec
