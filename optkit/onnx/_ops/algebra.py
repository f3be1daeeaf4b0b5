"""Tensor algebra and signal windows: Einsum, Det, Hardmax, LpNormalization, Hann/Hamming/Blackman windows."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import axis_index
from optkit.onnx._ops._registry import Family
from optkit.onnx._ops._values import onnx_dtype

OPS = Family("algebra")


@OPS.op("Einsum", 12, 28)
def _einsum(ctx):
    equation = ctx.attrs.get("equation", "").replace(" ", "")
    if not equation:
        raise ctx.error("the equation attribute is required")

    def einsum(*operands):
        try:
            return jnp.einsum(equation, *operands)
        except ValueError as err:
            raise ctx.error(f"equation {equation!r} does not fit the operands' shapes "
                            f"{[jnp.shape(o) for o in operands]}: {err}") from None

    return einsum


@OPS.op("Det", 11, 22)
def _det(ctx):
    return jnp.linalg.det


@OPS.op("Hardmax", 1, 11, 13)
def _hardmax(ctx):
    axis = int(ctx.attrs.get("axis", -1 if ctx.version >= 13 else 1))

    def hardmax(x):
        x = jnp.asarray(x)
        a = axis_index(ctx, axis, x.ndim)
        if ctx.version >= 13:  # along one axis
            hot = jnp.argmax(x, axis=a, keepdims=True) == jnp.expand_dims(
                jnp.arange(x.shape[a]), tuple(i for i in range(x.ndim) if i != a))
            return hot.astype(x.dtype)
        flat = jnp.reshape(x, (int(np.prod(x.shape[:a])), -1))  # versions 1 and 11: axes a.. flattened
        hot = jnp.argmax(flat, axis=1, keepdims=True) == jnp.arange(flat.shape[1])[None, :]
        return jnp.reshape(hot.astype(x.dtype), x.shape)

    return hardmax


@OPS.op("LpNormalization", 1, 22)
def _lp_normalization(ctx):
    axis, p = int(ctx.attrs.get("axis", -1)), int(ctx.attrs.get("p", 2))
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")

    def lp_normalization(x):
        x = jnp.asarray(x)
        a = axis_index(ctx, axis, x.ndim)
        norm = jnp.sum(jnp.abs(x), axis=a, keepdims=True) if p == 1 else jnp.sqrt(
            jnp.sum(x * x, axis=a, keepdims=True))
        return jnp.where(norm == 0, jnp.zeros_like(x), x / jnp.where(norm == 0, 1, norm))

    return lp_normalization


@OPS.op("HannWindow", 17, static_inputs=(0,), params=((0.5, 0.5, 0.0),))
@OPS.op("HammingWindow", 17, static_inputs=(0,), params=((25 / 46, 21 / 46, 0.0),))
@OPS.op("BlackmanWindow", 17, static_inputs=(0,), params=((0.42, 0.5, 0.08),))
def _window(ctx, coefficients):
    """``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)``, ``N = size`` (periodic) or ``size - 1`` (symmetric)."""
    periodic = bool(ctx.attrs.get("periodic", 1))
    dtype = onnx_dtype(ctx.attrs.get("output_datatype", 1), ctx.message("output_datatype"))
    a0, a1, a2 = coefficients

    def window(size):
        n = int(np.reshape(size, -1)[0])
        ctx.check_size((max(n, 0),), dtype, "the window")
        denominator = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        angle = 2 * np.pi * k / (denominator if denominator else 1)
        return (a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)).astype(dtype)

    return window
