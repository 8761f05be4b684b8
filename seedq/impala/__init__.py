"""IMPALA mode, for comparisons with SEED: actors keep a local model copy, pull
parameters every K unrolls and send whole unrolls to the learner.

`actor` is the actor process, `service` the learner's gRPC service for it
(parameter pulls, unroll streams), `codec` their wire encoding (parameters in
chunks, batches of unrolls). The learner, V-trace and the acting core are the
ones SEED mode uses (`seedq.learner`, `seedq.rollout`)."""
