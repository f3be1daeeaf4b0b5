"""Neural-network operators: MatMul and Gemm, Softmax and LogSoftmax, convolution and pooling."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from optkit.onnx._ops._common import axis_index, lowest
from optkit.onnx._ops._registry import Family, NodeContext

OPS = Family("nn")


OPS.op("MatMul", 1, 9, 13)(lambda ctx: jnp.matmul)


@OPS.op("Gemm", 7, 9, 11, 13)
def _gemm(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    beta = ctx.attrs.get("beta", 1.0)
    trans_a = bool(ctx.attrs.get("transA", 0))
    trans_b = bool(ctx.attrs.get("transB", 0))

    def gemm(a, b, c=None):
        if jnp.ndim(a) != 2 or jnp.ndim(b) != 2:
            raise ctx.error(f"A and B must be matrices, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        y = jnp.matmul(a, b)
        if alpha != 1.0:
            y = alpha * y
        if c is not None and beta != 0.0:
            y = y + (c if beta == 1.0 else beta * c)
        return y

    return gemm



def _softmax_builder(fn):
    def build(ctx):
        if ctx.version >= 13:
            axis = ctx.attrs.get("axis", -1)

            def softmax(x):
                return fn(x, axis=axis_index(ctx, axis, jnp.ndim(x)))

            return softmax

        # Before opset 13 the input is coerced to 2-D at `axis` (default 1):
        # [prod(shape[:axis]), prod(shape[axis:])], normalized along the second.
        axis = ctx.attrs.get("axis", 1)

        def softmax_2d(x):
            rank = jnp.ndim(x)
            a = axis_index(ctx, axis, rank) if rank else 0
            shape = jnp.shape(x)
            flat = jnp.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))
            return jnp.reshape(fn(flat, axis=1), shape)

        return softmax_2d

    return build


OPS.op("Softmax", 1, 11, 13)(_softmax_builder(jax.nn.softmax))
OPS.op("LogSoftmax", 1, 11, 13)(_softmax_builder(jax.nn.log_softmax))


def _spatial_attrs(ctx: NodeContext, n: int, kernel: Sequence[int]) -> tuple:
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


def _auto_pads(ctx: NodeContext, spatial, kernel, strides, dilations, pads):
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


@OPS.op("Conv", 1, 11, 22)
def _conv(ctx):
    group = int(ctx.attrs.get("group", 1))

    def conv(x, w, b=None):
        n = jnp.ndim(x) - 2
        if n < 1 or jnp.ndim(w) != n + 2:
            raise ctx.error(f"X must be (N, C, D1, ...) and W (M, C/group, k1, ...) of the same rank, "
                            f"got shapes {jnp.shape(x)} and {jnp.shape(w)}")
        kernel = list(ctx.attrs.get("kernel_shape") or jnp.shape(w)[2:])
        if tuple(kernel) != tuple(jnp.shape(w)[2:]):
            raise ctx.error(f"kernel_shape {kernel} does not match W's shape {jnp.shape(w)}")
        if jnp.shape(x)[1] != jnp.shape(w)[1] * group:
            raise ctx.error(f"X has {jnp.shape(x)[1]} channels but W {jnp.shape(w)} with group={group} "
                            f"expects {jnp.shape(w)[1] * group}")
        strides, dilations, pads = _spatial_attrs(ctx, n, kernel)
        pads = _auto_pads(ctx, jnp.shape(x)[2:], kernel, strides, dilations, pads)
        span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        padded = [s + b + e for s, (b, e) in zip(jnp.shape(x)[2:], pads)]
        if any(p < k for p, k in zip(padded, span)):
            raise ctx.error(f"the kernel ({span} with dilation) is larger than the padded input {padded} "
                            f"for input shape {jnp.shape(x)} and pads {pads}")
        # Zeros padded explicitly, then a VALID convolution: the same tensor, and XLA:CPU's
        # convolution with padding larger than the kernel on a tiny input crashed the process.
        x = jnp.pad(x, [(0, 0), (0, 0), *pads])
        y = lax.conv_general_dilated(
            x, w, window_strides=strides, padding="VALID", rhs_dilation=dilations,
            feature_group_count=group,
        )
        if b is not None:
            y = y + jnp.reshape(b, (1, -1) + (1,) * n)
        return y

    return conv


def _pool_geometry(ctx: NodeContext, x, *, dilations_allowed: bool):
    """Window, strides, dilations, the (begin, end) padding that gives ONNX's output size,
    and the explicit pads (which ``count_include_pad`` counts)."""
    n = jnp.ndim(x) - 2
    if n < 1:
        raise ctx.error(f"X must be (N, C, D1, ...), got shape {jnp.shape(x)}")
    kernel = list(ctx.attrs["kernel_shape"])
    strides, dilations, pads = _spatial_attrs(ctx, n, kernel)
    if not dilations_allowed and any(d != 1 for d in dilations):
        raise ctx.unsupported("dilations are not part of this operator version")
    spatial = jnp.shape(x)[2:]
    pads = _auto_pads(ctx, spatial, kernel, strides, dilations, pads)
    ceil_mode = bool(ctx.attrs.get("ceil_mode", 0)) and ctx.attrs.get("auto_pad", "NOTSET") == "NOTSET"
    padding = []
    for size, k, s, d, (begin, end) in zip(spatial, kernel, strides, dilations, pads):
        span = (k - 1) * d + 1
        room = size + begin + end - span
        if room < 0:
            raise ctx.error(f"the window ({span} with dilation) is larger than the padded input "
                            f"({size + begin + end}) for input shape {jnp.shape(x)}")
        out = (-(-room // s) if ceil_mode else room // s) + 1
        if ceil_mode and (out - 1) * s >= size + begin:
            out -= 1  # the last window would start in the end padding: dropped (ONNX, PyTorch)
        padding.append((begin, max((out - 1) * s + span - size - begin, 0)))
    return kernel, strides, dilations, padding, pads


def _reduce_window(x, init, op, kernel, strides, dilations, padding):
    return lax.reduce_window(
        x, init, op,
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=((0, 0), (0, 0), *padding),
        window_dilation=(1, 1, *dilations),
    )


@OPS.op("MaxPool", 1, 8, 10, 11, 12, 22)
def _max_pool(ctx):
    if ctx.has_output(1):
        raise ctx.unsupported("the Indices output is not supported; leave the second output out")
    if ctx.version < 8 and ctx.attrs.get("storage_order", 0):
        raise ctx.unsupported("storage_order is only used by the Indices output")

    def max_pool(x):
        kernel, strides, dilations, padding, _ = _pool_geometry(ctx, x, dilations_allowed=ctx.version >= 10)
        init = jnp.asarray(lowest(jnp.result_type(x)), jnp.result_type(x))
        return _reduce_window(x, init, lax.max, kernel, strides, dilations, padding)

    return max_pool


@OPS.op("AveragePool", 1, 7, 10, 11, 19, 22)
def _average_pool(ctx):
    count_include_pad = bool(ctx.attrs.get("count_include_pad", 0))

    def average_pool(x):
        kernel, strides, dilations, padding, pads = _pool_geometry(ctx, x, dilations_allowed=ctx.version >= 19)
        dtype = jnp.result_type(x)
        zero = jnp.zeros((), dtype)
        total = _reduce_window(x, zero, lax.add, kernel, strides, dilations, padding)
        # The divisor counts the input elements in each window, plus the explicit
        # pads with count_include_pad (never the extra end padding of ceil_mode).
        ones = jnp.ones(jnp.shape(x)[2:], dtype)
        if count_include_pad:
            kept = [(b, min(e, e_eff)) for (b, e), (_, e_eff) in zip(pads, padding)]
            ones = jnp.pad(ones, kept, constant_values=1)
            extra = [(0, e_eff - e) for (_, e), (_, e_eff) in zip(kept, padding)]
        else:
            extra = padding
        count = lax.reduce_window(
            ones, zero, lax.add, tuple(kernel), tuple(strides),
            padding=tuple(extra), window_dilation=tuple(dilations),
        )
        return total / count

    return average_pool


@OPS.op("GlobalAveragePool", 1, 22)
def _global_average_pool(ctx):
    def global_average_pool(x):
        if jnp.ndim(x) < 3:
            raise ctx.error(f"X must be (N, C, D1, ...), got shape {jnp.shape(x)}")
        return jnp.mean(x, axis=tuple(range(2, jnp.ndim(x))), keepdims=True)

    return global_average_pool
