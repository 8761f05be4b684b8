"""Turning a policy's steps into training data, wherever the policy runs (the
SEED learner's server, an IMPALA actor, evaluation): the acting core that acts
on a batch of env steps and books episodes (`core`), and the unroll store that
cuts each env's steps into training sequences (`store`). The processes that
step the envs are `seedq.actor` (SEED) and `seedq.impala.actor`."""
