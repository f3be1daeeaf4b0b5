"""Linear quantization: ``QuantizeLinear``, ``DequantizeLinear`` (2- to 16-bit integers, float 8 and float 4),
``DynamicQuantizeLinear``;
the integer kernels ``MatMulInteger``, ``QLinearMatMul``, ``ConvInteger``, ``QLinearConv`` (computed in float64,
exact for 8-bit products and their sums, then requantized as ONNX's reference implementations do).

``QuantizeLinear``: ``y = saturate(round_half_to_even(x / scale) + zero_point)`` in the zero point's type
(or ``output_dtype``, default uint8); ``DequantizeLinear``: ``y = (x - zero_point) * scale``; the scale and
zero point per tensor, per axis (a 1-D scale along ``axis``) or per block (``block_size`` along ``axis``), as
ONNX's reference implementation reads them. The 4- and 2-bit integers are ranges like the 8-bit ones; to a
float 8 type ``y = saturate(x / scale)`` (``saturate`` attribute; the zero point, which must be 0, is not
added), to float 4 ``y = cast(x / scale + zero_point)``.

A ``DequantizeLinear`` fed by a ``QuantizeLinear`` (the fake quantization a QDQ model is made of) is
differentiated with the straight-through estimator: the gradient with respect to ``x`` passes where ``x``
quantizes inside the type's range and is 0 where it saturates (see :func:`fake_quantize`). So is the
dynamically quantized matmul of ``quantize_dynamic``'s files, a ``Cast`` to float of a ``MatMulInteger`` of a
``DynamicQuantizeLinear``'s output (see :func:`dynamic_matmul`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._cast import FLOAT8, cast_to
from optkit.onnx._ops._common import axis_index
from optkit.onnx._ops._registry import Family, Float16, Fusion
from optkit.onnx._ops.nn import build_conv

OPS = Family("quantize")

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
           np.dtype(np.int16): (-32768, 32767), np.dtype(jnp.uint4): (0, 15), np.dtype(jnp.int4): (-8, 7),
           np.dtype(jnp.uint2): (0, 3), np.dtype(jnp.int2): (-2, 1)}
# Quantization to a float type: float 8 saturating (the zero point is not added, as ONNX's reference does),
# float 4 by a plain cast after adding the zero point.
_FLOAT4 = (np.dtype(jnp.float4_e2m1fn),)


def _check_quantized_type(ctx, dtype):
    if dtype not in (*_RANGES, *FLOAT8, *_FLOAT4):
        raise ctx.unsupported(f"quantization to {dtype} is not supported (2- to 16-bit integers, float 8 and "
                              f"float 4 are)")


def _broadcast_param(ctx, value, shape, axis, block_size, what):
    """A scale or zero point shaped to broadcast against ``shape`` (per tensor, per axis or per block)."""
    value = jnp.asarray(value)
    if value.ndim == 0 or value.size == 1 and not block_size:
        return jnp.reshape(value, ())
    a = axis_index(ctx, axis, len(shape))
    if not block_size:
        if value.ndim != 1 or value.shape[0] != shape[a]:
            raise ctx.error(f"{what} of shape {value.shape} does not fit axis {a} of an input of shape {shape}")
        return jnp.reshape(value, [shape[a] if i == a else 1 for i in range(len(shape))])
    if block_size < 0 or value.ndim != len(shape):
        raise ctx.error(f"blocked {what} of shape {value.shape} does not fit an input of shape {shape}")
    return jnp.take(jnp.repeat(value, block_size, axis=a), jnp.arange(shape[a]), axis=a)


def _out_type(ctx, zero_point):
    declared = ctx.attrs.get("output_dtype", 0)
    dtype = onnx_dtype(declared, ctx.message("output_dtype")) if declared else None
    if zero_point is not None:
        zp_type = np.dtype(jnp.result_type(zero_point))
        if dtype is not None and dtype != zp_type:
            raise ctx.error(f"output_dtype {dtype} differs from the zero point's type {zp_type}")
        dtype = zp_type
    dtype = np.dtype(np.uint8) if dtype is None else dtype
    _check_quantized_type(ctx, dtype)
    return dtype


def _divide(a, b, dtype):
    """``a / b`` correctly rounded to ``dtype``: XLA:CPU's float32 division can be one unit in the last place
    off, which moves a quotient across a rounding tie; the float64 quotient rounded to float32 is not."""
    wide = jnp.float64 if jax.config.jax_enable_x64 else dtype
    return (jnp.asarray(a).astype(dtype).astype(wide) / jnp.asarray(b).astype(dtype).astype(wide)).astype(dtype)


def _quantize(x, scale, zero_point, dtype, precision=None, saturate=True):
    work = precision or jnp.result_type(x)
    if dtype in FLOAT8:
        return cast_to(_divide(x, scale, work), dtype, saturate)
    if dtype in _FLOAT4:
        q = _divide(x, scale, work)
        return cast_to(q if zero_point is None else q + jnp.asarray(zero_point).astype(work), dtype)
    low, high = _RANGES[dtype]
    q = jnp.round(_divide(x, scale, work))  # halves to even
    if zero_point is not None:
        q = q + jnp.asarray(zero_point).astype(work)
    return jnp.clip(q, low, high).astype(dtype)


@OPS.op("QuantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28, float16=Float16(kernel_since=19))
def _quantize_linear(ctx):
    axis, block_size = int(ctx.attrs.get("axis", 1)), int(ctx.attrs.get("block_size", 0))
    precision = ctx.attrs.get("precision", 0)
    precision = onnx_dtype(precision, ctx.message("precision")) if precision else None
    saturate = bool(ctx.attrs.get("saturate", 1))

    def quantize_linear(x, scale, zero_point=None):
        dtype = _out_type(ctx, zero_point)
        shape = jnp.shape(x)
        s = _broadcast_param(ctx, scale, shape, axis, block_size, "y_scale")
        z = None if zero_point is None else _broadcast_param(ctx, zero_point, shape, axis, block_size, "y_zero_point")
        return _quantize(x, s, z, dtype, precision, saturate)

    return quantize_linear


@OPS.op("DequantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28,
        fusion=Fusion("QuantizeLinear", lambda q, dq: same_quantization(q, dq),
                      lambda ctx, q_attrs: straight_through(ctx, q_attrs)), float16=Float16(kernel_since=19))
def _dequantize_linear(ctx):
    axis, block_size = int(ctx.attrs.get("axis", 1)), int(ctx.attrs.get("block_size", 0))
    declared = ctx.attrs.get("output_dtype", 0)
    out = onnx_dtype(declared, ctx.message("output_dtype")) if declared else None

    def dequantize_linear(x, scale, zero_point=None):
        x_type = np.dtype(jnp.result_type(x))
        if x_type not in (*_RANGES, np.dtype(np.int32), *FLOAT8, *_FLOAT4):
            raise ctx.unsupported(f"dequantizing {x_type} is not supported")
        shape = jnp.shape(x)
        s = _broadcast_param(ctx, scale, shape, axis, block_size, "x_scale")
        dx = jnp.asarray(x).astype(jnp.float32)
        if zero_point is not None and x_type not in FLOAT8:  # a float 8 zero point is 0
            dx = dx - _broadcast_param(ctx, zero_point, shape, axis, block_size, "x_zero_point").astype(jnp.float32)
        return (dx * s).astype(out or jnp.result_type(scale))

    return dequantize_linear


def _dynamic_range(x):
    """``DynamicQuantizeLinear``'s range of a float32 ``x``: ``(low, high)``, widened to include 0."""
    return jnp.minimum(jnp.min(x, initial=0.0), 0.0), jnp.maximum(jnp.max(x, initial=0.0), 0.0)


def dynamic_quantize(x):
    """``DynamicQuantizeLinear`` of ``x``: ``(y uint8, y_scale float32 scalar, y_zero_point uint8 scalar)``,
    ``y_scale = (max(x, 0) - min(x, 0)) / 255`` (1 for an all-zero ``x``) and ``y_zero_point =
    round(clip(-min(x, 0) / y_scale, 0, 255))``, as ONNX's operator page and reference implementation define
    them."""
    x = jnp.asarray(x).astype(jnp.float32)
    low, high = _dynamic_range(x)
    scale = _divide(jnp.where(high == low, 1.0, high - low), 255.0, jnp.float32)
    zero_point = jnp.round(jnp.clip(_divide(-low, scale, jnp.float32), 0, 255)).astype(jnp.uint8)
    return _quantize(x, scale, zero_point, np.dtype(np.uint8)), scale, zero_point


@OPS.op("DynamicQuantizeLinear", 11)
def _dynamic_quantize_linear(ctx):
    def dynamic_quantize_linear(x):
        return dynamic_quantize(x)

    return dynamic_quantize_linear


def dynamic_matmul_matches(quantize, matmul, cast) -> bool:
    """Whether ``cast`` (a ``Cast``) of ``matmul`` (a ``MatMulInteger``) of ``quantize``'s (a
    ``DynamicQuantizeLinear``'s) output is the dynamically quantized matmul that
    ``onnxruntime.quantization.quantize_dynamic`` writes: ``matmul`` reads the quantized values and their
    zero point (or none) as its ``A``, and ``cast`` turns the int32 product into a float type."""
    to = next((a.i for a in cast.attribute if a.name == "to"), 0)
    a_zero_point = matmul.input[2] if len(matmul.input) > 2 else ""
    return (len(matmul.input) >= 2 and matmul.input[0] == quantize.output[0]
            and a_zero_point in ("", *quantize.output[2:3]) and len(cast.output) == 1
            and to in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                       onnx.TensorProto.BFLOAT16))


def dynamic_matmul(cast):
    """The node function of a ``Cast`` fused with a ``MatMulInteger`` of a ``DynamicQuantizeLinear`` (see
    :func:`dynamic_matmul_matches`): ``cast(MatMulInteger(DynamicQuantizeLinear(x)[0], b, a_zero_point,
    b_zero_point))`` of ``(x, b, a_zero_point, b_zero_point)``, the same values as the three nodes, differentiable
    in ``x`` by the straight-through estimator.

    The quantized activation minus its zero point, ``round(x / s) + z - z``, is differentiated as ``x / s``
    (the rounding as the identity, ``s = (max(x, 0) - min(x, 0)) / 255`` with its own derivative), and as 0
    where the level ``round(x / s) + z`` leaves [0, 255]. The graph's ``Mul`` by ``s * b_scale`` that follows
    then gives ``x``'s gradient as the float matmul with the dequantized weight has it, up to the rounding of
    ``x``: the quantized matmul trains as the float model it stands for (Bengio et al. 2013; Jacob et al.
    2018, section 3). ``b`` and the zero points get no gradient (integers)."""

    def product(x, b, a_zero_point, b_zero_point):
        q = dynamic_quantize(x)[0]
        return cast(jnp.matmul(_centered(q, a_zero_point), _centered(b, b_zero_point)).astype(jnp.int32))

    def levels(x):
        low, high = _dynamic_range(x)
        return x / (jnp.where(high == low, 1.0, high - low) / 255.0)

    @jax.custom_jvp
    def straight_through(x, b, a_zero_point, b_zero_point):
        return product(x, b, a_zero_point, b_zero_point)

    @straight_through.defjvp
    def straight_through_jvp(primals, tangents):
        x, b, a_zero_point, b_zero_point = primals
        y = product(x, b, a_zero_point, b_zero_point)
        level, dlevel = jax.jvp(levels, (x,), (tangents[0].astype(jnp.float32),))
        level = jnp.round(level) + a_zero_point.astype(jnp.float32)
        dlevel = jnp.where((level >= 0) & (level <= 255), dlevel, 0.0)
        weight = _centered(b, b_zero_point).astype(jnp.float32)  # exact: 8-bit values
        return y, jnp.matmul(dlevel, weight).astype(y.dtype)

    def fused(x, b, a_zero_point=None, b_zero_point=None):
        x = jnp.asarray(x).astype(jnp.float32)
        zero = jnp.zeros((), jnp.uint8)
        return straight_through(x, jnp.asarray(b), zero if a_zero_point is None else jnp.asarray(a_zero_point),
                                zero if b_zero_point is None else jnp.asarray(b_zero_point))

    return fused


def fake_quantize(x, scale, zero_point, dtype, out_dtype):
    """``DequantizeLinear(QuantizeLinear(x))`` (scale and zero point broadcast already), differentiable in ``x``
    by the straight-through estimator: the gradient passes where ``x`` quantizes inside ``dtype``'s range and is
    0 where it saturates; the scale and the zero point get none (they are the quantizer's, not trained here)."""
    low, high = _RANGES[np.dtype(dtype)]
    zero = jnp.zeros((), jnp.float32) if zero_point is None else jnp.asarray(zero_point)

    def forward(x, scale, zero):
        q = _quantize(x, scale, None if zero_point is None else zero, np.dtype(dtype)).astype(jnp.float32)
        return ((q - zero.astype(jnp.float32)) * scale).astype(out_dtype)

    @jax.custom_jvp
    def fake(x, scale, zero):
        return forward(x, scale, zero)

    @fake.defjvp
    def fake_jvp(primals, tangents):
        x, scale, zero = primals
        dx = tangents[0]
        level = jnp.round(_divide(x, scale, jnp.result_type(x))) + zero.astype(jnp.result_type(x))
        inside = (level >= low) & (level <= high)
        return forward(x, scale, zero), jnp.where(inside, dx, jnp.zeros_like(dx)).astype(out_dtype)

    return fake(jnp.asarray(x), jnp.asarray(scale), zero)


def same_quantization(q, dq) -> bool:
    """Whether a ``DequantizeLinear`` ``dq`` of a ``QuantizeLinear`` ``q``'s output undoes it: the same scale and
    zero point (names), the same ``axis`` and ``block_size``, no declared output type of its own, as
    ``onnxruntime.quantization`` writes QDQ pairs."""

    def attrs(node):
        found = {a.name: a.i for a in node.attribute if a.name in ("axis", "block_size", "output_dtype")}
        return found.get("axis", 1), found.get("block_size", 0)

    same_params = list(q.input[1:3]) + [""] * (3 - len(q.input)) == list(dq.input[1:3]) + [""] * (3 - len(dq.input))
    declared_out = any(a.name == "output_dtype" and a.i for a in dq.attribute)
    return same_params and attrs(q) == attrs(dq) and not declared_out


def straight_through(ctx, q_attrs):
    """The node function of a QDQ pair (``ctx`` the DequantizeLinear's, ``q_attrs`` the QuantizeLinear's):
    :func:`fake_quantize` of the quantized node's input."""
    axis, block_size = int(ctx.attrs.get("axis", 1)), int(ctx.attrs.get("block_size", 0))
    declared = q_attrs.get("output_dtype", 0)

    def fake(x, scale, zero_point=None):
        dtype = np.dtype(jnp.result_type(zero_point)) if zero_point is not None else (
            onnx_dtype(declared, ctx.message("output_dtype")) if declared else np.dtype(np.uint8))
        _check_quantized_type(ctx, dtype)
        shape = jnp.shape(x)
        s = _broadcast_param(ctx, scale, shape, axis, block_size, "x_scale")
        z = None if zero_point is None else _broadcast_param(ctx, zero_point, shape, axis, block_size,
                                                             "x_zero_point")
        if dtype not in _RANGES:  # float 8 and float 4: the two operators as they are, no straight-through rule
            q = _quantize(x, s, z, dtype).astype(jnp.float32)
            if z is not None and dtype in _FLOAT4:
                q = q - z.astype(jnp.float32)
            return (q * s).astype(jnp.result_type(scale))
        return fake_quantize(x, s, z, dtype, jnp.result_type(scale))

    return fake


def _centered(value, zero_point, expand_axes=None):
    """An integer tensor minus its zero point, as float64 (exact for the 8-bit products and their sums; float32
    with JAX's 64-bit mode off, exact while the sums stay below 2**24)."""
    wide = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    v = jnp.asarray(value).astype(wide)
    if zero_point is None:
        return v
    z = jnp.asarray(zero_point).astype(wide)
    if expand_axes is not None and z.ndim == 1 and z.size > 1:
        z = jnp.expand_dims(z, expand_axes)
    return v - z


def _requantize(acc, factor, zero_point, like):
    """``saturate(round(acc * factor) + zero_point)`` in the zero point's type (or ``like``'s), as ONNX's
    reference implementations of QLinearMatMul and QLinearConv compute it."""
    dtype = np.dtype(jnp.result_type(zero_point if zero_point is not None else like))
    low, high = _RANGES.get(dtype, (None, None))
    if low is None:
        raise TypeError(f"quantized outputs are 8- or 16-bit integers, got {dtype}")
    y = acc * factor
    if zero_point is not None:
        y = y + jnp.asarray(zero_point).astype(y.dtype)
    return jnp.clip(jnp.round(y), low, high).astype(dtype)


@OPS.op("MatMulInteger", 10)
def _matmul_integer(ctx):
    def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
        return jnp.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point)).astype(jnp.int32)

    return matmul_integer


@OPS.op("QLinearMatMul", 10, 21)
def _qlinear_matmul(ctx):
    def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        acc = jnp.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point))
        factor = (jnp.asarray(a_scale) * jnp.asarray(b_scale) / jnp.asarray(y_scale))
        return _requantize(acc.astype(jnp.int32).astype(factor.dtype), factor, y_zero_point, a)

    return qlinear_matmul


@OPS.op("ConvInteger", 10)
def _conv_integer(ctx):
    conv = build_conv(ctx)

    def conv_integer(x, w, x_zero_point=None, w_zero_point=None):
        return conv(_centered(x, x_zero_point), _centered(w, w_zero_point, (1, 2, 3))).astype(jnp.int32)

    return conv_integer


@OPS.op("QLinearConv", 10)
def _qlinear_conv(ctx):
    conv = build_conv(ctx)

    def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        acc = conv(_centered(x, x_zero_point), _centered(w, w_zero_point, (1, 2, 3)),
                   None if b is None else jnp.asarray(b).astype(jnp.float64)).astype(jnp.int32)
        w_scale = jnp.asarray(w_scale)
        if w_scale.size > 1:
            w_scale = jnp.reshape(w_scale, (1, -1) + (1,) * (acc.ndim - 2))
        factor = jnp.asarray(x_scale) * w_scale / jnp.asarray(y_scale)
        dtype = np.dtype(jnp.result_type(y_zero_point if y_zero_point is not None else x))
        low, high = _RANGES[dtype]
        y = acc.astype(factor.dtype) * factor
        if y_zero_point is not None:
            y = y + jnp.asarray(y_zero_point).astype(y.dtype)
        return jnp.round(jnp.clip(y, low, high)).astype(dtype)  # clipped, then rounded, as the reference

    return qlinear_conv
