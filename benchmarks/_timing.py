"""Timing helpers shared by the benchmarks: interleaved and rotated runs, medians, markdown tables."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import jax

__all__ = ["block", "time_interleaved", "time_rotated", "summary", "markdown_table", "first_call_seconds"]


def block(tree) -> None:
    """Wait until every array in ``tree`` is computed."""
    jax.block_until_ready(tree)


def first_call_seconds(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call (trace + compile + run when it is the first)."""
    start = time.perf_counter()
    block(fn())
    return time.perf_counter() - start


def time_interleaved(
    steps: Mapping[str, Callable[[], object]], *, repeats: int = 20, warmup: int = 3
) -> dict[str, list[float]]:
    """Time several zero-argument step functions round-robin, one call each per round.

    Interleaving puts every candidate under the same machine conditions (other
    load, frequency changes). Each ``step`` must block on its own result or
    return something :func:`block` can wait on. Returns seconds per call.
    """
    for _ in range(warmup):
        for step in steps.values():
            block(step())
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            block(step())
            times[name].append(time.perf_counter() - start)
    return times


def summary(seconds: Sequence[float]) -> dict[str, float]:
    """Median, min and max in milliseconds."""
    return {
        "median_ms": 1e3 * statistics.median(seconds),
        "min_ms": 1e3 * min(seconds),
        "max_ms": 1e3 * max(seconds),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; floats are written with 3 significant digits."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _reallocate_all(steps) -> None:
    """``reallocate()`` every stepper that has it (:class:`benchmarks.candidates.JaxStepper`);
    all new buffers are made before any old one is freed."""
    held = [s.reallocate() for s in steps if hasattr(s, "reallocate")]
    del held


def time_rotated(steps: dict, *, repeats: int, warmup: int, gap: float = 0.005,
                 seed: int = 0, epochs: int = 4) -> dict[str, list[float]]:
    """Round-robin timing as ``benchmarks._timing.time_interleaved``, in a new order every round.

    A fixed (or merely rotated) order puts the same candidate after the same
    neighbour every round, and it then pays for whatever that neighbour leaves
    behind: PyTorch's OpenMP threads spin for a while after a step, which slowed
    the step after it by 20-50%. So each round runs in a fresh random order,
    and ``gap`` seconds of idling (not timed) precede every timed call so that
    every step starts from a quiet machine. The rounds are split into
    ``epochs``, and before each epoch but the first every candidate's arrays
    move to new buffers (:meth:`benchmarks.candidates.JaxStepper.reallocate`). Returns seconds per call.
    """
    rng = random.Random(seed)
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            block(steps[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    per_epoch = max(1, -(-repeats // max(1, epochs)))
    for i in range(repeats):
        if i and i % per_epoch == 0:
            _reallocate_all(steps.values())
            for name in names:  # one untimed step in the new buffers
                block(steps[name]())
        rng.shuffle(names)
        for name in names:
            time.sleep(gap)
            start = time.perf_counter()
            block(steps[name]())
            times[name].append(time.perf_counter() - start)
    return times
