"""Resizing: ``Resize`` (versions 11 on: every mode, coordinate transformation, rounding, antialias, axes and
aspect-ratio policy) and ``Upsample`` / ``Resize-10`` (nearest, integer scales).

Resize is separable: each resized axis is interpolated on its own, as ONNX's
reference implementation does (``_interpolate_1d_along_axis``). For an axis,
the source coordinate of every output index, its neighbours and their
coefficients are computed in NumPy from the static sizes (float64, the
reference's arithmetic); the data are gathered along the axis and weighted in
JAX, so the result is differentiable in ``X``. Output sizes come from
``sizes`` or ``scales`` (static inputs) and are bounded before anything is
computed.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import axis_indices
from optkit.onnx._ops._registry import Family

OPS = Family("resize")

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _taps(mode: str, antialias: bool, scale: float) -> int:
    """The input elements each output element reads along one axis (the reference's coefficient count)."""
    if mode == "nearest" or (mode == "linear" and not antialias):
        return 2
    if not antialias:
        return 4
    reach = 1 if mode == "linear" else 2  # the kernel's half-width, stretched by 1 / scale when shrinking
    return 2 - 2 * int(np.floor(-reach / min(scale, 1.0)) + 1)


def _coefficients(mode, nearest_mode, antialias, a):
    """``ratios [m], scale -> coefficients [m, taps]`` of the neighbours (ONNX's reference ``_*_coeffs``, for all
    the output positions of an axis at once)."""
    if mode == "nearest":
        def nearest(r, scale):
            ceil = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5,
                    "floor": np.zeros(r.shape, bool), "ceil": np.ones(r.shape, bool)}[nearest_mode]
            ceil = np.where(r == np.floor(r), True, ceil)  # a whole ratio: the position itself
            return np.stack([~ceil, ceil], -1).astype(np.float64)
        return nearest
    if not antialias:
        if mode == "linear":
            return lambda r, scale: np.stack([1 - r, r], -1)

        def cubic(r, scale):
            q = 1 - r
            return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                             ((a + 2) * r - (a + 3)) * r * r + 1,
                             ((a + 2) * q - (a + 3)) * q * q + 1,
                             ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a], -1)
        return cubic

    def weight(x):
        x = np.abs(x)
        if mode == "linear":
            return np.clip(1 - x, 0, 1)
        return np.where(x <= 1, (a + 2) * x**3 - (a + 3) * x**2 + 1,
                        np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0.0))

    def antialiased(r, scale):
        n = _taps(mode, True, scale)
        start = (2 - n) // 2
        coeffs = weight((np.arange(start, start + n)[None, :] - r[:, None]) * min(scale, 1.0))
        return coeffs / coeffs.sum(axis=-1, keepdims=True)
    return antialiased


def _source(transform, out_size, scale, in_size, roi):
    """Each output index's source coordinate, and where it falls outside the input (tf_crop_and_resize)."""
    y = np.arange(out_size, dtype=np.float64)
    width = scale * in_size
    outside = None
    if transform == "align_corners":
        x = np.zeros(out_size) if width == 1 else y * (in_size - 1) / (width - 1)
    elif transform == "asymmetric":
        x = y / scale
    elif transform == "tf_crop_and_resize":
        x = (np.full(out_size, (roi[1] - roi[0]) * (in_size - 1) / 2) if width == 1
             else y * (roi[1] - roi[0]) * (in_size - 1) / (width - 1))
        x = x + roi[0] * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif transform == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif transform == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = in_size / 2 * (1 - out_size / width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def _resize_axis(x, axis, scale, out_size, coeffs_of, transform, roi, extrapolation, exclude_outside):
    """One axis of the reference's ``_interpolate_1d_along_axis``: gather the neighbours and weight them."""
    in_size = x.shape[axis]
    if out_size == 0:
        return jnp.zeros(x.shape[:axis] + (0,) + x.shape[axis + 1:], x.dtype)
    source, outside = _source(transform, out_size, scale, in_size, roi)
    floor = np.floor(source).astype(np.int64)
    ratios = np.where(source == floor, 1.0, source - floor)
    coeffs = np.asarray(coeffs_of(ratios, scale), np.float64)
    n = coeffs.shape[1]
    pad = int(math.ceil(n / 2))
    padded = source + pad
    base = np.floor(padded).astype(np.int64)
    frac = padded - base
    if n % 2 == 0:
        start = base + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        start = base + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    neighbours = start[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((neighbours < 0) | (neighbours >= in_size), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    gathered = jnp.take(x, np.clip(neighbours, 0, in_size - 1).reshape(-1), axis=axis)
    gathered = jnp.reshape(gathered, x.shape[:axis] + (out_size, n) + x.shape[axis + 1:])
    shape = (1,) * axis + coeffs.shape + (1,) * (x.ndim - axis - 1)
    result = jnp.sum(gathered * jnp.asarray(coeffs.reshape(shape), x.dtype), axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_size,) + (1,) * (x.ndim - axis - 1))
        result = jnp.where(mask, jnp.asarray(extrapolation, x.dtype), result)
    return result


def _plan(ctx, shape, axes, scales, sizes, roi, policy):
    """Per axis of the input: scale, output size, roi ``(start, end)`` (the reference's ``_interpolate_nd``)."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else list(axes)
    full_scales, out = [1.0] * rank, list(shape)
    rois = [(0.0, 1.0)] * rank
    if roi is not None and np.size(roi):
        roi = np.asarray(roi, np.float64).reshape(-1)
        if roi.size != 2 * len(axes):
            raise ctx.error(f"roi has {roi.size} values for {len(axes)} axes (2 per axis)")
        for i, a in enumerate(axes):
            rois[a] = (float(roi[i]), float(roi[len(axes) + i]))
    if sizes is not None and np.size(sizes):
        sizes = [int(s) for s in np.reshape(sizes, -1)]
        if len(sizes) != len(axes) or min(sizes) < 0:
            raise ctx.error(f"sizes {sizes} must give one non-negative size per resized axis ({len(axes)})")
        for a, s in zip(axes, sizes):
            full_scales[a], out[a] = s / shape[a] if shape[a] else 1.0, s
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(full_scales[a] for a in axes)
            for a in axes:
                full_scales[a], out[a] = scale, int(scale * shape[a] + 0.5)
    elif scales is not None and np.size(scales):
        scales = [float(s) for s in np.reshape(scales, -1)]
        if len(scales) != len(axes) or not all(0 < s < float("inf") for s in scales):
            raise ctx.error(f"scales {scales} must give one positive finite scale per resized axis ({len(axes)})")
        for a, s in zip(axes, scales):
            full_scales[a], out[a] = s, int(s * shape[a])
    else:
        raise ctx.error("one of scales and sizes must be given")
    return axes, full_scales, out, rois


@OPS.op("Resize", 11, 13, 18, 19, static_inputs=(1, 2, 3))
def _resize(ctx):
    a = ctx.attrs
    mode, transform = a.get("mode", "nearest"), a.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode, policy = a.get("nearest_mode", "round_prefer_floor"), a.get("keep_aspect_ratio_policy", "stretch")
    antialias = bool(a.get("antialias", 0))
    for name, value, allowed in (("mode", mode, _MODES), ("coordinate_transformation_mode", transform, _TRANSFORMS),
                                 ("nearest_mode", nearest_mode, _NEAREST),
                                 ("keep_aspect_ratio_policy", policy, ("stretch", "not_larger", "not_smaller"))):
        if value not in allowed:
            raise ctx.error(f"{name} must be one of {list(allowed)}, got {value!r}")
    if antialias and mode == "nearest":
        raise ctx.error("antialias applies to the linear and cubic modes only")
    coeffs_of = _coefficients(mode, nearest_mode, antialias, float(a.get("cubic_coeff_a", -0.75)))
    extrapolation, exclude = float(a.get("extrapolation_value", 0.0)), bool(a.get("exclude_outside", 0))

    def resize(x, roi=None, scales=None, sizes=None):
        shape = tuple(jnp.shape(x))
        axes = None if a.get("axes") is None else axis_indices(ctx, a["axes"], len(shape))
        axes, full_scales, out, rois = _plan(ctx, shape, axes, scales, sizes, roi, policy)
        ctx.check_size(tuple(out), jnp.result_type(x), "the resized output")
        dtype = jnp.result_type(x)
        work = dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32
        y = jnp.asarray(x).astype(work)
        for axis in axes:
            if math.isclose(full_scales[axis], 1.0) and out[axis] == y.shape[axis] and rois[axis] == (0.0, 1.0):
                continue
            taps = _taps(mode, antialias, full_scales[axis])
            read = (*y.shape[:axis], out[axis], taps, *y.shape[axis + 1:])
            ctx.check_work(math.prod(read), f"resizing axis {axis} to {out[axis]} reads {taps} input elements "
                                            f"for each output element")
            ctx.check_size(read, work, f"the input elements read to resize axis {axis}")
            y = _resize_axis(y, axis, full_scales[axis], out[axis], coeffs_of, transform, rois[axis], extrapolation,
                             exclude)
        if jnp.issubdtype(dtype, jnp.integer):
            info = jnp.iinfo(dtype)
            y = jnp.clip(jnp.round(y), info.min, info.max)
        return y.astype(dtype)

    return resize


@OPS.op("Upsample", 7, 9, static_inputs=(1,))
@OPS.op("Resize", 10, static_inputs=(1,))
def _upsample(ctx):
    """Nearest-neighbour upsampling by integer scales (each element repeated), the case ONNX's reference runs."""
    mode = ctx.attrs.get("mode", "nearest")
    fixed = ctx.attrs.get("scales") if ctx.version == 7 else None

    def upsample(x, scales=None):
        values = np.asarray(fixed if scales is None else scales, np.float64).reshape(-1)
        if values.size != jnp.ndim(x):
            raise ctx.error(f"scales {values.tolist()} must give one scale per axis of an input of rank {jnp.ndim(x)}")
        if mode != "nearest" or np.any(values != np.round(values)) or np.any(values < 1):
            raise ctx.unsupported(f"{ctx.op_type}-{ctx.version} runs nearest-neighbour upsampling by integer scales; "
                                  f"got mode {mode!r} and scales {values.tolist()} (use Resize-11 or later)")
        ctx.check_size(tuple(int(s * d) for s, d in zip(values, jnp.shape(x))), jnp.result_type(x), "the output")
        y = x
        for axis, s in enumerate(values):
            if s != 1:
                y = jnp.repeat(y, int(s), axis=axis)
        return y

    return upsample
