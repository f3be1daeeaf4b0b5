"""Sliding windows and layouts, shared by the convolution (:mod:`~optkit.onnx._ops.nn`), pooling
(:mod:`~optkit.onnx._ops.pool`) and normalization families: the spatial attributes, ``auto_pad``, one window
axis, the part of an input the windows reach, and the (N, C, D1, ...) / channels-last (N, D1, ..., C) shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._registry import NodeContext

__all__ = ["Window", "auto_pads", "logical_shape", "per_channel", "spatial", "spatial_attrs", "windowed",
           "with_spatial"]


def spatial_attrs(ctx: NodeContext, n: int, kernel: Sequence[int]) -> tuple:
    """strides, dilations and explicit pads (begin, end) per spatial axis, from the attributes."""
    strides = list(ctx.attrs.get("strides") or [1] * n)
    dilations = list(ctx.attrs.get("dilations") or [1] * n)
    pads = list(ctx.attrs.get("pads") or [0] * (2 * n))
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n or len(kernel) != n:
        raise ctx.error(f"kernel_shape {list(kernel)}, strides {strides}, dilations {dilations} and "
                        f"pads {pads} must have {n}, {n}, {n} and {2 * n} entries for {n} spatial axes")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations) or any(p < 0 for p in pads):
        raise ctx.error(f"strides and dilations must be >= 1 and pads >= 0, got strides {strides}, "
                        f"dilations {dilations}, pads {pads}")
    return strides, dilations, list(zip(pads[:n], pads[n:]))


def auto_pads(ctx: NodeContext, spatial, kernel, strides, dilations, pads):
    """Explicit (begin, end) pads after ``auto_pad`` (SAME_UPPER/SAME_LOWER/VALID/NOTSET)."""
    auto_pad = ctx.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        return pads
    if auto_pad == "VALID":
        return [(0, 0)] * len(spatial)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")
    result = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        result.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    return result


@dataclasses.dataclass(frozen=True)
class Window:
    """One spatial axis of a sliding window: input size, kernel, dilation, stride, begin padding, outputs."""

    n: int
    k: int
    d: int
    s: int
    begin: int
    out: int

    @property
    def span(self) -> int:
        return (self.k - 1) * self.d + 1

    @property
    def end(self) -> int:
        """The end padding the last window reaches (``ceil_mode`` may reach past the explicit pads)."""
        return max((self.out - 1) * self.s + self.span - self.n - self.begin, 0)

    def core(self) -> tuple[int, int, tuple[int, int], tuple[int, int]] | None:
        """The outputs whose window reaches the input, ``(first, last)``, the input range they read and the
        padding they need on each side (each less than the span); None when every window lies in the padding.

        Only these outputs need the input: the others see padding alone, so a window's padding never has
        to exist beyond one span on each side of the input, however large the pads and strides are.
        """
        first = 0 if self.begin < self.span else (self.begin - self.span) // self.s + 1
        last = min(self.out - 1, (self.n - 1 + self.begin) // self.s)
        if first > last:
            return None
        start, stop = first * self.s - self.begin, last * self.s - self.begin + self.span
        return first, last, (max(start, 0), min(stop, self.n)), (max(-start, 0), max(stop - self.n, 0))

    def counts(self, low: int, high: int, first: int, last: int) -> np.ndarray:
        """For outputs ``first..last``: how many of the window's cells lie in ``[low, high)`` (input coordinates)."""
        starts = np.arange(first, last + 1, dtype=np.int64) * self.s - self.begin
        cells = starts[:, None] + np.arange(self.k, dtype=np.int64)[None, :] * self.d
        return np.sum((cells >= low) & (cells < high), axis=1)


def logical_shape(shape: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    """ONNX's (N, C, D1, ...) shape of a value held as ``shape``: (N, D1, ..., C) when ``channels_last``."""
    shape = tuple(shape)
    return (shape[0], shape[-1], *shape[1:-1]) if channels_last and len(shape) >= 2 else shape


def per_channel(ndim: int, channels_last: bool) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel vector over a rank-``ndim`` value in that layout."""
    return (1,) * (ndim - 1) + (-1,) if channels_last else (1, -1) + (1,) * (ndim - 2)


def spatial(ndim: int, channels_last: bool, values: Sequence[Any], other: Any) -> tuple:
    """A tuple over the axes of a rank-``ndim`` value: ``values`` on its spatial axes, ``other`` on N and C."""
    first = 1 if channels_last else 2
    out = [other] * ndim
    out[first:first + len(values)] = values
    return tuple(out)


def with_spatial(shape: Sequence[int], channels_last: bool, sizes: Sequence[int]) -> tuple[int, ...]:
    """``shape`` with its spatial sizes replaced by ``sizes`` (in that layout)."""
    return tuple(old if new is None else new
                 for old, new in zip(shape, spatial(len(shape), channels_last, sizes, None)))


def windowed(ctx: NodeContext, x, windows: Sequence[Window], pad_value, compute, fill, channels_last=False):
    """``compute(core_x)`` on the part of ``x`` the windows reach, padded by at most a span on each side,
    placed in an output of ``fill`` (the value of a window that lies in the padding alone).

    ``compute`` gets the cropped input (padded with ``pad_value``, or None: left to it, as ``(begin, end)``
    per axis) and the ``(first, last)`` outputs of each axis, and returns the outputs of that block.
    The intermediate is held to the model's tensor bound. ``x`` is (N, C, D1, ...), or (N, D1, ..., C) when
    ``channels_last``; the output shape returned is in the same layout.
    """
    ndim = jnp.ndim(x)
    out_shape = with_spatial(jnp.shape(x), channels_last, [w.out for w in windows])
    if all(w.begin < w.span and w.end < w.span for w in windows):
        # Pads within a window's span (every real model): the whole input, as it is.
        whole = [(0, w.out - 1, (0, w.n), (w.begin, w.end)) for w in windows]
        cores: list = whole
    else:
        cores = [w.core() for w in windows]
    if any(c is None for c in cores):
        return None, out_shape, cores
    core_x = x[spatial(ndim, channels_last, [slice(lo, hi) for _, _, (lo, hi), _ in cores], slice(None))]
    pads = [p for _, _, _, p in cores]
    padded = spatial(ndim, channels_last, pads, (0, 0))
    ctx.check_size(logical_shape([size + b + e for size, (b, e) in zip(jnp.shape(core_x), padded)], channels_last),
                   jnp.result_type(x), "the padded window input")
    if pad_value is not None:
        core_x = jnp.pad(core_x, padded, constant_values=pad_value)
    block = compute(core_x, pads, [(first, last) for first, last, _, _ in cores])
    placement = spatial(ndim, channels_last,
                        [(first, w.out - 1 - last) for (first, last, _, _), w in zip(cores, windows)], (0, 0))
    return jnp.pad(block, placement, constant_values=fill), out_shape, cores
