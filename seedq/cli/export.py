"""`seedq export`: a run's policy as a StableHLO or ONNX program (seedq.export)."""

from __future__ import annotations

import argparse
import sys

from seedq.process import exit_codes
from seedq.cli.common import HelpFormatter


def add_parsers(sub) -> None:
    from seedq.export import EXPORT_PRECISIONS, FORMATS

    export = sub.add_parser(
        "export",
        help="write a run's policy as one self-contained program (StableHLO or ONNX) with its spec",
        description="Writes the greedy policy of a run (its newest checkpoint) or of a checkpoint to "
        "OUT: policy.json (observation and action spec, the env and the options that preprocess its "
        "observations) and policy.stablehlo (loads with JAX alone) or policy.onnx (loads with "
        "onnxruntime alone). seedq.load_policy(OUT) reads either.",
        formatter_class=HelpFormatter,
    )
    export.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a run directory (its newest checkpoint) or a checkpoints/step_* directory")
    export.add_argument("--out", required=True, metavar="DIR", help="the export directory (new or empty)")
    export.add_argument("--format", choices=FORMATS, default="stablehlo",
                        help="stablehlo: a jax.export program; onnx: one .onnx model")
    export.add_argument("--precision", choices=EXPORT_PRECISIONS, default="fp32",
                        help="the precision the program computes in (int8: int8 weights, per-row activation scales)")


def run(args: argparse.Namespace) -> int:
    from seedq import export

    try:
        meta = export.export(args.path, args.out, format=args.format, precision=args.precision)
    except (ValueError, OSError) as e:
        print(f"seedq export: {e}", file=sys.stderr)
        return exit_codes.USAGE if isinstance(e, ValueError) else exit_codes.RUNTIME_FAILURE
    print(f"wrote {args.out}/{meta['program']} and policy.json ({meta['env']}, {meta['precision']}, "
          f"from {meta['checkpoint']})")
    return exit_codes.FINISHED
