"""Timing helpers shared by the benchmarks: interleaved runs, medians, markdown tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import jax

__all__ = ["block", "time_interleaved", "summary", "markdown_table", "first_call_seconds"]


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
