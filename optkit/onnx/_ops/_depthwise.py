"""The depthwise convolution (one input channel per group: MobileNet, EfficientNet) as the kernel's shifted, strided
slices of the input times one weight per channel, with a derivative that XLA compiles compactly in both
differentiation modes. Used by ``Conv`` (:mod:`~optkit.onnx._ops.nn`) on CPU.

The forward pass is one fused loop (XLA:CPU's grouped convolution with one channel per group took 56 ms for
(8, 64, 56, 56) and a 3x3 kernel, the slices 0.3 ms). JAX's own derivative of the slices is one reduction per
kernel tap for the weight and one padded copy per tap for the input, which XLA:CPU neither fuses nor compiles
quickly (mobilenet_v3_small's jitted ``value_and_grad``: 52,583 lines of optimized HLO, 12.1 s of compile).
:func:`depthwise` instead carries a ``jax.custom_jvp`` whose tangent reverse mode transposes into the two compact
gradients: the input's tangent is JAX's transpose of :func:`input_gradient` (one depthwise convolution of the
spread-out cotangent), the weight's a primitive (:data:`by_weight_p`) whose transpose rule is
:func:`weight_gradient` (one variadic reduction over the taps). Forward mode, ``vmap`` and higher orders keep
working.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.core import ShapedArray
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from optkit.onnx._ops._window import logical_shape, per_channel, spatial, with_spatial


def accumulator(dtype):
    """float32 for a 16-bit float ``dtype`` (summed in float32 and rounded once, as a convolution's accumulator
    does), else None (the dtype itself)."""
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4 else None


def taps(x, w_shape, strides, dilations, channels_last):
    """``(offset, slice)`` for each offset of the kernel (row-major): the shifted, strided slice of ``x`` that it
    multiplies in a VALID depthwise convolution, ``x``'s channels repeated by the depth multiplier (output channel
    c * m + j reads input channel c); each slice has the output's shape."""
    ndim = jnp.ndim(x)
    channel_axis = ndim - 1 if channels_last else 1
    multiplier = w_shape[0] // jnp.shape(x)[channel_axis]
    if multiplier > 1:
        x = jnp.repeat(x, multiplier, axis=channel_axis)
    kernel = w_shape[2:]
    sizes = logical_shape(jnp.shape(x), channels_last)[2:]
    out = [(size - (k - 1) * d - 1) // s + 1 for size, k, d, s in zip(sizes, kernel, dilations, strides)]
    for offset in itertools.product(*(range(k) for k in kernel)):
        begin = [o * d for o, d in zip(offset, dilations)]
        limit = with_spatial(jnp.shape(x), channels_last, [b + (n - 1) * s + 1 for b, n, s in zip(begin, out, strides)])
        start, step = spatial(ndim, channels_last, begin, 0), spatial(ndim, channels_last, strides, 1)
        yield offset, lax.slice(x, start, limit, step)


def shifted(x, w, strides, dilations, channels_last=False):
    """A VALID depthwise convolution (``x`` (N, C, D1, ...) already padded, or (N, D1, ..., C) when
    ``channels_last``; ``w`` (C * m, 1, k1, ...)) as a sum of the kernel's shifted, strided slices of ``x`` times
    one weight per channel: XLA fuses it into one loop. Differentiated by JAX's own rules (see :func:`depthwise`).
    It is 10-40x faster than XLA:CPU's grouped convolution on small outputs too (one thread: (2, 4, 4, 672), 5x5:
    8.6 ms against 0.23 ms); it compiles slower (efficientnet_b0's first inference at 2 x 3 x 64 x 64: 4.3 s
    against 2.6 s), which a model run more than a few dozen times wins back (benchmarks/RESULTS.md, "Small
    inputs")."""
    dtype = jnp.result_type(x, w)
    work = accumulator(dtype) or dtype
    total = None  # 16-bit floats summed in float32 and rounded once, as a convolution's accumulator does
    for offset, tap in taps(x, jnp.shape(w), strides, dilations, channels_last):
        weight = jnp.reshape(w[(slice(None), 0, *offset)], per_channel(jnp.ndim(x), channels_last))
        term = tap.astype(work) * weight.astype(work)
        total = term if total is None else total + term
    return total.astype(dtype)


def input_gradient(g, w, x_shape, strides, dilations, channels_last):
    """The gradient of :func:`shifted` with respect to its (padded) input, for the output cotangent ``g``: itself a
    depthwise convolution, of ``g`` spread out by the strides and padded by the kernel's span, with the kernel
    flipped, summed over the depth multiplier's copies: one fused loop, where JAX's transposes of the taps' strided
    slices are one kernel each (mobilenet_v3_small at 2 x 3 x 32 x 32: the first jitted ``value_and_grad`` 11.7 s
    -> 6.6 s, then 2.9 -> 2.1 ms a step; at 224 x 224 the same, 14 ms)."""
    n = len(strides)
    sizes = logical_shape(x_shape, channels_last)[2:]
    outs = logical_shape(jnp.shape(g), channels_last)[2:]
    config = [((k - 1) * d, size - (out - 1) * s - 1, s - 1)
              for k, d, s, size, out in zip(jnp.shape(w)[2:], dilations, strides, sizes, outs)]
    spread = lax.pad(g, jnp.zeros((), g.dtype), spatial(n + 2, channels_last, config, (0, 0, 0)))
    flipped = jnp.flip(w, axis=tuple(range(2, n + 2)))
    dx = shifted(spread, flipped, (1,) * n, dilations, channels_last)
    channels = x_shape[n + 1 if channels_last else 1]
    multiplier = jnp.shape(w)[0] // channels
    if multiplier > 1:
        axis = n + 1 if channels_last else 1
        shape = jnp.shape(dx)
        dx = jnp.sum(jnp.reshape(dx, (*shape[:axis], channels, multiplier, *shape[axis + 1:])), axis=axis + 1)
    return dx.astype(jnp.result_type(g))


def weight_gradient(g, x, w_shape, strides, dilations, channels_last):
    """The gradient of :func:`shifted` with respect to its weight (shape ``w_shape``), for the output cotangent
    ``g``: one variadic reduction over the batch and spatial axes whose operands are the taps times ``g``, one
    accumulator per tap, so that XLA reads ``g`` once (a 16-bit float in a float32 accumulator). JAX's own
    derivative is one reduction per tap (mobilenet_v3_small's training step at batch 8 x 224 x 224: 0.25 s against
    0.14 s), and a contraction over the stacked taps copies every tap first (0.44 s)."""
    dtype = jnp.result_type(g)
    work = accumulator(dtype) or dtype
    channel = jnp.ndim(g) - 1 if channels_last else 1
    products = tuple(tap.astype(work) * g.astype(work)
                     for _, tap in taps(x, w_shape, strides, dilations, channels_last))
    zero = jnp.zeros((), work)
    sums = lax.reduce(products, (zero,) * len(products), lambda a, b: tuple(p + q for p, q in zip(a, b)),
                      tuple(axis for axis in range(jnp.ndim(g)) if axis != channel))
    return jnp.reshape(jnp.stack(sums, axis=-1), w_shape).astype(dtype)


# shifted(x, t) as a primitive bilinear in (x, t), used for the weight's tangent ``t`` in depthwise's JVP: JAX
# transposes it with weight_gradient's one variadic reduction (which no sum of jax.numpy operations transposes to)
# and, in higher orders, with input_gradient for x. Lowered, evaluated and batched as shifted itself.
by_weight_p = Primitive("optkit_depthwise_by_weight")


def by_weight(x, t, strides, dilations, channels_last):
    """:func:`shifted` of ``x`` and the weight tangent ``t``, as :data:`by_weight_p`."""
    return by_weight_p.bind(x, t, strides=tuple(strides), dilations=tuple(dilations), channels_last=channels_last)


def _by_weight_impl(x, t, *, strides, dilations, channels_last):
    return shifted(x, t, strides, dilations, channels_last)


def _by_weight_shape(x, t, **params):
    out = jax.eval_shape(functools.partial(_by_weight_impl, **params), x, t)
    return ShapedArray(out.shape, out.dtype)


def _by_weight_transpose_x(g, x, t, *, strides, dilations, channels_last):
    return input_gradient(g, t, x.aval.shape, strides, dilations, channels_last).astype(x.aval.dtype)


def _by_weight_transpose_t(g, x, t, *, strides, dilations, channels_last):
    return weight_gradient(g, x, t.aval.shape, strides, dilations, channels_last).astype(t.aval.dtype)


def _by_weight_batch(args, dims, **params):
    """A batch axis on ``x`` alone joins its N axis (one primitive, as unbatched); otherwise ``jax.vmap`` of
    :func:`shifted` (JAX's own derivative from there)."""
    (x, t), (x_dim, t_dim) = args, dims
    if t_dim is None:  # not mapped
        x = jnp.moveaxis(x, x_dim, 0)
        folded = by_weight(jnp.reshape(x, (-1, *jnp.shape(x)[2:])), t, **params)
        return jnp.reshape(folded, (jnp.shape(x)[0], -1, *jnp.shape(folded)[1:])), 0
    return jax.vmap(functools.partial(_by_weight_impl, **params), (x_dim, t_dim))(x, t), 0


by_weight_p.def_impl(_by_weight_impl)
by_weight_p.def_abstract_eval(_by_weight_shape)
mlir.register_lowering(by_weight_p, mlir.lower_fun(_by_weight_impl, multiple_results=False))
ad.defbilinear(by_weight_p, _by_weight_transpose_x, _by_weight_transpose_t)
batching.primitive_batchers[by_weight_p] = _by_weight_batch


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def depthwise(x, w, strides, dilations, channels_last):
    """:func:`shifted`, differentiable in every mode, with a tangent whose transpose (reverse mode) is
    :func:`input_gradient` plus :func:`weight_gradient`: mobilenet_v3_small's jitted ``value_and_grad`` at
    2 x 3 x 32 x 32 compiles from 19,280 lines of optimized HLO instead of 52,583 (benchmarks/RESULTS.md, "Small
    inputs"). ``strides`` and ``dilations`` are tuples of ints, one per spatial axis."""
    return shifted(x, w, strides, dilations, channels_last)


def _depthwise_jvp(strides, dilations, channels_last, primals, tangents):
    """The input's tangent as the linear transpose of :func:`input_gradient` (``jax.linear_transpose``), the
    weight's as :func:`by_weight`: evaluated as written in forward mode, transposed back into the two gradients'
    own forms in reverse mode."""
    x, w = primals
    dx, dw = tangents
    y = shifted(x, w, strides, dilations, channels_last)
    tangent = None
    if not isinstance(dx, SymbolicZero):  # (y as the example: its type carries a mesh's sharding)
        (tangent,) = jax.linear_transpose(
            lambda g: input_gradient(g, w, jnp.shape(x), strides, dilations, channels_last), y)(dx)
    if not isinstance(dw, SymbolicZero):
        along = by_weight(x, dw, strides, dilations, channels_last)
        tangent = along if tangent is None else tangent + along
    return y, (jnp.zeros_like(y) if tangent is None else tangent)


depthwise.defjvp(_depthwise_jvp, symbolic_zeros=True)
