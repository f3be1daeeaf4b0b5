"""One training step through the ONNX backend vs the same step written with optkit directly.

The ONNX side is a training graph built with ``onnx.helper`` (Gemm, Relu, Gemm,
SoftmaxCrossEntropyLoss, a Gradient node, an Adam node), loaded with
``optkit.onnx.prepare`` and run with ``BackendRep.run`` on device arrays fed
back each step (``as_numpy=False``), so every call pays the backend's feed
checks; with the learning rate R and step T as NumPy scalars (two host-to-device
copies per step) and already on the device; and, to separate the backend's
per-call cost from the compiled program, the loaded graph itself under
``jax.jit(graph.as_function(...))``. The direct side is the usual JAX training step: ``jax.value_and_grad``
of the same loss and ``optkit.adam``, under ``jax.jit``. Both compute the same
numbers (ONNX Adam with ``T = step + 1`` is ``optkit.adam``, SPEC 2-3); the
script checks that before timing.

Timings are interleaved (benchmarks/_timing.py), medians over repeats.

    python -m benchmarks.onnx_backend            # about a minute on 2 CPU cores
    python -m benchmarks.onnx_backend --quick    # a few seconds (CI smoke test)
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
from onnx import TensorProto, helper

import optkit
import optkit.onnx
from benchmarks._timing import block, markdown_table, summary, time_interleaved

TRAINING = "ai.onnx.preview.training"
PARAMS = ["W1", "B1", "W2", "B2"]
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-7


def training_model(n_in: int, hidden: int, n_out: int) -> onnx.ModelProto:
    """MLP training step: loss, new weights, new first and second moments."""
    f = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    shapes = {"W1": [n_in, hidden], "B1": [hidden], "W2": [hidden, n_out], "B2": [n_out]}
    grads = [f"d{p}" for p in PARAMS]
    state = [f"{s}_{p}" for s in "VH" for p in PARAMS]
    new = [f"{n}_new" for n in PARAMS + state]
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "B1"], ["Z1"]),
        helper.make_node("Relu", ["Z1"], ["A1"]),
        helper.make_node("Gemm", ["A1", "W2", "B2"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
        helper.make_node("Gradient", [*PARAMS, "X", "labels"], grads, domain=TRAINING, xs=PARAMS,
                         zs=["X", "labels"], y="loss"),
        helper.make_node("Adam", ["R", "T", *PARAMS, *grads, *state], new, domain=TRAINING,
                         alpha=B1, beta=B2, epsilon=EPS),
    ]
    inputs = [f("X", ["N", n_in]), helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]),
              f("R", []), helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [f(n, shapes[n.split("_")[-1]]) for n in PARAMS + state]
    outputs = [f("loss", [])] + [f(n, shapes[n[:-4].split("_")[-1]]) for n in new]
    graph = helper.make_graph(nodes, "mlp_adam_step", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)])


def direct_step_fn():
    """The same step with optkit directly: value_and_grad + optkit.adam, jitted."""
    opt = optkit.adam(LR, b1=B1, b2=B2, eps=EPS)

    def loss_fn(params, x, labels):
        z = jnp.maximum(x @ params["W1"] + params["B1"], 0)
        logp = jax.nn.log_softmax(z @ params["W2"] + params["B2"], axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    @jax.jit
    def step(params, opt_state, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        updates, opt_state = opt.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return opt, step


def run_case(name: str, batch: int, n_in: int, hidden: int, n_out: int, repeats: int, warmup: int) -> list:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, n_in)).astype(np.float32)
    labels = rng.integers(0, n_out, size=batch)
    init = {"W1": (rng.normal(size=(n_in, hidden)) / np.sqrt(n_in)).astype(np.float32),
            "B1": np.zeros(hidden, np.float32),
            "W2": (rng.normal(size=(hidden, n_out)) / np.sqrt(hidden)).astype(np.float32),
            "B2": np.zeros(n_out, np.float32)}

    # optkit directly (default 32-bit JAX: int32 labels, as a JAX user writes it)
    opt, step = direct_step_fn()
    d_params = {k: jnp.asarray(v) for k, v in init.items()}
    d_state = opt.init(d_params)
    d_x, d_labels = jnp.asarray(x), jnp.asarray(labels, jnp.int32)

    # the ONNX graph through optkit.onnx (int64 labels and T, as ONNX declares them)
    rep = optkit.onnx.prepare(training_model(n_in, hidden, n_out))
    with jax.enable_x64(True):
        o_x, o_labels = jax.device_put(x), jax.device_put(labels.astype(np.int64))
    o_feeds = {"X": o_x, "labels": o_labels, "R": np.float32(LR), **init,
               **{f"{s}_{p}": np.zeros_like(init[p]) for s in "VH" for p in PARAMS}}
    updated = [name[:-4] for name in rep.outputs if name.endswith("_new")]
    counter = {"direct": 0, "onnx": 0}

    def direct():
        nonlocal d_params, d_state
        loss, d_params, d_state = step(d_params, d_state, d_x, d_labels)
        counter["direct"] += 1
        return loss

    def via_onnx():
        out = rep.run({**o_feeds, "T": np.int64(counter["onnx"] + 1)}, as_numpy=False)
        o_feeds.update({n: out[f"{n}_new"] for n in updated})
        counter["onnx"] += 1
        return out

    # Same numbers before timing: 3 steps each from the same start. The two XLA programs
    # may sum in different orders; where a gradient is about epsilon in size, Adam's
    # g / (|g| + eps) turns that rounding into up to a step's worth of difference (<= 3 * LR
    # over 3 steps) in a few coordinates, so all but those must agree closely.
    for _ in range(3):
        loss_direct, loss_onnx = direct(), via_onnx()["loss"]
    np.testing.assert_allclose(float(loss_onnx), float(loss_direct), rtol=1e-5)
    for p in PARAMS:
        a, b = np.asarray(o_feeds[p]), np.asarray(d_params[p])
        assert np.max(np.abs(a - b)) <= 3 * LR and np.mean(np.isclose(a, b, rtol=1e-4, atol=1e-6)) > 0.999, p

    # The same, with R and T already on the device (T for every step made before timing, as
    # the direct step's count already lives on the device): no host-to-device copies per step.
    total = 3 + warmup + repeats + 8
    with jax.enable_x64(True):
        t_device = [jax.device_put(np.int64(t)) for t in range(total)]
        r_device = jax.device_put(np.float32(LR))
    lean_feeds = dict(o_feeds)
    lean_counter = [3]

    def via_onnx_device_scalars():
        lean_counter[0] += 1
        out = rep.run({**lean_feeds, "R": r_device, "T": t_device[lean_counter[0]]}, as_numpy=False)
        lean_feeds.update({n: out[f"{n}_new"] for n in updated})
        return out

    # The graph itself, jitted without BackendRep's per-call checks.
    graph = optkit.onnx.to_graph(rep.model)
    names = [info.name for info in rep.inputs]
    with jax.enable_x64(True):
        graph_fn = jax.jit(graph.as_function(names, list(rep.outputs)))
    graph_values = dict(o_feeds)
    graph_counter = [3]

    def via_graph_function():
        graph_counter[0] += 1
        values = {**graph_values, "R": r_device, "T": t_device[graph_counter[0]]}
        with jax.enable_x64(True):
            out = dict(zip(rep.outputs, graph_fn(*(values[n] for n in names))))
        graph_values.update({n: out[f"{n}_new"] for n in updated})
        return out

    steps = {
        "optkit (jax.jit step)": direct,
        "optkit.onnx BackendRep.run, R and T from NumPy": via_onnx,
        "optkit.onnx BackendRep.run, R and T on device": via_onnx_device_scalars,
        "optkit.onnx graph, jax.jit(as_function), no feed checks": via_graph_function,
    }
    times = time_interleaved(steps, repeats=repeats, warmup=warmup)
    block(d_params)
    base = summary(times["optkit (jax.jit step)"])["median_ms"]
    rows = []
    for label, seconds in times.items():
        s = summary(seconds)
        rows.append([name, label, s["median_ms"], s["min_ms"], s["max_ms"], s["median_ms"] / base])
    return rows


CASES = {
    # name: (batch, inputs, hidden, classes)
    "digits MLP 64-64-10, batch 64": (64, 64, 64, 10),
    "MLP 784-512-10, batch 256": (256, 784, 512, 10),
    "MLP 784-1024-10, batch 1024": (1024, 784, 1024, 10),
}


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small cases, few repeats (smoke test)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 200)
    cases = dict(list(CASES.items())[:1]) if args.quick else CASES
    rows = []
    for name, dims in cases.items():
        rows += run_case(name, *dims, repeats=repeats, warmup=2 if args.quick else 20)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs; "
          f"{repeats} interleaved repeats; load average {os.getloadavg()[0]:.2f}")
    print(markdown_table(["case", "step", "median ms", "min ms", "max ms", "ratio (median)"], rows))
    return rows


if __name__ == "__main__":
    main()
