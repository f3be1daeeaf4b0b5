"""Train the character-level LM of lm_adafactor.py with its blocks scanned: the loss curve equals the unrolled one.

The transformer of ``examples/transformer.py`` is built twice from the same
weights: once as it is (``num_layers`` separate blocks, a Python loop), once
with its blocks stacked into ``[layers, ...]`` parameters (``nnx.vmap``) and
run by ``nnx.scan``, what large models do to compile one block instead of
``num_layers``. Both train on Python's ``pydoc_data.topics`` with the same
batches and ``optkit.adafactor``. The scanned model's optimizer gets one
factor rule per kind of parameter: its leading axis is a batch axis
(``"batch"``), so Adafactor's statistics, ``RMS(X)``, ``RMS(U)`` and
clipping are per layer, and it trains exactly as the unrolled model. With
``--no-rules`` the stacked arrays are one tensor each for ``RMS`` and the
curves part.

Run from the repository root (about a minute on 2 CPU cores)::

    python examples/lm_scanned.py
    python examples/lm_scanned.py --no-rules      # the stacked arrays as whole tensors: the curves differ
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optkit  # noqa: E402
from examples.lm_adafactor import CharData, load_text  # noqa: E402
from examples.transformer import Block, Transformer, TransformerConfig  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")

# The scanned model's parameters under "blocks" have a leading layers axis: a batch axis for Adafactor.
# Kernels are [layers, in, out] (rows: in, columns: out); biases and LayerNorm parameters [layers, d].
SCANNED_RULES = [
    (r"^blocks/.*/kernel$", ("batch", "row", "column")),
    (r"^blocks/", ("batch", "none")),
    (r".*", "heuristic"),  # the embeddings, the final LayerNorm and the head: as in the unrolled model
]


class ScannedTransformer(nnx.Module):
    """``Transformer`` with its blocks stacked (``nnx.vmap``) and run by ``nnx.scan``, from ``unrolled``'s weights."""

    def __init__(self, unrolled: Transformer):
        cfg = unrolled.cfg
        self.cfg = cfg

        @nnx.vmap(in_axes=0, out_axes=0)
        def make(key):
            return Block(cfg, rngs=nnx.Rngs(key))

        self.blocks = make(jax.random.split(jax.random.key(0), cfg.num_layers))
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves),
                               *[nnx.state(block, nnx.Param) for block in unrolled.blocks])
        nnx.update(self.blocks, stacked)
        self.embed, self.pos_embed, self.ln_f, self.head = (unrolled.embed, unrolled.pos_embed, unrolled.ln_f,
                                                            unrolled.head)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[-1]))

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def run(block, x):
            return block(x)

        return self.head(self.ln_f(run(self.blocks, x)))


def train(model, tx, data, args) -> list[float]:
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = jax.tree.map(jnp.copy, params)
    rng = np.random.default_rng(args.seed)  # the same batches for both models
    losses = []
    for _ in range(args.steps):
        x, y = data.batch(rng, args.batch_size)
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return losses


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps per model")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens (characters) per sequence")
    parser.add_argument("--d-model", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    parser.add_argument("--no-rules", action="store_true", help="no factor rules for the scanned model")
    parser.add_argument("--out", default=OUT_DIR, help="folder for the JSON of both curves")
    args = parser.parse_args(argv)

    data = CharData(load_text(), args.seq_len)
    cfg = TransformerConfig(vocab_size=len(data.chars), d_model=args.d_model, num_heads=args.heads,
                            num_layers=args.layers, max_len=args.seq_len)
    unrolled = Transformer(cfg, rngs=nnx.Rngs(args.seed))
    scanned = ScannedTransformer(unrolled)
    unrolled_losses = train(unrolled, optkit.adafactor(), data, args)
    scanned_tx = optkit.adafactor() if args.no_rules else optkit.adafactor(factor_map=SCANNED_RULES)
    scanned_losses = train(scanned, scanned_tx, data, args)
    gap = float(np.max(np.abs(np.array(scanned_losses) - unrolled_losses) / np.array(unrolled_losses)))
    print(f"unrolled: loss {unrolled_losses[0]:.4f} -> {unrolled_losses[-1]:.4f}")
    print(f"scanned:  loss {scanned_losses[0]:.4f} -> {scanned_losses[-1]:.4f}"
          f"{' (no factor rules)' if args.no_rules else ' (layers as a batch axis)'}")
    same = gap < 1e-4
    print(f"largest relative difference of the two loss curves over {args.steps} steps: {gap:.2e} "
          f"({'equal within rounding' if same else 'they differ'})")
    os.makedirs(args.out, exist_ok=True)
    import json

    with open(os.path.join(args.out, "lm_scanned.json"), "w") as f:
        json.dump({"unrolled": unrolled_losses, "scanned": scanned_losses, "rules": not args.no_rules}, f)
    return {"unrolled": unrolled_losses, "scanned": scanned_losses, "gap": gap}


if __name__ == "__main__":
    main()
