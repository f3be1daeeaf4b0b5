"""optkit benchmarks: optkit side by side with Optax (and PyTorch when present).

Each module is runnable, e.g. ``python -m benchmarks.gradient``. Timings are
reported as medians and ratios, never asserted in tests.
"""
