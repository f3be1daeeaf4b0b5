"""``python -m optkit.onnx`` (the ``optkit-onnx`` command): ``check``, ``summary`` and ``run`` of an ONNX file.

- ``check MODEL``: loads the file as :func:`optkit.onnx.prepare` does; prints what optkit does not run (each
  operator with its node count and node names) or the load error, and exits 1; exits 0 when it loads.
- ``summary MODEL``: what is in the file: inputs and outputs with their symbolic dimensions, opsets, external
  data, the operator histogram, parameters (count and bytes by dtype), the initializers trained by default,
  initializers read by several nodes (tied when trained), sub-graphs and quantized weights.
- ``run MODEL``: runs it on given or random inputs, times it, compares it with ONNX Runtime (``--compare-ort``)
  and checks its gradient (``--grad``): :mod:`optkit.onnx._cli_run`.

Built on ``argparse``; the model is read through the one load pipeline (:mod:`optkit.onnx._load.pipeline`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from optkit.onnx._base.errors import UnsupportedOpError
from optkit.onnx._base.limits import Limits
from optkit.onnx._base.walk import nodes_of
from optkit.onnx._cli_run import add_parser as add_run_parser
from optkit.onnx._cli_run import run
from optkit.onnx._load.pipeline import load
from optkit.onnx._summary import summary

__all__ = ["main", "summary"]

def _check(path: str) -> int:
    try:
        loaded = load(path, Limits.make(None, None))
    except UnsupportedOpError as err:
        print(f"{path}: not supported\n{err}")
        return 1
    except (ValueError, TypeError, OSError) as err:
        print(f"{path}: cannot be loaded: {type(err).__name__}: {err}")
        return 1
    count = sum(1 for _ in nodes_of(loaded.model.graph))
    print(f"{path}: OK, every operator is supported ({count} nodes)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``optkit-onnx check MODEL``, ``summary MODEL`` or ``run MODEL [options]`` (see
    ``optkit-onnx run --help``); returns the exit status.

    Example:
      >>> main(["--help"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(prog="optkit-onnx", description="Check, summarize and run ONNX models "
                                                                     "with optkit.onnx (JAX).")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="load a model; exit 1 naming what optkit does not run")
    check.add_argument("model", help="path to a .onnx file (external data read from its directory)")
    show = commands.add_parser("summary", help="inputs, outputs, operators, parameters of a model")
    show.add_argument("model", help="path to a .onnx file (external data read from its directory)")
    add_run_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check(args.model)
    if args.command == "run":
        return run(args)
    try:
        print(summary(args.model))
    except (UnsupportedOpError, ValueError, TypeError, OSError) as err:
        print(f"{args.model}: cannot be loaded: {type(err).__name__}: {err}")
        return 1
    return 0
