"""Handlers for the standard (``ai.onnx``) operators a training graph needs.

One small builder per operator (see ``_table.py``), recorded in this module's
``HANDLERS`` list: it reads the node's attributes once, at load time, and
returns the JAX function of the inputs.
The semantics follow the ONNX operator documentation of each version listed
in ``handler``; where versions differ (attribute vs input forms of axes,
Softmax's 2-D coercion before opset 13), the builder branches on
``ctx.version``.

ONNX requires the inputs of most operators to share one element type, so no
handler promotes dtypes; Python scalars (attributes) are weakly typed in JAX
and keep the tensor's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._table import Handler, NodeContext, handler, onnx_dtype, static_value

# This module's part of the op table (``optkit.onnx._ops`` assembles the table).
HANDLERS: list[Handler] = []

# ---------------------------------------------------------------------------
# helpers


def _axis(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """Normalize a possibly negative axis against ``rank``, naming the node on error."""
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def _axes(ctx: NodeContext, axes: Sequence[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    normalized = tuple(_axis(ctx, int(a), rank, what) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"{what} {list(axes)} repeats an axis")
    return normalized


def _is_integer(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.integer)


def _lowest(dtype: Any) -> Any:
    """The identity of ``max``: -inf for floats, the smallest value otherwise."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min


# ---------------------------------------------------------------------------
# element-wise arithmetic (multidirectional, i.e. NumPy, broadcasting from version 7)

# Operators that are one jax.numpy function (arithmetic, MatMul, comparisons, logic,
# Where), with every since_version whose semantics that function implements.
_ONE_FUNCTION = {
    "Add": (jnp.add, (7, 13, 14)),
    "Sub": (jnp.subtract, (7, 13, 14)),
    "Mul": (jnp.multiply, (7, 13, 14)),
    "Neg": (jnp.negative, (6, 13)),
    "Abs": (jnp.abs, (6, 13)),
    "Sqrt": (jnp.sqrt, (6, 13)),
    "Exp": (jnp.exp, (6, 13)),
    "Log": (jnp.log, (6, 13)),
    "Sigmoid": (jax.nn.sigmoid, (6, 13)),
    "Tanh": (jnp.tanh, (6, 13)),
    "MatMul": (jnp.matmul, (1, 9, 13)),
    "Equal": (jnp.equal, (7, 11, 13, 19)),
    "Less": (jnp.less, (7, 9, 13)),
    "Greater": (jnp.greater, (7, 9, 13)),
    "GreaterOrEqual": (jnp.greater_equal, (12, 16)),
    "LessOrEqual": (jnp.less_equal, (12, 16)),
    "And": (jnp.logical_and, (7,)),
    "Or": (jnp.logical_or, (7,)),
    "Not": (jnp.logical_not, (1,)),
    "Where": (jnp.where, (9, 16)),
}
for _op_type, (_fn, _versions) in _ONE_FUNCTION.items():
    handler(HANDLERS, _op_type, *_versions)(lambda ctx, fn=_fn: fn)


@handler(HANDLERS, "Div", 7, 13, 14)
def _div(ctx):
    def div(a, b):
        # Integer Div truncates toward zero, as C does (test_div_int32_trunc).
        if _is_integer(a):
            a, b = jnp.broadcast_arrays(a, b)
            return lax.div(a, b)
        return jnp.divide(a, b)

    return div


@handler(HANDLERS, "Pow", 7, 12, 13, 15)
def _pow(ctx):
    def power(x, y):
        x_dtype = jnp.result_type(x)
        y_dtype = jnp.result_type(y)
        # The result has the base's type (Pow-12 allows a different exponent type).
        if jnp.issubdtype(x_dtype, jnp.integer) and jnp.issubdtype(y_dtype, jnp.floating):
            return jnp.power(jnp.asarray(x).astype(y_dtype), y).astype(x_dtype)
        return jnp.power(x, jnp.asarray(y).astype(x_dtype))

    return power


@handler(HANDLERS, "Relu", 6, 13, 14)
def _relu(ctx):
    return lambda x: jnp.maximum(x, jnp.zeros((), jnp.result_type(x)))


@handler(HANDLERS, "LeakyRelu", 6, 16)
def _leaky_relu(ctx):
    alpha = ctx.attrs["alpha"]
    return lambda x: jnp.where(x >= 0, x, alpha * x)


# ---------------------------------------------------------------------------
# Softmax family


def _softmax_builder(fn):
    def build(ctx):
        if ctx.version >= 13:
            axis = ctx.attrs.get("axis", -1)

            def softmax(x):
                return fn(x, axis=_axis(ctx, axis, jnp.ndim(x)))

            return softmax

        # Before opset 13 the input is coerced to 2-D at `axis` (default 1):
        # [prod(shape[:axis]), prod(shape[axis:])], normalized along the second.
        axis = ctx.attrs.get("axis", 1)

        def softmax_2d(x):
            rank = jnp.ndim(x)
            a = _axis(ctx, axis, rank) if rank else 0
            shape = jnp.shape(x)
            flat = jnp.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))
            return jnp.reshape(fn(flat, axis=1), shape)

        return softmax_2d

    return build


handler(HANDLERS, "Softmax", 1, 11, 13)(_softmax_builder(jax.nn.softmax))
handler(HANDLERS, "LogSoftmax", 1, 11, 13)(_softmax_builder(jax.nn.log_softmax))


# ---------------------------------------------------------------------------
# linear algebra


@handler(HANDLERS, "Gemm", 7, 9, 11, 13)
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


# ---------------------------------------------------------------------------
# convolution and pooling


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


@handler(HANDLERS, "Conv", 1, 11, 22)
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


@handler(HANDLERS, "MaxPool", 1, 8, 10, 11, 12, 22)
def _max_pool(ctx):
    if ctx.has_output(1):
        raise ctx.unsupported("the Indices output is not supported; leave the second output out")
    if ctx.version < 8 and ctx.attrs.get("storage_order", 0):
        raise ctx.unsupported("storage_order is only used by the Indices output")

    def max_pool(x):
        kernel, strides, dilations, padding, _ = _pool_geometry(ctx, x, dilations_allowed=ctx.version >= 10)
        init = jnp.asarray(_lowest(jnp.result_type(x)), jnp.result_type(x))
        return _reduce_window(x, init, lax.max, kernel, strides, dilations, padding)

    return max_pool


@handler(HANDLERS, "AveragePool", 1, 7, 10, 11, 19, 22)
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


@handler(HANDLERS, "GlobalAveragePool", 1, 22)
def _global_average_pool(ctx):
    def global_average_pool(x):
        if jnp.ndim(x) < 3:
            raise ctx.error(f"X must be (N, C, D1, ...), got shape {jnp.shape(x)}")
        return jnp.mean(x, axis=tuple(range(2, jnp.ndim(x))), keepdims=True)

    return global_average_pool


# ---------------------------------------------------------------------------
# shapes


@handler(HANDLERS, "Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def _flatten(ctx):
    axis = ctx.attrs.get("axis", 1)

    def flatten(x):
        rank = jnp.ndim(x)
        if not -rank <= axis <= rank:
            raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
        a = axis % rank if axis < 0 else axis
        shape = jnp.shape(x)
        return jnp.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))

    return flatten


@handler(HANDLERS, "Reshape", 5, 13, 14, 19, 21, 23, 24, 25, static_inputs=(1,))
def _reshape(ctx):
    allowzero = bool(ctx.attrs.get("allowzero", 0))

    def reshape(x, shape):
        target = [int(d) for d in static_value(shape, ctx, "shape").reshape(-1)]
        source = jnp.shape(x)
        if target.count(-1) > 1:
            raise ctx.error(f"shape {target} has more than one -1")
        if allowzero and 0 in target and -1 in target:
            raise ctx.error(f"shape {target} has both 0 and -1 with allowzero=1")
        resolved = []
        for i, d in enumerate(target):
            if d == 0 and not allowzero:
                if i >= len(source):
                    raise ctx.error(f"shape {target} copies dimension {i} (a 0), but the input "
                                    f"{source} has rank {len(source)}")
                d = source[i]
            elif d < -1:
                raise ctx.error(f"shape {target} has a negative dimension other than -1")
            resolved.append(d)
        if -1 in resolved:
            known = math.prod(d for d in resolved if d != -1)
            size = math.prod(source)
            if known == 0 or size % known:
                raise ctx.error(f"cannot reshape {source} to {target}")
            resolved[resolved.index(-1)] = size // known
        if math.prod(resolved) != math.prod(source):
            raise ctx.error(f"cannot reshape a tensor of shape {source} to {target} "
                            f"(resolved: {resolved})")
        return jnp.reshape(x, resolved)

    return reshape


@handler(HANDLERS, "Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(ctx):
    perm = ctx.attrs.get("perm")

    def transpose(x):
        rank = jnp.ndim(x)
        order = list(range(rank))[::-1] if perm is None else list(perm)
        if sorted(order) != list(range(rank)):
            raise ctx.error(f"perm {order} is not a permutation of the {rank} axes")
        return jnp.transpose(x, order)

    return transpose


@handler(HANDLERS, "Concat", 4, 11, 13)
def _concat(ctx):
    axis = ctx.attrs["axis"]

    def concat(*xs):
        xs = [x for x in xs if x is not None]
        return jnp.concatenate(xs, axis=_axis(ctx, axis, jnp.ndim(xs[0])))

    return concat


def _axes_attribute_or_input(ctx: NodeContext, axes: Any) -> list[int] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, a (static) input from 13."""
    if ctx.version < 13:
        return ctx.attrs.get("axes")
    value = static_value(axes, ctx, "axes")
    return None if value is None else [int(a) for a in value.reshape(-1)]


@handler(HANDLERS, "Unsqueeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,))
def _unsqueeze(ctx):
    def unsqueeze(x, axes=None):
        values = _axes_attribute_or_input(ctx, axes)
        if values is None:
            raise ctx.error("axes is required")
        rank = jnp.ndim(x) + len(values)
        return jnp.expand_dims(x, _axes(ctx, values, rank))

    return unsqueeze


@handler(HANDLERS, "Squeeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,))
def _squeeze(ctx):
    def squeeze(x, axes=None):
        values = _axes_attribute_or_input(ctx, axes)
        shape = jnp.shape(x)
        if values is None:
            return jnp.reshape(x, [d for d in shape if d != 1])
        normalized = _axes(ctx, values, len(shape))
        bad = [a for a in normalized if shape[a] != 1]
        if bad:
            raise ctx.error(f"cannot squeeze axes {bad} of shape {shape}: their size is not 1")
        return jnp.squeeze(x, normalized)

    return squeeze


@handler(HANDLERS, "Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def _identity(ctx):
    return lambda x: x


@handler(HANDLERS, "Shape", 1, 13, 15, 19, 21, 23, 24, 25, static_outputs=True)
def _shape(ctx):
    start = ctx.attrs.get("start", 0)
    end = ctx.attrs.get("end")

    def shape(x):
        # Shapes are static in XLA, so the result is a NumPy constant even under
        # jit, and Reshape/Unsqueeze can read it (PyTorch exports rely on this).
        return np.asarray(jnp.shape(x)[start:end], dtype=np.int64)

    return shape


@handler(HANDLERS, "Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def _constant(ctx):
    given = [k for k in ctx.attrs if k.startswith("value") or k == "sparse_value"]
    if len(given) != 1:
        raise ctx.error(f"exactly one value attribute must be given, got {given}")
    key = given[0]
    if key in ("value_string", "value_strings", "sparse_value"):
        raise ctx.unsupported(f"attribute {key!r} is not supported (string and sparse tensors)")
    value = ctx.attrs[key]
    if key in ("value_float", "value_floats"):
        value = np.asarray(value, np.float32)
    elif key in ("value_int", "value_ints"):
        value = np.asarray(value, np.int64)
    else:
        value = np.asarray(value)
    value.setflags(write=False)
    return lambda: value


# ---------------------------------------------------------------------------
# reductions


def _reduce_builder(fn, input_axes_since: int):
    """ReduceX: axes as an attribute before ``input_axes_since``, a (static) input from it."""

    def build(ctx):
        keepdims = bool(ctx.attrs.get("keepdims", 1))
        noop = bool(ctx.attrs.get("noop_with_empty_axes", 0))
        axes_input = ctx.version >= input_axes_since

        def reduce(x, axes=None):
            if axes_input:
                given = static_value(axes, ctx, "axes")
                values = None if given is None else [int(a) for a in given.reshape(-1)]
            else:
                values = ctx.attrs.get("axes")
            if not values:
                if noop and axes_input:
                    return x
                values = list(range(jnp.ndim(x)))
            normalized = _axes(ctx, values, jnp.ndim(x))
            return fn(x, normalized, keepdims)

        return reduce

    return build


def _reduce_max(x, axes, keepdims):
    dtype = jnp.result_type(x)
    empty = any(jnp.shape(x)[a] == 0 for a in axes)
    return jnp.max(x, axis=axes, keepdims=keepdims, initial=_lowest(dtype) if empty else None)


handler(HANDLERS, "ReduceSum", 1, 11, 13, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.sum(x, axis=a, keepdims=k), 13))
handler(HANDLERS, "ReduceMean", 1, 11, 13, 18, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.mean(x, axis=a, keepdims=k), 18))
handler(HANDLERS, "ReduceMax", 1, 11, 12, 13, 18, 20, static_inputs=(1,))(
    _reduce_builder(_reduce_max, 18))


# ---------------------------------------------------------------------------
# types and indexing


@handler(HANDLERS, "Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def _cast(ctx):
    dtype = onnx_dtype(ctx.attrs["to"], ctx.message("attribute 'to'"))

    def cast(x):
        return jnp.asarray(x).astype(dtype)

    return cast


@handler(HANDLERS, "Gather", 1, 11, 13)
def _gather(ctx):
    axis = ctx.attrs.get("axis", 0)

    def gather(x, indices):
        a = _axis(ctx, axis, jnp.ndim(x))
        size = jnp.shape(x)[a]
        if not _is_integer(indices):
            raise ctx.error(f"indices must be int32 or int64, got {jnp.result_type(indices)}")
        return jnp.take(x, _checked_indices(ctx, indices, size, f"axis {a}"), axis=a, mode="fill")

    return gather


def _checked_indices(ctx: NodeContext, indices: Any, size: int, where: str) -> Any:
    """Indices into an axis of ``size`` with negatives counted from the end, for ``mode="fill"``.

    Indices known at load time (constants) that are out of range raise here.
    Others are tested in their own dtype, and every out-of-range one becomes
    ``size``: JAX gathers with int32 indices when the axis fits, so an int64
    index of 2**32 + 1 would otherwise wrap to row 1; ``size`` is out of range
    in any dtype, and ``mode="fill"`` then gives NaN (floats) or the fill value
    of the type, as for any out-of-range index, never a valid element.
    """
    if isinstance(indices, (np.ndarray, np.generic)):
        values = np.asarray(indices)
        bad = values[(values < -size) | (values >= size)]
        if bad.size:
            raise ctx.error(f"indices {bad.tolist()[:8]} are out of range for {where} of size {size}")
    indices = jnp.asarray(indices)
    valid = (indices >= -size) & (indices < size)
    normalized = jnp.where(indices < 0, indices + size, indices)
    return jnp.where(valid, normalized, jnp.asarray(size, indices.dtype))


# ---------------------------------------------------------------------------
# losses


def _nll(ctx: NodeContext, log_prob, labels, weights, reduction: str, ignore_index):
    """NegativeLogLikelihoodLoss on (N, C, d...) log-probabilities and (N, d...) labels."""
    if jnp.ndim(log_prob) < 2:
        raise ctx.error(f"input must be (N, C) or (N, C, d1, ...), got shape {jnp.shape(log_prob)}")
    expected = jnp.shape(log_prob)[:1] + jnp.shape(log_prob)[2:]
    if jnp.shape(labels) != expected:
        raise ctx.error(f"target must have shape {expected} for input shape {jnp.shape(log_prob)}, "
                        f"got {jnp.shape(labels)}")
    if not _is_integer(labels):
        raise ctx.error(f"target must be int32 or int64, got {jnp.result_type(labels)}")
    dtype = jnp.result_type(log_prob)
    classes = jnp.shape(log_prob)[1]
    if ignore_index is None:
        keep = jnp.ones(jnp.shape(labels), bool)
    else:
        keep = labels != ignore_index
    if isinstance(labels, (np.ndarray, np.generic)):
        bad = np.asarray(labels)[np.asarray(keep) & ((labels < 0) | (labels >= classes))]
        if bad.size:
            raise ctx.error(f"target labels {bad.tolist()[:8]} are out of range for {classes} classes")
    # Tested in the labels' own dtype (an int64 label of 2**32 + 1 must not wrap to class 1).
    valid = (labels >= 0) & (labels < classes)
    # An ignored label may be out of range (e.g. -1): gather at 0, then zero it; a kept label out
    # of range gives NaN, as onnx.reference's IndexError would have stopped the run.
    safe = jnp.where(keep & valid, labels, 0)
    picked = jnp.take_along_axis(log_prob, jnp.expand_dims(safe, 1), axis=1)
    picked = jnp.where(keep & ~valid, jnp.asarray(jnp.nan, dtype), jnp.squeeze(picked, 1))
    weight = keep.astype(dtype)
    if weights is not None:
        weight = weight * jnp.take(weights, safe, axis=0)
    loss = -picked * weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        return jnp.sum(loss) / jnp.sum(weight)
    raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


@handler(HANDLERS, "NegativeLogLikelihoodLoss", 12, 13, 22)
def _negative_log_likelihood_loss(ctx):
    reduction = ctx.attrs.get("reduction", "mean")
    ignore_index = ctx.attrs.get("ignore_index")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")

    def nll(x, target, weight=None):
        return _nll(ctx, x, target, weight, reduction, ignore_index)

    return nll


@handler(HANDLERS, "SoftmaxCrossEntropyLoss", 12, 13)
def _softmax_cross_entropy_loss(ctx):
    reduction = ctx.attrs.get("reduction", "mean")
    ignore_index = ctx.attrs.get("ignore_index")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    want_log_prob = ctx.has_output(1)

    def softmax_cross_entropy_loss(scores, labels, weights=None):
        if jnp.ndim(scores) < 2:
            raise ctx.error(f"scores must be (N, C) or (N, C, d1, ...), got shape {jnp.shape(scores)}")
        log_prob = jax.nn.log_softmax(scores, axis=1)
        loss = _nll(ctx, log_prob, labels, weights, reduction, ignore_index)
        if len(ctx.outputs) == 1:
            return loss
        return loss, (log_prob if want_log_prob else None)

    return softmax_cross_entropy_loss


# ---------------------------------------------------------------------------
# comparisons, selection and slicing (masks and clipping in real graphs, and
# the function bodies of the loss operators: ONNX's "_expanded" test cases)


def _variadic_builder(fn):
    def build(ctx):
        def variadic(*xs):
            result = xs[0]
            for x in xs[1:]:
                result = fn(result, x)
            return result

        return variadic

    return build


handler(HANDLERS, "Max", 8, 12, 13)(_variadic_builder(jnp.maximum))
handler(HANDLERS, "Min", 8, 12, 13)(_variadic_builder(jnp.minimum))


@handler(HANDLERS, "CastLike", 15, 19, 21, 23, 24, 25)
def _cast_like(ctx):
    def cast_like(x, target):
        return jnp.asarray(x).astype(jnp.result_type(target))

    return cast_like


@handler(HANDLERS, "GatherElements", 11, 13)
def _gather_elements(ctx):
    axis = ctx.attrs.get("axis", 0)

    def gather_elements(x, indices):
        rank = jnp.ndim(x)
        if jnp.ndim(indices) != rank:
            raise ctx.error(f"data and indices must have the same rank, got shapes {jnp.shape(x)} "
                            f"and {jnp.shape(indices)}")
        a = _axis(ctx, axis, rank)
        size = jnp.shape(x)[a]
        if any(i > d for k, (i, d) in enumerate(zip(jnp.shape(indices), jnp.shape(x))) if k != a):
            raise ctx.error(f"indices {jnp.shape(indices)} must not exceed data {jnp.shape(x)} "
                            f"outside axis {a}")
        # Outside `axis` the output uses the leading part of data (no broadcasting).
        x = x[tuple(slice(None) if k == a else slice(0, i) for k, i in enumerate(jnp.shape(indices)))]
        indices = _checked_indices(ctx, indices, size, f"axis {a}")
        return jnp.take_along_axis(x, indices, axis=a, mode="fill")

    return gather_elements


@handler(HANDLERS, "Slice", 10, 11, 13, static_inputs=(1, 2, 3, 4))
def _slice(ctx):
    def slice_(x, starts, ends, axes=None, steps=None):
        starts = [int(v) for v in static_value(starts, ctx, "starts").reshape(-1)]
        ends = [int(v) for v in static_value(ends, ctx, "ends").reshape(-1)]
        rank = jnp.ndim(x)
        axes = list(range(len(starts))) if axes is None else [
            int(v) for v in static_value(axes, ctx, "axes").reshape(-1)]
        steps = [1] * len(starts) if steps is None else [
            int(v) for v in static_value(steps, ctx, "steps").reshape(-1)]
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have "
                            f"the same length")
        index = [slice(None)] * rank
        for a, start, end, step in zip(_axes(ctx, axes, rank), starts, ends, steps):
            if step == 0:
                raise ctx.error("steps must not be 0")
            dim = jnp.shape(x)[a]
            start = start + dim if start < 0 else start
            end = end + dim if end < 0 else end
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[a] = slice(start, end if end >= 0 else None, step)
        return x[tuple(index)]

    return slice_


handler(HANDLERS, "ReduceSumSquare", 1, 11, 13, 18, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.sum(x * x, axis=a, keepdims=k), 18))
