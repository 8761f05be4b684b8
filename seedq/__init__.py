"""seedq: SEED-style distributed reinforcement learning in JAX."""

from seedq import grpc_setup as _grpc_setup

__version__ = "0.1.0"

# Before any seedq module imports grpc, which reads its settings on import.
_grpc_setup.configure_environment()
