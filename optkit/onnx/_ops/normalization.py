"""Normalization and regularization layers: BatchNormalization, LayerNormalization, RMSNormalization,
GroupNormalization, MeanVarianceNormalization, InstanceNormalization, LRN, Dropout.

Statistics are computed in the input's type (LayerNormalization: in
``stash_type``), with the population (biased) variance, as ONNX's function
bodies and reference implementation compute them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._common import axis_index, node_key
from optkit.onnx._ops._registry import FLOAT16_KERNEL, Family, Float16, Layout
from optkit.onnx._ops._window import per_channel

OPS = Family("normalization")


def _channel(v, rank, channels_last=False):
    """A per-channel vector shaped to broadcast against (N, C, D1, ...), or (N, D1, ..., C) ``channels_last``."""
    return jnp.reshape(v, per_channel(rank, channels_last))


@OPS.op("BatchNormalization", 6, 7, 9, 14, 15, layout=Layout("reads_x", since=9, outputs=3))
def _batch_normalization(ctx):
    eps = ctx.attrs.get("epsilon", 1e-5)
    momentum = ctx.attrs.get("momentum", 0.9)
    training = bool(ctx.attrs.get("training_mode", 0)) if ctx.version >= 14 else False
    if ctx.version < 14 and any(ctx.has_output(i) for i in range(1, 5)):
        raise ctx.unsupported(f"the training outputs of BatchNormalization-{ctx.version} (mean, var, "
                              f"saved_mean, saved_var) are not supported; use opset 14 or later (training_mode)")
    if ctx.version == 6 and not ctx.attrs.get("is_test", 0):
        raise ctx.unsupported("BatchNormalization-6 in training mode (is_test=0) is not supported; use opset "
                              "14 or later (training_mode)")
    if ctx.version < 9 and not ctx.attrs.get("spatial", 1):
        raise ctx.unsupported("spatial=0 (statistics per activation) is not supported")
    if ctx.version >= 14 and not training and any(ctx.has_output(i) for i in (1, 2)):
        raise ctx.error("running_mean and running_var are outputs only with training_mode=1")

    def batch_normalization(x, scale, bias, mean, var):
        rank = jnp.ndim(x)
        if rank < 2:
            raise ctx.error(f"X must be (N, C, ...), got shape {jnp.shape(x)}")
        last = ctx.channels_last  # (N, D1, ..., C): optkit.onnx._plans.layout
        channels = jnp.shape(x)[-1 if last else 1]
        for v, what in ((scale, "scale"), (bias, "B"), (mean, "input_mean"), (var, "input_var")):
            if jnp.shape(v) != (channels,):
                raise ctx.error(f"{what} must have shape ({channels},), got {jnp.shape(v)}")
        dtype = jnp.result_type(x)
        if training:
            axes = (0, *range(1, rank - 1)) if last else (0, *range(2, rank))
            batch_mean = jnp.mean(x, axis=axes)
            batch_var = jnp.mean(jnp.square(x - _channel(batch_mean, rank, last)), axis=axes)
            use_mean, use_var = batch_mean, batch_var
        else:
            use_mean, use_var = mean, var
        y = (_channel(scale, rank, last) * (x - _channel(use_mean, rank, last))
             / jnp.sqrt(_channel(use_var, rank, last) + eps) + _channel(bias, rank, last)).astype(dtype)
        if not training:
            return y
        running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(jnp.result_type(mean))
        running_var = (var * momentum + batch_var * (1 - momentum)).astype(jnp.result_type(var))
        return y, running_mean, running_var

    return batch_normalization


@OPS.op("InstanceNormalization", 6, 22)
def _instance_normalization(ctx):
    eps = ctx.attrs.get("epsilon", 1e-5)

    def instance_normalization(x, scale, bias):
        rank = jnp.ndim(x)
        if rank < 3 or jnp.shape(scale) != (jnp.shape(x)[1],) or jnp.shape(bias) != (jnp.shape(x)[1],):
            raise ctx.error(f"X must be (N, C, D1, ...) and scale, B (C,), got shapes {jnp.shape(x)}, "
                            f"{jnp.shape(scale)}, {jnp.shape(bias)}")
        axes = tuple(range(2, rank))
        mean = jnp.mean(x, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
        return _channel(scale, rank) * (x - mean) / jnp.sqrt(var + eps) + _channel(bias, rank)

    return instance_normalization


def _stash_type(ctx):
    """The ``stash_type`` attribute (the statistics' type, float32 by default), a floating-point type."""
    stash = onnx_dtype(ctx.attrs.get("stash_type", 1), ctx.message("attribute 'stash_type'"))
    if not jnp.issubdtype(stash, jnp.floating):
        raise ctx.error(f"stash_type must be a floating-point type, got {stash}")
    return stash


@OPS.op("RMSNormalization", 23, float16=Float16(kernel_since=23))
def _rms_normalization(ctx):
    """Y = X / sqrt(mean(X^2 over axes axis..-1) + epsilon) * scale, the statistics in ``stash_type``."""
    axis, eps, stash = ctx.attrs.get("axis", -1), ctx.attrs.get("epsilon", 1e-5), _stash_type(ctx)

    def rms_normalization(x, scale):
        rank = jnp.ndim(x)
        a = axis_index(ctx, axis, rank)
        normalized = jnp.shape(x)[a:]
        if jnp.broadcast_shapes(jnp.shape(scale), normalized) != normalized:
            raise ctx.error(f"scale {jnp.shape(scale)} cannot be broadcast to the normalized shape {normalized}")
        xs = jnp.asarray(x).astype(stash)
        mean_square = jnp.mean(jnp.square(xs), axis=tuple(range(a, rank)), keepdims=True)
        y = xs * lax.rsqrt(mean_square + jnp.asarray(eps, stash))
        return (y * jnp.asarray(scale).astype(stash)).astype(jnp.result_type(x))

    return rms_normalization


@OPS.op("LayerNormalization", 17, float16=FLOAT16_KERNEL)
def _layer_normalization(ctx):
    axis, eps, stash = ctx.attrs.get("axis", -1), ctx.attrs.get("epsilon", 1e-5), _stash_type(ctx)

    def layer_normalization(x, scale, bias=None):
        rank = jnp.ndim(x)
        a = axis_index(ctx, axis, rank)
        normalized = jnp.shape(x)[a:]
        for v, what in ((scale, "Scale"), (bias, "B")):
            if v is not None and jnp.broadcast_shapes(jnp.shape(v), normalized) != normalized:
                raise ctx.error(f"{what} {jnp.shape(v)} cannot be broadcast to the normalized shape {normalized}")
        dtype = jnp.result_type(x)
        axes = tuple(range(a, rank))
        xs = jnp.asarray(x).astype(stash)
        mean = jnp.mean(xs, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(xs - mean), axis=axes, keepdims=True)
        inv_std = lax.rsqrt(var + jnp.asarray(eps, stash))
        if jnp.finfo(dtype).bits < jnp.finfo(stash).bits:
            # float16 as ONNX Runtime's CPU kernel computes it: scale and bias in the stash type, rounded once
            # (ONNX's function body rounds the normalized value first)
            y = (xs - mean) * inv_std * jnp.asarray(scale).astype(stash)
            y = (y if bias is None else y + jnp.asarray(bias).astype(stash)).astype(dtype)
            return y, mean, inv_std
        y = ((xs - mean) * inv_std).astype(dtype) * scale
        if bias is not None:
            y = y + bias
        return y, mean, inv_std

    return layer_normalization


@OPS.op("LRN", 1, 13)
def _lrn(ctx):
    size = int(ctx.attrs["size"])
    alpha, beta, bias = ctx.attrs.get("alpha", 1e-4), ctx.attrs.get("beta", 0.75), ctx.attrs.get("bias", 1.0)
    if size < 1:
        raise ctx.error(f"size must be >= 1, got {size}")

    def lrn(x):
        if jnp.ndim(x) < 3:
            raise ctx.error(f"X must be (N, C, D1, ...), got shape {jnp.shape(x)}")
        # the sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)]
        low, high = (size - 1) // 2, size - 1 - (size - 1) // 2
        square = jnp.square(x)
        padded = jnp.pad(square, [(0, 0), (low, high)] + [(0, 0)] * (jnp.ndim(x) - 2))
        channels = jnp.shape(x)[1]
        total = sum(lax.slice_in_dim(padded, i, i + channels, axis=1) for i in range(size))
        return x / (bias + alpha / size * total) ** beta

    return lrn


@OPS.op("Dropout", 7, 10, 12, 13, 22, static_inputs=(1, 2), float16=Float16(kernel_since=7, kernel_until=11))
def _dropout(ctx):
    seed = ctx.attrs.get("seed")

    def dropout(x, ratio=None, training_mode=None):
        if ctx.version < 12:
            ratio_value, training = ctx.attrs.get("ratio", 0.5), False
        else:
            ratio_value = 0.5 if ratio is None else float(ratio.reshape(()))
            training = False if training_mode is None else bool(training_mode.reshape(()))
        if not 0 <= ratio_value < 1:
            raise ctx.error(f"ratio must be in [0, 1), got {ratio_value}")
        if not training or ratio_value == 0:
            y, mask = x, jnp.ones(jnp.shape(x), bool)
        else:
            # ONNX leaves the random numbers to the backend: a mask drawn from the run's key, else from `seed`.
            key = node_key(ctx, seed)
            mask = jax.random.bernoulli(key, 1 - ratio_value, jnp.shape(x))
            scale = np.asarray(1 / (1 - ratio_value), jnp.result_type(x))
            y = jnp.where(mask, x * scale, jnp.zeros((), jnp.result_type(x)))
        return (y, mask) if ctx.has_output(1) else y

    return dropout


@OPS.op("GroupNormalization", 18, 21)
def _group_normalization(ctx):
    """Statistics over each group of ``num_groups`` channels (and the spatial axes); version 18 scales and shifts
    per group, version 21 per channel, computing in ``stash_type``."""
    groups, eps = int(ctx.attrs.get("num_groups", 0)), ctx.attrs.get("epsilon", 1e-5)
    stash = _stash_type(ctx) if ctx.version >= 21 else None

    def group_normalization(x, scale, bias):
        n, c = jnp.shape(x)[:2]
        if groups < 1 or c % groups:
            raise ctx.error(f"num_groups {groups} must divide the {c} channels")
        per = groups if ctx.version < 21 else c
        if jnp.shape(scale) != (per,) or jnp.shape(bias) != (per,):
            raise ctx.error(f"scale and bias must have shape ({per},), got {jnp.shape(scale)} and {jnp.shape(bias)}")
        dtype = jnp.result_type(x)
        work = stash or dtype
        xs = jnp.reshape(jnp.asarray(x).astype(work), (n, groups, -1))
        mean = jnp.mean(xs, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xs - mean), axis=-1, keepdims=True)
        y = jnp.reshape((xs - mean) * lax.rsqrt(var + jnp.asarray(eps, work)), jnp.shape(x)).astype(dtype)
        if ctx.version < 21:
            scale, bias = jnp.repeat(scale, c // groups), jnp.repeat(bias, c // groups)
        return y * _channel(scale, y.ndim) + _channel(bias, y.ndim)

    return group_normalization


@OPS.op("MeanVarianceNormalization", 9, 13)
def _mean_variance_normalization(ctx):
    """``(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)`` over ``axes`` (default 0, 2, 3), as ONNX's function body."""
    axes = ctx.attrs.get("axes", [0, 2, 3])

    def mean_variance_normalization(x):
        a = tuple(axis_index(ctx, int(i), jnp.ndim(x)) for i in axes)
        mean = jnp.mean(x, axis=a, keepdims=True)
        std = jnp.sqrt(jnp.mean(jnp.square(x), axis=a, keepdims=True) - jnp.square(mean))
        return (x - mean) / (std + jnp.asarray(1e-9, jnp.result_type(x)))

    return mean_variance_normalization
