"""Adafactor: step time and memory traffic against Optax, and optimizer-state bytes.

Three tables:

1. Speed: the full jitted step with donated parameters and state,
   ``params, state = step(params, state, grads)`` (``tx.update`` then
   ``optax.apply_updates``), for one float32 matrix leaf, timed interleaved in
   one process: ``optkit.adafactor`` and ``optax.adafactor`` in the same
   configuration (two largest axes, min size 128, ``rho_t`` as the step size)
   and ``optax.adam``. Medians and ratios.
2. Passes over memory: in the compiled HLO of each step, the top-level kernels
   that read or write a full-size array, and how many full-size arrays they
   read and write in all (a loop that carries a full-size array is one read).
3. State bytes for "the transformer parameter tree" (``examples/transformer.py``):
   ``jax.eval_shape(tx.init, params)``, nothing allocated.

Run from the repository root::

    python -m benchmarks.adafactor           # 4096^2 and 8192^2, about half a minute
    python -m benchmarks.adafactor --quick   # seconds (CI smoke test)
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optkit
from benchmarks._hlo import full_array_traffic
from benchmarks._timing import markdown_table, summary, time_interleaved
from examples.lm_adafactor import load_text
from examples.transformer import TransformerConfig, abstract_params, count_params


def rho(count):
    """The paper's relative step size as an Optax schedule (count = updates already made)."""
    return jnp.minimum(1e-2, 1 / jnp.sqrt(count + 1.0))


def contenders() -> dict[str, optax.GradientTransformation]:
    return {
        "optkit.adafactor": optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128),
        "optax.adafactor": optax.adafactor(learning_rate=rho, min_dim_size_to_factor=128),
        "optax.adam": optax.adam(1e-3),
    }


class Stepper:
    """One optimizer's jitted, donated step on its own copy of the parameters."""

    def __init__(self, tx, params, grads):
        def step(p, s, g):
            updates, s = tx.update(g, s, p)
            return optax.apply_updates(p, updates), s

        self.jitted = jax.jit(step, donate_argnums=(0, 1))
        self.params = jnp.copy(params)
        self.state = tx.init(self.params)
        self.grads = grads
        self.hlo = self.jitted.lower(self.params, self.state, grads).compile().as_text()

    def __call__(self):
        self.params, self.state = self.jitted(self.params, self.state, self.grads)
        return self.params


def speed(shapes, repeats: int, warmup: int):
    rows, traffic_rows = [], []
    for shape in shapes:
        key_p, key_g = jax.random.split(jax.random.key(0))
        params = jax.random.normal(key_p, shape, jnp.float32)
        grads = jax.random.normal(key_g, shape, jnp.float32)
        steppers = {name: Stepper(tx, params, grads) for name, tx in contenders().items()}
        del params
        times = time_interleaved(steppers, repeats=repeats, warmup=warmup)
        medians = {name: summary(t)["median_ms"] for name, t in times.items()}
        label = "x".join(map(str, shape))
        for name, t in times.items():
            s = summary(t)
            rows.append([label, name, s["median_ms"], s["min_ms"], s["max_ms"],
                         medians["optkit.adafactor"] / medians[name] if name != "optkit.adafactor" else ""])
        rows.append([label, "**optkit / optax.adafactor**", "", "", "",
                     f"**{medians['optkit.adafactor'] / medians['optax.adafactor']:.3f}** (goal <= 0.333)"])
        rows.append([label, "**optkit / optax.adam**", "", "", "",
                     f"**{medians['optkit.adafactor'] / medians['optax.adam']:.3f}** (goal <= 1)"])
        for name, stepper in steppers.items():
            traffic = full_array_traffic(stepper.hlo, int(np.prod(shape)))
            traffic_rows.append([label, name, traffic["kernels"], traffic["reads"], traffic["writes"],
                                 traffic["reads"] + traffic["writes"]])
        del steppers
    return rows, traffic_rows


def state_bytes(configs):
    rows = []
    txs = {
        "optkit.adafactor()": optkit.adafactor(),
        "optkit.adafactor(b1=0.9)": optkit.adafactor(b1=0.9),
        "optkit.adafactor(largest, min 128)": optkit.adafactor(factored_dims="largest",
                                                               min_dim_size_to_factor=128),
        "optax.adafactor()": optax.adafactor(),
        "optax.adam": optax.adam(1e-3),
        "optkit.adam": optkit.adam(1e-3),
    }
    for label, cfg in configs.items():
        params = abstract_params(cfg)
        param_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
        for name, tx in txs.items():
            state = jax.eval_shape(tx.init, params)
            leaves = jax.tree.leaves(state)
            nbytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
            placeholders = sum(1 for leaf in leaves if leaf.shape == (1,))
            rows.append([label, f"{count_params(params):,}", name, f"{nbytes:,}",
                         f"{nbytes / param_bytes:.4f}", len(leaves), placeholders])
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats (seconds)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    vocab = len(set(load_text()))  # examples/lm_adafactor.py's model: one token per character
    if args.quick:
        shapes, repeats, warmup = [(1024, 2048)], args.repeats or 5, 1
        configs = {"example (d=128, 3 layers)": TransformerConfig(vocab_size=vocab, d_model=128, num_layers=3,
                                                                  max_len=64)}
    else:
        shapes, repeats, warmup = [(4096, 4096), (8192, 8192)], args.repeats or 20, 3
        configs = {
            "example (d=128, 3 layers)": TransformerConfig(vocab_size=vocab, d_model=128, num_layers=3,
                                                           max_len=64),
            "GPT-2 small size (d=768, 12 layers)": TransformerConfig(
                vocab_size=256, d_model=768, num_heads=12, num_layers=12, max_len=1024
            ),
        }

    load_before = os.getloadavg()
    speed_rows, traffic_rows = speed(shapes, repeats, warmup)
    load_after = os.getloadavg()
    print(f"## Full jitted, donated step, float32 (jax {jax.__version__}, optax {optax.__version__}, "
          f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs)")
    print(f"load average (1, 5, 15 min) before: {np.round(load_before, 2).tolist()}, "
          f"after: {np.round(load_after, 2).tolist()}; {repeats} interleaved rounds\n")
    print(markdown_table(["shape", "step", "median ms", "min ms", "max ms", "optkit.adafactor / this"],
                         speed_rows))
    print("\n## Passes over full-size arrays in the compiled step (HLO)\n")
    print(markdown_table(["shape", "step", "kernels touching them", "full-size reads", "full-size writes",
                          "traffic (arrays)"], traffic_rows))
    print("\n## Optimizer state for the transformer parameter tree (examples/transformer.py)\n")
    print(markdown_table(["model", "parameters", "optimizer", "state bytes", "state / params bytes",
                          "state arrays", "placeholder (1,) arrays"], state_bytes(configs)))


if __name__ == "__main__":
    main()
