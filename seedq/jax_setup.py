"""Process-wide JAX settings, applied once before the first compilation."""

from __future__ import annotations

import os

_configured = False


def configure() -> None:
    """Enables JAX's persistent compilation cache.

    XLA:CPU takes ~1-2 s to compile each of the learner's functions on a small
    machine; with the on-disk cache a second run starts in a fraction of
    that. `SEEDQ_JAX_CACHE_DIR` moves the cache; set it to "off" to disable.
    """
    global _configured
    if _configured:
        return
    _configured = True
    import jax

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
