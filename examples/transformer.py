"""A small decoder-only transformer language model in Flax NNX, character level.

Reused by ``examples/lm_adafactor.py`` (training), ``benchmarks/adafactor.py``
(optimizer-state bytes of "the transformer parameter tree"),
``examples/sharded_training.py`` and ``benchmarks/sharding.py`` (data and
model parallel): every sharded parameter is created through one place
(:meth:`TransformerConfig.init`) that can wrap its initializer in
``nnx.with_partitioning`` from a per-role table of mesh axes.

Shapes (``d`` = ``d_model``, ``V`` = ``vocab_size``, ``L`` = ``max_len``)::

    embed/embedding            (V, d)        role "embed"
    pos_embed/embedding        (L, d)        role "pos_embed"
    blocks/i/ln1, ln2, ln_f    (d,) scale and bias
    blocks/i/attn/qkv/kernel   (d, 3d)       role "qkv"      (+ bias (3d,), role "qkv_bias")
    blocks/i/attn/out/kernel   (d, d)        role "attn_out" (+ bias (d,))
    blocks/i/mlp/up/kernel     (d, d_ff)     role "mlp_up"   (+ bias (d_ff,), role "mlp_up_bias")
    blocks/i/mlp/down/kernel   (d_ff, d)     role "mlp_down" (+ bias (d,))
    head/kernel                (d, V)        role "head"     (no bias)

Example:
  >>> from examples.transformer import TransformerConfig, abstract_params
  >>> tree = abstract_params(TransformerConfig(vocab_size=96))
  >>> tree["head"]["kernel"].shape
  (128, 96)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["TransformerConfig", "Transformer", "abstract_params", "abstract_state", "count_params"]

# Mesh axes per role for nnx.with_partitioning, in the order of the array's
# axes; a starting point for data/model parallelism (Megatron-style columns
# then rows: a column-parallel layer's bias is split with its outputs, a
# row-parallel layer's bias and the layer norms are replicated). Not used
# unless passed as TransformerConfig(partitioning=...).
MEGATRON_PARTITIONING: Mapping[str, tuple[str | None, ...]] = {
    "embed": (None, "model"),
    "pos_embed": (None, "model"),
    "qkv": (None, "model"),
    "qkv_bias": ("model",),
    "attn_out": ("model", None),
    "mlp_up": (None, "model"),
    "mlp_up_bias": ("model",),
    "mlp_down": ("model", None),
    "head": (None, "model"),
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes of the model.

    Attributes:
      vocab_size: number of characters (tokens).
      d_model: width of the residual stream.
      num_heads: attention heads (``d_model`` must be a multiple).
      num_layers: transformer blocks.
      d_ff: width of the MLP (default ``4 * d_model``).
      max_len: longest sequence (learned position embeddings).
      param_dtype: dtype of the parameters.
      partitioning: None, or mesh axes per role (see :data:`MEGATRON_PARTITIONING`);
        with it, build the model inside ``jax.set_mesh(mesh)``.
    """

    vocab_size: int
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int | None = None
    max_len: int = 128
    param_dtype: Any = jnp.float32
    partitioning: Mapping[str, tuple[str | None, ...]] | None = None

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of num_heads={self.num_heads}")

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def init(self, role: str, initializer):
        """``initializer``, wrapped in ``nnx.with_partitioning`` when ``partitioning`` names ``role``."""
        if self.partitioning is not None and role in self.partitioning:
            return nnx.with_partitioning(initializer, self.partitioning[role])
        return initializer


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        kernel = nnx.initializers.normal(0.02)
        self.num_heads = cfg.num_heads
        self.qkv = nnx.Linear(d, 3 * d, kernel_init=cfg.init("qkv", kernel),
                              bias_init=cfg.init("qkv_bias", nnx.initializers.zeros_init()),
                              param_dtype=cfg.param_dtype, rngs=rngs)
        # GPT-2's scaling of residual projections by depth
        out_kernel = nnx.initializers.normal(0.02 / (2 * cfg.num_layers) ** 0.5)
        self.out = nnx.Linear(d, d, kernel_init=cfg.init("attn_out", out_kernel), param_dtype=cfg.param_dtype,
                              rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        heads = lambda a: a.reshape(b, t, self.num_heads, d // self.num_heads)  # noqa: E731
        y = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.out(y.reshape(b, t, d))


class MLP(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        kernel = nnx.initializers.normal(0.02)
        down_kernel = nnx.initializers.normal(0.02 / (2 * cfg.num_layers) ** 0.5)
        self.up = nnx.Linear(cfg.d_model, cfg.ff, kernel_init=cfg.init("mlp_up", kernel),
                             bias_init=cfg.init("mlp_up_bias", nnx.initializers.zeros_init()),
                             param_dtype=cfg.param_dtype, rngs=rngs)
        self.down = nnx.Linear(cfg.ff, cfg.d_model, kernel_init=cfg.init("mlp_down", down_kernel),
                               param_dtype=cfg.param_dtype, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(cfg.d_model, param_dtype=cfg.param_dtype, rngs=rngs)
        self.attn = CausalSelfAttention(cfg, rngs=rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, param_dtype=cfg.param_dtype, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nnx.Module):
    """Decoder-only transformer: token ids (batch, time) -> next-token logits (batch, time, vocab)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        embed_init = nnx.initializers.normal(0.02)
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=cfg.init("embed", embed_init),
                               param_dtype=cfg.param_dtype, rngs=rngs)
        self.pos_embed = nnx.Embed(cfg.max_len, cfg.d_model, embedding_init=cfg.init("pos_embed", embed_init),
                                   param_dtype=cfg.param_dtype, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, param_dtype=cfg.param_dtype, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False,
                               kernel_init=cfg.init("head", nnx.initializers.normal(0.02)),
                               param_dtype=cfg.param_dtype, rngs=rngs)

    def __call__(self, tokens):
        t = tokens.shape[-1]
        if t > self.cfg.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len={self.cfg.max_len}")
        x = self.embed(tokens) + self.pos_embed(jnp.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def abstract_state(cfg: TransformerConfig) -> nnx.State:
    """The model's parameters as an abstract ``nnx.State`` (shapes, dtypes and any sharding metadata).

    Nothing is allocated: the model is built under ``nnx.eval_shape``. Use
    ``nnx.get_partition_spec`` on it when ``cfg.partitioning`` is set.
    """
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return nnx.state(model, nnx.Param)


def abstract_params(cfg: TransformerConfig) -> dict:
    """"The transformer parameter tree": a nested dict of ``jax.ShapeDtypeStruct``, no memory used.

    This is the tree an optimizer sees (``nnx.split(model, nnx.Param)`` as a
    pure dict), so ``jax.eval_shape(tx.init, abstract_params(cfg))`` gives the
    optimizer state's shapes without allocating anything.
    """
    return nnx.to_pure_dict(abstract_state(cfg))


def count_params(tree) -> int:
    """Number of scalars in a parameter tree (concrete or abstract)."""
    return sum(math.prod(leaf.shape) if hasattr(leaf, "shape") else 1 for leaf in jax.tree.leaves(tree))


def main(argv=None) -> None:
    """Print the parameter tree's shapes for the given sizes (nothing is allocated)."""
    import argparse

    parser = argparse.ArgumentParser(description="The transformer that the Adafactor examples train: print "
                                                 "its parameter shapes (a model definition; it trains nothing)")
    parser.add_argument("--vocab-size", type=int, default=104, help="tokens (default 104)")
    parser.add_argument("--d-model", type=int, default=128, help="width of the residual stream (default 128)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    args = parser.parse_args(argv)
    cfg = TransformerConfig(vocab_size=args.vocab_size, d_model=args.d_model, num_layers=args.layers,
                            num_heads=args.heads)
    params = abstract_params(cfg)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        print(f"{jax.tree_util.keystr(path):50s} {tuple(leaf.shape)}")
    print(f"{count_params(params):,} parameters")


if __name__ == "__main__":
    main()
