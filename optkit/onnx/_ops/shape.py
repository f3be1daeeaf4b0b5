"""Shape operators: reshaping, transposing, joining, slicing and gathering tensors; Shape, Constant, Identity.

Values known before running (initializers, ``Constant`` outputs, ``Shape``
outputs, and what is computed from those alone) flow through the graph as
NumPy arrays; inputs that ONNX passes as tensors but XLA needs as static
values (``Reshape``'s ``shape``, ``Unsqueeze``'s ``axes``...) are declared as
``static_inputs`` and reach the handler as NumPy arrays.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._common import aligned, axis_index, axis_indices, checked_indices, reshape, take
from optkit.onnx._ops._registry import ELEMENTWISE, FLOAT16_KERNEL, MOVES_FLOAT16, Family, Float16, Layout, NodeContext

OPS = Family("shape")


@OPS.op("Flatten", 1, 9, 11, 13, 21, 23, 24, 25, float16=MOVES_FLOAT16)
def _flatten(ctx):
    axis = ctx.attrs.get("axis", 1)

    def flatten(x):
        rank = jnp.ndim(x)
        if not -rank <= axis <= rank:
            raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
        a = axis % rank if axis < 0 else axis
        shape = jnp.shape(x)
        return reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))

    return flatten


@OPS.op("Reshape", 5, 13, 14, 19, 21, 23, 24, 25, static_inputs=(1,), float16=MOVES_FLOAT16)
def _reshape(ctx):
    allowzero = bool(ctx.attrs.get("allowzero", 0))

    def reshape_node(x, shape):
        target = [int(d) for d in shape.reshape(-1)]
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
        return reshape(x, resolved)

    return reshape_node


@OPS.op("Transpose", 1, 13, 21, 23, 24, 25, layout=Layout("transpose"), float16=MOVES_FLOAT16)
def _transpose(ctx):
    perm = ctx.attrs.get("perm")

    def transpose(x):
        rank = jnp.ndim(x)
        order = list(range(rank))[::-1] if perm is None else list(perm)
        if sorted(order) != list(range(rank)):
            raise ctx.error(f"perm {order} is not a permutation of the {rank} axes")
        return jnp.transpose(x, order)

    return transpose


@OPS.op("Concat", 4, 11, 13, layout=Layout("concat"), float16=Float16(kernel_since=4, moves_data=True))
def _concat(ctx):
    axis = ctx.attrs["axis"]

    def concat(*xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise ctx.error("every input is absent (''); Concat needs at least one tensor")
        a = axis_index(ctx, axis, jnp.ndim(xs[0]))
        others = {(jnp.ndim(x), *jnp.shape(x)[:a], *jnp.shape(x)[a + 1:]) for x in xs}
        if len(others) != 1:
            raise ctx.error(f"the inputs must have one rank and the same sizes except on axis {axis}, got shapes "
                            f"{[jnp.shape(x) for x in xs]}")
        return jnp.concatenate(aligned(xs, skip=(jnp.ndim(xs[0]) - a,)), axis=a)

    return concat


def _axes_attribute_or_input(ctx: NodeContext, axes: Any) -> list[int] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, a (static) input from 13."""
    if ctx.version < 13:
        return ctx.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes.reshape(-1)]


@OPS.op("Unsqueeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,), float16=MOVES_FLOAT16)
def _unsqueeze(ctx):
    def unsqueeze(x, axes=None):
        values = _axes_attribute_or_input(ctx, axes)
        if values is None:
            raise ctx.error("axes is required")
        rank = jnp.ndim(x) + len(values)
        return jnp.expand_dims(x, axis_indices(ctx, values, rank))

    return unsqueeze


@OPS.op("Squeeze", 1, 11, 13, 21, 23, 24, 25, static_inputs=(1,), float16=MOVES_FLOAT16)
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


@OPS.op("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25, layout=ELEMENTWISE, float16=MOVES_FLOAT16)
def _identity(ctx):
    return lambda x: x


@OPS.op("Shape", 1, 13, 15, 19, 21, 23, 24, 25, static_outputs=True, float16=FLOAT16_KERNEL)
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


@OPS.op("Gather", 1, 11, 13, float16=MOVES_FLOAT16)
def _gather(ctx):
    axis = ctx.attrs.get("axis", 0)

    def gather(x, indices):
        a = axis_index(ctx, axis, jnp.ndim(x))
        size = jnp.shape(x)[a]
        return take(x, checked_indices(ctx, indices, size, f"axis {a}"), a)

    return gather


@OPS.op("GatherElements", 11, 13, float16=Float16(kernel_since=11, moves_data=True))
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
        if isinstance(x, np.ndarray) and isinstance(indices, np.ndarray):  # (constants, checked: in range)
            return np.take_along_axis(x, indices, axis=a)
        return jnp.take_along_axis(x, indices, axis=a, mode="fill")

    return gather_elements


@OPS.op("Slice", 1, float16=MOVES_FLOAT16)
def _slice_1(ctx):
    """Version 1: ``starts``, ``ends`` and ``axes`` are attributes."""
    starts, ends = np.asarray(ctx.attrs.get("starts", [])), np.asarray(ctx.attrs.get("ends", []))
    axes = ctx.attrs.get("axes")
    slice_ = _slice(ctx)
    return lambda x: slice_(x, starts, ends, None if axes is None else np.asarray(axes))


@OPS.op("Slice", 10, 11, 13, static_inputs=(1, 2, 3, 4), float16=MOVES_FLOAT16)
def _slice(ctx):
    def slice_(x, starts, ends, axes=None, steps=None):
        starts = [int(v) for v in starts.reshape(-1)]
        ends = [int(v) for v in ends.reshape(-1)]
        rank = jnp.ndim(x)
        axes = list(range(len(starts))) if axes is None else [
            int(v) for v in axes.reshape(-1)]
        steps = [1] * len(starts) if steps is None else [
            int(v) for v in steps.reshape(-1)]
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


def _ints(value: np.ndarray) -> list[int]:
    """A static input (a NumPy array) as a list of ints."""
    return [int(v) for v in value.reshape(-1)]


@OPS.op("Expand", 8, 13, static_inputs=(1,), float16=Float16(kernel_since=8, moves_data=True))
def _expand(ctx):
    def expand(x, shape):
        target = _ints(shape)
        if any(d < 0 for d in target):
            raise ctx.error(f"shape {target} has a negative dimension")
        try:  # bidirectional: a 1 in shape keeps X's dimension
            out = jnp.broadcast_shapes(jnp.shape(x), tuple(target))
        except ValueError:
            raise ctx.error(f"X {jnp.shape(x)} cannot be broadcast with shape {target}") from None
        ctx.check_size(out, jnp.result_type(x), "the output")
        return np.broadcast_to(x, out) if isinstance(x, np.ndarray) else jnp.broadcast_to(x, out)

    return expand


@OPS.op("ConstantOfShape", 9, 20, 21, 23, 24, 25, static_inputs=(0,), float16=Float16(kernel_since=9))
def _constant_of_shape(ctx):
    value = ctx.attrs.get("value")
    value = np.zeros((1,), np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ctx.error(f"value must hold one element, got shape {value.shape}")

    def constant_of_shape(shape):
        dims = _ints(shape)
        if any(d < 0 for d in dims):
            raise ctx.error(f"shape {dims} has a negative dimension")
        ctx.check_size(dims, value.dtype, "the output")
        out = np.full(dims, value.reshape(()), value.dtype)
        out.setflags(write=False)
        return out

    return constant_of_shape


@OPS.op("Range", 11, 27, static_inputs=(0, 1, 2))
def _range(ctx):
    stash = ctx.version >= 27 and ctx.attrs.get("stash_type", 1) == 1

    def range_(start, limit, delta):
        values = [start, limit, delta]
        if any(v.size != 1 for v in values):
            raise ctx.error(f"start, limit and delta must be scalars, got shapes {[v.shape for v in values]}")
        dtype = values[0].dtype
        start, limit, delta = (v.reshape(()) for v in values)
        if delta == 0:
            raise ctx.error("delta must not be 0")
        count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
        ctx.check_size((count,), dtype, "the output")
        # start + i * delta in the input type, as ONNX's definition computes it (Range-27 with
        # stash_type=1: float16 and bfloat16 in float32)
        work = np.float32 if stash and dtype in (np.float16, jnp.bfloat16) else dtype
        out = (start.astype(work) + np.arange(count, dtype=work) * delta.astype(work)).astype(dtype)
        out.setflags(write=False)
        return out

    return range_


@OPS.op("Tile", 6, 13, static_inputs=(1,))
def _tile(ctx):
    def tile(x, repeats):
        reps = _ints(repeats)
        if len(reps) != jnp.ndim(x) or any(r < 0 for r in reps):
            raise ctx.error(f"repeats {reps} must hold one non-negative count per axis of X {jnp.shape(x)}")
        ctx.check_size([d * r for d, r in zip(jnp.shape(x), reps)], jnp.result_type(x), "the output")
        return jnp.tile(x, reps)

    return tile


@OPS.op("Split", 2, 11, 13, 18, static_inputs=(1,), float16=Float16(kernel_since=2, moves_data=True))
def _split(ctx):
    axis = ctx.attrs.get("axis", 0)
    num_outputs = ctx.attrs.get("num_outputs")
    count = len(ctx.outputs)
    if ctx.version >= 18 and num_outputs is not None and num_outputs != count:
        raise ctx.error(f"num_outputs is {num_outputs} but the node has {count} outputs")

    def split(x, sizes=None):
        a = axis_index(ctx, axis, jnp.ndim(x))
        dim = jnp.shape(x)[a]
        given = ctx.attrs.get("split") if ctx.version < 13 else (
            None if sizes is None else _ints(sizes))
        if given is not None:
            if len(given) != count or any(s < 0 for s in given) or sum(given) != dim:
                raise ctx.error(f"split {given} must hold {count} non-negative sizes adding up to {dim}")
        elif ctx.version >= 18 and num_outputs is not None:
            chunk = -(-dim // count)  # the last output gets what is left (ONNX 18)
            given = [min(chunk, max(dim - i * chunk, 0)) for i in range(count)]
        else:
            if dim % count:
                raise ctx.error(f"axis {a} of size {dim} cannot be split evenly into {count} outputs")
            given = [dim // count] * count
        bounds = np.cumsum([0, *given])
        return tuple(lax.slice_in_dim(x, int(lo), int(hi), axis=a) for lo, hi in zip(bounds[:-1], bounds[1:]))

    return split


@OPS.op("Pad", 2, 11, 13, 18, 19, 21, 23, 24, 25, static_inputs=(1, 3))
def _pad(ctx):
    mode = ctx.attrs.get("mode", "constant")
    modes = {"constant": "constant", "reflect": "reflect", "edge": "edge"}
    if ctx.version >= 19:
        modes["wrap"] = "wrap"
    if mode not in modes:
        raise ctx.error(f"mode must be one of {sorted(modes)}, got {mode!r}")

    def pad(x, pads=None, constant_value=None, axes=None):
        rank = jnp.ndim(x)
        if ctx.version < 11:
            pads, value = list(ctx.attrs["pads"]), ctx.attrs.get("value", 0.0)
        else:
            pads = _ints(pads)
            value = 0 if constant_value is None else constant_value
            if jnp.size(value) != 1:
                raise ctx.error(f"constant_value must be a scalar, got shape {jnp.shape(value)}")
            value = jnp.reshape(value, ())
        named = list(range(rank)) if axes is None else list(axis_indices(ctx, _ints(axes), rank))
        if len(pads) != 2 * len(named):
            raise ctx.error(f"pads {pads} must hold 2 entries per padded axis ({len(named)} axes)")
        begin, end = [0] * rank, [0] * rank
        for i, a in enumerate(named):
            begin[a], end[a] = pads[i], pads[i + len(named)]
        shape = jnp.shape(x)
        # Negative pads crop first.
        x = x[tuple(slice(-min(b, 0), d + min(e, 0)) for b, e, d in zip(begin, end, shape))]
        shape = jnp.shape(x)
        if any(d < 0 for d in shape):
            raise ctx.error(f"pads {pads} crop more than the input {jnp.shape(x)} holds")
        widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
        ctx.check_size([d + b + e for d, (b, e) in zip(shape, widths)], jnp.result_type(x), "the output")
        if mode == "constant":
            return jnp.pad(x, widths, mode="constant", constant_values=jnp.asarray(value, jnp.result_type(x)))
        if mode in ("reflect", "edge", "wrap"):
            short = [a for a, (b, e) in enumerate(widths) if (b or e) and shape[a] == 0]
            if short or (mode == "reflect" and any((b or e) and (b >= shape[a] or e >= shape[a])
                                                   for a, (b, e) in enumerate(widths))):
                raise ctx.error(f"{mode} padding {widths} needs more of the input {shape} than it holds")
        return jnp.pad(x, widths, mode=modes[mode])

    return pad


@OPS.op("GatherND", 11, 12, 13, float16=Float16(kernel_since=11, moves_data=True))
def _gather_nd(ctx):
    batch_dims = int(ctx.attrs.get("batch_dims", 0))

    def gather_nd(x, indices):
        xs, ish = jnp.shape(x), jnp.shape(indices)
        if len(ish) < 1 or batch_dims < 0 or batch_dims >= min(len(xs), len(ish)):
            raise ctx.error(f"batch_dims {batch_dims} must be less than the ranks of data {xs} and indices {ish}")
        k = ish[-1]
        if xs[:batch_dims] != ish[:batch_dims] or k > len(xs) - batch_dims:
            raise ctx.error(f"indices {ish} do not fit data {xs} with batch_dims {batch_dims}")
        coords = [checked_indices(ctx, indices[..., i], xs[batch_dims + i], f"axis {batch_dims + i}")
                  for i in range(k)]

        def one(data, *cs):
            return jnp.asarray(data).at[tuple(cs)].get(mode="fill")  # data may be a NumPy initializer

        fn = one
        for _ in range(batch_dims):
            fn = jax.vmap(fn)
        return fn(x, *coords)

    return gather_nd


@OPS.op("Trilu", 14, static_inputs=(1,))
def _trilu(ctx):
    upper = bool(ctx.attrs.get("upper", 1))

    def trilu(x, k=None):
        if jnp.ndim(x) < 2:
            raise ctx.error(f"input must have rank >= 2, got shape {jnp.shape(x)}")
        diagonal = 0 if k is None else _ints(k)[0]
        return jnp.triu(x, diagonal) if upper else jnp.tril(x, diagonal)

    return trilu


@OPS.op("Size", 1, 13, 19, 21, 23, 24, 25, static_outputs=True)
def _size(ctx):
    return lambda x: np.asarray(math.prod(jnp.shape(x)), np.int64)
