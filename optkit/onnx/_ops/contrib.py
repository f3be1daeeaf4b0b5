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


@OPS.op("MatMulNBits", 1)
def _matmul_nbits(ctx):
    """Y = A @ W^T (+ bias) with W (N, K) stored blockwise quantized: B (uint8, [N, ceil(K / block_size),
    block_size * bits / 8]) holding ``bits``-bit unsigned values (4-bit: the low nibble first), ``scales``
    (N x blocks), optional uint8 ``zero_points`` packed the same way (default 2^(bits - 1)); W[n, k] =
    (q[n, k] - zero_point[n, block]) * scale[n, block]. The weights stay packed in the program (constants of the
    file's size) and are expanded inside it; A is differentiable, the quantized weights are not."""
    for name in ("K", "N", "block_size"):
        if name not in ctx.attrs:
            raise ctx.error(f"the required attribute {name!r} is missing")
    k, n, block = int(ctx.attrs["K"]), int(ctx.attrs["N"]), int(ctx.attrs["block_size"])
    bits = int(ctx.attrs.get("bits", 4))
    if bits not in (4, 8):
        raise ctx.unsupported(f"bits={bits}: optkit runs 4- and 8-bit MatMulNBits weights")
    if block < 16 or block & (block - 1):
        raise ctx.error(f"block_size must be a power of 2 and at least 16, got {block}")
    blocks = -(-k // block)

    def unpack(packed, count):
        packed = jnp.asarray(packed).astype(jnp.uint8)
        if bits == 8:
            return packed[..., :count]
        both = jnp.stack([packed & 0x0F, packed >> 4], axis=-1)
        return both.reshape(*packed.shape[:-1], -1)[..., :count]

    def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None):
        if g_idx is not None:
            raise ctx.unsupported("input g_idx (act-order quantization) is not run")
        if jnp.size(b) != n * blocks * block * bits // 8:
            raise ctx.error(f"B has {jnp.size(b)} bytes; N={n}, K={k}, block_size={block}, bits={bits} need "
                            f"{n * blocks * block * bits // 8}")
        if jnp.shape(a)[-1] != k:
            raise ctx.error(f"A's last dimension is {jnp.shape(a)[-1]}, K is {k}")
        dtype = jnp.result_type(scales)
        q = unpack(jnp.reshape(b, (n, blocks, -1)), block).astype(dtype)
        scale = jnp.reshape(scales, (n, blocks, 1))
        if zero_points is None:
            zero = jnp.asarray(2 ** (bits - 1), dtype)
        elif jnp.result_type(zero_points) == jnp.uint8:
            zero = unpack(jnp.reshape(zero_points, (n, -1)), blocks).astype(dtype).reshape(n, blocks, 1)
        else:
            raise ctx.unsupported(f"zero_points of type {jnp.result_type(zero_points)}: optkit runs uint8 ones")
        w = ((q - zero) * scale).reshape(n, blocks * block)[:, :k]
        y = jnp.matmul(a, w.T.astype(jnp.result_type(a)))
        return y if bias is None else y + bias

    return matmul_nbits
