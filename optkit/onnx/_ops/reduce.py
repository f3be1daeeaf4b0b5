"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceSumSquare (axes an attribute, then a static input)."""

from __future__ import annotations

import jax.numpy as jnp

from optkit.onnx._ops._common import axis_indices, lowest
from optkit.onnx._ops._registry import Family
from optkit.onnx._ops._values import static_value

OPS = Family("reduce")


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
            normalized = axis_indices(ctx, values, jnp.ndim(x))
            return fn(x, normalized, keepdims)

        return reduce

    return build


def _reduce_max(x, axes, keepdims):
    dtype = jnp.result_type(x)
    empty = any(jnp.shape(x)[a] == 0 for a in axes)
    return jnp.max(x, axis=axes, keepdims=keepdims, initial=lowest(dtype) if empty else None)


OPS.op("ReduceSum", 1, 11, 13, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.sum(x, axis=a, keepdims=k), 13))
OPS.op("ReduceMean", 1, 11, 13, 18, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.mean(x, axis=a, keepdims=k), 18))
OPS.op("ReduceMax", 1, 11, 12, 13, 18, 20, static_inputs=(1,))(
    _reduce_builder(_reduce_max, 18))


OPS.op("ReduceSumSquare", 1, 11, 13, 18, static_inputs=(1,))(
    _reduce_builder(lambda x, a, k: jnp.sum(x * x, axis=a, keepdims=k), 18))
