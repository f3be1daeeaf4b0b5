"""ONNX Runtime's fused ``com.microsoft`` attentions, as its transformer optimizer, Optimum's exporter and
onnxruntime-genai's model builder write them: ``Attention`` (BERT- and GPT-style, with ``past``/``present``),
``MultiHeadAttention``, ``GroupQueryAttention`` (grouped key/value heads and a KV cache) and ``RotaryEmbedding``.

Formulas from ONNX Runtime's contrib operator documentation (``docs/ContribOperators.md``), each checked against
ONNX Runtime 1.32's CPU kernels (tests/onnx/ops/test_contrib_attention.py,
tests/onnx/ops/test_group_query_attention.py): softmax in float32 for 16-bit inputs, the masks as its CPU kernels
read them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import checked_indices, take
from optkit.onnx._ops._registry import FLOAT16_KERNEL, Accepts, Family
from optkit.onnx._ops.attention import rotary

OPS = Family("contrib_attention", "com.microsoft")
# What the attention operators accept (ONNX Runtime's contrib operator pages): heads from 1 (a count of 2**62
# reached a reshape), flags 0 or 1.
_HEADS, _FLAG = (1, 65536), frozenset({0, 1})


# GroupQueryAttention's inputs and attributes for KV-cache quantization, QK normalization and packed query
# lengths: optkit refuses them by name rather than computing something else.
_GQA_UNRUN_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"}


@OPS.op("GroupQueryAttention", 1, static_inputs=(6,), table_inputs=(7, 8), float16=FLOAT16_KERNEL, accepts=Accepts(
    {"num_heads": _HEADS, "kv_num_heads": _HEADS, "do_rotary": _FLAG, "rotary_interleaved": _FLAG}, {0: (3, 3)}))
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
    heads, kv_heads, scale, softcap, window, smooth, do_rotary, interleaved = _gqa_attributes(ctx)

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
        batch, length, _ = jnp.shape(query)
        q, k, v, head = _gqa_heads(ctx, query, key, value, (heads, kv_heads), work)
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
            cos = take(jnp.asarray(cos_cache).astype(work), positions, 0, mode="clip")[:, :, None, :]
            sin = take(jnp.asarray(sin_cache).astype(work), positions, 0, mode="clip")[:, :, None, :]
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
        probs = _softmax_with_sink(scores, head_sink if head_sink is not None or not smooth
                                   else jnp.zeros((heads,), work), heads, work)
        out = jnp.einsum("bnsl,bnld->bsnd", probs, values).reshape(batch, length, heads * head)
        cache_type = dtype if past_key is None else jnp.result_type(past_key)
        return out.astype(dtype), present_key.astype(cache_type), present_value.astype(cache_type)

    return group_query_attention


def _gqa_attributes(ctx) -> tuple:
    """GroupQueryAttention's attributes, checked: ``(heads, kv_heads, scale, softcap, window, smooth, do_rotary,
    interleaved)``; the attributes it does not run refused, naming the node."""
    a = ctx.attrs
    for name in ("num_heads", "kv_num_heads"):
        if name not in a:
            raise ctx.error(f"the required attribute {name!r} is missing")
    heads, kv_heads = int(a["num_heads"]), int(a["kv_num_heads"])
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ctx.error(f"num_heads={heads} must be a positive multiple of kv_num_heads={kv_heads}")
    for name, default in (("qk_output", 0), ("kv_cache_bit_width", 0), ("sliding_window_cache", 0), ("causal", 1)):
        if int(a.get(name, default)) != default:
            raise ctx.unsupported(f"{name}={a[name]} is not run (only {name}={default})")
    for name in ("k_quant_type", "v_quant_type"):
        value = a.get(name, "NONE")
        if (value.decode() if isinstance(value, bytes) else value) != "NONE":
            raise ctx.unsupported(f"{name}={value!r}: optkit runs GroupQueryAttention with an unquantized KV cache")
    return (heads, kv_heads, float(a.get("scale", 0.0)), float(a.get("softcap", 0.0)),
            int(a.get("local_window_size", -1)), int(a.get("smooth_softmax", -1)) == 1,
            bool(a.get("do_rotary", 0)), bool(a.get("rotary_interleaved", 0)))


def _gqa_heads(ctx, query, key, value, head_counts: tuple[int, int], work) -> tuple:
    """``(q, k, v, head)``: the query, key and value (unpacked from a packed query when ``key`` is None) as
    (batch, S, heads or kv_heads, head) in the ``work`` dtype, and the head size."""
    heads, kv_heads = head_counts
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
    return (jnp.reshape(q, (batch, length, heads, head)).astype(work),
            jnp.reshape(k, (batch, length, kv_heads, head)).astype(work),
            jnp.reshape(v, (batch, length, kv_heads, head)).astype(work), head)


def _softmax_with_sink(scores, sink, heads: int, work):
    """The softmax over the last axis of (batch, heads, S, keys) ``scores``; with a per-head ``sink`` (``head_sink``,
    or zeros for ``smooth_softmax``), ``exp(sink)`` added to each sum (None: the plain softmax)."""
    if sink is None:
        return jax.nn.softmax(scores, axis=-1)
    sink = jnp.reshape(jnp.asarray(sink), (heads,)).astype(work)[None, :, None, None]
    top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink)
    e = jnp.exp(scores - top)
    return e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))


def _key_mask(ctx, m, batch, length, keys, fill, what, starts):
    """The additive (batch, S or 1, keys) mask of a fused attention's mask input, as ONNX Runtime's CPU kernels read
    it: 1-D (batch) each sequence's end (``fill`` at and after it; with ``starts``, (2 batch) the starts too),
    2-D (batch, keys) or 3-D (batch, S, keys) 0/1 (``fill`` where 0)."""
    m = jnp.asarray(m)
    j = jnp.arange(keys)
    if m.ndim == 1 and (m.shape[0] == batch or starts and m.shape[0] == 2 * batch):
        dropped = j[None, :] >= m[:batch, None]
        if m.shape[0] == 2 * batch:
            dropped |= j[None, :] < jnp.minimum(m[batch:], keys)[:, None]
        return jnp.where(dropped, fill, 0.0)[:, None, :]
    if m.ndim == 2 and m.shape == (batch, keys):
        return jnp.where(m > 0, 0.0, fill)[:, None, :]
    if m.ndim == 3 and m.shape == (batch, length, keys):
        return jnp.where(m > 0, 0.0, fill)
    ends = "(batch) or (2 batch)" if starts else "(batch)"
    raise ctx.unsupported(f"{what} of shape {m.shape}: optkit runs {ends}, (batch, {keys}) and (batch, {length}, "
                          f"{keys})")


def _attend(q, k, v, mask, causal, before, fill, bias, alpha):
    """softmax(alpha Q K^T + mask (+ ``fill`` after each query when ``causal``) + bias) V of (batch, heads, S,
    head) Q and (batch, heads, keys, head) K and V (the first ``before`` keys a past), as (batch, S, heads * head)."""
    batch, _, length, _ = q.shape
    keys = k.shape[2]
    scores = jnp.einsum("bnsd,bntd->bnst", q, k) * jnp.asarray(alpha, q.dtype)
    if causal:
        later = jnp.arange(keys)[None, :] > before + jnp.arange(length)[:, None]
        mask = (0.0 if mask is None else mask) + jnp.where(later, fill, 0.0)[None]
    if mask is not None:
        scores = scores + jnp.broadcast_to(mask, (batch, length, keys))[:, None].astype(q.dtype)
    if bias is not None:
        scores = scores + jnp.asarray(bias).astype(q.dtype)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.reshape(jnp.einsum("bnst,bntd->bsnd", probs, v), (batch, length, -1))


@OPS.op("Attention", 1, accepts=Accepts({"num_heads": _HEADS, "unidirectional": _FLAG}, {0: (3, 3)}))
def _contrib_attention(ctx):
    """BERT- and GPT-style self-attention as ONNX Runtime's transformer optimizer fuses it, following ONNX
    Runtime 1.32's CPU kernel: ``input @ weights (+ bias)`` split into Q, K, V (``qkv_hidden_sizes``, default
    three equal parts) of ``num_heads`` heads; ``past`` (2, batch, heads, P, head) before K and V, ``present``
    the concatenation; scores ``scale * Q K^T`` (default 1/sqrt(head)) plus an additive mask of
    ``mask_filter_value`` (default -10000) where a key is masked: ``mask_index`` 1-D (batch) each sequence's end
    (keys at or after it; (2 batch): starts too), 2-D (batch, P+S) or 3-D (batch, S, P+S) a raw 0/1 mask;
    ``unidirectional`` adds it again to the keys after each query (causal); plus ``attention_bias``. Softmax in
    float32. Outputs: (batch, S, v hidden) and ``present``."""
    a = ctx.attrs
    if "num_heads" not in a:
        raise ctx.error("the required attribute 'num_heads' is missing")
    heads, causal = int(a["num_heads"]), bool(a.get("unidirectional", 0))
    sizes = [int(v) for v in a.get("qkv_hidden_sizes", [])]
    scale, fill = a.get("scale"), float(a.get("mask_filter_value", -10000.0))
    for name in ("do_rotary", "past_present_share_buffer"):
        if int(a.get(name, 0)):
            raise ctx.unsupported(f"{name}=1 is not run")

    def attention(x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                  past_sequence_length=None):
        if past_sequence_length is not None:
            raise ctx.unsupported("input 'past_sequence_length' (a shared past/present buffer) is not run")
        if jnp.ndim(x) != 3 or jnp.ndim(weights) != 2 or jnp.shape(weights)[0] != jnp.shape(x)[2]:
            raise ctx.error(f"input {jnp.shape(x)} and weights {jnp.shape(weights)} must be (batch, S, in) and "
                            f"(in, q + k + v hidden)")
        q_size, k_size, v_size = sizes or [jnp.shape(weights)[1] // 3] * 3
        if q_size + k_size + v_size != jnp.shape(weights)[1] or q_size != k_size or any(
                s % heads for s in (q_size, v_size)):
            raise ctx.error(f"qkv_hidden_sizes {[q_size, k_size, v_size]} do not fit weights {jnp.shape(weights)} "
                            f"and num_heads={heads}")
        dtype = jnp.result_type(x)
        work = jnp.float64 if dtype == jnp.float64 else jnp.float32
        batch, length, _ = jnp.shape(x)
        qkv = jnp.matmul(x, weights)
        if bias is not None:
            qkv = qkv + bias
        q, k, v = jnp.split(qkv.astype(work), [q_size, q_size + k_size], axis=2)

        def split_heads(t):
            return jnp.transpose(jnp.reshape(t, (batch, length, heads, -1)), (0, 2, 1, 3))

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        before = 0
        if past is not None:
            if jnp.ndim(past) != 5 or jnp.shape(past)[:3] != (2, batch, heads):
                raise ctx.error(f"past must be (2, batch, num_heads, past length, head), got {jnp.shape(past)}")
            before = jnp.shape(past)[3]
            k = jnp.concatenate([jnp.asarray(past[0]).astype(work), k], axis=2)
            v = jnp.concatenate([jnp.asarray(past[1]).astype(work), v], axis=2)
        wants_present = len(ctx.outputs) > 1 and bool(ctx.outputs[1])
        if wants_present and k.shape != v.shape:
            raise ctx.error(f"a present of keys {k.shape} and values {v.shape} cannot be one tensor: output "
                            f"'present' needs equal key and value sizes in qkv_hidden_sizes")
        keys = before + length
        alpha = scale if scale is not None else 1 / np.sqrt(q_size // heads)
        mask = None if mask_index is None else _key_mask(ctx, mask_index, batch, length, keys, fill, "mask_index",
                                                          starts=True)
        out = _attend(q, k, v, mask, causal, before, fill, attention_bias, alpha).astype(dtype)
        return (out, jnp.stack([k, v]).astype(dtype)) if wants_present else out

    return attention


@OPS.op("RotaryEmbedding", 1, table_inputs=(2, 3), float16=FLOAT16_KERNEL, accepts=Accepts(
    {"num_heads": (0, 65536), "rotary_embedding_dim": (0, 65536), "interleaved": _FLAG}))
def _contrib_rotary_embedding(ctx):
    """ONNX Runtime's rotary embedding (its ``com.microsoft`` operator; ONNX's own has the caches before the
    positions): ``input`` (batch, S, num_heads * head) or (batch, num_heads, S, head), ``position_ids`` (batch,
    S) or one offset (shape (1,): positions ``offset + 0..S-1``), ``cos_cache``/``sin_cache`` (max positions,
    rotary dim / 2); the first rotary dim features of each head rotated in pairs ``(i, i + d/2)`` or, with
    ``interleaved``, ``(2i, 2i+1)``; the rest as they are."""
    heads = int(ctx.attrs.get("num_heads", 0))
    interleaved = bool(ctx.attrs.get("interleaved", 0))
    if int(ctx.attrs.get("is_packed_batching", 0)):
        raise ctx.unsupported("is_packed_batching=1 is not run")

    def rotary_embedding(x, position_ids, cos_cache, sin_cache):
        rank, dim = jnp.ndim(x), 2 * jnp.shape(cos_cache)[-1]
        if rank == 4:
            xs = jnp.transpose(x, (0, 2, 1, 3))
        elif rank == 3:
            head = dim if heads <= 0 else jnp.shape(x)[2] // heads
            if jnp.shape(x)[2] % head:
                raise ctx.error(f"a 3-D input's hidden size {jnp.shape(x)[2]} is not num_heads={heads} heads")
            xs = jnp.reshape(x, (*jnp.shape(x)[:2], -1, head))
        else:
            raise ctx.error(f"input must be 3-D or 4-D, got {jnp.shape(x)}")
        batch, length = xs.shape[:2]
        if dim > xs.shape[3]:
            raise ctx.error(f"cos_cache's last dimension {dim // 2} is more than half the head size {xs.shape[3]}")
        p = jnp.asarray(position_ids)
        positions = (p.reshape(()) + jnp.arange(length))[None] if p.size == 1 and p.ndim <= 1 else p
        positions = jnp.broadcast_to(positions, (batch, length))
        cos = take(cos_cache, checked_indices(ctx, positions, jnp.shape(cos_cache)[0], "cos_cache"), 0)[:, :, None, :]
        sin = take(sin_cache, checked_indices(ctx, positions, jnp.shape(sin_cache)[0], "sin_cache"), 0)[:, :, None, :]
        out = rotary(xs, cos, sin, interleaved).astype(jnp.result_type(x))
        return jnp.reshape(out, jnp.shape(x)) if rank == 3 else jnp.transpose(out, (0, 2, 1, 3))

    return rotary_embedding


@OPS.op("MultiHeadAttention", 1, accepts=Accepts({"num_heads": _HEADS, "unidirectional": _FLAG}, {0: (3, 5)}))
def _multi_head_attention(ctx):
    """Multi-head attention on projected inputs as ONNX Runtime's optimizers and Optimum write it (decoders,
    T5, Whisper), following ONNX Runtime 1.32's CPU kernel. ``query`` (batch, S, hidden) with ``key`` (batch, L,
    hidden) and ``value`` (batch, L, v hidden), or ``key``/``value`` already split into heads (batch, heads, L,
    head: a cross-attention cache, used as they are); the packed QKV and KV forms, which ONNX Runtime runs on GPUs
    only, are refused. ``bias`` (hidden + hidden + v hidden) is added to the projections given as 3-D;
    ``past_key``/``past_value`` (batch, heads, P, head) go before K and V (``present_key``/``present_value``).
    Scores ``scale * Q K^T`` (default 1/sqrt(head)) plus ``attention_bias`` plus ``mask_filter_value`` (default
    -10000) where ``key_padding_mask`` (batch, P+L) is 0, or at and after each sequence's length (batch), and
    after each query with ``unidirectional``; softmax in float32."""
    a = ctx.attrs
    if "num_heads" not in a:
        raise ctx.error("the required attribute 'num_heads' is missing")
    heads, causal = int(a["num_heads"]), bool(a.get("unidirectional", 0))
    scale, fill = a.get("scale"), float(a.get("mask_filter_value", -10000.0))

    def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                             past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None):
        for given, name in ((past_sequence_length, "past_sequence_length"), (cache_indirection, "cache_indirection")):
            if given is not None:
                raise ctx.unsupported(f"input {name!r} (beam search's shared buffers) is not run")
        dtype = jnp.result_type(query)
        work = jnp.float64 if dtype == jnp.float64 else jnp.float32
        batch, length = jnp.shape(query)[:2]

        def heads_first(t):  # (batch, n, heads * head) -> (batch, heads, n, head)
            return jnp.transpose(jnp.reshape(t, (batch, jnp.shape(t)[1], heads, -1)), (0, 2, 1, 3))

        if jnp.ndim(query) != 3 or key is None or value is None or jnp.ndim(key) not in (3, 4):
            raise ctx.unsupported(f"query {jnp.shape(query)}, key {None if key is None else jnp.shape(key)} and value "
                                  f"{None if value is None else jnp.shape(value)}: optkit runs a 3-D query with 3-D "
                                  f"or (batch, heads, L, head) key and value, as ONNX Runtime's CPU kernel does "
                                  f"(packed QKV and KV are GPU forms)")
        parts = [None, None, None]
        if bias is not None:
            q_size, k_size = jnp.shape(query)[2], jnp.shape(query)[2]
            if jnp.shape(bias)[0] <= q_size + k_size:
                raise ctx.error(f"bias of {jnp.shape(bias)[0]} does not hold the query, key and value biases")
            parts = jnp.split(jnp.asarray(bias), [q_size, q_size + k_size])
        q = heads_first(query if parts[0] is None else query + parts[0])
        if jnp.ndim(key) == 4:  # already (batch, heads, L, head): a cross-attention cache, used as it is
            k, v = key, value
        else:
            k = heads_first(key if parts[1] is None else key + parts[1])
            v = heads_first(value if parts[2] is None else value + parts[2])
        q, k, v = (jnp.asarray(t).astype(work) for t in (q, k, v))
        before = 0
        if (past_key is None) != (past_value is None):
            raise ctx.error("past_key and past_value must be given together")
        if past_key is not None:
            before = jnp.shape(past_key)[2]
            k = jnp.concatenate([jnp.asarray(past_key).astype(work), k], axis=2)
            v = jnp.concatenate([jnp.asarray(past_value).astype(work), v], axis=2)
        keys = k.shape[2]
        alpha = scale if scale is not None else 1 / np.sqrt(q.shape[3])
        mask = None if key_padding_mask is None else _key_mask(ctx, key_padding_mask, batch, length, keys, fill,
                                                               "key_padding_mask", starts=False)
        out = _attend(q, k, v, mask, causal, before, fill, attention_bias, alpha).astype(dtype)
        return out, k.astype(dtype), v.astype(dtype)

    return multi_head_attention
