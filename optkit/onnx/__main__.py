"""``python -m optkit.onnx``: the command line (:mod:`optkit.onnx._cli`)."""

import sys

from optkit.onnx._cli import main

if __name__ == "__main__":
    sys.exit(main())
