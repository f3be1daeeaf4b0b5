"""The benchmarks' parameter trees (as ``jax.ShapeDtypeStruct``) and the deterministic arrays made for them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import optkit

__all__ = ["values", "make_tree", "abstract_leaves", "transformer_tree", "gpt_tree", "flat_abstract", "nbytes",
           "nparams"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def values(shape, dtype, seed, scale):
    """Deterministic, smooth pseudo-random values; one output buffer, no temporaries."""
    n = int(np.prod(shape, dtype=np.int64))
    i = jnp.arange(n, dtype=jnp.float32)
    return (scale * jnp.sin(i * 0.7071 + seed * 1.618)).astype(dtype).reshape(shape)


def make_tree(abstract, seed: float, scale: float):
    """Concrete arrays for a tree of ``jax.ShapeDtypeStruct``, each made directly on device."""
    leaves, treedef = jax.tree.flatten(abstract)
    return treedef.unflatten(
        [values(tuple(x.shape), jnp.dtype(x.dtype), jnp.float32(seed + k), scale) for k, x in enumerate(leaves)]
    )


def abstract_leaves(count: int, shape: tuple[int, ...]):
    return {f"layer{i:05d}": jax.ShapeDtypeStruct(shape, jnp.float32) for i in range(count)}


def transformer_tree(quick: bool):
    """``examples/transformer.py``'s parameter tree, as ``jax.ShapeDtypeStruct``, and where it comes from.

    GPT-2-small sizes: d_model 768, 12 layers, 1024 positions, 256 tokens
    (``quick``: d_model 64, 2 layers). Returns ``(tree, source)``.
    """
    sizes = dict(vocab_size=256, d_model=768, num_heads=12, num_layers=12, max_len=1024)
    if quick:
        sizes = dict(vocab_size=64, d_model=64, num_heads=2, num_layers=2, max_len=32)
    from examples.transformer import TransformerConfig, abstract_params

    return abstract_params(TransformerConfig(**sizes)), "examples/transformer.py"


def gpt_tree(quick: bool):
    """A GPT-2-style tree (issue 18): 6 layers, d_model 768, vocabulary 50257 tied to the output, 1024 positions.

    76 leaves: token and position embeddings, per layer two LayerNorms (scale,
    bias), a fused QKV projection (768 x 2304), the attention output (768 x
    768) and the MLP (768 x 3072, 3072 x 768), each with a bias; a final
    LayerNorm. No separate output matrix (tied embedding).
    """
    d, layers, vocab, positions = (64, 2, 512, 32) if quick else (768, 6, 50257, 1024)

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def norm():
        return {"scale": s(d), "bias": s(d)}

    def block():
        return {"ln1": norm(), "ln2": norm(),
                "attn": {"qkv": {"kernel": s(d, 3 * d), "bias": s(3 * d)}, "out": {"kernel": s(d, d), "bias": s(d)}},
                "mlp": {"up": {"kernel": s(d, 4 * d), "bias": s(4 * d)},
                        "down": {"kernel": s(4 * d, d), "bias": s(d)}}}

    return {"wte": {"embedding": s(vocab, d)}, "wpe": {"embedding": s(positions, d)},
            "blocks": {str(i): block() for i in range(layers)}, "ln_f": norm()}


def flat_abstract(abstract_tree):
    """The :class:`optkit.FlatParams` layout of a tree, with abstract buffers (nothing computed)."""
    return jax.eval_shape(optkit.FlatParams.from_tree, abstract_tree)


def nbytes(tree) -> int:
    return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def nparams(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))
