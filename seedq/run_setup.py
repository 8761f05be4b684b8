"""A run's config, resolved and validated once, with the env spec it was resolved for.

The route of a setting from the command line to the learner:

1. `seedq.cli` layers the env's defaults (`defaults_for_env`: they depend on
   the env's action space, pixel observations and registered threshold), the `--config` file and
   the flags into one `TrainConfig`;
2. `prepare` resolves it (run directory), validates it and builds the env
   spec: once per run;
3. `seedq.local.train` builds the agent from the config and the spec, once,
   and hands both to the `Learner`.

Nothing after `prepare` reads flags or defaults again.
"""

from __future__ import annotations

import dataclasses

from seedq.config import TrainConfig
from seedq.flags import defaults_for_spec
from seedq.schema import EnvSpec


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A validated run config (run directory resolved) and the spec of its env."""

    config: TrainConfig
    spec: EnvSpec


def build_env_spec(config: TrainConfig) -> EnvSpec:
    """The spec of the run's env with its options (ValueError for an unknown env id)."""
    from seedq.envs import env_spec

    return env_spec(config.env, config.env_options)


def defaults_for_env(spec: EnvSpec, env_id: str) -> TrainConfig:
    """The defaults the config file and flags apply to for an env with `spec`:
    Box actions take CONTINUOUS_VTRACE, pixel frames PIXEL_VTRACE, and the
    target return is the env's registered reward threshold."""
    return defaults_for_spec(spec, env_id)


def prepare(config: TrainConfig, spec: EnvSpec | None = None) -> PreparedRun:
    """`config` resolved and validated, with its env's spec (`spec`: already
    built for this env and these options). ValueError naming the first bad field."""
    config = config.resolved()
    config.validate()
    return PreparedRun(config, build_env_spec(config) if spec is None else spec)
