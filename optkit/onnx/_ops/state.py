"""Operators of carried state (opsets 24-27): ``TensorScatter`` (a KV-cache write), ``CausalConvWithState``
(Mamba's and Gated DeltaNet's causal depthwise convolution) and ``LinearAttention`` (linear, gated, delta and
gated-delta recurrences), each written from its ONNX operator page.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._ops._common import axis_index
from optkit.onnx._ops._registry import Family, Float16

OPS = Family("state")


@OPS.op("TensorScatter", 24, float16=Float16(kernel_since=24))
def _tensor_scatter(ctx):
    """``present = past`` with ``update`` written along ``axis`` from each batch row's ``write_indices`` (0 without
    them), wrapping around the cache's length in ``"circular"`` mode; writes past the end are dropped."""
    mode = ctx.attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.error(f"mode must be 'linear' or 'circular', got {mode!r}")

    def tensor_scatter(past, update, write_indices=None):
        rank = jnp.ndim(past)
        axis = axis_index(ctx, int(ctx.attrs.get("axis", -2)), rank)
        if axis == 0 or jnp.ndim(update) != rank or any(
                p != u for i, (p, u) in enumerate(zip(jnp.shape(past), jnp.shape(update))) if i != axis) or (
                jnp.shape(update)[axis] > jnp.shape(past)[axis]):
            raise ctx.error(f"update {jnp.shape(update)} must match past_cache {jnp.shape(past)} except along axis "
                            f"{axis} (not the batch axis), where it may be shorter")
        batch, length, count = jnp.shape(past)[0], jnp.shape(past)[axis], jnp.shape(update)[axis]
        start = (jnp.zeros((batch,), jnp.int32) if write_indices is None
                 else jnp.reshape(jnp.asarray(write_indices), (batch,)).astype(jnp.int32))
        positions = start[:, None] + jnp.arange(count, dtype=jnp.int32)[None, :]  # (batch, count)
        if mode == "circular":
            positions = positions % length
        moved_past, moved_update = jnp.moveaxis(past, axis, 1), jnp.moveaxis(update, axis, 1)
        # (batch, count) positions broadcast over the axes between the batch and the sequence
        prefix = jnp.shape(moved_past)[2:axis + 1]
        index = [jnp.arange(batch).reshape(batch, 1, *([1] * len(prefix)))]
        index.append(positions.reshape(batch, count, *([1] * len(prefix))))
        index += [jnp.arange(size).reshape(1, 1, *[size if j == i else 1 for j in range(len(prefix))])
                  for i, size in enumerate(prefix)]
        out = moved_past.at[tuple(index)].set(moved_update.astype(moved_past.dtype), mode="drop")
        return jnp.moveaxis(out, 1, axis)

    return tensor_scatter


@OPS.op("CausalConvWithState", 27)
def _causal_conv_with_state(ctx):
    """``padded = concat(past_state or zeros (B, C, k-1), input)``; ``output[b, c, t] = sum_j weight[c, 0, j]
    padded[b, c, t + j] + bias[c]``, then SiLU for ``activation`` ``"silu"``/``"swish"`` (in float32);
    ``present_state`` the last ``k - 1`` positions of ``padded``."""
    activation = ctx.attrs.get("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ctx.error(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")

    def causal_conv(x, weight, bias=None, past_state=None):
        if jnp.ndim(x) != 3 or jnp.ndim(weight) != 3 or jnp.shape(weight)[:2] != (jnp.shape(x)[1], 1):
            raise ctx.error(f"input must be (batch, channels, length) and weight (channels, 1, k), got "
                            f"{jnp.shape(x)} and {jnp.shape(weight)}")
        batch, channels, length = jnp.shape(x)
        k = jnp.shape(weight)[2]
        if past_state is None:
            past_state = jnp.zeros((batch, channels, k - 1), jnp.result_type(x))
        elif jnp.shape(past_state) != (batch, channels, k - 1):
            raise ctx.error(f"past_state must be {(batch, channels, k - 1)}, got {jnp.shape(past_state)}")
        dtype = jnp.result_type(x)
        padded = jnp.concatenate([jnp.asarray(past_state).astype(dtype), x], axis=2)
        work = jnp.float32 if jnp.dtype(dtype).itemsize < 4 else dtype  # 16-bit types summed in float32
        wide = padded.astype(work)
        y = sum(wide[:, :, j:j + length] * weight[None, :, 0, j:j + 1].astype(work) for j in range(k))
        if bias is not None:
            y = y + jnp.reshape(bias, (1, channels, 1)).astype(work)
        y = y.astype(dtype)  # the convolution's result in the input's type, then the activation in float32
        if activation != "none":
            f = y.astype(work)
            y = (f * jax.nn.sigmoid(f)).astype(dtype)
        return y, padded[:, :, padded.shape[2] - (k - 1):]

    return causal_conv


def _heads(x, heads):
    """(B, T, H*D) -> (B, H, T, D)."""
    b, t, hd = jnp.shape(x)
    return jnp.transpose(jnp.reshape(x, (b, t, heads, hd // heads)), (0, 2, 1, 3))


@OPS.op("LinearAttention", 27)
def _linear_attention(ctx):
    """The recurrence of ``update_rule`` over the tokens, state ``S`` (B, H_kv, d_k, d_v) in float32 (float64 for
    DOUBLE inputs):
    ``linear``: S += k v^T; ``gated``: S = exp(g) S + k v^T; ``delta``: S += k (beta (v - S^T k))^T;
    ``gated_delta``: S = exp(g) S, then as ``delta``. ``o_t = scale q_t^T S_t`` with each KV head's state read by
    ``q_num_heads / kv_num_heads`` query heads; ``scale`` 0 means ``1 / sqrt(d_k)``. ``chunk_size`` is a hint
    that changes no value."""
    rule = ctx.attrs.get("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.error(f"update_rule must be linear, gated, delta or gated_delta, got {rule!r}")
    q_heads, kv_heads = ctx.attrs.get("q_num_heads"), ctx.attrs.get("kv_num_heads")
    if not q_heads or not kv_heads or q_heads % kv_heads:
        raise ctx.error(f"q_num_heads ({q_heads}) must be a positive multiple of kv_num_heads ({kv_heads})")
    q_heads, kv_heads = int(q_heads), int(kv_heads)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")

    def linear_attention(query, key, value, past_state=None, decay=None, beta=None):
        if gated != (decay is not None) or delta != (beta is not None):
            raise ctx.error(f"update_rule {rule!r} takes {'a' if gated else 'no'} decay and {'a' if delta else 'no'} "
                            f"beta input")
        if any(jnp.ndim(v) != 3 for v in (query, key, value)):
            raise ctx.error("query, key and value must be (batch, tokens, heads * dim)")
        b, t, _ = jnp.shape(query)
        d_k, d_v = jnp.shape(query)[2] // q_heads, jnp.shape(value)[2] // kv_heads
        work = jnp.float64 if jnp.result_type(query) == jnp.float64 else jnp.float32  # float32 below that
        q, k, v = (_heads(x, h).astype(work) for x, h in ((query, q_heads), (key, kv_heads), (value, kv_heads)))
        steps = {"q": jnp.moveaxis(q, 2, 0), "k": jnp.moveaxis(k, 2, 0), "v": jnp.moveaxis(v, 2, 0)}
        if gated:
            last = jnp.shape(decay)[2]
            if last not in (kv_heads, kv_heads * d_k):
                raise ctx.error(f"decay's last axis must be kv_num_heads ({kv_heads}) or kv_num_heads * d_k "
                                f"({kv_heads * d_k}), got {last}")
            steps["g"] = jnp.moveaxis(_heads(decay, kv_heads).astype(work), 2, 0)  # (T, B, H, 1 or d_k)
        if delta:
            last = jnp.shape(beta)[2]
            if last not in (kv_heads, 1):
                raise ctx.error(f"beta's last axis must be kv_num_heads ({kv_heads}) or 1, got {last}")
            steps["beta"] = jnp.moveaxis(_heads(beta, last).astype(work), 2, 0)  # (T, B, H or 1, 1)
        if past_state is None:
            state, state_dtype = jnp.zeros((b, kv_heads, d_k, d_v), work), jnp.result_type(query)
        else:
            if jnp.shape(past_state) != (b, kv_heads, d_k, d_v):
                raise ctx.error(f"past_state must be {(b, kv_heads, d_k, d_v)}, got {jnp.shape(past_state)}")
            state, state_dtype = jnp.asarray(past_state).astype(work), jnp.result_type(past_state)
        scale = float(ctx.attrs.get("scale", 0.0)) or 1.0 / np.sqrt(d_k)

        def step(s, x):
            if gated:
                s = s * jnp.exp(x["g"])[..., None]
            update = x["v"]
            if delta:
                update = x["beta"] * (update - jnp.einsum("bhdm,bhd->bhm", s, x["k"]))
            s = s + x["k"][..., :, None] * update[..., None, :]
            read = jnp.repeat(s, q_heads // kv_heads, axis=1)
            return s, scale * jnp.einsum("bhd,bhdm->bhm", x["q"], read)

        state, outputs = lax.scan(step, state, steps)  # outputs (T, B, H_q, d_v)
        out = jnp.reshape(jnp.transpose(outputs, (1, 0, 2, 3)), (b, t, q_heads * d_v))
        return out.astype(jnp.result_type(query)), state.astype(state_dtype)

    return linear_attention
