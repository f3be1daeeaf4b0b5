"""Train a Flax NNX classifier on scikit-learn's digits with optkit's optimizers beside Optax's.

The data ship with scikit-learn (no network). Each optimizer trains the same
MLP from the same initialization with the same mini-batches; the script prints
a table (final train loss, test accuracy, optimizer-state bytes, median step
time) and saves the loss curves as a PNG.

The training step is the pattern the README recommends: a pure function of
``(params, opt_state, batch)`` jitted with the parameters and optimizer state
donated, so XLA updates them in place.

Run from the repository root::

    python examples/quickstart.py            # about a minute on 2 CPU cores
    python examples/quickstart.py --steps 200 --out /tmp/quickstart
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import optkit  # noqa: E402


class MLP(nnx.Module):
    """64 -> hidden -> hidden -> 10 with ReLU."""

    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(64, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.l3 = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x):
        return self.l3(nnx.relu(self.l2(nnx.relu(self.l1(x)))))


def optimizers() -> dict[str, optax.GradientTransformation]:
    """Each optkit optimizer beside its nearest Optax counterpart."""
    table = {
        "optkit.adagrad": optkit.adagrad(0.05),
        "optax.adagrad": optax.adagrad(0.05),
        "optkit.adam": optkit.adam(2e-3),
        "optax.adam": optax.adam(2e-3),
        "optkit.momentum": optkit.momentum(0.05, alpha=0.9),
        "optax.sgd(momentum)": optax.sgd(0.05, momentum=0.9),
    }
    if hasattr(optkit, "adafactor"):
        table["optkit.adafactor"] = optkit.adafactor()
        # optax.adafactor's learning_rate=None means no step size at all; give it the paper's
        # relative step size rho_t = min(1e-2, 1/sqrt(t)), which optkit.adafactor() uses by default.
        table["optax.adafactor"] = optax.adafactor(
            learning_rate=lambda count: jnp.minimum(1e-2, 1 / jnp.sqrt(count + 1.0))
        )
    return table


def load_data(seed: int = 0):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def make_step(graphdef, tx):
    """A jitted, donated training step over (params, opt_state)."""

    def loss_fn(params, x, y):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def evaluate(params, x, y):
        logits = nnx.merge(graphdef, params)(x)
        return loss_fn(params, x, y), jnp.mean(jnp.argmax(logits, -1) == y)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1)), evaluate


def tree_bytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree) if hasattr(leaf, "nbytes"))


def train(name, tx, data, *, steps, batch_size, hidden, seed, progress):
    x_train, x_test, y_train, y_test = data
    model = MLP(hidden, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)  # plain nested dicts of arrays
    opt_state = tx.init(params)
    state_bytes = tree_bytes(opt_state)
    step, evaluate = make_step(graphdef, tx)
    rng = np.random.default_rng(seed)
    losses, times = [], []
    n = len(x_train)
    order = rng.permutation(n)
    for i in range(steps):
        start = (i * batch_size) % n
        if start + batch_size > n:
            order = rng.permutation(n)
            start = 0
        idx = order[start : start + batch_size]
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x_train[idx], y_train[idx])
        loss = float(loss)  # blocks until the step is done
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        progress.update(1)
    train_loss, _ = evaluate(params, x_train, y_train)
    _, test_acc = evaluate(params, x_test, y_test)
    return {
        "name": name,
        "losses": losses,
        "train_loss": float(train_loss),
        "test_accuracy": float(test_acc),
        "state_bytes": state_bytes,
        # The first call compiles; the median is over the rest.
        "step_ms": 1e3 * statistics.median(times[1:]),
    }


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        curve = np.convolve(r["losses"], np.ones(10) / 10, mode="valid")
        style = "-" if r["name"].startswith("optkit") else "--"
        ax.plot(curve, style, label=r["name"])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (10-step moving average)")
    ax.set_title("MLP on scikit-learn digits")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(title="a dashed curve hidden under a solid one: the two are equal", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=800, help="training steps per optimizer")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step")
    parser.add_argument("--hidden", type=int, default=128, help="width of the two hidden layers")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, split and batches")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="folder for the PNG and JSON")
    args = parser.parse_args(argv)

    data = load_data(args.seed)
    txs = optimizers()
    results = []
    with tqdm(total=args.steps * len(txs), desc="training", unit="step") as progress:
        for name, tx in txs.items():
            progress.set_postfix_str(name)
            results.append(
                train(name, tx, data, steps=args.steps, batch_size=args.batch_size, hidden=args.hidden,
                      seed=args.seed, progress=progress)
            )

    print()
    print(f"digits: {len(data[0])} train / {len(data[1])} test images, MLP 64-{args.hidden}-{args.hidden}-10, "
          f"{args.steps} steps of batch {args.batch_size}")
    print("| optimizer | final train loss | test accuracy | optimizer-state bytes | median step (ms) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {r['train_loss']:.4f} | {100 * r['test_accuracy']:.1f}% | "
              f"{r['state_bytes']:,} | {r['step_ms']:.3f} |")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "quickstart_loss.png")
    plot(results, path)
    print(f"\nloss curves: {path}")
    return results


if __name__ == "__main__":
    main()
