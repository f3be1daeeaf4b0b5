"""``python -m benchmarks``: the optimizer-step benchmarks of :mod:`benchmarks.run`."""

from benchmarks.run import main

main()
