"""seedq: SEED-style distributed reinforcement learning in JAX.

The Python API (`train`, `load_policy`, `evaluate`, `Run`, `Policy`) is
imported on first use: `import seedq` stays free of JAX, as the actor
processes need. (Type checkers read the names from `__init__.pyi`.)
"""

from __future__ import annotations

import importlib

from seedq.process import grpc_setup as _grpc_setup

__version__ = "0.1.0"

# Before any seedq module imports grpc, which reads its settings on import.
_grpc_setup.configure_environment()

# Public name -> the module that defines it.
_API = {
    "train": "seedq.api",
    "evaluate": "seedq.api",
    "Run": "seedq.api",
    "load_policy": "seedq.policy",
    "Policy": "seedq.policy",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'seedq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
