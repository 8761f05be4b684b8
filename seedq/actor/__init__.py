"""The SEED actor process (`seed_actor`): steps a vector of envs and asks the
learner for every action; no model, no JAX. IMPALA mode's actor, which acts
with its own model copy, is `seedq.impala.actor`."""
