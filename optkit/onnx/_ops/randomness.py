"""Random numbers: ``RandomUniform``, ``RandomNormal``, their ``*Like`` forms, ``Bernoulli``, ``Multinomial``.

ONNX leaves the generator to the backend. optkit draws from JAX's
``jax.random``: with a key given to the run (``apply_fn(params, *inputs, rng=key)``, an
:class:`~optkit.onnx.OnnxModule` with ``nnx.Rngs``), from that key with the node's name folded in (fresh numbers
per key, the same for the same key); without one, with the key ``jax.random.key(seed)`` of the node's ``seed``
attribute (a float, truncated to an integer), or of 0 when the node has none, as ``Dropout`` does: a model then
gives the same numbers at every run, jitted or not. (ONNX's node cases compute their expected values with
NumPy's generator, which no backend reproduces.) The outputs are constants for differentiation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._common import node_key
from optkit.onnx._ops._registry import FLOAT16_KERNEL, Family

OPS = Family("randomness")


def _key(ctx):
    return node_key(ctx, ctx.attrs.get("seed"))


def _dtype(ctx, like=None):
    """The output type: attribute ``dtype``, else the input's type (``like``), else FLOAT."""
    declared = ctx.attrs.get("dtype")
    if declared:
        return onnx_dtype(declared, ctx.message("attribute 'dtype'"))
    return np.dtype(jnp.result_type(like)) if like is not None else np.dtype(np.float32)


def _draw(ctx, normal, shape, dtype):
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ctx.error(f"dtype must be a float type, got {dtype}")
    ctx.check_size(shape, dtype, "the output")
    # Drawn in float64 for DOUBLE (the graph runs in JAX's 64-bit mode), in float32 for the narrower types.
    work = dtype if dtype == np.dtype(np.float64) and jax.config.jax_enable_x64 else np.dtype(np.float32)
    if normal:
        mean, scale = float(ctx.attrs.get("mean", 0.0)), float(ctx.attrs.get("scale", 1.0))
        return (mean + scale * jax.random.normal(_key(ctx), shape, work)).astype(dtype)
    low, high = float(ctx.attrs.get("low", 0.0)), float(ctx.attrs.get("high", 1.0))
    return jax.random.uniform(_key(ctx), shape, work, low, high).astype(dtype)


@OPS.op("RandomUniform", 1, 22, params=(False,))
@OPS.op("RandomNormal", 1, 22, params=(True,))
def _random(ctx, normal):
    shape = tuple(int(d) for d in ctx.attrs.get("shape", ()))
    if any(d < 0 for d in shape):
        raise ctx.error(f"shape {list(shape)} has a negative dimension")

    def random():
        return _draw(ctx, normal, shape, _dtype(ctx))

    return random


@OPS.op("RandomUniformLike", 1, 22, params=(False,), float16=FLOAT16_KERNEL)
@OPS.op("RandomNormalLike", 1, 22, params=(True,), float16=FLOAT16_KERNEL)
def _random_like(ctx, normal):
    def random_like(x):
        return _draw(ctx, normal, jnp.shape(x), _dtype(ctx, x))

    return random_like


@OPS.op("Bernoulli", 15, 22)
def _bernoulli(ctx):
    """1 where a uniform draw is below the input probability, else 0, in ``dtype`` (default: the input's)."""
    def bernoulli(p):
        dtype = _dtype(ctx, p)
        ctx.check_size(jnp.shape(p), dtype, "the output")
        draw = jax.random.uniform(_key(ctx), jnp.shape(p), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        return (draw < jax.lax.stop_gradient(p)).astype(dtype)

    return bernoulli


@OPS.op("Multinomial", 7, 22)
def _multinomial(ctx):
    """``sample_size`` class indices per batch row, drawn from the row's unnormalized log-probabilities."""
    sample_size = int(ctx.attrs.get("sample_size", 1))
    dtype = onnx_dtype(ctx.attrs.get("dtype", 6), ctx.message("attribute 'dtype'"))
    if sample_size < 1 or dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ctx.error(f"sample_size must be >= 1 and dtype int32 or int64, got {sample_size} and {dtype}")

    def multinomial(logits):
        if jnp.ndim(logits) != 2:
            raise ctx.error(f"the input must be (batch, classes), got shape {jnp.shape(logits)}")
        ctx.check_size((jnp.shape(logits)[0], sample_size), dtype, "the output")
        samples = jax.random.categorical(_key(ctx), jax.lax.stop_gradient(logits), axis=1,
                                         shape=(sample_size, jnp.shape(logits)[0]))
        return jnp.transpose(samples).astype(dtype)

    return multinomial
