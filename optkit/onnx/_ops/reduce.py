"""Reductions: ``Reduce*`` (axes an attribute, then a static input), ArgMax and ArgMin; CumSum and CumProd."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._common import axis_index, axis_indices, lowest
from optkit.onnx._ops._registry import Family

OPS = Family("reduce")


def _reduce_max(x, axes, keepdims):
    dtype = jnp.result_type(x)
    empty = any(jnp.shape(x)[a] == 0 for a in axes)
    return jnp.max(x, axis=axes, keepdims=keepdims, initial=lowest(dtype) if empty else None)


def _highest(dtype):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.inf
    return True if dtype == jnp.bool_ else jnp.iinfo(dtype).max


def _reduce_min(x, axes, keepdims):
    empty = any(jnp.shape(x)[a] == 0 for a in axes)
    return jnp.min(x, axis=axes, keepdims=keepdims, initial=_highest(jnp.result_type(x)) if empty else None)


def _log_sum_exp(x, axes, keepdims):
    # ONNX: log(sum(exp(x))), -inf over an empty set; max-shifted, so it does not overflow
    if any(jnp.shape(x)[a] == 0 for a in axes):
        return jnp.log(jnp.sum(jnp.exp(x), axis=axes, keepdims=keepdims))
    return jax.nn.logsumexp(x, axis=axes, keepdims=keepdims).astype(jnp.result_type(x))


def _sum(x, axes, keepdims):
    return jnp.sum(x, axis=axes, keepdims=keepdims)


def _mean(x, axes, keepdims):
    return jnp.mean(x, axis=axes, keepdims=keepdims)


def _sum_square(x, axes, keepdims):
    return jnp.sum(x * x, axis=axes, keepdims=keepdims)


def _prod(x, axes, keepdims):
    return jnp.prod(x, axis=axes, keepdims=keepdims)


def _l1(x, axes, keepdims):
    return jnp.sum(jnp.abs(x), axis=axes, keepdims=keepdims)


def _l2(x, axes, keepdims):
    return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdims)).astype(jnp.result_type(x))


def _log_sum(x, axes, keepdims):
    return jnp.log(jnp.sum(x, axis=axes, keepdims=keepdims))


# params: the reduction, and the version from which axes is an input rather than an attribute
@OPS.op("ReduceSum", 1, 11, 13, static_inputs=(1,), params=(_sum, 13))
@OPS.op("ReduceMean", 1, 11, 13, 18, static_inputs=(1,), params=(_mean, 18))
@OPS.op("ReduceMax", 1, 11, 12, 13, 18, 20, static_inputs=(1,), params=(_reduce_max, 18))
@OPS.op("ReduceSumSquare", 1, 11, 13, 18, static_inputs=(1,), params=(_sum_square, 18))
@OPS.op("ReduceMin", 1, 11, 12, 13, 18, 20, static_inputs=(1,), params=(_reduce_min, 18))
@OPS.op("ReduceProd", 1, 11, 13, 18, static_inputs=(1,), params=(_prod, 18))
@OPS.op("ReduceL1", 1, 11, 13, 18, static_inputs=(1,), params=(_l1, 18))
@OPS.op("ReduceL2", 1, 11, 13, 18, static_inputs=(1,), params=(_l2, 18))
@OPS.op("ReduceLogSum", 1, 11, 13, 18, 28, static_inputs=(1,), params=(_log_sum, 18))
@OPS.op("ReduceLogSumExp", 1, 11, 13, 18, 28, static_inputs=(1,), params=(_log_sum_exp, 18))
def _reduce(ctx, fn, input_axes_since: int):
    """ReduceX: axes as an attribute before ``input_axes_since``, a (static) input from it."""
    keepdims = bool(ctx.attrs.get("keepdims", 1))
    noop = bool(ctx.attrs.get("noop_with_empty_axes", 0))
    axes_input = ctx.version >= input_axes_since

    def reduce(x, axes=None):
        if axes_input:
            values = None if axes is None else [int(a) for a in axes.reshape(-1)]
        else:
            values = ctx.attrs.get("axes")
        if not values:
            if noop and axes_input:
                return x
            values = list(range(jnp.ndim(x)))
        normalized = axis_indices(ctx, values, jnp.ndim(x))
        return fn(x, normalized, keepdims)

    return reduce


@OPS.op("ArgMax", 11, 12, 13, params=(jnp.argmax,))
@OPS.op("ArgMin", 11, 12, 13, params=(jnp.argmin,))
def _arg(ctx, fn):
    """ArgMax/ArgMin: int64 indices along ``axis``; the first extreme, or the last with ``select_last_index``."""
    axis = ctx.attrs.get("axis", 0)
    keepdims = bool(ctx.attrs.get("keepdims", 1))
    last = bool(ctx.attrs.get("select_last_index", 0))

    def arg(x):
        a = axis_index(ctx, axis, jnp.ndim(x))
        if jnp.shape(x)[a] == 0:
            raise ctx.error(f"axis {a} of shape {jnp.shape(x)} is empty")
        if last:
            n = jnp.shape(x)[a]
            index = n - 1 - fn(jnp.flip(x, a), axis=a, keepdims=keepdims)
        else:
            index = fn(x, axis=a, keepdims=keepdims)
        return index.astype(jnp.int64)

    return arg


@OPS.op("CumSum", 11, 14, static_inputs=(1,), params=(jnp.cumsum, 0))
@OPS.op("CumProd", 26, static_inputs=(1,), params=(jnp.cumprod, 1))
def _cumulative(ctx, fn, identity):
    """A running sum or product along ``axis``; ``exclusive`` shifts it by one (the identity first), ``reverse``
    runs from the end."""
    exclusive = bool(ctx.attrs.get("exclusive", 0))
    reverse = bool(ctx.attrs.get("reverse", 0))

    def cumulative(x, axis):
        if np.size(axis) != 1:
            raise ctx.error(f"axis must hold one value, got {np.asarray(axis).tolist()}")
        a = axis_index(ctx, int(np.reshape(axis, -1)[0]), jnp.ndim(x))
        x = jnp.flip(x, a) if reverse else x
        y = fn(x, axis=a, dtype=jnp.result_type(x))
        if exclusive:  # shifted by one along the axis, the identity first
            n = jnp.shape(x)[a]
            first = jnp.full_like(lax.slice_in_dim(y, 0, min(n, 1), axis=a), identity)
            y = jnp.concatenate([first, lax.slice_in_dim(y, 0, max(n - 1, 0), axis=a)], axis=a)
        return jnp.flip(y, a) if reverse else y

    return cumulative
