"""Indexing and rearranging: Scatter*, TopK, OneHot, Compress, NonZero, Unique, NonMaxSuppression,
ReverseSequence, EyeLike, DepthToSpace, SpaceToDepth, CenterCropPad.

``Compress``, ``NonZero``, ``Unique`` and ``NonMaxSuppression`` give outputs whose size depends on
values: they run on concrete values (between the compiled segments of ``prepare``'s default run, op by op
with ``jit=False``, or values known at load time); traced inside a caller's ``jax.jit``, they are refused
naming the node (:class:`~optkit.onnx._base.errors.ValueDependentError`). Sizes derived from values
(``TopK``'s ``k``, ``OneHot``'s depth) are static inputs, bounded before
anything is allocated.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._base.errors import RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._base.values import as_static, onnx_dtype
from optkit.onnx._ops._common import axis_index, checked_indices, sharded_like
from optkit.onnx._ops._registry import Family, Float16

OPS = Family("indexing")

_REDUCE = {"none": None, "add": "add", "mul": "multiply", "max": "max", "min": "min"}


def _scatter(target, index, updates, reduction):
    ref = target.at[index]
    return ref.set(updates, mode="drop") if reduction is None else getattr(ref, reduction)(updates, mode="drop")


@OPS.op("ScatterElements", 11, 13, 16, 18, float16=Float16(kernel_since=11))
@OPS.op("Scatter", 9, 11, float16=Float16(kernel_since=9, kernel_until=10))
def _scatter_elements(ctx):
    axis = int(ctx.attrs.get("axis", 0))
    reduction = _REDUCE.get(ctx.attrs.get("reduction", "none"), False)
    if reduction is False:
        raise ctx.error(f"reduction must be one of {list(_REDUCE)}, got {ctx.attrs.get('reduction')!r}")

    def scatter_elements(data, indices, updates):
        data = jnp.asarray(data)
        a = axis_index(ctx, axis, data.ndim)
        if jnp.shape(indices) != jnp.shape(updates) or jnp.ndim(indices) != data.ndim:
            raise ctx.error(f"indices {jnp.shape(indices)} and updates {jnp.shape(updates)} must have one shape, "
                            f"of the data's rank {data.ndim}")
        idx = checked_indices(ctx, indices, data.shape[a], f"axis {a}")
        grid = list(jnp.meshgrid(*(jnp.arange(n) for n in jnp.shape(indices)), indexing="ij"))
        grid[a] = idx
        return _scatter(data, tuple(grid), updates, reduction)

    return scatter_elements


@OPS.op("ScatterND", 11, 13, 16, 18, float16=Float16(kernel_since=11))
def _scatter_nd(ctx):
    reduction = _REDUCE.get(ctx.attrs.get("reduction", "none"), False)
    if reduction is False:
        raise ctx.error(f"reduction must be one of {list(_REDUCE)}, got {ctx.attrs.get('reduction')!r}")

    def scatter_nd(data, indices, updates):
        data = jnp.asarray(data)
        k = jnp.shape(indices)[-1]
        if k > data.ndim or jnp.shape(updates) != jnp.shape(indices)[:-1] + data.shape[k:]:
            raise ctx.error(f"updates {jnp.shape(updates)} do not fit indices {jnp.shape(indices)} into data "
                            f"{data.shape}")
        index = tuple(checked_indices(ctx, indices[..., i], data.shape[i], f"axis {i}") for i in range(k))
        return _scatter(data, index, updates, reduction)

    return scatter_nd


@OPS.op("TopK", 10, 11, 24, static_inputs=(1,))
def _top_k(ctx):
    axis = int(ctx.attrs.get("axis", -1))
    largest, ordered = bool(ctx.attrs.get("largest", 1)), bool(ctx.attrs.get("sorted", 1))

    def top_k(x, k):
        x = jnp.asarray(x)
        a = axis_index(ctx, axis, x.ndim)
        k = int(np.reshape(k, -1)[0])
        if not 0 <= k <= x.shape[a]:
            raise ctx.error(f"k={k} is out of range for an axis of {x.shape[a]}")
        moved = jnp.moveaxis(x, a, -1)
        # Ties keep the lower index first, as ONNX specifies: a stable sort on (value, index).
        # Descending by a key that reverses the order exactly: ~x for integers (-x wraps), -x for floats.
        key = (jnp.invert(moved) if jnp.issubdtype(moved.dtype, jnp.integer) else -moved) if largest else moved
        # (jnp.argsort's own iota would be unsharded next to a key split over explicit mesh axes: lax.sort refuses)
        # (the order has no derivative: the values taken by it carry the gradient)
        key = lax.stop_gradient(key)
        iota = sharded_like(lax.broadcasted_iota(jnp.int32, key.shape, key.ndim - 1), key)
        order = lax.sort((key, iota), dimension=key.ndim - 1, is_stable=True, num_keys=1)[1][..., :k]
        if not ordered:
            order = jnp.sort(order, axis=-1)
        values = jnp.take_along_axis(moved, order, axis=-1)
        return jnp.moveaxis(values, -1, a), jnp.moveaxis(order.astype(jnp.int64), -1, a)

    return top_k


@OPS.op("OneHot", 9, 11, 28, static_inputs=(1,))
def _one_hot(ctx):
    axis = int(ctx.attrs.get("axis", -1))

    def one_hot(indices, depth, values):
        depth = int(np.reshape(depth, -1)[0])
        if depth < 1:
            raise ctx.error(f"depth must be at least 1, got {depth}")
        rank = jnp.ndim(indices) + 1
        a = axis_index(ctx, axis, rank)
        shape = list(jnp.shape(indices))
        shape.insert(a, depth)
        ctx.check_size(tuple(shape), jnp.result_type(values), "the output")
        idx = jnp.asarray(indices).astype(jnp.int64)
        idx = jnp.where(idx < 0, idx + depth, idx)
        hot = jnp.expand_dims(idx, a) == jnp.arange(depth).reshape([depth if i == a else 1 for i in range(rank)])
        return jnp.where(hot, values[1], values[0])

    return one_hot


def _concrete(ctx, value, what):
    known = as_static(value)
    if known is None:
        raise ValueDependentError(ctx.message(f"its output size depends on the values of {what}: {RUNS_IN_SEGMENTS}"))
    return known


@OPS.op("Compress", 9, 11, 28, float16=Float16(kernel_since=9, moves_data=True))
def _compress(ctx):
    axis = ctx.attrs.get("axis")

    def compress(x, condition):
        keep = np.nonzero(np.reshape(_concrete(ctx, condition, "condition"), -1))[0]
        if axis is None:
            flat = jnp.reshape(x, -1)
            return jnp.take(flat, keep[keep < flat.shape[0]])
        a = axis_index(ctx, int(axis), jnp.ndim(x))
        return jnp.take(x, keep[keep < jnp.shape(x)[a]], axis=a)

    return compress


@OPS.op("NonZero", 9, 13)
def _non_zero(ctx):
    def non_zero(x):
        return np.asarray(np.nonzero(_concrete(ctx, x, "X")), np.int64).reshape(np.ndim(x), -1)

    return non_zero


def _box_edges(boxes, center_point_box):
    """``(x_min, x_max, y_min, y_max)`` of (num_boxes, 4) boxes: ``[y1, x1, y2, x2]`` in either corner order, or
    ``[x_center, y_center, width, height]``."""
    if center_point_box:
        return (boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 0] + boxes[:, 2] / 2,
                boxes[:, 1] - boxes[:, 3] / 2, boxes[:, 1] + boxes[:, 3] / 2)
    return (np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3]),
            np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2]))


def _overlaps(edges, box, chosen, iou_threshold):
    """True if box ``box`` overlaps any of the boxes ``chosen`` with an IoU above the threshold (ONNX's
    ``suppress_by_iou``: empty intersections and degenerate boxes never suppress)."""
    x0, x1, y0, y1 = (e[box] for e in edges)
    cx0, cx1, cy0, cy1 = (e[chosen] for e in edges)
    width = np.minimum(x1, cx1) - np.maximum(x0, cx0)
    height = np.minimum(y1, cy1) - np.maximum(y0, cy0)
    inter = width * height
    area, areas = (x1 - x0) * (y1 - y0), (cx1 - cx0) * (cy1 - cy0)
    union = area + areas - inter
    valid = (width > 0) & (height > 0) & (inter > 0) & (area > 0) & (areas > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return bool(np.any(valid & (inter / np.where(valid, union, 1) > iou_threshold)))


@OPS.op("NonMaxSuppression", 10, 11)
def _non_max_suppression(ctx):
    """ONNX's greedy selection per batch and class: boxes by descending score (ties: lower index first), those
    at or below ``score_threshold`` left out, each kept unless it overlaps a kept one by IoU > ``iou_threshold``,
    at most ``max_output_boxes_per_class``; the output is ``[batch, class, box]`` rows, int64."""
    center_point_box = int(ctx.attrs.get("center_point_box", 0))

    def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                            score_threshold=None):
        boxes, scores = _concrete(ctx, boxes, "boxes"), _concrete(ctx, scores, "scores")
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
                or scores.shape[2] != boxes.shape[1]:
            raise ctx.error(f"boxes (batches, boxes, 4) and scores (batches, classes, boxes) do not fit: "
                            f"shapes {boxes.shape} and {scores.shape}")
        limit = 0 if max_output_boxes_per_class is None or np.size(max_output_boxes_per_class) == 0 else max(
            int(np.reshape(_concrete(ctx, max_output_boxes_per_class, "max_output_boxes_per_class"), -1)[0]), 0)
        iou = 0.0 if iou_threshold is None or np.size(iou_threshold) == 0 else np.reshape(
            _concrete(ctx, iou_threshold, "iou_threshold"), -1)[0]
        floor = None if score_threshold is None or np.size(score_threshold) == 0 else np.reshape(
            _concrete(ctx, score_threshold, "score_threshold"), -1)[0]
        selected = []
        for b in range(boxes.shape[0]):
            edges = _box_edges(boxes[b], center_point_box)
            for c in range(scores.shape[1]):
                s = scores[b, c]
                order = np.lexsort((np.arange(s.size), -s))
                if floor is not None:
                    order = order[s[order] > floor]
                kept: list[int] = []
                for box in order:
                    if len(kept) >= limit:
                        break
                    if not kept or not _overlaps(edges, box, np.array(kept), iou):
                        kept.append(int(box))
                selected += [(b, c, box) for box in kept]
        return np.array(selected, np.int64).reshape(-1, 3)

    return non_max_suppression


@OPS.op("Unique", 11, 28)
def _unique(ctx):
    axis, ordered = ctx.attrs.get("axis"), bool(ctx.attrs.get("sorted", 1))

    def unique(x):
        x = _concrete(ctx, x, "X")
        a = None if axis is None else axis_index(ctx, int(axis), x.ndim)
        values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                                   axis=a)
        inverse = np.reshape(inverse, -1)
        if not ordered:  # in order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            values = np.take(values, order, axis=0 if a is None else a)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return values, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)

    return unique


@OPS.op("ReverseSequence", 10, 28, float16=Float16(kernel_since=10, moves_data=True))
def _reverse_sequence(ctx):
    batch_axis, time_axis = int(ctx.attrs.get("batch_axis", 1)), int(ctx.attrs.get("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.error(f"batch_axis and time_axis must be 0 and 1, got {batch_axis} and {time_axis}")

    def reverse_sequence(x, lens):
        x = jnp.asarray(x)
        steps = x.shape[time_axis]
        t = jnp.arange(steps).reshape([steps if i == time_axis else 1 for i in range(2)])
        n = jnp.reshape(lens, [-1 if i == batch_axis else 1 for i in range(2)]).astype(jnp.int64)
        source = jnp.where(t < n, n - 1 - t, t)  # (time, batch) or (batch, time)
        source = jnp.reshape(source, source.shape + (1,) * (x.ndim - 2))
        return jnp.take_along_axis(x, jnp.broadcast_to(source, x.shape), axis=time_axis)

    return reverse_sequence


@OPS.op("EyeLike", 9, 22)
def _eye_like(ctx):
    k = int(ctx.attrs.get("k", 0))
    declared = ctx.attrs.get("dtype")

    def eye_like(x):
        if jnp.ndim(x) != 2:
            raise ctx.error(f"the input must be 2-D, got shape {jnp.shape(x)}")
        dtype = onnx_dtype(declared, ctx.message("dtype")) if declared else jnp.result_type(x)
        return jnp.eye(*jnp.shape(x), k=k, dtype=dtype)

    return eye_like


def _block_attrs(ctx):
    """DepthToSpace's and SpaceToDepth's ``blocksize`` (>= 1) and ``mode`` ('DCR' or 'CRD')."""
    b, mode = int(ctx.attrs.get("blocksize", 0)), ctx.attrs.get("mode", "DCR")
    if b < 1 or mode not in ("DCR", "CRD"):
        raise ctx.error(f"blocksize must be >= 1 and mode 'DCR' or 'CRD', got {b} and {mode!r}")
    return b, mode


@OPS.op("DepthToSpace", 1, 11, 13, 28)
def _depth_to_space(ctx):
    b, mode = _block_attrs(ctx)

    def depth_to_space(x):
        n, c, h, w = jnp.shape(x)
        if c % (b * b):
            raise ctx.error(f"channels {c} are not a multiple of blocksize^2 = {b * b}")
        if mode == "DCR":
            y = jnp.transpose(jnp.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
        else:
            y = jnp.transpose(jnp.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
        return jnp.reshape(y, (n, c // (b * b), h * b, w * b))

    return depth_to_space


@OPS.op("SpaceToDepth", 1, 13, 28)
def _space_to_depth(ctx):
    b, mode = _block_attrs(ctx)

    def space_to_depth(x):
        n, c, h, w = jnp.shape(x)
        if h % b or w % b:
            raise ctx.error(f"height {h} and width {w} must be multiples of blocksize {b}")
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        y = jnp.transpose(jnp.reshape(x, (n, c, h // b, b, w // b, b)), perm)
        return jnp.reshape(y, (n, c * b * b, h // b, w // b))

    return space_to_depth


@OPS.op("CenterCropPad", 18, static_inputs=(1,))
def _center_crop_pad(ctx):
    axes = ctx.attrs.get("axes")

    def center_crop_pad(x, shape):
        x = jnp.asarray(x)
        targets = [int(s) for s in np.reshape(shape, -1)]
        chosen = list(range(x.ndim)) if axes is None else [axis_index(ctx, int(a), x.ndim) for a in axes]
        if len(targets) != len(chosen):
            raise ctx.error(f"shape {targets} gives {len(targets)} sizes for {len(chosen)} axes")
        out = list(x.shape)
        for a, t in zip(chosen, targets):
            out[a] = t
        ctx.check_size(tuple(out), x.dtype, "the output")
        for a, t in zip(chosen, targets):
            size = x.shape[a]
            if t < size:  # crop: the centre, the extra element taken from the end
                start = (size - t) // 2
                x = lax.slice_in_dim(x, start, start + t, axis=a)
            elif t > size:  # pad: the extra element added at the end
                before = (t - size) // 2
                widths = [(0, 0)] * x.ndim
                widths[a] = (before, t - size - before)
                x = jnp.pad(x, widths)
        return x

    return center_crop_pad
