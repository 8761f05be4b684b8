"""The agents (V-trace, R2D2) behind one interface (`seedq.agents.base.Agent`)."""

from __future__ import annotations


def make_agent(config, spec):
    """The agent `config.agent` names, for an env with `spec` (a `seedq.schema.EnvSpec`).

    Agents are precision-free: inference precision is a mode of whoever acts
    (`seedq.quant.mode.InferencePrecision`)."""
    from seedq.config import agent_config_for_run

    if config.agent == "vtrace":
        from seedq.agents.vtrace.agent import VTraceAgent

        return VTraceAgent(spec, agent_config_for_run(config), frame_stack=config.frame_stack, seed=config.seed)
    if config.agent == "r2d2":
        from seedq.agents.r2d2.agent import R2D2Agent

        return R2D2Agent(
            spec, agent_config_for_run(config), num_envs=config.num_actors * config.envs_per_actor,
            seed=config.seed, frame_stack=config.frame_stack,
        )
    raise ValueError(f"agent={config.agent!r} is not available")
