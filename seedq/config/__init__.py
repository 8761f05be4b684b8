"""Run configuration: frozen dataclasses with defaults that work.

One `TrainConfig` (`run`) describes a whole run. Nested sections are frozen
dataclasses too, each in its own module with its checks beside it: the
server and the actor channel (`server`), env preprocessing (`env_options`),
the agents (`vtrace`, `r2d2`) and the optimizer fields both inherit
(`optimizer`), devices and process groups (`devices`). The
CLI derives one flag per field (`--num-actors`, `--vtrace.learning-rate`,
...) from these definitions, so a field added here is overridable without
touching the CLI. Every run writes the resolved config to `config.json` in
its run directory (`files`), with the version of its layout (`layout`).

Defaults are tuned for a 2-core machine (CartPole-v1 solves in well under a
minute); larger machines raise `num_actors` / `envs_per_actor`.
"""

from seedq.config.checks import NETWORK_CHOICES, check_channel
from seedq.config.devices import DevicesConfig, DistributedConfig
from seedq.config.env_options import AtariConfig, DmcConfig, EnvOptions
from seedq.config.files import dotted_fields, from_dict, from_saved, load, read_json, save, saved_dict, to_dict, updated
from seedq.config.layout import LAYOUT_VERSION, migrated
from seedq.config.r2d2 import R2D2Config
from seedq.config.run import (
    ACTOR_PRECISIONS, AGENTS, ARCHITECTURES, PRECISIONS, QuantConfig, TrainConfig, defaults_for,
    is_pixel_observation,
)
from seedq.config.optimizer import DEFAULT_DECAY_FRAMES, OptimizerConfig
from seedq.config.server import (
    BATCHING_RULES, QUEUE_FULL_RULES, ActorChannelConfig, ActorTlsConfig, AuthConfig, ServerConfig, TlsConfig,
    check_batching_rule,
)
from seedq.config.tracking import WandbConfig
from seedq.config.vtrace import CONTINUOUS_VTRACE, LAYER_NORM_MODES, PIXEL_VTRACE, VTraceConfig

__all__ = [
    "ACTOR_PRECISIONS", "AGENTS", "ARCHITECTURES", "BATCHING_RULES", "CONTINUOUS_VTRACE", "DEFAULT_DECAY_FRAMES",
    "LAYER_NORM_MODES", "LAYOUT_VERSION", "NETWORK_CHOICES", "PIXEL_VTRACE", "PRECISIONS", "QUEUE_FULL_RULES",
    "ActorChannelConfig", "ActorTlsConfig", "AtariConfig", "AuthConfig", "DevicesConfig", "DistributedConfig",
    "DmcConfig", "EnvOptions", "OptimizerConfig", "QuantConfig", "R2D2Config", "ServerConfig", "TlsConfig", "TrainConfig",
    "VTraceConfig", "WandbConfig",
    "check_batching_rule", "check_channel", "defaults_for", "dotted_fields", "from_dict", "from_saved",
    "is_pixel_observation",
    "load", "migrated", "read_json", "save", "saved_dict", "to_dict", "updated",
]
