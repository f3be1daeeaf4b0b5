"""Shape operators: reshaping, transposing, joining, slicing and gathering tensors; Shape, Constant, Identity.

Values known before running (initializers, ``Constant`` outputs, ``Shape``
outputs, and what is computed from those alone) flow through the graph as
NumPy arrays; inputs that ONNX passes as tensors but XLA needs as static
values (``Reshape``'s ``shape``, ``Unsqueeze``'s ``axes``...) are read with
:func:`~optkit.onnx._ops._values.static_value`.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import axis_index, axis_indices, checked_indices
from optkit.onnx._ops._registry import Family, NodeContext
from optkit.onnx._ops._values import static_value

OPS = Family("shape")


@OPS.op("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
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


@OPS.op("Reshape", 5, 13, 14, 19, 21, 23, 24, 25, static_inputs=(1,))
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


@OPS.op("Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(ctx):
    perm = ctx.attrs.get("perm")

    def transpose(x):
        rank = jnp.ndim(x)
        order = list(range(rank))[::-1] if perm is None else list(perm)
        if sorted(order) != list(range(rank)):
            raise ctx.error(f"perm {order} is not a permutation of the {rank} axes")
        return jnp.transpose(x, order)

    return transpose


@OPS.op("Concat", 4, 11, 13)
def _concat(ctx):
    axis = ctx.attrs["axis"]

    def concat(*xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise ctx.error("every input is absent (''); Concat needs at least one tensor")
        return jnp.concatenate(xs, axis=axis_index(ctx, axis, jnp.ndim(xs[0])))

    return concat


def _axes_attribute_or_input(ctx: NodeContext, axes: Any) -> list[int] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, a (static) input from 13."""
    if ctx.version < 13:
        return ctx.attrs.get("axes")
    value = static_value(axes, ctx, "axes")
    return None if value is None else [int(a) for a in value.reshape(-1)]


@OPS.op("Unsqueeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,))
def _unsqueeze(ctx):
    def unsqueeze(x, axes=None):
        values = _axes_attribute_or_input(ctx, axes)
        if values is None:
            raise ctx.error("axes is required")
        rank = jnp.ndim(x) + len(values)
        return jnp.expand_dims(x, axis_indices(ctx, values, rank))

    return unsqueeze


@OPS.op("Squeeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,))
def _squeeze(ctx):
    def squeeze(x, axes=None):
        values = _axes_attribute_or_input(ctx, axes)
        shape = jnp.shape(x)
        if values is None:
            return jnp.reshape(x, [d for d in shape if d != 1])
        normalized = axis_indices(ctx, values, len(shape))
        bad = [a for a in normalized if shape[a] != 1]
        if bad:
            raise ctx.error(f"cannot squeeze axes {bad} of shape {shape}: their size is not 1")
        return jnp.squeeze(x, normalized)

    return squeeze


@OPS.op("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def _identity(ctx):
    return lambda x: x


@OPS.op("Shape", 1, 13, 15, 19, 21, 23, 24, 25, static_outputs=True)
def _shape(ctx):
    start = ctx.attrs.get("start", 0)
    end = ctx.attrs.get("end")

    def shape(x):
        # Shapes are static in XLA, so the result is a NumPy constant even under
        # jit, and Reshape/Unsqueeze can read it (PyTorch exports rely on this).
        return np.asarray(jnp.shape(x)[start:end], dtype=np.int64)

    return shape


@OPS.op("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
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


@OPS.op("Gather", 1, 11, 13)
def _gather(ctx):
    axis = ctx.attrs.get("axis", 0)

    def gather(x, indices):
        a = axis_index(ctx, axis, jnp.ndim(x))
        size = jnp.shape(x)[a]
        return jnp.take(x, checked_indices(ctx, indices, size, f"axis {a}"), axis=a, mode="fill")

    return gather


@OPS.op("GatherElements", 11, 13)
def _gather_elements(ctx):
    axis = ctx.attrs.get("axis", 0)

    def gather_elements(x, indices):
        rank = jnp.ndim(x)
        if jnp.ndim(indices) != rank:
            raise ctx.error(f"data and indices must have the same rank, got shapes {jnp.shape(x)} "
                            f"and {jnp.shape(indices)}")
        a = axis_index(ctx, axis, rank)
        size = jnp.shape(x)[a]
        if any(i > d for k, (i, d) in enumerate(zip(jnp.shape(indices), jnp.shape(x))) if k != a):
            raise ctx.error(f"indices {jnp.shape(indices)} must not exceed data {jnp.shape(x)} "
                            f"outside axis {a}")
        # Outside `axis` the output uses the leading part of data (no broadcasting).
        x = x[tuple(slice(None) if k == a else slice(0, i) for k, i in enumerate(jnp.shape(indices)))]
        indices = checked_indices(ctx, indices, size, f"axis {a}")
        return jnp.take_along_axis(x, indices, axis=a, mode="fill")

    return gather_elements


@OPS.op("Slice", 10, 11, 13, static_inputs=(1, 2, 3, 4))
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
        for a, start, end, step in zip(axis_indices(ctx, axes, rank), starts, ends, steps):
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
