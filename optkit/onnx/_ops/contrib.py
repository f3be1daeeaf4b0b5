"""ONNX Runtime's ``com.microsoft`` operators that its transformer optimizer and Optimum's exporter write into
BERT- and GPT-style graphs: the fused activations ``Gelu``, ``BiasGelu``, ``FastGelu``, ``QuickGelu``, ``BiasAdd``
and the fused residual normalizations ``SkipLayerNormalization`` and ``SkipSimplifiedLayerNormalization``; and
``SimplifiedLayerNormalization`` (RMSNorm), which ONNX Runtime registers in the default domain and
onnxruntime-genai's model builder writes there.

Formulas from ONNX Runtime's contrib operator documentation (``docs/ContribOperators.md``), each checked against
ONNX Runtime's CPU kernels (tests/onnx/test_contrib.py): statistics in float32 for 16-bit inputs, the population
variance, the epsilon defaults ONNX Runtime's schemas give (1e-12 for the Skip normalizations).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._registry import ELEMENTWISE, Family

OPS = Family("contrib", "com.microsoft")
# ONNX Runtime registers SimplifiedLayerNormalization in the default domain (ONNX defines no such operator; the
# loader checks such nodes apart, optkit.onnx._files.ORT_DEFAULT_DOMAIN_OPS).
DEFAULT_DOMAIN_OPS = Family("contrib_default_domain")

_SKIP_EPSILON = 1e-12  # ONNX Runtime's default epsilon of SkipLayerNormalization and SkipSimplifiedLayerNormalization


def _gelu(x):
    """0.5 x (1 + erf(x / sqrt 2)): the exact GELU."""
    return 0.5 * x * (1 + jax.scipy.special.erf(x / np.sqrt(2).astype(jnp.result_type(x))))


def _add_bias(ctx, x, bias):
    if bias is None:
        return x
    if jnp.shape(bias) != jnp.shape(x)[-1:]:
        raise ctx.error(f"bias {jnp.shape(bias)} must have the last dimension of the input {jnp.shape(x)}")
    return x + bias


@OPS.op("Gelu", 1, layout=ELEMENTWISE)
def _contrib_gelu(ctx):
    return _gelu


@OPS.op("BiasGelu", 1)
def _bias_gelu(ctx):
    return lambda x, bias: _gelu(_add_bias(ctx, x, bias))


@OPS.op("FastGelu", 1)
def _fast_gelu(ctx):
    """GELU's tanh approximation, 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))), of y = x + bias."""
    return lambda x, bias=None: jax.nn.gelu(_add_bias(ctx, x, bias), approximate=True)


@OPS.op("QuickGelu", 1, layout=ELEMENTWISE)
def _quick_gelu(ctx):
    """x sigmoid(alpha x), alpha default 1.702."""
    alpha = float(ctx.attrs.get("alpha", 1.702))
    return lambda x: x * jax.nn.sigmoid(jnp.asarray(alpha, jnp.result_type(x)) * x)


@OPS.op("BiasAdd", 1)
def _bias_add(ctx):
    """X + bias + skip: X and skip (N, S, C), bias (C,)."""
    def bias_add(x, bias, skip):
        if jnp.shape(skip) != jnp.shape(x):
            raise ctx.error(f"skip {jnp.shape(skip)} must have the input's shape {jnp.shape(x)}")
        return _add_bias(ctx, x, bias) + skip

    return bias_add


def _skip_sum(ctx, x, skip, bias):
    if jnp.shape(skip) != jnp.shape(x) and jnp.broadcast_shapes(jnp.shape(skip), jnp.shape(x)) != jnp.shape(x):
        raise ctx.error(f"skip {jnp.shape(skip)} must broadcast to the input's shape {jnp.shape(x)}")
    return _add_bias(ctx, x + skip, bias)


def _stats_dtype(x):
    dtype = jnp.result_type(x)
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


@OPS.op("SkipLayerNormalization", 1)
def _skip_layer_normalization(ctx):
    """s = input + skip (+ bias); LayerNormalization of s over the last axis with gamma (and beta). Outputs:
    the result, the mean, 1 / sqrt(variance + epsilon), and s (``input_skip_bias_sum``)."""
    eps = float(ctx.attrs.get("epsilon", _SKIP_EPSILON))

    def skip_layer_normalization(x, skip, gamma, beta=None, bias=None):
        s = _skip_sum(ctx, x, skip, bias)
        stats = _stats_dtype(x)
        xs = s.astype(stats)
        mean = jnp.mean(xs, axis=-1, keepdims=True)
        inv_std = lax.rsqrt(jnp.mean(jnp.square(xs - mean), axis=-1, keepdims=True) + jnp.asarray(eps, stats))
        y = (xs - mean) * inv_std * jnp.asarray(gamma).astype(stats)
        if beta is not None:
            y = y + jnp.asarray(beta).astype(stats)
        return y.astype(jnp.result_type(x)), mean, inv_std, s

    return skip_layer_normalization


@DEFAULT_DOMAIN_OPS.op("SimplifiedLayerNormalization", 1)
def _simplified_layer_normalization(ctx):
    """RMS normalization over the axes from ``axis`` (default -1) to the last, times scale: Y = X /
    sqrt(mean(X^2) + epsilon) * scale (epsilon default 1e-5), statistics in float32 for 16-bit inputs
    (``stash_type``); second output 1 / sqrt(mean(X^2) + epsilon)."""
    axis, eps = int(ctx.attrs.get("axis", -1)), float(ctx.attrs.get("epsilon", 1e-5))

    def simplified_layer_normalization(x, scale):
        rank = jnp.ndim(x)
        a = axis + rank if axis < 0 else axis
        if not 0 <= a < rank:
            raise ctx.error(f"axis {axis} is out of range for an input of rank {rank}")
        stats = _stats_dtype(x)
        xs = jnp.asarray(x).astype(stats)
        inv_rms = lax.rsqrt(jnp.mean(jnp.square(xs), axis=tuple(range(a, rank)), keepdims=True)
                            + jnp.asarray(eps, stats))
        return (xs * inv_rms * jnp.asarray(scale).astype(stats)).astype(jnp.result_type(x)), inv_rms

    return simplified_layer_normalization


@OPS.op("SkipSimplifiedLayerNormalization", 1)
def _skip_simplified_layer_normalization(ctx):
    """s = input + skip (+ bias); RMS normalization of s over the last axis times gamma. Outputs: the result,
    the mean (not computed by ONNX Runtime: zeros here), 1 / sqrt(mean(s^2) + epsilon), and s."""
    eps = float(ctx.attrs.get("epsilon", _SKIP_EPSILON))

    def skip_simplified_layer_normalization(x, skip, gamma, bias=None):
        s = _skip_sum(ctx, x, skip, bias)
        stats = _stats_dtype(x)
        xs = s.astype(stats)
        inv_rms = lax.rsqrt(jnp.mean(jnp.square(xs), axis=-1, keepdims=True) + jnp.asarray(eps, stats))
        y = xs * inv_rms * jnp.asarray(gamma).astype(stats)
        return y.astype(jnp.result_type(x)), jnp.zeros_like(inv_rms), inv_rms, s

    return skip_simplified_layer_normalization
