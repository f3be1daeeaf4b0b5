"""ONNX Runtime's ``com.microsoft`` operators that its transformer optimizer, Optimum's exporter, its
quantizers and onnxruntime-genai's model builder write into language-model graphs: the fused activations
``Gelu``, ``BiasGelu``, ``FastGelu``, ``QuickGelu``, ``BiasAdd``; the fused residual normalizations
``SkipLayerNormalization`` and ``SkipSimplifiedLayerNormalization``; ``EmbedLayerNormalization``; the
blockwise-quantized ``MatMulNBits`` and ``GatherBlockQuantized``; and ``SimplifiedLayerNormalization``
(RMSNorm), which ONNX Runtime registers in the default domain and onnxruntime-genai's model builder writes there.
The fused attentions (``Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``, ``RotaryEmbedding``) are in
:mod:`~optkit.onnx._ops.contrib_attention`.

Formulas from ONNX Runtime's contrib operator documentation (``docs/ContribOperators.md``), each checked against
ONNX Runtime 1.32's CPU kernels (tests/onnx/ops/test_contrib.py, tests/onnx/files/test_quantized.py): statistics in
float32 for 16-bit inputs, the population variance, the epsilon defaults ONNX Runtime's schemas give (1e-12 for
the Skip normalizations).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._common import checked_indices, take
from optkit.onnx._ops._registry import ELEMENTWISE, FLOAT16_KERNEL, Accepts, Family

OPS = Family("contrib", "com.microsoft")
# ONNX Runtime's skip layer norms take (batch, sequence, hidden) or (tokens, hidden), a skip of the same ranks, and
# a 1-D scale
_SKIP_ACCEPTS = Accepts(ranks={0: (2, 3), 1: (2, 3), 2: (1, 1)})
# ONNX Runtime registers SimplifiedLayerNormalization in the default domain (ONNX defines no such operator; the
# loader checks such nodes apart, optkit.onnx._load.files.ORT_DEFAULT_DOMAIN_OPS).
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
    """``x + skip (+ bias)`` in the statistics' dtype (float32 for 16-bit inputs, summed and rounded once, as
    ONNX Runtime's CPU kernels sum them), and that sum in ``x``'s dtype (the ``input_skip_bias_sum`` output)."""
    if jnp.shape(skip) != jnp.shape(x) and jnp.broadcast_shapes(jnp.shape(skip), jnp.shape(x)) != jnp.shape(x):
        raise ctx.error(f"skip {jnp.shape(skip)} must broadcast to the input's shape {jnp.shape(x)}")
    stats = _stats_dtype(x)
    wide = [None if v is None else jnp.asarray(v).astype(stats) for v in (x, skip, bias)]
    total = _add_bias(ctx, wide[0] + wide[1], wide[2])
    return total, total.astype(jnp.result_type(x))


def _stats_dtype(x):
    dtype = jnp.result_type(x)
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


@OPS.op("SkipLayerNormalization", 1, float16=FLOAT16_KERNEL, accepts=_SKIP_ACCEPTS)
def _skip_layer_normalization(ctx):
    """s = input + skip (+ bias); LayerNormalization of s over the last axis with gamma (and beta). Outputs:
    the result, the mean, 1 / sqrt(variance + epsilon), and s (``input_skip_bias_sum``)."""
    eps = float(ctx.attrs.get("epsilon", _SKIP_EPSILON))

    def skip_layer_normalization(x, skip, gamma, beta=None, bias=None):
        xs, s = _skip_sum(ctx, x, skip, bias)
        stats = _stats_dtype(x)
        mean = jnp.mean(xs, axis=-1, keepdims=True)
        inv_std = lax.rsqrt(jnp.mean(jnp.square(xs - mean), axis=-1, keepdims=True) + jnp.asarray(eps, stats))
        y = (xs - mean) * inv_std * jnp.asarray(gamma).astype(stats)
        if beta is not None:
            y = y + jnp.asarray(beta).astype(stats)
        return y.astype(jnp.result_type(x)), mean, inv_std, s

    return skip_layer_normalization


@DEFAULT_DOMAIN_OPS.op("SimplifiedLayerNormalization", 1, float16=FLOAT16_KERNEL)
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


@OPS.op("SkipSimplifiedLayerNormalization", 1, float16=FLOAT16_KERNEL, accepts=_SKIP_ACCEPTS)
def _skip_simplified_layer_normalization(ctx):
    """s = input + skip (+ bias); RMS normalization of s over the last axis times gamma. Outputs: the result,
    the mean (not computed by ONNX Runtime: zeros here), 1 / sqrt(mean(s^2) + epsilon), and s."""
    eps = float(ctx.attrs.get("epsilon", _SKIP_EPSILON))

    def skip_simplified_layer_normalization(x, skip, gamma, bias=None):
        xs, s = _skip_sum(ctx, x, skip, bias)
        stats = _stats_dtype(x)
        inv_rms = lax.rsqrt(jnp.mean(jnp.square(xs), axis=-1, keepdims=True) + jnp.asarray(eps, stats))
        y = xs * inv_rms * jnp.asarray(gamma).astype(stats)
        return y.astype(jnp.result_type(x)), jnp.zeros_like(inv_rms), inv_rms, s

    return skip_simplified_layer_normalization


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _int8_blocks(a, block):
    """``a`` (..., K) quantized to int8 per block of ``block`` along its last axis and dequantized: ``round(a /
    s) * s``, ``s = max|a| / 127`` per block (0 for a zero block), as ONNX Runtime's ``MatMulNBits`` quantizes its
    activations at ``accuracy_level=4``; differentiated as the identity (straight-through)."""
    size = jnp.shape(a)[-1]
    padded = -(-size // block) * block
    blocks = jnp.pad(a, [(0, 0)] * (jnp.ndim(a) - 1) + [(0, padded - size)])
    blocks = jnp.reshape(blocks, (*jnp.shape(a)[:-1], padded // block, block))
    s = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True) / jnp.float32(127)
    inverse = jnp.where(s != 0, 1 / jnp.where(s != 0, s, 1), 0)
    q = jnp.clip(jnp.round(blocks * inverse), -128, 127)
    return jnp.reshape(q * s, (*jnp.shape(a)[:-1], padded))[..., :size]


@_int8_blocks.defjvp
def _int8_blocks_jvp(block, primals, tangents):
    return _int8_blocks(primals[0], block), tangents[0]


@OPS.op("MatMulNBits", 1, float16=FLOAT16_KERNEL, accepts=Accepts(
    {"K": (1, 2**31 - 1), "N": (1, 2**31 - 1), "bits": frozenset({2, 4, 8}), "block_size": (16, 2**31 - 1),
     "accuracy_level": (0, 4)}))
def _matmul_nbits(ctx):
    """Y = A @ W^T (+ bias) with W (N, K) stored blockwise quantized: B (uint8, [N, ceil(K / block_size),
    block_size * bits / 8]) holding ``bits``-bit unsigned values (4-bit: the low nibble first), ``scales``
    (N x blocks), optional uint8 ``zero_points`` packed the same way (default 2^(bits - 1)); W[n, k] =
    (q[n, k] - zero_point[n, block]) * scale[n, block]. The weights stay packed in the program (constants of the
    file's size) and are expanded inside it; A is differentiable, the quantized weights are not.

    ``accuracy_level=4`` (what onnxruntime-genai's builder writes for CPU) computes with int8 activations, as
    ONNX Runtime's CPU kernel does: each row of a float32 A is quantized per block of ``block_size`` along K,
    symmetrically, ``round(a / s)`` with ``s = max|a| / 127`` (halves to even), and the product is that of the
    quantized blocks. Its gradient is the float product's (the straight-through estimator)."""
    for name in ("K", "N", "block_size"):
        if name not in ctx.attrs:
            raise ctx.error(f"the required attribute {name!r} is missing")
    k, n, block = int(ctx.attrs["K"]), int(ctx.attrs["N"]), int(ctx.attrs["block_size"])
    bits = int(ctx.attrs.get("bits", 4))
    int8_activations = int(ctx.attrs.get("accuracy_level", 0)) == 4
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
        if int8_activations and jnp.result_type(a) == jnp.float32:
            a = _int8_blocks(a, block)
        y = jnp.matmul(a, w.T.astype(jnp.result_type(a)))
        return y if bias is None else y + bias

    return matmul_nbits


def _layer_norm(xs, gamma, beta, eps):
    """LayerNormalization over the last axis (population variance), in ``xs``'s dtype."""
    mean = jnp.mean(xs, axis=-1, keepdims=True)
    inv_std = lax.rsqrt(jnp.mean(jnp.square(xs - mean), axis=-1, keepdims=True) + jnp.asarray(eps, xs.dtype))
    y = (xs - mean) * inv_std * jnp.asarray(gamma).astype(xs.dtype)
    return y if beta is None else y + jnp.asarray(beta).astype(xs.dtype)


@OPS.op("EmbedLayerNormalization", 1)
def _embed_layer_normalization(ctx):
    """BERT's embeddings as ONNX Runtime's transformer optimizer fuses them: ``word_embedding[input_ids] +
    position_embedding[position_ids] (+ segment_embedding[segment_ids])``, ``position_ids`` default ``0..S-1``,
    then LayerNormalization with gamma and beta (``epsilon`` default 1e-12; statistics in float32 for 16-bit
    tables). Outputs: the result (batch, S, hidden); ``mask_index``, each row's count of non-zero ``mask``
    entries (int32, batch; zeros without a mask), what ``Attention`` reads as each sequence's length; and
    the sum before the normalization."""
    eps = float(ctx.attrs.get("epsilon", _SKIP_EPSILON))

    def embed_layer_normalization(input_ids, segment_ids, word_embedding, position_embedding,
                                  segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None):
        if gamma is None or beta is None:
            raise ctx.error("gamma and beta are required")
        if (segment_ids is None) != (segment_embedding is None):
            raise ctx.error("segment_ids and segment_embedding must be given together")
        if jnp.ndim(input_ids) != 2:
            raise ctx.error(f"input_ids must be (batch, sequence), got {jnp.shape(input_ids)}")
        batch, length = jnp.shape(input_ids)

        def rows(table, ids, what):
            return take(table, checked_indices(ctx, ids, jnp.shape(table)[0], what), 0)

        positions = (jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)) if position_ids is None
                     else jnp.broadcast_to(jnp.asarray(position_ids), (batch, length)))
        total = rows(word_embedding, input_ids, "word_embedding") + rows(position_embedding, positions,
                                                                        "position_embedding")
        if segment_ids is not None:
            total = total + rows(segment_embedding, segment_ids, "segment_embedding")
        stats = _stats_dtype(total)
        y = _layer_norm(total.astype(stats), gamma, beta, eps).astype(jnp.result_type(word_embedding))
        mask_index = (jnp.zeros((batch,), jnp.int32) if mask is None
                      else jnp.sum(jnp.asarray(mask) != 0, axis=1).astype(jnp.int32))
        return y, mask_index, total

    return embed_layer_normalization


@OPS.op("GatherBlockQuantized", 1, float16=FLOAT16_KERNEL)
def _gather_block_quantized(ctx):
    """Rows of a blockwise-quantized table (the 4-bit embeddings of onnxruntime-genai's releases): ``data``
    (uint8 holding ``bits``-bit values, two 4-bit ones per byte low nibble first along the last axis, or int4 /
    uint4), ``scales`` and optional ``zero_points`` (packed as ``data``) per block of ``block_size`` along
    ``quantize_axis``; the rows at ``indices`` along ``gather_axis`` dequantized, ``(q - zero_point) * scale``
    (default zero point 2^(bits-1) for uint8 data, 0 for int4/uint4). The rows are gathered before they are
    dequantized: the table stays packed."""
    bits, block = int(ctx.attrs.get("bits", 4)), int(ctx.attrs.get("block_size", 128))
    if bits not in (4, 8):
        raise ctx.unsupported(f"bits={bits}: optkit runs 4- and 8-bit tables")
    if block < 16 or block & (block - 1):
        raise ctx.error(f"block_size must be a power of 2 and at least 16, got {block}")

    def unpack(values):  # uint8 bytes -> 4-bit values along the last axis
        values = jnp.asarray(values)
        both = jnp.stack([values & 0x0F, values >> 4], axis=-1)
        return both.reshape(*values.shape[:-1], 2 * values.shape[-1])

    def gather_block_quantized(data, indices, scales, zero_points=None):
        kind = np.dtype(jnp.result_type(data))
        rank = jnp.ndim(data)
        qa = int(ctx.attrs.get("quantize_axis", 1)) % rank
        ga = int(ctx.attrs.get("gather_axis", 0)) % rank
        if kind == np.uint8:
            if bits == 4 and qa != rank - 1:
                raise ctx.unsupported("a uint8 table of 4-bit values is packed along its last axis: quantize_axis "
                                      "must be the last")
            q = unpack(data) if bits == 4 else jnp.asarray(data)
            z = (jnp.asarray(2 ** (bits - 1)) if zero_points is None else
                 (unpack(zero_points) if bits == 4 else jnp.asarray(zero_points)))
        elif kind in (np.dtype(jnp.int4), np.dtype(jnp.uint4)):
            q, z = jnp.asarray(data), (jnp.asarray(0) if zero_points is None else jnp.asarray(zero_points))
        else:
            raise ctx.error(f"data must be uint8, int4 or uint4, got {kind}")
        if ga == qa:
            raise ctx.unsupported("gather_axis equal to quantize_axis is not run")
        blocks = -(-q.shape[qa] // block)
        if jnp.shape(scales)[qa] != blocks:
            raise ctx.error(f"scales {jnp.shape(scales)} must have {blocks} blocks of {block} along axis {qa}")
        picked = checked_indices(ctx, indices, q.shape[ga], "data")
        q = take(q, picked, ga).astype(jnp.result_type(scales))
        s = take(scales, picked, ga)
        if jnp.ndim(z):
            z = take(z, picked, ga)
        axis = qa if qa < ga else qa + jnp.ndim(indices) - 1  # where the blocks' axis went after the gather

        def spread(t):  # one value per block -> one per element along that axis
            if not jnp.ndim(t):
                return t
            t = jnp.repeat(t, block, axis=axis)
            return jax.lax.slice_in_dim(t, 0, q.shape[axis], axis=axis)

        return (q - spread(z).astype(q.dtype)) * spread(s)

    return gather_block_quantized
