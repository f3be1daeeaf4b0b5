"""Spatial sampling: ``GridSample`` (versions 16, 20, 22), ``AffineGrid`` (20), ``Col2Im`` (18), ``RoiAlign``
(10, 16, 22).

``GridSample`` reads ``X`` (N, C, D1, ..., Dr) at the normalized coordinates of
``grid`` (N, H1, ..., Hr, r), whose last axis lists them innermost spatial axis
first (x, y, z), as ONNX's reference implementation does: a coordinate is
denormalized (``align_corners``), rounded half to even for ``nearest``, brought
inside the border by ``padding_mode`` (``border`` clamps, ``reflection``
reflects; ``zeros`` leaves it), and interpolated separably from its 2 (linear)
or 4 (cubic, Keys' kernel with ``a = -0.75``) neighbours per axis, a neighbour
outside the input reading 0 (``zeros``), the nearest edge (``border``) or its
reflection. Every tap is a gather, so the result differentiates in ``X`` and
in ``grid`` (linear and cubic). Version 16 takes 4-D inputs and names the modes
``bilinear`` and ``bicubic``.

``Col2Im`` is the adjoint of sliding-window extraction (``torch.nn.Fold``): each
column of the (N, C * prod(block_shape), L) input is added into the image at
its block's position (strides, dilations), and the pads are cut off.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.errors import RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._base.values import as_static
from optkit.onnx._ops._common import reshape
from optkit.onnx._ops._registry import Family

OPS = Family("sampling")

_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}
_PADDING = ("zeros", "border", "reflection")


def _reflect(x, low, high):
    """``x`` reflected by the nearer border until it lies in ``[low, high]`` (ONNX's ``_gs_reflect``)."""
    span = high - low
    below, above = low - x, x - high
    dx = jnp.where(x < low, below, above)
    n = jnp.floor(dx / span)
    r = dx - n * span
    even = jnp.mod(n, 2) == 0
    from_low = jnp.where(even, low + r, high - r)
    from_high = jnp.where(even, high - r, low + r)
    return jnp.where(x < low, from_low, jnp.where(x > high, from_high, x))


def _cubic_weights(t):
    """Keys' cubic convolution coefficients (``a = -0.75``) of the taps at -1, 0, 1, 2 from ``floor(x)``."""
    a = -0.75
    t1, t2 = t + 1, 1 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


def _taps(x, size, mode, padding, low, high):
    """``[(index, weight)]`` of one axis's neighbours: integer indices inside ``[0, size)`` and weights (0 for a
    ``zeros`` neighbour outside the input)."""
    if mode == "nearest":
        taps = [(jnp.trunc(x), jnp.ones_like(x))]
    else:
        base = jnp.floor(x)
        t = x - base
        offsets, weights = ((0, 1), [1 - t, t]) if mode == "linear" else ((-1, 0, 1, 2), _cubic_weights(t))
        taps = [(base + k, w) for k, w in zip(offsets, weights)]
    out = []
    for index, weight in taps:
        if padding == "zeros":
            weight = jnp.where((index >= 0) & (index <= size - 1), weight, 0)
        elif padding == "reflection":
            index = jnp.trunc(_reflect(index, low, high))
        out.append((jnp.clip(index, 0, size - 1).astype(jnp.int32), weight))
    return out


@OPS.op("GridSample", 16, 20, 22)
def _grid_sample(ctx):
    mode = _MODES.get(ctx.attrs.get("mode", "bilinear" if ctx.version < 20 else "linear"))
    named = ("bilinear", "bicubic", "nearest") if ctx.version < 20 else ("linear", "cubic", "nearest")
    padding = ctx.attrs.get("padding_mode", "zeros")
    align = bool(ctx.attrs.get("align_corners", 0))
    if ctx.attrs.get("mode", named[0]) not in named or padding not in _PADDING:
        raise ctx.error(f"mode must be one of {named} and padding_mode one of {_PADDING}, got "
                        f"{ctx.attrs.get('mode')!r} and {padding!r}")

    def grid_sample(x, grid):
        shape, r = jnp.shape(x), jnp.ndim(x) - 2
        if r < 1 or (ctx.version < 20 and r != 2) or jnp.ndim(grid) != r + 2 or jnp.shape(grid)[-1] != r \
                or jnp.shape(grid)[0] != shape[0]:
            raise ctx.error(f"X (N, C, D1..Dr) and grid (N, H1..Hr, r) do not fit: shapes {shape} and "
                            f"{jnp.shape(grid)}" + (" (version 16 takes 4-D inputs)" if ctx.version < 20 else ""))
        n, c, spatial = shape[0], shape[1], shape[2:]
        out = jnp.shape(grid)[1:-1]
        ctx.check_size((n, c, *out), jnp.result_type(x), "the output")
        dtype = jnp.result_type(grid)
        axes_taps = []
        for i, size in enumerate(spatial):
            g = jnp.asarray(grid)[..., r - 1 - i]
            coord = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
            low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
            if mode == "nearest":
                coord = jnp.round(coord)  # half to even
            if padding == "border":
                coord = jnp.where((coord < low) | (coord > high), jnp.clip(coord, 0, size - 1), coord)
            elif padding == "reflection":
                coord = _reflect(coord, low, high)
            axes_taps.append(_taps(coord.astype(dtype), size, mode, padding, low, high))
        batch = jnp.reshape(jnp.arange(n), (n,) + (1,) * len(out))
        channels_last = jnp.moveaxis(jnp.asarray(x), 1, -1)  # (N, D1..Dr, C): one gather per tap
        y = 0
        for combo in itertools.product(*axes_taps):
            weight = math.prod(w for _, w in combo)
            y = y + channels_last[(batch, *(index for index, _ in combo))] * weight[..., None].astype(x.dtype)
        return jnp.moveaxis(jnp.asarray(y, jnp.result_type(x)), -1, 1)

    return grid_sample


@OPS.op("AffineGrid", 20, static_inputs=(1,))
def _affine_grid(ctx):
    """``grid[n, ..., :] = theta[n] @ (x, y[, z], 1)`` over the normalized base coordinates of ``size``
    (``align_corners``: -1 and 1 at the corner pixels' centres, else at their outer edges)."""
    align = bool(ctx.attrs.get("align_corners", 0))

    def affine_grid(theta, size):
        size = [int(v) for v in np.reshape(size, -1)]
        r = len(size) - 2
        if r not in (2, 3) or jnp.shape(theta) != (size[0], r, r + 1):
            raise ctx.error(f"size must be (N, C, H, W) or (N, C, D, H, W) and theta (N, {r}, {r + 1}); got "
                            f"size {size} and theta {jnp.shape(theta)}")
        ctx.check_size((size[0], *size[2:], r), jnp.result_type(theta), "the grid")
        dtype = jnp.result_type(theta)

        def base(k):
            steps = jnp.arange(k, dtype=dtype)
            if k == 1:
                return jnp.zeros(1, dtype)
            return -1 + 2 * steps / (k - 1) if align else (-1 + (2 * steps + 1) / k)

        mesh = jnp.meshgrid(*(base(k) for k in size[2:]), indexing="ij")  # D, H, W order
        points = jnp.stack([*mesh[::-1], jnp.ones_like(mesh[0])], axis=-1)  # (..., x, y[, z], 1)
        return jnp.einsum("...k,njk->n...j", points, theta)

    return affine_grid


@OPS.op("Col2Im", 18, static_inputs=(1, 2))
def _col2im(ctx):
    def col2im(cols, image_shape, block_shape):
        image = [int(v) for v in np.reshape(image_shape, -1)]
        block = [int(v) for v in np.reshape(block_shape, -1)]
        r = len(image)
        dilations = list(ctx.attrs.get("dilations") or [1] * r)
        strides = list(ctx.attrs.get("strides") or [1] * r)
        pads = list(ctx.attrs.get("pads") or [0] * (2 * r))
        if len(block) != r or len(dilations) != r or len(strides) != r or len(pads) != 2 * r or min(
                [*image, *block, *dilations, *strides], default=1) < 1:
            raise ctx.error(f"image_shape {image}, block_shape {block}, dilations {dilations}, strides {strides} "
                            f"and pads {pads} do not describe {r} positive spatial axes")
        padded = [size + pads[i] + pads[i + r] for i, size in enumerate(image)]
        counts = [(p - (k - 1) * d - 1) // s + 1 for p, k, d, s in zip(padded, block, dilations, strides)]
        n, channels_blocks, length = jnp.shape(cols)
        kernel = math.prod(block)
        if min(counts) < 1 or math.prod(counts) != length or channels_blocks % kernel:
            raise ctx.error(f"input of shape {jnp.shape(cols)} does not fit blocks {block} sliding over "
                            f"{padded} (with pads) in {counts} steps")
        c = channels_blocks // kernel
        ctx.check_size((n, c, *padded), jnp.result_type(cols), "the padded image")
        columns = jnp.reshape(cols, (n, c, kernel, *counts))
        out = jnp.zeros((n, c, *padded), jnp.result_type(cols))
        for k, offset in enumerate(itertools.product(*(range(b) for b in block))):
            where = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                          for o, d, s, m in zip(offset, dilations, strides, counts))
            out = out.at[(slice(None), slice(None), *where)].add(columns[:, :, k])
        return out[(slice(None), slice(None), *(slice(pads[i], pads[i] + image[i]) for i in range(r)))]

    return col2im


def _roi_axis(start, bin_size, grid, grid_max, pooled, size):
    """One axis of RoiAlign's samples (ONNX's ``pre_calc_for_bilinear_interpolate``): for each roi, output
    index and sample (R, pooled, grid_max), the two neighbours' indices, their weights, and whether the sample
    counts (inside the roi's own grid, and not beyond -1 or ``size``)."""
    step = jnp.arange(pooled)[None, :, None]
    sample = jnp.arange(grid_max)[None, None, :]
    grid = grid[:, None, None]
    coord = start[:, None, None] + step * bin_size[:, None, None] + (sample + 0.5) * bin_size[:, None, None] / grid
    counts = (sample < grid) & (coord >= -1.0) & (coord <= size)
    coord = jnp.maximum(coord, 0)
    low = jnp.floor(coord).astype(jnp.int32)
    at_edge = low >= size - 1
    low = jnp.where(at_edge, size - 1, low)
    high = jnp.where(at_edge, size - 1, low + 1)
    frac = jnp.where(at_edge, 0, coord - low)
    return low, high, 1 - frac, frac, counts


@OPS.op("RoiAlign", 10, 16, 22)
def _roi_align(ctx):
    """Each roi (x1, y1, x2, y2, scaled by ``spatial_scale``; ``half_pixel`` shifts by -0.5 from version 16)
    split into ``output_height x output_width`` bins, each the average (or the maximum of the weighted corner
    values, as ONNX's reference computes ``max``) of bilinear samples on a regular grid of ``sampling_ratio``
    per axis, or ``ceil(bin size)`` when it is 0 (then the rois must be known: run op by op)."""
    mode = ctx.attrs.get("mode", "avg")
    transform = ctx.attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.version >= 16
                              else "output_half_pixel")
    pooled_h, pooled_w = int(ctx.attrs.get("output_height", 1)), int(ctx.attrs.get("output_width", 1))
    ratio, scale = int(ctx.attrs.get("sampling_ratio", 0)), float(ctx.attrs.get("spatial_scale", 1.0))
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel") or min(
            pooled_h, pooled_w) < 1 or ratio < 0:
        raise ctx.error(f"mode {mode!r}, coordinate_transformation_mode {transform!r}, output size "
                        f"{pooled_h}x{pooled_w} or sampling_ratio {ratio} out of range")

    def roi_align(x, rois, batch_indices):
        if jnp.ndim(x) != 4 or jnp.ndim(rois) != 2 or jnp.shape(rois)[1] != 4 or jnp.shape(batch_indices) != (
                jnp.shape(rois)[0],):
            raise ctx.error(f"X (N, C, H, W), rois (R, 4) and batch_indices (R,) do not fit: shapes {jnp.shape(x)}, "
                            f"{jnp.shape(rois)}, {jnp.shape(batch_indices)}")
        n_rois, (_, channels, height, width) = jnp.shape(rois)[0], jnp.shape(x)
        ctx.check_size((n_rois, channels, pooled_h, pooled_w), jnp.result_type(x), "the output")
        offset = 0.5 if transform == "half_pixel" else 0.0
        boxes = jnp.asarray(rois).astype(jnp.result_type(x)) * scale - offset
        size_w, size_h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        if transform != "half_pixel":
            size_w, size_h = jnp.maximum(size_w, 1.0), jnp.maximum(size_h, 1.0)
        bin_h, bin_w = size_h / pooled_h, size_w / pooled_w
        if ratio > 0:
            grid_h = grid_w = jnp.full((n_rois,), ratio)
            max_h = max_w = ratio
        else:
            known_h, known_w = as_static(bin_h), as_static(bin_w)
            if known_h is None or known_w is None:
                raise ValueDependentError(ctx.message("with sampling_ratio 0 the sample grid depends on the rois' "
                                                      f"values: {RUNS_IN_SEGMENTS}"))
            grid_h, grid_w = np.ceil(known_h).astype(np.int64), np.ceil(known_w).astype(np.int64)
            max_h, max_w = max(int(grid_h.max(initial=1)), 1), max(int(grid_w.max(initial=1)), 1)
        ctx.check_size((n_rois, channels, pooled_h, pooled_w, max_h, max_w, 4), jnp.result_type(x), "the samples")
        y0, y1, wy0, wy1, in_y = _roi_axis(boxes[:, 1], bin_h, jnp.asarray(grid_h), max_h, pooled_h, height)
        x0, x1, wx0, wx1, in_x = _roi_axis(boxes[:, 0], bin_w, jnp.asarray(grid_w), max_w, pooled_w, width)
        image = jnp.moveaxis(jnp.asarray(x), 1, -1)[jnp.asarray(batch_indices).astype(jnp.int32)]  # (R, H, W, C)
        rows = jnp.arange(n_rois)[:, None, None, None, None]

        def corner(ys, xs, wy, wx):  # (R, ph, pw, gh, gw, C): the weighted corner value
            value = image[rows, ys[:, :, None, :, None], xs[:, None, :, None, :]]
            return value * (wy[:, :, None, :, None] * wx[:, None, :, None, :])[..., None]

        corners = [corner(y0, x0, wy0, wx0), corner(y0, x1, wy0, wx1), corner(y1, x0, wy1, wx0),
                   corner(y1, x1, wy1, wx1)]
        counts = (in_y[:, :, None, :, None] & in_x[:, None, :, None, :])[..., None]
        inside = (jnp.arange(max_h)[None, :, None] < jnp.asarray(grid_h)[:, None, None]) & (
            jnp.arange(max_w)[None, None, :] < jnp.asarray(grid_w)[:, None, None])  # (R, gh, gw)
        inside = inside[:, None, None, :, :, None]
        if mode == "avg":
            total = jnp.sum(jnp.where(counts, sum(corners), 0), axis=(3, 4))
            out = total / jnp.maximum(jnp.asarray(grid_h) * jnp.asarray(grid_w), 1)[:, None, None, None]
        else:  # a sample outside the image counts as 0 (its weights are 0), one beyond the roi's grid not at all
            # The largest of every sample's corners, picked by index: jnp.max's gradient finds its maximum by
            # equality, which XLA:CPU's fused multiply-adds broke under jax.jit (a zero gradient everywhere).
            candidates = jnp.stack([jnp.where(counts & inside, c, jnp.where(inside, 0, -jnp.inf)) for c in corners],
                                   axis=3)  # (R, ph, pw, 4, gh, gw, C)
            candidates = jnp.reshape(candidates, (*candidates.shape[:3], -1, channels))
            pick = jnp.argmax(jax.lax.stop_gradient(candidates), axis=3)[:, :, :, None]
            out = jnp.take_along_axis(candidates, pick, axis=3)[:, :, :, 0]
        return jnp.moveaxis(out, -1, 1).astype(jnp.result_type(x))

    return roi_align


@OPS.op("DeformConv", 19, 22)
def _deform_conv(ctx):
    """A 2-D convolution whose taps are moved by learned ``offset`` (N, offset_group * kH * kW * 2, oH, oW; each
    tap's (dy, dx)) and scaled by ``mask`` (N, offset_group * kH * kW, oH, oW; default 1): each tap samples its
    input channels bilinearly at its moved position, 0 outside the image (ONNX's ``DeformConv``: GridSample with
    ``align_corners``, zeros padding), then the taps are weighted by ``W`` (oC, C / group, kH, kW) as ``Conv``
    does, plus ``B``. Differentiable in X, W, offset, mask and B."""
    a = ctx.attrs
    group, offset_group = int(a.get("group", 1)), int(a.get("offset_group", 1))

    def deform_conv(x, w, offset, b=None, mask=None):
        x, w, offset = jnp.asarray(x), jnp.asarray(w), jnp.asarray(offset)
        if x.ndim != 4 or w.ndim != 4:
            raise ctx.unsupported(f"optkit runs the 2-D DeformConv (X of rank 4), got X {x.shape}")
        n, c, height, width = x.shape
        kh, kw = (int(k) for k in a.get("kernel_shape") or w.shape[2:])
        sh, sw = (int(s) for s in a.get("strides") or (1, 1))
        dh, dw = (int(d) for d in a.get("dilations") or (1, 1))
        top, left, bottom, right = (int(p) for p in a.get("pads") or (0, 0, 0, 0))
        oh = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
        ow = (width + left + right - (kw - 1) * dw - 1) // sw + 1
        taps = kh * kw
        if c != w.shape[1] * group or w.shape[0] % group or c % offset_group:
            raise ctx.error(f"X {x.shape}, W {w.shape}, group {group} and offset_group {offset_group} do not fit")
        if offset.shape != (n, offset_group * taps * 2, oh, ow):
            raise ctx.error(f"offset must be {(n, offset_group * taps * 2, oh, ow)}, got {offset.shape}")
        ctx.check_size((n, c, taps, oh, ow), x.dtype, "the sampled taps")
        dtype = x.dtype
        move = reshape(offset, (n, offset_group, taps, 2, oh, ow))
        ti, tj = np.divmod(np.arange(taps), kw)
        y = (np.arange(oh)[None, :, None] * sh - top + ti[:, None, None] * dh).astype(np.float64)
        xs = (np.arange(ow)[None, None, :] * sw - left + tj[:, None, None] * dw).astype(np.float64)
        y = jnp.asarray(y, dtype) + move[:, :, :, 0]  # (n, og, taps, oh, ow)
        xs = jnp.asarray(xs, dtype) + move[:, :, :, 1]
        # Each (image, offset group)'s pixels in a row, every tap's four corners gathered along it (a gather with
        # its batch axes aligned: sharded with the images on a mesh).
        image = reshape(x, (n, offset_group, c // offset_group, height * width))
        y0, x0 = jnp.floor(y), jnp.floor(xs)
        sampled = 0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xx, wx in ((x0, 1 - (xs - x0)), (x0 + 1, xs - x0)):
                inside = (yy >= 0) & (yy <= height - 1) & (xx >= 0) & (xx <= width - 1)
                at = (jnp.clip(yy, 0, height - 1) * width + jnp.clip(xx, 0, width - 1)).astype(jnp.int32)
                corner = jnp.take_along_axis(image, reshape(at, (n, offset_group, 1, taps * oh * ow)), axis=-1)
                weight = reshape(jnp.where(inside, wy * wx, 0).astype(dtype), (n, offset_group, 1, taps * oh * ow))
                sampled = sampled + corner * weight
        if mask is not None:
            sampled = sampled * reshape(jnp.asarray(mask).astype(dtype), (n, offset_group, 1, taps * oh * ow))
        cols = reshape(sampled, (n, group, c // group, taps, oh, ow))  # (n, og, c/og, taps*oh*ow) in channel order
        kernel = w.reshape(group, w.shape[0] // group, c // group, taps)
        out = jnp.einsum("ngctyx,goct->ngoyx", cols, kernel, precision=jax.lax.Precision.HIGHEST)
        out = reshape(out, (n, w.shape[0], oh, ow))
        if b is not None:
            out = out + jnp.asarray(b).astype(dtype)[None, :, None, None]
        return out

    return deform_conv
