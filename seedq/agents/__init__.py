"""The agents (V-trace, R2D2) behind one interface (`seedq.agents.base.Agent`)."""

from __future__ import annotations


def make_agent(config, spec):
    """The agent `config.agent` names, for an env with `spec` (a `seedq.schema.EnvSpec`).

    Agents are precision-free: inference precision is a mode of whoever acts
    (`seedq.quant.mode.InferencePrecision`)."""
    if config.agent == "vtrace":
        from seedq.agents.vtrace.agent import VTraceAgent

        return VTraceAgent(spec, config.vtrace, frame_stack=config.frame_stack, seed=config.seed,
                           max_frames=config.max_frames)
    if config.agent == "r2d2":
        from seedq.agents.r2d2.agent import R2D2Agent

        return R2D2Agent(
            spec, config.r2d2, num_envs=config.num_actors * config.envs_per_actor,
            seed=config.seed, frame_stack=config.frame_stack, max_frames=config.max_frames,
        )
    raise ValueError(f"agent={config.agent!r} is not available")
