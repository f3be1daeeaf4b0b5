"""Train an MLP on scikit-learn's digits with an ONNX training graph run by optkit.onnx.

The graph is built with ``onnx.helper`` the way an ONNX training exporter
writes one: the forward pass (Gemm, Relu, Gemm), SoftmaxCrossEntropyLoss, an
``ai.onnx.preview.training`` Gradient node for the loss's gradients with
respect to the weights, and an Adam (or Adagrad) node that turns weights,
gradients and optimizer state into new weights and state. It is saved as a
``.onnx`` file, loaded back through ``optkit.onnx`` (ONNX Runtime's CPU build
cannot load these operators, and ONNX's reference evaluator has no Gradient),
and each training step is one compiled XLA call whose new weights and state
are fed back as the next step's inputs.

The first step is checked against ``onnx.reference.ReferenceEvaluator``: it
runs the same graph with the Gradient node's outputs fed in (optkit's
gradients), so the loss and every optimizer output must agree.

Run from the repository root::

    python examples/onnx_training.py                 # a few seconds on 2 CPU cores
    python examples/onnx_training.py --optimizer adagrad --steps 800
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.reference  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import optkit.onnx  # noqa: E402

TRAINING = "ai.onnx.preview.training"
PARAMS = ["W1", "B1", "W2", "B2"]


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def build_training_model(hidden: int, optimizer: str) -> onnx.ModelProto:
    """One training step of a 64 -> hidden -> 10 ReLU MLP as an ONNX graph.

    Inputs: X (N, 64), labels (N,), R (learning rate), T (updates made so far),
    the weights, then the optimizer state (Adam: first moments V_*, second
    moments H_*; Adagrad: H_*). Outputs: the loss, the gradients, the new
    weights and the new state, the last two in the order they are fed.
    """
    shapes = {"W1": [64, hidden], "B1": [hidden], "W2": [hidden, 10], "B2": [10]}
    grads = [f"d{p}" for p in PARAMS]
    states = ["V", "H"] if optimizer == "adam" else ["H"]
    state_in = [f"{s}_{p}" for s in states for p in PARAMS]
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "B1"], ["Z1"], name="layer1"),
        helper.make_node("Relu", ["Z1"], ["A1"], name="relu"),
        helper.make_node("Gemm", ["A1", "W2", "B2"], ["logits"], name="layer2"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], name="loss",
                         reduction="mean"),
        helper.make_node("Gradient", [*PARAMS, "X", "labels"], grads, name="gradient", domain=TRAINING,
                         xs=PARAMS, zs=["X", "labels"], y="loss"),
    ]
    new = [f"{p}_new" for p in PARAMS] + [f"{s}_new" for s in state_in]
    if optimizer == "adam":
        nodes.append(helper.make_node("Adam", ["R", "T", *PARAMS, *grads, *state_in], new, name="adam",
                                      domain=TRAINING, alpha=0.9, beta=0.999, epsilon=1e-7))
    else:
        nodes.append(helper.make_node("Adagrad", ["R", "T", *PARAMS, *grads, *state_in], new, name="adagrad",
                                      domain=TRAINING, decay_factor=0.0, epsilon=1e-7))
    inputs = [_float("X", ["N", 64]), helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]),
              _float("R", []), helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [_float(p, shapes[p]) for p in PARAMS]
    inputs += [_float(s, shapes[s.split("_")[1]]) for s in state_in]
    outputs = [_float("loss", []), *(_float(g, shapes[g[1:]]) for g in grads),
               *(_float(n, shapes[n.split("_")[-2]]) for n in new)]
    graph = helper.make_graph(nodes, f"mlp_{optimizer}_training_step", inputs, outputs)
    model = helper.make_model(graph, producer_name="optkit examples/onnx_training.py",
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)])
    onnx.checker.check_model(model)
    return model


def build_inference_model(hidden: int) -> onnx.ModelProto:
    """The forward pass alone: X and weights -> logits."""
    nodes = [helper.make_node("Gemm", ["X", "W1", "B1"], ["Z1"]), helper.make_node("Relu", ["Z1"], ["A1"]),
             helper.make_node("Gemm", ["A1", "W2", "B2"], ["logits"])]
    inputs = [_float("X", ["N", 64]), _float("W1", [64, hidden]), _float("B1", [hidden]),
              _float("W2", [hidden, 10]), _float("B2", [10])]
    graph = helper.make_graph(nodes, "mlp_inference", inputs, [_float("logits", ["N", 10])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference_first_step(model: onnx.ModelProto, feeds: dict, gradients: dict) -> list[np.ndarray]:
    """ONNX's reference evaluator on the training graph, with the Gradient node's outputs fed in."""
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    kept = [node for node in cut.graph.node if node.op_type != "Gradient"]
    del cut.graph.node[:]
    cut.graph.node.extend(kept)
    for name, value in gradients.items():
        cut.graph.input.append(_float(name, list(value.shape)))
    outputs = [o.name for o in model.graph.output if o.name not in gradients]
    ref = onnx.reference.ReferenceEvaluator(cut)
    return dict(zip(outputs, ref.run(outputs, {**feeds, **gradients})))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--optimizer", choices=["adam", "adagrad"], default="adam")
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    parser.add_argument("--lr", type=float, default=None, help="default: 3e-3 (adam), 5e-2 (adagrad)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="folder for the .onnx file and the PNG (default examples/out)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, weights and batches (default 0)")
    args = parser.parse_args(argv)
    lr = args.lr if args.lr is not None else (3e-3 if args.optimizer == "adam" else 5e-2)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=args.seed, stratify=y)

    # Build, save, load back: the file is what a training exporter would hand over.
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"mlp_{args.optimizer}_training.onnx")
    model = build_training_model(args.hidden, args.optimizer)
    onnx.save(model, path)
    rep = optkit.onnx.prepare(path)
    predict = optkit.onnx.prepare(build_inference_model(args.hidden))
    print(f"saved {path} ({os.path.getsize(path)} bytes); loaded: {rep}")

    rng = np.random.default_rng(args.seed)
    params = {
        "W1": (rng.normal(size=(64, args.hidden)) * np.sqrt(2 / 64)).astype(np.float32),
        "B1": np.zeros(args.hidden, np.float32),
        "W2": (rng.normal(size=(args.hidden, 10)) * np.sqrt(1 / args.hidden)).astype(np.float32),
        "B2": np.zeros(10, np.float32),
    }
    state_names = [name for name in rep.outputs if name.endswith("_new") and name[:-4] not in PARAMS]
    state = {name[:-4]: np.zeros_like(params[name[:-4].split("_")[1]]) for name in state_names}

    def accuracy() -> float:
        (logits,) = predict.run({"X": x_test, **{p: np.asarray(params[p]) for p in PARAMS}})
        return float(np.mean(np.argmax(logits, axis=1) == y_test))

    losses, check, start, accuracies = [], None, None, []
    progress = tqdm(range(args.steps), desc=f"onnx {args.optimizer}", unit="step")
    for step in progress:
        if step == 1:
            start = time.perf_counter()  # after the first step's compilation
        batch = rng.choice(len(x_train), size=args.batch_size, replace=False)
        feeds = {"X": x_train[batch], "labels": y_train[batch], "R": np.float32(lr), "T": np.int64(step),
                 **params, **state}
        out = rep.run(feeds, as_numpy=step == 0)
        if step == 0:
            gradients = {f"d{p}": out[f"d{p}"] for p in PARAMS}
            want = reference_first_step(model, {k: np.asarray(v) for k, v in feeds.items()}, gradients)
            for name, value in want.items():  # float32 rounding apart, the same numbers
                np.testing.assert_allclose(np.asarray(out[name]), value, rtol=1e-6, atol=1e-7, err_msg=name)
            check = max(float(np.max(np.abs(np.asarray(out[name]) - want[name]))) for name in want)
            tqdm.write(f"step 0 matches onnx.reference.ReferenceEvaluator on {len(want)} outputs (the loss and "
                  f"every {args.optimizer} output; rtol 1e-6, atol 1e-7): max abs difference {check:.2e}")
        params = {p: out[f"{p}_new"] for p in PARAMS}
        state = {name[:-4]: out[name] for name in state_names}
        losses.append(out["loss"])
        if (step + 1) % max(1, args.steps // 5) == 0:
            accuracies.append((step + 1, accuracy()))
            progress.set_postfix(loss=f"{float(np.mean([float(v) for v in losses[-20:]])):.4f}",
                                 test_accuracy=f"{accuracies[-1][1]:.4f}")
    seconds = (time.perf_counter() - start) / max(1, args.steps - 1) if start else float("nan")
    acc = accuracy()
    print(f"{args.optimizer}: final test accuracy {acc:.4f} after {args.steps} steps "
          f"({1e3 * seconds:.2f} ms per step, including feeding and reading back)")
    figure = plot(losses, accuracies, args, os.path.join(args.out, f"onnx_training_{args.optimizer}.png"))
    return {"test_accuracy": acc, "losses": [float(v) for v in losses], "reference_check": check, "path": path,
            "figure": figure}


def plot(losses, accuracies, args, path: str) -> str:
    """The training loss of the ONNX graph's steps, and the test accuracy, as a PNG."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([float(v) for v in losses], lw=0.8, label="training loss (batch)")
    ax.set(xlabel="step", ylabel="softmax cross-entropy", title=f"ONNX training graph with {args.optimizer}, "
           f"run by optkit.onnx")
    ax.xaxis.get_major_locator().set_params(integer=True)
    handles, labels = ax.get_legend_handles_labels()
    if accuracies:
        twin = ax.twinx()
        twin.plot(*zip(*accuracies), "o-", color="C1", label="test accuracy")
        twin.set_ylabel("test accuracy")
        twin.set_ylim(0, 1)
        more = twin.get_legend_handles_labels()  # the twin axis's line, in the same legend
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
