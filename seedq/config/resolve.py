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
from typing import Any, Callable, Mapping, Sequence

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


def defaults_for_env(spec, threshold: float | None) -> TrainConfig:
    """The defaults the layers apply to for an env with `spec` (a
    `seedq.schema.EnvSpec`) and registered reward `threshold`: Box actions,
    pixel frames and the threshold decide them (config.run.defaults_for)."""
    pixels = is_pixel_observation(spec.obs_shape, spec.obs_dtype)
    return defaults_for(not spec.discrete, threshold, pixels)


# (env id, env options) -> (the env's spec, its registered reward threshold):
# seedq.envs.env_facts. Passed in, since seedq.envs builds on this package.
EnvFacts = Callable[[str, Any], tuple[Any, "float | None"]]


def resolve(layers: Sequence[Layer], env_facts: EnvFacts, saved: TrainConfig | None = None):
    """(the config, the env spec it was resolved for) from `layers` over the
    env's defaults, or over `saved` (a resumed run's config; its env spec is
    built later). ValueError naming the first bad field."""
    if saved is not None:
        return apply(saved, layers), None
    # The env and its options come from the layers alone; every other default
    # depends on the env's spec, built here once for the run.
    chosen = apply(TrainConfig(), layers)
    spec, threshold = env_facts(chosen.env, chosen.env_options)
    config = apply(defaults_for_env(spec, threshold), layers)
    if config.deterministic and not any(layer.sets("num_actors") for layer in layers):
        config = dataclasses.replace(config, num_actors=1)  # one order of batches
    return config, spec
