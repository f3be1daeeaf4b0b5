"""Train a character-level transformer on Python's own documentation: optkit.adafactor vs optkit.adam.

The text is the standard library's ``pydoc_data.topics`` (the help() topics,
about 465,000 characters, shipped with every Python), so nothing is
downloaded. The same model (``examples/transformer.py``), initialisation and
batches are trained once with each optimizer; the script prints a summary
(losses, optimizer-state bytes, step time), a sample of generated text, and
saves the loss curves to ``examples/out/lm_adafactor.png``.

Adafactor runs with the paper's defaults (relative step size
``rho_t = min(1e-2, 1/sqrt(t))`` times the parameter scale, ``b2_t = 1 - t^-0.8``,
update clipping at 1, no first moment; ``--adafactor-lr`` replaces ``rho_t``);
Adam with a constant learning rate (``--adam-lr``).

Run from the repository root (a few minutes on 2 CPU cores)::

    python examples/lm_adafactor.py            # 300 steps per optimizer
    python examples/lm_adafactor.py --steps 3000 --d-model 256 --layers 6
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optkit  # noqa: E402
from examples.transformer import Transformer, TransformerConfig, count_params  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def load_text() -> str:
    """The help() topics of this Python, in a fixed order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))


class CharData:
    """Characters as integer ids, a 90/10 train/validation split, and random windows.

    Every tenth block of 4,096 characters is validation text, so both splits
    cover all topics (the topics differ in style: grammar rules, prose, code).
    """

    def __init__(self, text: str, seq_len: int, block: int = 4096):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = np.array([self.index[c] for c in text], np.int32)
        blocks = [ids[i : i + block] for i in range(0, len(ids), block)]
        self.train = np.concatenate([b for i, b in enumerate(blocks) if i % 10 != 9])
        self.val = np.concatenate([b for i, b in enumerate(blocks) if i % 10 == 9])
        self.seq_len = seq_len

    def batch(self, rng: np.random.Generator, batch_size: int, split: str = "train"):
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - self.seq_len - 1, batch_size)
        windows = np.stack([data[s : s + self.seq_len + 1] for s in starts])
        return jnp.asarray(windows[:, :-1]), jnp.asarray(windows[:, 1:])

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def tree_bytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def train(name, tx, graphdef, params, data, args):
    """Train a copy of ``params`` with ``tx``; returns a record of the run."""

    def loss_fn(params, x, y):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    eval_loss = jax.jit(loss_fn)
    params = jax.tree.map(jnp.copy, params)  # both runs start from the same weights
    opt_state = tx.init(params)
    state_bytes = tree_bytes(opt_state)
    batch_rng = np.random.default_rng(args.seed)  # the same batches for every optimizer
    val_batches = [data.batch(np.random.default_rng(1000 + i), args.batch_size, "val") for i in range(4)]
    train_losses, val_curve, step_seconds = [], [], []
    for step in tqdm(range(1, args.steps + 1), desc=f"{name:>9}", unit="step"):
        x, y = data.batch(batch_rng, args.batch_size)
        start = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, x, y)
        train_losses.append(float(loss))  # waits for the step
        if step > 1:  # the first step compiles
            step_seconds.append(time.perf_counter() - start)
        if step % args.eval_every == 0 or step == args.steps:
            val = np.mean([float(eval_loss(params, vx, vy)) for vx, vy in val_batches])
            val_curve.append((step, val))
    return {
        "name": name,
        "params": params,
        "train_losses": train_losses,
        "val_curve": val_curve,
        "state_bytes": state_bytes,
        "step_ms": 1e3 * statistics.median(step_seconds) if step_seconds else float("nan"),
    }


def sample(graphdef, params, data, prompt: str, length: int, temperature: float, seed: int) -> str:
    """Sample ``length`` characters after ``prompt`` from a window of the model's context length."""
    seq_len = data.seq_len
    forward = jax.jit(lambda p, tokens: nnx.merge(graphdef, p)(tokens[None])[0])
    ids = [data.index.get(c, 0) for c in prompt]
    key = jax.random.key(seed)
    for _ in range(length):
        window = ids[-seq_len:]
        padded = jnp.asarray(window + [0] * (seq_len - len(window)), jnp.int32)  # causal: padding is unseen
        logits = forward(params, padded)[len(window) - 1]
        key, sub = jax.random.split(key)
        ids.append(int(jax.random.categorical(sub, logits / temperature)))
    return data.decode(ids)


def plot(runs, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, color in zip(runs, ["tab:blue", "tab:orange"]):
        losses = np.asarray(run["train_losses"])
        window = min(10, len(losses))  # a running mean over 10 steps
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        steps = np.arange(window, len(losses) + 1)
        ax.plot(steps, smooth, color=color, alpha=0.8, label=f"{run['name']} train")
        steps, vals = zip(*run["val_curve"])
        ax.plot(steps, vals, "o--", color=color, label=f"{run['name']} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title("Character-level transformer on pydoc_data.topics")
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per optimizer")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens (characters) per sequence")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=3, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    parser.add_argument("--adam-lr", type=float, default=2e-3, help="optkit.adam's learning rate")
    parser.add_argument("--adafactor-lr", type=float, default=None,
                        help="optkit.adafactor's learning_rate; None: the paper's relative step rho_t")
    parser.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    parser.add_argument("--out", default=OUT_DIR, help="folder for the PNG")
    args = parser.parse_args(argv)

    data = CharData(load_text(), args.seq_len)
    cfg = TransformerConfig(vocab_size=len(data.chars), d_model=args.d_model, num_heads=args.heads,
                            num_layers=args.layers, max_len=args.seq_len)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(args.seed)), nnx.Param)
    print(f"text: {len(data.train) + len(data.val):,} characters, {len(data.chars)} distinct; "
          f"model: {count_params(params):,} parameters ({tree_bytes(params):,} bytes)")

    runs = [
        train("adafactor", optkit.adafactor(args.adafactor_lr), graphdef, params, data, args),
        train("adam", optkit.adam(args.adam_lr), graphdef, params, data, args),
    ]

    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "lm_adafactor.png")
    plot(runs, png)

    print(f"\n## Summary ({args.steps} steps, batch {args.batch_size} x {args.seq_len} characters)\n")
    print("| optimizer | train loss (last 20 steps) | validation loss | optimizer state (bytes) "
          "| state / params | step time (median ms) |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        print(f"| {run['name']} | {np.mean(run['train_losses'][-20:]):.3f} | {run['val_curve'][-1][1]:.3f} "
              f"| {run['state_bytes']:,} | {run['state_bytes'] / tree_bytes(params):.3f} "
              f"| {run['step_ms']:.1f} |")
    for run in runs:
        text = sample(graphdef, run["params"], data, "The ", 240, 0.8, args.seed)
        rule = "-" * 60
        print(f"\nSample from the {run['name']} model (temperature 0.8):\n{rule}\n{text}\n{rule}")
    print(f"\nloss curves: {png}")


if __name__ == "__main__":
    main()
