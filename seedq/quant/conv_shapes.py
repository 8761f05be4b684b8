"""The 2-D convolutions the bf16 and int8 rules implement, and their geometry.

An `nn.Conv` qualifies when it is 2-D, ungrouped, unmasked and undilated,
with SAME, VALID or explicit padding; other convolutions run unchanged.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np
from jax import lax

# NHWC activations, HWIO kernels: flax's layout.
DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def conv_supported(module: nn.Module, x_ndim: int) -> bool:
    """Whether the bf16/int8 rules implement this `nn.Conv` fed an input of rank `x_ndim`."""
    if len(module.kernel_size) != 2 or x_ndim < 3:
        return False
    if getattr(module, "mask", None) is not None or module.feature_group_count != 1:
        return False
    for dilation in (module.input_dilation, module.kernel_dilation):
        if dilation not in (None, 1) and tuple(np.broadcast_to(dilation, (2,))) != (1, 1):
            return False
    padding = module.padding
    if isinstance(padding, str):
        return padding.upper() in ("SAME", "VALID")
    return True


def conv_strides(module: nn.Module) -> tuple[int, int]:
    """The (row, column) strides of a 2-D `nn.Conv`."""
    return tuple(int(s) for s in np.broadcast_to(module.strides or 1, (2,)))


def explicit_padding(module: nn.Module, spatial: tuple[int, int],
                     strides: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """((top, bottom), (left, right)) padding of a 2-D `nn.Conv` on an input of `spatial` (H, W)."""
    padding = module.padding
    if isinstance(padding, str):
        pads = lax.padtype_to_pads(spatial, module.kernel_size, strides, padding.upper())
    elif isinstance(padding, int):
        pads = [(padding, padding)] * 2
    else:
        pads = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
    return tuple(tuple(int(v) for v in p) for p in pads)
