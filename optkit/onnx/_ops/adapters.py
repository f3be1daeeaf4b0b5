"""``ai.optkit::LoRA``: a low-rank adapter's term at the matmul it adapts, which :func:`optkit.onnx.to_jax`
adds with ``lora=`` (:mod:`optkit.onnx._load.adapters`); no exporter writes it.

``delta = scale * dropout(x') @ A @ B``, with ``x'`` the matmul's activation input (transposed for a
``Gemm`` with ``transA``), ``A`` (in x rank) and ``B`` (rank x out) the adapter, computed in the adapter's
dtype and given in ``x``'s. Dropout (attribute ``dropout``, the rate) draws from the run's random key
(``apply_fn(..., rng=key)``) and is off without one, as Flax's ``nnx.Dropout`` is when deterministic.
Source: Hu et al. (2021), "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from optkit.onnx._base.tracing import random_key_active
from optkit.onnx._ops._common import node_key
from optkit.onnx._ops._registry import Family

OPS = Family("adapters", "ai.optkit")


@OPS.op("LoRA", 1)
def _lora(ctx):
    scale = float(ctx.attrs.get("scale", 1.0))
    rate = float(ctx.attrs.get("dropout", 0.0))
    trans = bool(ctx.attrs.get("trans_x", 0))
    if not 0 <= rate < 1:
        raise ctx.error(f"dropout must be in [0, 1), got {rate}")

    def lora(x, a, b):
        x = jnp.asarray(x)
        if trans:
            x = x.T
        work = jnp.result_type(a, b)
        h = x.astype(work)
        if rate and random_key_active() is not None:
            keep = jax.random.bernoulli(node_key(ctx), 1 - rate, h.shape)
            h = jnp.where(keep, h / (1 - rate), jnp.zeros((), work))
        return ((h @ a) @ b * jnp.asarray(scale, work)).astype(x.dtype)

    return lora
