"""The depthwise convolution (one input channel per group: MobileNet, EfficientNet) as the kernel's shifted, strided
slices of the input times one weight per channel, with a derivative that XLA compiles compactly in both
differentiation modes. Used by ``Conv`` (:mod:`~optkit.onnx._ops.nn`) on CPU.

The forward pass is one fused loop (XLA:CPU's grouped convolution with one channel per group took 56 ms for
(8, 64, 56, 56) and a 3x3 kernel, the slices 0.3 ms). JAX's own derivative of the slices is one reduction per
kernel tap for the weight and one padded copy per tap for the input, which XLA:CPU neither fuses nor compiles
quickly (mobilenet_v3_small's jitted ``value_and_grad``: 52,583 lines of optimized HLO, 12.1 s of compile).
:func:`depthwise` is instead one primitive (:data:`depthwise_p`), bilinear in the input and the weight, which
reverse mode transposes into the two compact gradients: :func:`input_gradient` (one depthwise convolution of the
spread-out cotangent) and :func:`weight_gradient` (one variadic reduction over the taps). Forward mode, ``vmap`` and
higher orders keep working, and JAX traces one operation per node rather than each tap's.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from optkit.onnx._ops._window import logical_shape, spatial, with_spatial


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
    out = logical_shape(out_shape(jnp.shape(x), w_shape, strides, dilations, channels_last), channels_last)[2:]
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
    # lax's operations, not jax.numpy's: each of those is a jitted function of its own, which JAX traces apart
    channel = jnp.ndim(x) - 1 if channels_last else 1
    weights = lax.convert_element_type(jnp.reshape(w, (jnp.shape(w)[0], -1)), work)  # (C * m, taps)
    total = None  # 16-bit floats summed in float32 and rounded once, as a convolution's accumulator does
    for i, (_, tap) in enumerate(taps(x, jnp.shape(w), strides, dilations, channels_last)):
        weight = lax.broadcast_in_dim(lax.index_in_dim(weights, i, axis=1, keepdims=False), jnp.shape(tap),
                                      (channel,))
        term = lax.mul(lax.convert_element_type(tap, work), weight)
        total = term if total is None else lax.add(total, term)
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
    dx = depthwise(spread, flipped, (1,) * n, dilations, channels_last)
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
    g = lax.convert_element_type(g, work)
    products = tuple(lax.mul(lax.convert_element_type(tap, work), g)
                     for _, tap in taps(x, w_shape, strides, dilations, channels_last))
    zero = jnp.zeros((), work)
    sums = lax.reduce(products, (zero,) * len(products), lambda a, b: tuple(p + q for p, q in zip(a, b)),
                      tuple(axis for axis in range(jnp.ndim(g)) if axis != channel))
    return jnp.reshape(jnp.stack(sums, axis=-1), w_shape).astype(dtype)


def out_shape(x_shape, w_shape, strides, dilations, channels_last):
    """The shape of :func:`shifted`'s result for an input of shape ``x_shape`` and a weight of shape ``w_shape``
    (VALID windows; the weight's C * m channels in place of the input's C)."""
    sizes = logical_shape(x_shape, channels_last)[2:]
    out = [(size - (k - 1) * d - 1) // s + 1 for size, k, d, s in zip(sizes, w_shape[2:], dilations, strides)]
    channel = len(x_shape) - 1 if channels_last else 1
    shape = list(with_spatial(x_shape, channels_last, out))
    shape[channel] = w_shape[0]
    return tuple(shape)


# The depthwise convolution as one primitive, bilinear in (x, w): JAX's linearization and transposition see one
# operation per node instead of the kernel's taps (a sum of k1 * k2 slices and products, traced, differentiated and
# transposed op by op: mobilenet_v3_small's training step traced in 4.5 s, most of it in its 11 depthwise nodes).
# Lowered as :func:`shifted` (JAX's lowering cache emits one function per shape); transposed into
# :func:`input_gradient` for x (itself this primitive) and :func:`weight_gradient` for w (one variadic reduction,
# which no sum of jax.numpy operations transposes to). Forward mode, ``vmap`` and higher orders compose.
depthwise_p = Primitive("optkit_depthwise")


def depthwise(x, w, strides, dilations, channels_last):
    """:func:`shifted` as :data:`depthwise_p`: differentiable in every mode, with a reverse-mode derivative of
    :func:`input_gradient` plus :func:`weight_gradient` (mobilenet_v3_small's jitted ``value_and_grad`` at
    2 x 3 x 32 x 32 compiles from 19,280 lines of optimized HLO instead of 52,583: benchmarks/RESULTS.md, "Small
    inputs"). ``x`` is padded already; ``strides`` and ``dilations`` are ints, one per spatial axis."""
    return depthwise_p.bind(x, w, strides=tuple(int(s) for s in strides),
                            dilations=tuple(int(d) for d in dilations), channels_last=bool(channels_last))


def _depthwise_impl(x, w, *, strides, dilations, channels_last):
    return shifted(x, w, strides, dilations, channels_last)


def _depthwise_abstract(x, w, *, strides, dilations, channels_last):
    """The result's shape from the windows' arithmetic (no trace of the taps); its dtype the operands' common one;
    on a mesh, the input's batch axis sharded as it is."""
    shape = out_shape(x.shape, w.shape, strides, dilations, channels_last)
    dtype = jnp.result_type(x.dtype, w.dtype)
    sharding = getattr(x, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or not hasattr(sharding, "update"):
        return ShapedArray(shape, dtype)
    batch = spec[0] if len(spec) else None
    return ShapedArray(shape, dtype, sharding=sharding.update(spec=type(spec)(batch, *([None] * (len(shape) - 1)))))


def _depthwise_transpose_x(g, x, w, *, strides, dilations, channels_last):
    return input_gradient(g, w, x.aval.shape, strides, dilations, channels_last).astype(x.aval.dtype)


def _depthwise_transpose_w(g, x, w, *, strides, dilations, channels_last):
    return weight_gradient(g, x, w.aval.shape, strides, dilations, channels_last).astype(w.aval.dtype)


def _depthwise_batch(args, dims, **params):
    """A batch axis on ``x`` alone joins its N axis (one primitive, as unbatched); otherwise ``jax.vmap`` of
    :func:`shifted` (JAX's own derivative from there)."""
    (x, w), (x_dim, w_dim) = args, dims
    if w_dim is None:  # not mapped
        x = jnp.moveaxis(x, x_dim, 0)
        folded = depthwise_p.bind(jnp.reshape(x, (-1, *jnp.shape(x)[2:])), w, **params)
        return jnp.reshape(folded, (jnp.shape(x)[0], -1, *jnp.shape(folded)[1:])), 0
    return jax.vmap(functools.partial(_depthwise_impl, **params), (x_dim, w_dim))(x, w), 0


depthwise_p.def_impl(jax.jit(_depthwise_impl, static_argnames=("strides", "dilations", "channels_last")))
depthwise_p.def_abstract_eval(_depthwise_abstract)
mlir.register_lowering(depthwise_p, mlir.lower_fun(_depthwise_impl, multiple_results=False))
ad.defbilinear(depthwise_p, _depthwise_transpose_x, _depthwise_transpose_w)
batching.primitive_batchers[depthwise_p] = _depthwise_batch
