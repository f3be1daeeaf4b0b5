"""Pooling: ``MaxPool`` (with its ``Indices`` output), ``AveragePool``, ``LpPool``, ``GlobalAveragePool``,
``GlobalMaxPool``; windows, pads and ``ceil_mode`` as the convolutions in :mod:`~optkit.onnx._ops.nn` read them."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._common import lowest
from optkit.onnx._ops._registry import Family, Layout, NodeContext
from optkit.onnx._ops._window import Window, auto_pads, logical_shape, spatial, spatial_attrs, windowed

OPS = Family("pool")


def _pool_windows(ctx: NodeContext, x, *, dilations_allowed: bool) -> tuple[list[Window], list]:
    """Each spatial axis's window with ONNX's output size (``ceil_mode``, ``auto_pad``), and the explicit
    pads (which ``count_include_pad`` counts); ``x`` in the node's layout (``ctx.channels_last``)."""
    shape = logical_shape(jnp.shape(x), ctx.channels_last)
    n = len(shape) - 2
    if n < 1:
        raise ctx.error(f"X must be (N, C, D1, ...), got shape {shape}")
    kernel = list(ctx.attrs["kernel_shape"])
    strides, dilations, pads = spatial_attrs(ctx, n, kernel)
    if not dilations_allowed and any(d != 1 for d in dilations):
        raise ctx.unsupported("dilations are not part of this operator version")
    sizes = shape[2:]
    pads = auto_pads(ctx, sizes, kernel, strides, dilations, pads)
    ceil_mode = bool(ctx.attrs.get("ceil_mode", 0)) and ctx.attrs.get("auto_pad", "NOTSET") == "NOTSET"
    windows = []
    for size, k, s, d, (begin, end) in zip(sizes, kernel, strides, dilations, pads):
        span = (k - 1) * d + 1
        room = size + begin + end - span
        if room < 0:
            raise ctx.error(f"the window ({span} with dilation) is larger than the padded input "
                            f"({size + begin + end}) for input shape {shape}")
        out = (-(-room // s) if ceil_mode else room // s) + 1
        if ceil_mode and (out - 1) * s >= size + begin:
            out -= 1  # the last window would start in the end padding: dropped (ONNX, PyTorch)
        windows.append(Window(size, k, d, s, begin, out))
    ctx.check_size((*shape[:2], *(w.out for w in windows)), jnp.result_type(x), "the output")
    return windows, pads


def _reduce_window(x, init, op, windows, pads, channels_last=False):
    """``op`` over each window of ``x`` (already cropped to what the windows reach), ``pads`` virtual."""
    ndim = jnp.ndim(x)
    return lax.reduce_window(
        x, init, op,
        window_dimensions=spatial(ndim, channels_last, [w.k for w in windows], 1),
        window_strides=spatial(ndim, channels_last, [w.s for w in windows], 1),
        padding=spatial(ndim, channels_last, pads, (0, 0)),
        window_dilation=spatial(ndim, channels_last, [w.d for w in windows], 1),
    )


def _argmax_indices(ctx, x, windows, init, column_major):
    """MaxPool's ``Indices``: each window's first maximum (in row-major window order), as its index into X
    flattened row-major, or with the spatial axes column-major (``storage_order=1``); pads never win."""
    if not all(w.begin < w.span and w.end < w.span for w in windows):
        raise ctx.unsupported("the Indices output with pads as large as the window is not supported")
    shape = jnp.shape(x)
    index = jnp.reshape(jnp.arange(math.prod(shape), dtype=jnp.int64), shape)

    def pick(a, b):
        (xa, ia), (xb, ib) = a, b
        first = (xa > xb) | ((xa == xb) & (ia < ib))
        return jnp.where(first, xa, xb), jnp.where(first, ia, ib)

    _, flat = lax.reduce_window((x, index), (init, np.asarray(np.iinfo(np.int64).max)), pick,
                                (1, 1, *(w.k for w in windows)), (1, 1, *(w.s for w in windows)),
                                ((0, 0), (0, 0), *((w.begin, w.end) for w in windows)),
                                window_dilation=(1, 1, *(w.d for w in windows)))
    if not column_major:
        return flat
    spatial = math.prod(shape[2:])
    return flat // spatial * spatial + _column_major(flat % spatial, shape[2:])


def _column_major(row_major, dims):
    """Row-major flat positions in ``dims`` as column-major ones (the first axis varying fastest)."""
    coordinates = []
    rest = row_major
    for size in reversed(dims):
        coordinates.append(rest % size)
        rest = rest // size
    coordinates.reverse()
    out, stride = 0, 1
    for coordinate, size in zip(coordinates, dims):
        out, stride = out + coordinate * stride, stride * size
    return out


@OPS.op("MaxPool", 1, 8, 10, 11, 12, 22, layout=Layout("reads_x"))
def _max_pool(ctx):
    if ctx.version < 8 and ctx.attrs.get("storage_order", 0):
        raise ctx.unsupported("storage_order is only used by the Indices output")
    column_major = bool(ctx.attrs.get("storage_order", 0))

    def max_pool(x):
        windows, _ = _pool_windows(ctx, x, dilations_allowed=ctx.version >= 10)
        dtype = jnp.result_type(x)
        # A NumPy initial value (a constant, not traced): lax.reduce_window then is reduce_window_max,
        # which JAX differentiates (a traced one has no gradient rule).
        init = np.asarray(lowest(dtype), dtype)
        y, shape, _ = windowed(
            ctx, x, windows, None,
            lambda core, pads, _: _reduce_window(core, init, lax.max, windows, pads, ctx.channels_last), init,
            ctx.channels_last)
        y = jnp.full(shape, init, dtype) if y is None else y
        if ctx.has_output(1):  # (never built channels-last: optkit.onnx._plans.layout)
            return y, _argmax_indices(ctx, lax.stop_gradient(x), windows, init, column_major)
        return y

    return max_pool


@OPS.op("AveragePool", 1, 7, 10, 11, 19, 22, layout=Layout("reads_x"))
def _average_pool(ctx):
    count_include_pad = bool(ctx.attrs.get("count_include_pad", 0))

    def average_pool(x):
        windows, pads = _pool_windows(ctx, x, dilations_allowed=ctx.version >= 19)
        dtype = jnp.result_type(x)
        zero = np.zeros((), dtype)

        def mean(core, core_pads, ranges):
            total = _reduce_window(core, zero, lax.add, windows, core_pads, ctx.channels_last)
            # The divisor counts the input elements in each window, plus the explicit pads with
            # count_include_pad (never the extra end padding of ceil_mode): per axis, then their product.
            count = np.ones((), np.int64)
            for w, (begin, end), (first, last) in zip(windows, pads, ranges):
                low, high = (-begin, w.n + end) if count_include_pad else (0, w.n)
                count = np.multiply.outer(count, w.counts(low, high, first, last))
            return total / (count[..., None] if ctx.channels_last else count).astype(dtype)

        # A window in the padding alone: 0 over the pads it counts, 0/0 (NaN) over none.
        fill = np.asarray(0.0 if count_include_pad else np.nan, dtype)
        y, shape, _ = windowed(ctx, x, windows, None, mean, fill, ctx.channels_last)
        return jnp.full(shape, fill, dtype) if y is None else y

    return average_pool


@OPS.op("LpPool", 1, 2, 11, 18, 22)
def _lp_pool(ctx):
    """``(sum over the window of |x|^p)^(1/p)``, the pads counting 0 (ONNX's reference: the window count times
    the padded average)."""
    p = float(ctx.attrs.get("p", 2.0))

    def lp_pool(x):
        windows, _ = _pool_windows(ctx, x, dilations_allowed=ctx.version >= 18)
        dtype = jnp.result_type(x)
        zero = np.zeros((), dtype)
        powered = jnp.power(jnp.abs(x), jnp.asarray(p, dtype))
        y, shape, _ = windowed(ctx, powered, windows, None,
                                lambda core, pads, _: _reduce_window(core, zero, lax.add, windows, pads), zero)
        total = jnp.zeros(shape, dtype) if y is None else y
        return jnp.power(total, jnp.asarray(1.0 / p, dtype))

    return lp_pool


@OPS.op("GlobalAveragePool", 1, 22, params=(jnp.mean,), layout=Layout("reads_x"))
@OPS.op("GlobalMaxPool", 1, 22, params=(jnp.max,), layout=Layout("reads_x"))
def _global_pool(ctx, reduce):
    """GlobalAveragePool / GlobalMaxPool: ``reduce`` over every spatial axis of (N, C, D1, ...) (or of
    (N, D1, ..., C) channels-last)."""
    def global_pool(x):
        if jnp.ndim(x) < 3:
            raise ctx.error(f"X must be (N, C, D1, ...), got shape {jnp.shape(x)}")
        axes = range(1, jnp.ndim(x) - 1) if ctx.channels_last else range(2, jnp.ndim(x))
        return reduce(x, axis=tuple(axes), keepdims=True)

    return global_pool


@OPS.op("MaxUnpool", 9, 11, 22, static_inputs=(2,))
def _max_unpool(ctx):
    """``X``'s values written at ``I``'s flat indices into zeros of the shape the pool inverts,
    ``(in - 1) * stride - pads + kernel`` per axis, which then sits at the start of ``output_shape`` (when given,
    the rest zeros), as ONNX's operator page and reference define it."""
    kernel = list(ctx.attrs.get("kernel_shape") or [])
    if not kernel:
        raise ctx.error("the required attribute 'kernel_shape' is missing")
    n = len(kernel)
    strides = list(ctx.attrs.get("strides") or [1] * n)
    pads = list(ctx.attrs.get("pads") or [0] * (2 * n))

    def max_unpool(x, indices, output_shape=None):
        if jnp.ndim(x) != n + 2 or jnp.shape(indices) != jnp.shape(x):
            raise ctx.error(f"X must be (N, C) and {n} spatial axes, and I of its shape; got {jnp.shape(x)} and "
                            f"{jnp.shape(indices)}")
        inferred = (*jnp.shape(x)[:2], *((size - 1) * s - (pads[i] + pads[n + i]) + k for i, (size, s, k) in
                                         enumerate(zip(jnp.shape(x)[2:], strides, kernel))))
        shape = inferred if output_shape is None else tuple(int(d) for d in np.reshape(output_shape, -1))
        if len(shape) != n + 2 or any(a < b for a, b in zip(shape, inferred)):
            raise ctx.error(f"output_shape {list(shape)} must have rank {n + 2} and hold the unpooled shape "
                            f"{list(inferred)}")
        ctx.check_size(shape, jnp.result_type(x), "the output")
        flat = jnp.zeros((math.prod(inferred),), jnp.result_type(x))
        flat = flat.at[jnp.reshape(jnp.asarray(indices), -1)].set(jnp.reshape(x, -1), mode="drop")
        y = jnp.reshape(flat, inferred)
        return jnp.pad(y, [(0, a - b) for a, b in zip(shape, inferred)])

    return max_unpool
