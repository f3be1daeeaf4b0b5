"""Attention building blocks of opset 23: ``RotaryEmbedding`` (and ``RMSNormalization`` in normalization).

``RotaryEmbedding`` rotates the first ``rotary_embedding_dim`` features of each
head by the angles in ``cos_cache`` and ``sin_cache`` (gathered by
``position_ids`` when given), in halves or in interleaved pairs, as ONNX's
reference implementation does; it is differentiable in ``X`` and the caches.
"""

from __future__ import annotations

import jax.numpy as jnp

from optkit.onnx._ops._common import checked_indices
from optkit.onnx._ops._registry import Family

OPS = Family("attention")


@OPS.op("RotaryEmbedding", 23)
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
            cos_cache = jnp.take(cos_cache, checked_indices(ctx, position_ids, cos_cache.shape[0], "cos_cache"),
                                 axis=0, mode="fill")
            sin_cache = jnp.take(sin_cache, checked_indices(ctx, position_ids, sin_cache.shape[0], "sin_cache"),
                                 axis=0, mode="fill")
        for cache, what in ((cos_cache, "cos_cache"), (sin_cache, "sin_cache")):
            if jnp.shape(cache)[-1] != dim // 2:
                raise ctx.error(f"{what}'s last dimension is {jnp.shape(cache)[-1]}, not rotary_embedding_dim / 2 "
                                f"= {dim // 2}")
        cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]
        rotate, keep = xs[..., :dim], xs[..., dim:]
        if interleaved:
            x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
        else:
            x1, x2 = rotate[..., :dim // 2], rotate[..., dim // 2:]
        real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
        if interleaved:
            rotated = jnp.reshape(jnp.stack([real, imag], axis=-1), rotate.shape)
        else:
            rotated = jnp.concatenate([real, imag], axis=-1)
        out = jnp.concatenate([rotated, keep], axis=-1).astype(jnp.result_type(x))
        return jnp.reshape(out, jnp.shape(x)) if rank == 3 else jnp.transpose(out, (0, 2, 1, 3))

    return rotary_embedding
