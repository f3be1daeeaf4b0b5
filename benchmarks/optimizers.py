"""Muon, schedule-free AdamW and 8-bit Adam beside their peers, in one run (issue 66).

``python -m benchmarks.optimizers`` (``--quick``: small trees, few steps) prints and writes to
``benchmarks/out/optimizers.json``:

1. **Agreement with the references** (the committed runs of ``benchmarks.optimizer_references``: torch's Muon,
   ``schedulefree``'s AdamW, bitsandbytes' Adam8bit): the largest difference of optkit's parameters, and of the
   Optax peer's where there is one, from the reference's after 10 steps from the same start with the same
   gradients (each step jitted), relative to the reference's largest value.
2. **Step time and state size**: a jitted update (``tx.update`` + ``optax.apply_updates``) on the GPT-2 layout of
   ``examples/transformer.py`` (d_model 256, 4 layers) and on the parameters ``optkit.onnx.to_jax`` reads from the
   committed torch.onnx GPT-2 export; median milliseconds (interleaved rounds) as ratios to ``optkit.adam``'s, and the
   optimizer state's bytes per parameter.
3. **Training**: an MLP (64-256-256-10) on scikit-learn's digits (1,500 for training, the rest held out), 300 steps
   of 64 from one start with each optimizer at a learning rate of its usual range; the training loss curves as a
   plot (``benchmarks/out/optimizers_training.png``; ``--docs`` also writes it to ``docs/images``) and the held-out
   loss and accuracy at the end (schedule-free AdamW's at its evaluation parameters).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optkit

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
DOCS_IMAGE = ROOT / "docs" / "images" / "optimizers_training.png"


def _matrices_to(tx_2d, other):
    """``tx_2d`` on the 2-D leaves, ``other`` on the rest (how Muon is used)."""
    return optax.partition({"2d": tx_2d, "other": other},
                           lambda p: jax.tree.map(lambda a: "2d" if a.ndim == 2 else "other", p))


def contenders(lr: float = 1e-3) -> list[dict[str, optax.GradientTransformation]]:
    """The optimizers timed, in groups of peers timed together (interleaved), each beside ``optkit.adam``; a
    group at a time, so that only one group's states are in memory."""
    adam = {"optkit.adam": optkit.adam(lr)}
    return [
        {**adam, "optkit.muon (+ optkit.adam on non-matrices)": _matrices_to(optkit.muon(0.02), optkit.adam(lr)),
         "optkit.muon float32 iteration (+ adam)": _matrices_to(optkit.muon(0.02, ns_dtype=jnp.float32),
                                                                optkit.adam(lr)),
         "optax.contrib.muon": optax.contrib.muon(0.02, adam_learning_rate=lr)},
        {**adam, "optkit.schedule_free_adamw": optkit.schedule_free_adamw(lr),
         "optax.contrib.schedule_free_adamw": optax.contrib.schedule_free_adamw(lr)},
        {**adam, "optkit.adam8bit": optkit.adam8bit(lr),
         "optkit.adam8bit table rounding": optkit.adam8bit(lr, rounding="table")},
    ]


# ----------------------------------------------------------------------------- 1. agreement


def _relative(got: dict, want: dict) -> float:
    scale = max(float(np.max(np.abs(v))) for v in want.values())
    return max(float(np.max(np.abs(np.asarray(got[k]) - want[k]))) for k in want) / scale


def agreement() -> list[dict]:
    """Each optimizer (and its Optax peer) against its reference's committed run."""
    sys.path.insert(0, str(ROOT))
    from tests import reference_runs

    rows = []
    with jax.enable_x64(True):
        values = reference_runs.data("muon")
        want = {n: values[f"f64_default/traj/{n}"][-1] for n in reference_runs.leaves(values)}
        for name, tx in (("optkit.muon(ns_dtype=float64)", optkit.muon(0.02, ns_dtype=jnp.float64)),
                         ("optax.contrib.muon", optax.contrib.muon(0.02, weight_decay=0.1))):
            got = reference_runs.run(tx, values, jnp.float64, 10, step=jax.jit)[0][-1]
            rows.append({"reference": "torch.optim.Muon (float64, lr 0.02)", "optimizer": name,
                         "max_relative_difference": _relative(got, want)})
        values = reference_runs.data("schedule_free")
        for case, kwargs in (("f64_default", {"learning_rate": 0.01}),
                             ("f64_warmup", reference_runs.cases("schedule_free")["f64_warmup"]["kwargs"])):
            want = {n: values[f"{case}/traj/{n}"][-1] for n in reference_runs.leaves(values)}
            ours = reference_runs.run(optkit.schedule_free_adamw(**kwargs), values, jnp.float64, 10,
                                      step=jax.jit)[0][-1]
            peer_kwargs = {k: v for k, v in kwargs.items() if k != "r"}
            theirs = reference_runs.run(optax.contrib.schedule_free_adamw(**peer_kwargs), values, jnp.float64,
                                        10, step=jax.jit)[0][-1]
            label = f"schedulefree.AdamWScheduleFree (float64, {case[4:]})"
            rows.append({"reference": label, "optimizer": "optkit.schedule_free_adamw",
                         "max_relative_difference": _relative(ours, want)})
            rows.append({"reference": label, "optimizer": "optax.contrib.schedule_free_adamw (no r)",
                         "max_relative_difference": _relative(theirs, want)})
    values = reference_runs.data("adam8bit")
    want = {n: values[f"default/traj/{n}"][-1] for n in reference_runs.leaves(values)}
    for rounding in ("table", "nearest"):
        got = reference_runs.run(optkit.adam8bit(0.01, rounding=rounding), values, jnp.float32, 10,
                                 step=jax.jit)[0][-1]
        rows.append({"reference": "bitsandbytes Adam8bit 0.50.2 (CPU, float32, lr 0.01)",
                     "optimizer": f"optkit.adam8bit(rounding={rounding!r})",
                     "max_relative_difference": _relative(got, want)})
    return rows


# ----------------------------------------------------------------------------- 2. step time and state size


def _exported_params():
    import optkit.onnx

    _, params = optkit.onnx.to_jax(str(ROOT / "tests" / "onnx" / "models" / "torch_dynamo_gpt2.onnx"))
    return {k: v for k, v in params.items() if jnp.issubdtype(v.dtype, jnp.floating)}


TREE = "GPT-2 layout, d_model 256, 4 layers (examples/transformer.py)"


def _gpt_layout(quick: bool):
    """``examples/transformer.py``'s GPT-2 layout at d_model 256 and 4 layers (3.2M parameters; quick: 64 and 2).

    Not GPT-2 small's 768 and 12: Muon's Newton-Schulz iterations in bfloat16 take minutes a step there on 2 CPU
    cores (XLA:CPU has no fast bfloat16 matrix product), which is a GPU's work.
    """
    from examples.transformer import TransformerConfig, abstract_params

    sizes = dict(vocab_size=256, d_model=256, num_heads=4, num_layers=4, max_len=256)
    if quick:
        sizes = dict(vocab_size=64, d_model=64, num_heads=2, num_layers=2, max_len=32)
    return abstract_params(TransformerConfig(**sizes))


def _state_bytes_per_parameter(tx, params) -> float:
    state = jax.eval_shape(tx.init, params)
    state_bytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))
    return state_bytes / sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def step_times(quick: bool, repeats: int) -> list[dict]:
    from benchmarks import trees
    from benchmarks._timing import summary, time_interleaved

    trees_to_time = {TREE: trees.make_tree(_gpt_layout(quick), 0.0, 0.02),
                     "torch.onnx GPT-2 export (tests/onnx/models)": _exported_params()}
    rows = []
    for tree_name, params in trees_to_time.items():
        grads = jax.tree.map(lambda p: jnp.sin(p) * 0.01 + 0.001, params)
        count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
        for group in contenders():
            steps = {}
            for name, tx in group.items():
                @jax.jit
                def one(p, s, tx=tx, grads=grads):
                    updates, s = tx.update(grads, s, p)
                    return optax.apply_updates(p, updates), s

                holder = {"p": jax.tree.map(jnp.copy, params), "s": jax.jit(tx.init)(params)}

                def run(one=one, holder=holder):
                    holder["p"], holder["s"] = one(holder["p"], holder["s"])
                    return holder["p"]

                steps[name] = run
            print(f"timing {list(group)} on {tree_name}", file=sys.stderr, flush=True)
            times = time_interleaved(steps, repeats=repeats, warmup=2)
            base = summary(times["optkit.adam"])["median_ms"]
            for name, tx in group.items():
                if name == "optkit.adam" and any(r["tree"] == tree_name and r["optimizer"] == name for r in rows):
                    continue
                median = summary(times[name])["median_ms"]
                rows.append({"tree": tree_name, "parameters": count, "optimizer": name, "median_ms": median,
                             "ratio_to_optkit_adam": median / base,
                             "state_bytes_per_parameter": _state_bytes_per_parameter(tx, params)})
            del steps
    return rows


# ----------------------------------------------------------------------------- 3. training


def _digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def _mlp_init(seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = [(64, 256), (256, 256), (256, 10)]
    params = {}
    for i, (n_in, n_out) in enumerate(sizes):
        params[f"w{i}"] = jnp.asarray(rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)), jnp.float32)
        params[f"b{i}"] = jnp.zeros(n_out, jnp.float32)
    return params


def _mlp_loss(params, x, y):
    h = x
    for i in range(3):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < 2:
            h = jax.nn.gelu(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean(), h


TRAINING = {
    "Adam (optkit.adam, 1e-3)": lambda: optkit.adam(1e-3),
    "AdamW schedule-free (optkit, 2.5e-3, warmup 20)": lambda: optkit.schedule_free_adamw(2.5e-3, warmup_steps=20),
    "Muon + Adam (optkit, 0.02 / 1e-3)": lambda: _matrices_to(optkit.muon(0.02, weight_decay=0.0),
                                                                optkit.adam(1e-3)),
    "8-bit Adam (optkit.adam8bit, 1e-3)": lambda: optkit.adam8bit(1e-3),
}


def training(steps: int) -> dict:
    (x, y), (x_test, y_test) = _digits()
    rng = np.random.default_rng(1)
    order = [rng.choice(len(x), 64, replace=False) for _ in range(steps)]
    results = {}
    for name, make in TRAINING.items():
        tx = make()
        params = _mlp_init()
        state = tx.init(params)

        @jax.jit
        def step(params, state, xb, yb, tx=tx):
            (loss, _), grads = jax.value_and_grad(_mlp_loss, has_aux=True)(params, xb, yb)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        losses = []
        for idx in order:
            params, state, loss = step(params, state, x[idx], y[idx])
            losses.append(float(loss))
        if "schedule-free" in name:
            params = optkit.schedule_free_eval_params(state, params)
        test_loss, logits = _mlp_loss(params, x_test, y_test)
        results[name] = {"train_loss": losses, "test_loss": float(test_loss),
                         "test_accuracy": float(np.mean(np.argmax(np.asarray(logits), 1) == y_test))}
    return results


def plot(results: dict, paths: list[pathlib.Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, result), style in zip(results.items(), ["--", "-", "-", ":"]):  # Adam dashed: 8-bit Adam covers it
        losses = np.asarray(result["train_loss"])
        smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
        ax.plot(np.arange(len(smooth)) + 10, smooth, style, label=f"{name}: held-out {result['test_loss']:.3f}")
    ax.set_xlabel("step (batch of 64)")
    ax.set_ylabel("training loss (mean of 10 steps)")
    ax.set_yscale("log")
    ax.set_title("MLP on scikit-learn's digits")
    ax.legend(fontsize=8)
    fig.tight_layout()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from benchmarks._timing import markdown_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small trees, few repeats and steps")
    parser.add_argument("--docs", action="store_true", help=f"also write the plot to {DOCS_IMAGE}")
    args = parser.parse_args(argv)
    report = {"agreement": agreement(),
              "steps": step_times(args.quick, repeats=3 if args.quick else 10),
              "training": training(40 if args.quick else 300)}
    print(markdown_table(["reference", "optimizer", "max relative difference after 10 steps"],
                         [[r["reference"], r["optimizer"], r["max_relative_difference"]] for r in report["agreement"]]))
    print()
    print(markdown_table(["tree", "optimizer", "step ms", "x optkit.adam", "state bytes / parameter"],
                         [[r["tree"], r["optimizer"], r["median_ms"], r["ratio_to_optkit_adam"],
                           r["state_bytes_per_parameter"]] for r in report["steps"]]))
    print()
    print(markdown_table(["optimizer", "final training loss (mean of 10)", "held-out loss", "held-out accuracy"],
                         [[name, float(np.mean(r["train_loss"][-10:])), r["test_loss"], r["test_accuracy"]]
                          for name, r in report["training"].items()]))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "optimizers.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report["training"], [OUT / "optimizers_training.png"] + ([DOCS_IMAGE] if args.docs else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
