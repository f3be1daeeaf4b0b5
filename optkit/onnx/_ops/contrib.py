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

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._registry import ELEMENTWISE, Family
from optkit.onnx._ops.attention import rotary

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


@OPS.op("MatMulNBits", 1)
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


# GroupQueryAttention's inputs and attributes for KV-cache quantization, QK normalization and packed query
# lengths: optkit refuses them by name rather than computing something else.
_GQA_UNRUN_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"}


@OPS.op("GroupQueryAttention", 1, static_inputs=(6,), table_inputs=(7, 8))
def _group_query_attention(ctx):
    """Causal multi-head attention with grouped key/value heads and a KV cache, as onnxruntime-genai's model
    builder writes it (LLaMA, Qwen, Phi, Mistral), following ONNX Runtime 1.32's CPU kernel.

    ``query`` is (batch, S, num_heads * head) or, without ``key`` and ``value``, the packed (batch, S,
    (num_heads + 2 kv_num_heads) * head). ``past_key``/``past_value`` (batch, kv_num_heads, P, head) hold each
    sequence's first ``past_b`` positions, right-padded; ``seqlens_k`` (int32, batch) is each sequence's total
    length minus 1, ``total_sequence_length`` (a scalar known before running) the longest total T. When S == T
    (the first prompt) ``past_b = 0``, otherwise ``past_b = seqlens_k[b] + 1 - S``. The present cache
    (batch, kv_num_heads, max(T, P), head) is the past's first ``past_b`` positions, the new keys (values) after
    them and zeros. With ``do_rotary`` Q and K are rotated first (``cos_cache``/``sin_cache`` rows at
    ``position_ids``, default ``past_b + s``; ``rotary_interleaved``). Query s of sequence b attends the keys at
    ``j <= past_b + s`` and ``j <= seqlens_k[b]`` (and ``j > past_b + s - local_window_size`` with a window),
    on the scores ``scale * q.k`` (default 1/sqrt(head); ``softcap * tanh(x / softcap)`` with a softcap) plus
    ``attention_bias``; the softmax adds ``exp(sink)`` to its sum with ``smooth_softmax`` (sink 0) or
    ``head_sink`` (one per head). Computed in float32 (float64 for doubles); outputs the attention (batch, S,
    num_heads * head), present_key, present_value."""
    a = ctx.attrs
    for name in ("num_heads", "kv_num_heads"):
        if name not in a:
            raise ctx.error(f"the required attribute {name!r} is missing")
    heads, kv_heads = int(a["num_heads"]), int(a["kv_num_heads"])
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ctx.error(f"num_heads={heads} must be a positive multiple of kv_num_heads={kv_heads}")
    scale, softcap = float(a.get("scale", 0.0)), float(a.get("softcap", 0.0))
    window, smooth = int(a.get("local_window_size", -1)), int(a.get("smooth_softmax", -1)) == 1
    do_rotary, interleaved = bool(a.get("do_rotary", 0)), bool(a.get("rotary_interleaved", 0))
    for name, default in (("qk_output", 0), ("kv_cache_bit_width", 0), ("sliding_window_cache", 0), ("causal", 1)):
        if int(a.get(name, default)) != default:
            raise ctx.unsupported(f"{name}={a[name]} is not run (only {name}={default})")
    for name in ("k_quant_type", "v_quant_type"):
        value = a.get(name, "NONE")
        if (value.decode() if isinstance(value, bytes) else value) != "NONE":
            raise ctx.unsupported(f"{name}={value!r}: optkit runs GroupQueryAttention with an unquantized KV cache")

    def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                              total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                              attention_bias=None, head_sink=None, *rest):
        for index, given in enumerate(rest, start=12):
            if given is not None:
                raise ctx.unsupported(f"input {_GQA_UNRUN_INPUTS[index]!r} is not run")
        if seqlens_k is None or total_sequence_length is None:
            raise ctx.error("seqlens_k and total_sequence_length are required")
        if (key is None) != (value is None) or (past_key is None) != (past_value is None):
            raise ctx.error("key and value, and past_key and past_value, must be given together")
        if jnp.ndim(query) != 3:
            raise ctx.error(f"query must be (batch, sequence, hidden), got {jnp.shape(query)}")
        dtype = jnp.result_type(query)
        work = jnp.float64 if dtype == jnp.float64 else jnp.float32
        batch, length, hidden = jnp.shape(query)
        if key is None:
            if hidden % (heads + 2 * kv_heads):
                raise ctx.error(f"a packed query's hidden size {hidden} is not (num_heads + 2 * kv_num_heads) * "
                                f"head size")
            head = hidden // (heads + 2 * kv_heads)
            q, k, v = jnp.split(query, [heads * head, (heads + kv_heads) * head], axis=2)
        else:
            head = hidden // heads
            if hidden % heads or jnp.shape(key)[2] != kv_heads * head or jnp.shape(value) != jnp.shape(key):
                raise ctx.error(f"query {jnp.shape(query)}, key {jnp.shape(key)} and value {jnp.shape(value)} do not "
                                f"fit num_heads={heads} and kv_num_heads={kv_heads}")
            q, k, v = query, key, value
        q = jnp.reshape(q, (batch, length, heads, head)).astype(work)
        k = jnp.reshape(k, (batch, length, kv_heads, head)).astype(work)
        v = jnp.reshape(v, (batch, length, kv_heads, head)).astype(work)
        total = int(np.asarray(total_sequence_length).reshape(()))
        past = 0 if past_key is None else jnp.shape(past_key)[2]
        if past_key is not None and (jnp.shape(past_key) != (batch, kv_heads, past, head)
                                     or jnp.shape(past_value) != jnp.shape(past_key)):
            raise ctx.error(f"past_key {jnp.shape(past_key)} and past_value {jnp.shape(past_value)} must be "
                            f"(batch, kv_num_heads, past length, head size) = ({batch}, {kv_heads}, P, {head})")
        present = max(total, past)
        seen = jnp.reshape(seqlens_k, (-1,)).astype(jnp.int32) + 1  # each sequence's total length
        first_prompt = length == total
        before = jnp.zeros_like(seen) if first_prompt else seen - length  # past_b
        steps = jnp.arange(length, dtype=jnp.int32)
        if do_rotary:
            if cos_cache is None or sin_cache is None:
                raise ctx.error("do_rotary needs cos_cache and sin_cache")
            positions = (before[:, None] + steps[None, :] if position_ids is None
                         else jnp.broadcast_to(jnp.asarray(position_ids), (batch, length)))
            cos = jnp.take(jnp.asarray(cos_cache).astype(work), positions, axis=0, mode="clip")[:, :, None, :]
            sin = jnp.take(jnp.asarray(sin_cache).astype(work), positions, axis=0, mode="clip")[:, :, None, :]
            if 2 * cos.shape[-1] > head:
                raise ctx.error(f"cos_cache's last dimension {cos.shape[-1]} is more than half the head size {head}")
            q, k = rotary(q, cos, sin, interleaved), rotary(k, cos, sin, interleaved)

        slots = jnp.arange(present, dtype=jnp.int32)
        offset = slots[None, :] - before[:, None]  # (batch, present): where each slot's new key comes from
        is_past = (slots[None, :] < before[:, None])[:, None, :, None]
        is_new = ((offset >= 0) & (offset < length))[:, None, :, None]

        def cache(new, old):
            new = jnp.transpose(new, (0, 2, 1, 3))  # (batch, kv_heads, S, head)
            taken = jnp.take_along_axis(new, jnp.clip(offset, 0, length - 1)[:, None, :, None], axis=2)
            filled = jnp.where(is_new, taken, 0)
            if old is None:
                return filled
            old = jnp.asarray(old).astype(work)[:, :, :present]
            old = jnp.pad(old, ((0, 0), (0, 0), (0, present - old.shape[2]), (0, 0)))
            return jnp.where(is_past, old, filled)

        present_key, present_value = cache(k, past_key), cache(v, past_value)
        group = heads // kv_heads
        keys = jnp.repeat(present_key, group, axis=1)
        values = jnp.repeat(present_value, group, axis=1)
        alpha = scale if scale else 1 / np.sqrt(head)
        scores = jnp.einsum("bsnd,bnld->bnsl", q, keys) * jnp.asarray(alpha, work)
        if softcap > 0:
            scores = softcap * jnp.tanh(scores / softcap)
        if attention_bias is not None:
            scores = scores + jnp.asarray(attention_bias).astype(work)[..., :present]
        at = before[:, None] + steps[None, :]  # each query's position
        allowed = (slots[None, None, :] <= at[:, :, None]) & (slots[None, None, :] < seen[:, None, None])
        if window > 0:
            allowed &= slots[None, None, :] > at[:, :, None] - window
        scores = jnp.where(allowed[:, None], scores, -jnp.inf)
        if head_sink is not None or smooth:
            sink = (jnp.zeros((heads,), work) if head_sink is None
                    else jnp.reshape(jnp.asarray(head_sink), (heads,)).astype(work))[None, :, None, None]
            top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink)
            e = jnp.exp(scores - top)
            probs = e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))
        else:
            probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bnsl,bnld->bsnd", probs, values).reshape(batch, length, heads * head)
        cache_type = dtype if past_key is None else jnp.result_type(past_key)
        return out.astype(dtype), present_key.astype(cache_type), present_value.astype(cache_type)

    return group_query_attention
