"""Process-wide JAX settings, applied once before the first compilation."""

from __future__ import annotations

import os

_configured = False


def configure() -> None:
    """Runs CPU computations inline and enables JAX's persistent compilation cache.

    Inline CPU dispatch (`jax_cpu_enable_async_dispatch` off): the learner's
    calls are small (one inference batch of a 64-unit MLP is tens of
    microseconds of arithmetic), and async dispatch adds a thread hand-off to
    each that costs more than the work: the CartPole inference call took
    ~80-110 us with it and ~31 us without (docs/benchmarks.md, "Inline CPU dispatch"). Set
    `JAX_CPU_ENABLE_ASYNC_DISPATCH=1` to keep JAX's default. Must run before
    the first JAX computation creates the CPU client; no effect on GPU/TPU.

    XLA:CPU takes ~1-2 s to compile each of the learner's functions on a small
    machine; with the on-disk cache a second run starts in a fraction of
    that. `SEEDQ_JAX_CACHE_DIR` moves the cache; set it to "off" to disable.
    """
    global _configured
    if _configured:
        return
    _configured = True
    import jax

    if "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    cache_dir = os.environ.get(
        "SEEDQ_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "seedq", "jax")
    )
    if cache_dir.lower() == "off":
        return
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError:
        return  # read-only home: run without the cache
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
