"""Attention of opset 23: ``Attention`` and ``RotaryEmbedding`` (``RMSNormalization`` is in normalization).

``Attention`` (versions 23-25) is ONNX's reference implementation transcribed:
3-D inputs split into ``q_num_heads`` and ``kv_num_heads`` heads, grouped-query
heads repeated, ``sqrt(scale)`` applied to Q and to K (default ``scale = 1 /
sqrt(head size)``), a boolean or additive ``attn_mask`` padded to the keys, the
causal frontier and sliding windows aligned to the past length (or to
``nonpad_kv_seqlen``), ``softcap``, ``softmax_precision``, a fully masked row
giving 0, and the four ``qk_matmul_output_mode`` outputs.

``RotaryEmbedding`` rotates the first ``rotary_embedding_dim`` features of each
head by the angles in ``cos_cache`` and ``sin_cache`` (gathered by
``position_ids`` when given), in halves or in interleaved pairs, as ONNX's
reference implementation does; it is differentiable in ``X`` and the caches.

``FlexAttention`` (``ai.onnx.preview`` 1, with opset 26) is attention over 4-D inputs with two sub-graphs: the
scores (``sqrt(scale)`` on Q and on K, grouped-query heads repeated) go through ``score_mod`` before the softmax
and the probabilities through ``prob_mod`` after it, in ``softmax_precision`` (float32 for 16-bit inputs), as
ONNX's reference implementation computes it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._common import below_max, body_runner, checked_indices, take
from optkit.onnx._ops._registry import Family, Float16

OPS = Family("attention")
PREVIEW_OPS = Family("attention", "ai.onnx.preview")


@OPS.op("RotaryEmbedding", 23, table_inputs=(1, 2), float16=Float16(kernel_since=23))
def _rotary_embedding(ctx):
    num_heads = int(ctx.attrs.get("num_heads", 0))
    rotary_dim = int(ctx.attrs.get("rotary_embedding_dim", 0))
    interleaved = bool(ctx.attrs.get("interleaved", 0))

    def rotary_embedding(x, cos_cache, sin_cache, position_ids=None):
        rank = jnp.ndim(x)
        if rank == 4:  # (batch, heads, sequence, head size)
            xs = jnp.transpose(x, (0, 2, 1, 3))
        elif rank == 3:  # (batch, sequence, hidden), hidden = heads * head size
            if num_heads <= 0 or x.shape[2] % num_heads:
                raise ctx.error(f"a 3-D input needs num_heads dividing its hidden size {x.shape[2]}, got "
                                f"num_heads={num_heads}")
            xs = jnp.reshape(x, (*x.shape[:2], num_heads, x.shape[2] // num_heads))
        else:
            raise ctx.error(f"X must be 3-D or 4-D, got shape {jnp.shape(x)}")
        head = xs.shape[3]
        dim = rotary_dim or head
        if dim > head or dim % 2:
            raise ctx.error(f"rotary_embedding_dim {dim} must be even and at most the head size {head}")
        if position_ids is not None:
            cos_cache = take(cos_cache, checked_indices(ctx, position_ids, cos_cache.shape[0], "cos_cache"), 0)
            sin_cache = take(sin_cache, checked_indices(ctx, position_ids, sin_cache.shape[0], "sin_cache"), 0)
        for cache, what in ((cos_cache, "cos_cache"), (sin_cache, "sin_cache")):
            if jnp.shape(cache)[-1] != dim // 2:
                raise ctx.error(f"{what}'s last dimension is {jnp.shape(cache)[-1]}, not rotary_embedding_dim / 2 "
                                f"= {dim // 2}")
        out = rotary(xs, cos_cache[:, :, None, :], sin_cache[:, :, None, :], interleaved).astype(jnp.result_type(x))
        return jnp.reshape(out, jnp.shape(x)) if rank == 3 else jnp.transpose(out, (0, 2, 1, 3))

    return rotary_embedding


def rotary(x, cos, sin, interleaved):
    """The rotary embedding of ``x`` (..., head size): its first ``2 * cos.shape[-1]`` features rotated by the
    angles whose cosines and sines ``cos`` and ``sin`` hold (broadcast against ``x[..., :d/2]``), in pairs
    ``(x[i], x[i + d/2])`` or, ``interleaved``, ``(x[2i], x[2i+1])``; the rest of ``x`` as it is (Su et al.
    2021; ONNX's ``RotaryEmbedding``, ONNX Runtime's ``com.microsoft`` one)."""
    dim = 2 * jnp.shape(cos)[-1]
    rotate, keep = x[..., :dim], x[..., dim:]
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., :dim // 2], rotate[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = jnp.reshape(jnp.stack([real, imag], axis=-1), rotate.shape)
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    return jnp.concatenate([rotated, keep], axis=-1)


def _bias(ctx, shape_qk, dtype, attn_mask, causal, offset, windows):
    """The additive bias of ``Attention`` (0 where a query attends a key, -inf where not), as ONNX's reference
    builds it: the mask (bool or additive, padded to the keys), the offset-aligned causal frontier and the
    sliding window (``offset``: the past length, or per batch ``nonpad_kv_seqlen - q``)."""
    q_len, kv_len = shape_qk
    neg = jnp.asarray(-jnp.inf, dtype)
    zero = jnp.zeros((), dtype)
    bias = jnp.zeros((q_len, kv_len), dtype)
    if attn_mask is not None:
        mask = jnp.asarray(attn_mask)
        pad = kv_len - mask.shape[-1]
        if pad > 0:
            fill = False if mask.dtype == jnp.bool_ else -jnp.inf
            mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=fill)
        bias = bias + (jnp.where(mask, zero, neg) if mask.dtype == jnp.bool_ else mask.astype(dtype))
    i = jnp.arange(q_len).reshape(q_len, 1)
    j = jnp.arange(kv_len).reshape(1, kv_len)
    per_batch = jnp.ndim(offset) > 0
    position = i + (jnp.reshape(offset, (-1, 1, 1)) if per_batch else offset)  # (q, 1) or (batch, q, 1)

    def add(bias, allowed):
        term = jnp.where(allowed, zero, neg)
        return bias + (term[:, None] if per_batch else term)

    if causal:
        bias = add(bias, j <= position)
    left, right = windows
    if left >= 0 or right >= 0:
        diff = position - j
        allowed = jnp.ones(diff.shape, bool)
        if left >= 0:
            allowed = allowed & (diff <= left)
        if right >= 0:
            allowed = allowed & (-diff <= right)
        bias = add(bias, allowed)
    return bias


def _heads(ctx, x, heads, what):
    """A 3-D ``(batch, sequence, heads * size)`` input as ``(batch, heads, sequence, size)``."""
    if not heads or x.shape[2] % heads:
        raise ctx.error(f"a 3-D {what} needs q_num_heads and kv_num_heads dividing its hidden size {x.shape[2]}")
    return jnp.transpose(jnp.reshape(x, (x.shape[0], x.shape[1], heads, x.shape[2] // heads)), (0, 2, 1, 3))


@OPS.op("Attention", 23, 24, 25, float16=Float16(kernel_since=23))
def _attention(ctx):
    a = ctx.attrs
    scale_attr, causal = a.get("scale"), bool(a.get("is_causal", 0))
    q_heads, kv_heads = a.get("q_num_heads"), a.get("kv_num_heads")
    softcap, mode = float(a.get("softcap", 0.0)), int(a.get("qk_matmul_output_mode", 0))
    precision = a.get("softmax_precision")
    windows = (int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1)))
    if mode not in (0, 1, 2, 3):
        raise ctx.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")

    def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        if (past_key is None) != (past_value is None):
            raise ctx.error("past_key and past_value must be given together")
        if nonpad_kv_seqlen is not None and past_key is not None:
            raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key and past_value")
        if not jnp.ndim(q) == jnp.ndim(k) == jnp.ndim(v) or jnp.ndim(q) not in (3, 4):
            raise ctx.error(f"Q, K and V must all be 3-D or all 4-D, got {jnp.shape(q)}, {jnp.shape(k)}, "
                            f"{jnp.shape(v)}")
        three = jnp.ndim(q) == 3
        if ctx.version >= 25 and not three and (q_heads is not None or kv_heads is not None):
            raise ctx.error("q_num_heads and kv_num_heads must not be given for 4-D inputs")
        dtype = jnp.result_type(q)
        if three:
            q, k, v = _heads(ctx, q, q_heads, "Q"), _heads(ctx, k, kv_heads, "K"), _heads(ctx, v, kv_heads, "V")
        root = jnp.sqrt(jnp.asarray(1 / np.sqrt(q.shape[3]) if scale_attr is None else scale_attr,
                                    jnp.float64 if dtype == jnp.float64 else jnp.float32)).astype(dtype)
        if past_key is not None:
            k, v = jnp.concatenate([past_key, k], axis=2), jnp.concatenate([past_value, v], axis=2)
        present_key, present_value = k, v
        offset = (jnp.reshape(nonpad_kv_seqlen, (-1,)) - q.shape[2] if nonpad_kv_seqlen is not None and past_key is None
                  else (past_key.shape[2] if past_key is not None else 0))
        bias = _bias(ctx, (q.shape[2], k.shape[2]), dtype, attn_mask, causal, offset, windows)
        if nonpad_kv_seqlen is not None:
            keep = jnp.arange(k.shape[2]) < jnp.reshape(nonpad_kv_seqlen, (-1, 1))
            bias = bias + jnp.where(keep, 0, -jnp.inf).astype(dtype).reshape(q.shape[0], 1, 1, k.shape[2])
        if q.shape[1] != k.shape[1]:
            if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
                raise ctx.error(f"{q.shape[1]} query heads cannot share {k.shape[1]} key and {v.shape[1]} value heads")
            k, v = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1), jnp.repeat(v, q.shape[1] // k.shape[1], axis=1)
        qk = jnp.matmul(q * root, jnp.swapaxes(k, 2, 3) * root)
        if softcap > 0:
            qk = jnp.tanh(qk / softcap) * softcap
        with_bias = qk + bias
        out_qk = with_bias if mode == 2 else qk
        if precision:
            with_bias = with_bias.astype(onnx_dtype(precision, ctx.message("softmax_precision")))
        e = jnp.exp(below_max(with_bias, -1))  # a row masked whole: exp(-inf) = 0 everywhere
        total = jnp.sum(e, axis=-1, keepdims=True)
        probs = e / jnp.where(total == 0, 1, total)
        probs = jnp.where(jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True)), 0, probs)
        if mode == 3:
            out_qk = probs
        y = jnp.matmul(probs.astype(dtype), v)
        if three:
            y = jnp.reshape(jnp.transpose(y, (0, 2, 1, 3)), (y.shape[0], y.shape[2], -1))
        return y, present_key, present_value, out_qk.astype(dtype)

    return attention


@PREVIEW_OPS.op("FlexAttention", 1)
def _flex_attention(ctx):
    """``Y = prob_mod(softmax(score_mod(Q' K'^T))) V`` over (B, H, L, E) queries and (B, H_kv, S, E) keys and
    (B, H_kv, S, E_v) values, ``Q' = Q sqrt(scale)`` and ``K' = K sqrt(scale)`` (default ``scale = 1 /
    sqrt(E)``, its square root taken in float32), key and value heads repeated for H / H_kv query heads; the
    scores, the softmax and the product with V in ``softmax_precision`` (default: float32 for 16-bit inputs, else
    the input's type), Y in V's type. Each mod is a one-input, one-output sub-graph on (B, H, L, S)."""
    mods = {}
    for name in ("score_mod", "prob_mod"):
        if ctx.attrs.get(name) is not None:
            body = ctx.convert_subgraph(name)
            if len(body.inputs) != 1 or len(body.outputs) != 1:
                raise ctx.error(f"{name} must have one input and one output, got {len(body.inputs)} and "
                                f"{len(body.outputs)}")
            mods[name] = body
    scale, precision = ctx.attrs.get("scale"), ctx.attrs.get("softmax_precision")

    def flex_attention(q, k, v, captured=None):
        if jnp.ndim(q) != 4 or jnp.ndim(k) != 4 or jnp.ndim(v) != 4:
            raise ctx.error(f"Q, K and V must be 4-D, got shapes {jnp.shape(q)}, {jnp.shape(k)}, {jnp.shape(v)}")
        (_, heads, _, size), (_, kv_heads, length, k_size) = jnp.shape(q), jnp.shape(k)
        if k_size != size or jnp.shape(v)[1:3] != (kv_heads, length) or kv_heads <= 0 or heads % kv_heads:
            raise ctx.error(f"K {jnp.shape(k)} and V {jnp.shape(v)} must share heads and length, K's features "
                            f"must be Q's {jnp.shape(q)}, and Q's heads a multiple of K's")
        if heads != kv_heads:
            k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
        root = jnp.sqrt(jnp.float32(1.0 / np.sqrt(size) if scale is None else scale)).astype(q.dtype)
        scores = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2))
        work = (onnx_dtype(precision, ctx.message("softmax_precision")) if precision is not None
                else jnp.float32 if jnp.dtype(q.dtype).itemsize < 4 else q.dtype)
        scores = scores.astype(work)
        if "score_mod" in mods:
            (scores,) = body_runner(mods["score_mod"], captured)(scores)
            scores = scores.astype(work)
        e = jnp.exp(below_max(scores, -1))
        probs = e / jnp.sum(e, axis=-1, keepdims=True)
        if "prob_mod" in mods:
            (probs,) = body_runner(mods["prob_mod"], captured)(probs)
            probs = probs.astype(work)
        return jnp.matmul(probs, v.astype(work)).astype(v.dtype)

    return flex_attention
