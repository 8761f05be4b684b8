"""The networks' input hooks: where an observation enters a network.

Networks turn uint8 frames into floats with `scale_pixels` and pass a float
observation to their first layer through `observation_input`. Both return
plain arrays; what makes them hooks is that whoever runs a network can watch
them: inside `observed_by(observer)` every call reports to `observer`.

The inference precisions register here (`seedq.quant`): an int8 layer fed
exactly the output of `scale_pixels` uses the raw integers instead of
re-quantizing them, and layers fed the float observation stay fp32. The
networks know nothing of quantization; quant imports this module, never the
reverse.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Protocol

import jax
import jax.numpy as jnp


class InputObserver(Protocol):
    """What a watcher of the input hooks implements."""

    def saw_pixels(self, scaled: jax.Array, raw: jax.Array, scale: float) -> None:
        """`scaled` = `raw` (integer pixels) * `scale`, as float32."""

    def saw_observation(self, x: jax.Array) -> None:
        """`x` is the network's float observation, about to enter its first layer."""


_OBSERVER: contextvars.ContextVar[InputObserver | None] = contextvars.ContextVar(
    "seedq_input_observer", default=None
)


@contextlib.contextmanager
def observed_by(observer: InputObserver) -> Iterator[None]:
    """Reports every `scale_pixels`/`observation_input` call in this context to `observer`."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def scale_pixels(x: jax.Array, scale: float = 1.0 / 255.0) -> jax.Array:
    """Integer pixels [...] -> float32 `x * scale` [...] (reported to the observer)."""
    y = x.astype(jnp.float32) * jnp.float32(scale)
    observer = _OBSERVER.get()
    if observer is not None:
        observer.saw_pixels(y, x, float(scale))
    return y


def observation_input(x: jax.Array) -> jax.Array:
    """Marks `x` as the network's float observation, as fed to its first layer.

    Returns `x` unchanged (reported to the observer)."""
    observer = _OBSERVER.get()
    if observer is not None:
        observer.saw_observation(x)
    return x
