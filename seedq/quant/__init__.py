"""Inference precision: fp32, bf16 and int8 (post-training quantization).

`publish(params, precision, layers)` turns fp32 parameters into what the
inference server runs; `apply(module, published, precision, *args)` runs any
flax network at that precision through one interception mechanism
(`seedq.quant.intercept`; `seedq.quant.layers` finds a network's layers).
`make_plan` measures which layers int8 speeds up at
each batch size (`seedq.quant.plan`). Training always stays fp32.
"""

from seedq.quant.intercept import apply
from seedq.quant.layers import OUTPUT_LAYER_NAMES, find_layers, quantizable_paths
from seedq.quant.plan import Int8Plan, make_plan
from seedq.quant.quantize import (
    PRECISIONS,
    publish,
    quantize_per_channel,
    quantize_rows,
)

__all__ = [
    "Int8Plan",
    "OUTPUT_LAYER_NAMES",
    "PRECISIONS",
    "apply",
    "find_layers",
    "make_plan",
    "publish",
    "quantizable_paths",
    "quantize_per_channel",
    "quantize_rows",
]
