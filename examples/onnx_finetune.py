"""Fine-tune a model that torch.onnx exported, on scikit-learn's digits, on XLA with optkit.onnx.

The model is ``tests/onnx/models/torch_torchscript_resnet18.onnx``: torchvision's ResNet-18 layout
(BasicBlock x [2, 2, 2, 2], widths 8-64, 10 classes, random weights) exported by torch.onnx's
TorchScript exporter at opset 17 (tests/onnx/models/make_models.py; pass ``--model`` for another
exported classifier with one ``[N, 3, 32, 32]`` input). :func:`optkit.onnx.make_training_model`
turns the inference graph into a training graph (SoftmaxCrossEntropyLoss, a Gradient node over
its initializers, an Adam node); each step is one compiled XLA call whose new weights and Adam
state are fed back. The digits (8 x 8) are scaled to 32 x 32 on 3 channels. The trained weights
are written back into the inference model (:func:`optkit.onnx.with_initializers`) and saved;
ONNX Runtime, when installed, runs that file and must give the same test accuracy as optkit.

Run from the repository root::

    python examples/onnx_finetune.py              # about a minute on 2 CPU cores
    python examples/onnx_finetune.py --steps 40   # a quick look
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from tqdm import tqdm  # noqa: E402

import optkit.onnx  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "tests" / "onnx" / "models" / "torch_torchscript_resnet18.onnx"


def images(x: np.ndarray) -> np.ndarray:
    """Digits [N, 64] in 0..16 -> [N, 3, 32, 32] float32 in 0..1 (each pixel 4 x 4, on 3 channels)."""
    x = (x / 16.0).reshape(-1, 1, 8, 8).astype(np.float32)
    return np.repeat(np.repeat(np.repeat(x, 4, axis=2), 4, axis=3), 3, axis=1)


def any_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its inputs' and outputs' first dimension named ``N`` (the export fixed the batch size
    of its example input; the graph itself does not depend on it here)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "N"
    del model.graph.value_info[:]  # shapes inferred for the example batch
    return model


def onnx_runtime_accuracy(path: str, input_name: str, x: np.ndarray, y: np.ndarray) -> float | None:
    """The accuracy of the saved classifier at ``path`` run by ONNX Runtime, or None when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime is not installed: the saved model was not run by ONNX Runtime")
        return None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return float(np.mean(np.argmax(session.run(None, {input_name: x})[0], axis=1) == y))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="an exported classifier (default: ResNet-18 "
                                                                   "layout from tests/onnx/models)")
    parser.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate (default 3e-3)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="folder for the plot and the fine-tuned model (default examples/out)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and batches (default 0)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(images(digits.data), digits.target.astype(np.int64),
                                                        test_size=0.25, random_state=args.seed)
    model = any_batch(optkit.onnx.load_model(args.model))
    input_name = model.graph.input[0].name
    training = optkit.onnx.make_training_model(model, loss="softmax_cross_entropy", optimizer="adam",
                                               optimizer_attributes={"alpha": 0.9, "beta": 0.999, "epsilon": 1e-8})
    trainable = [o.name.removesuffix(".new") for o in training.graph.output[1:]]
    t0 = time.perf_counter()
    step = optkit.onnx.prepare(training)
    infer = optkit.onnx.prepare(model)
    state = {}
    rng = np.random.default_rng(args.seed)
    losses = []
    first_step_s = None
    for t in tqdm(range(args.steps), desc="fine-tuning", leave=False):
        batch = rng.choice(len(x_train), args.batch_size, replace=False)
        out = step.run({input_name: x_train[batch], "labels": y_train[batch], "R": np.float32(args.lr),
                        "T": np.int64(t), **state}, as_numpy=False, donate=True)  # new weights in old buffers
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0
        losses.append(float(out[0]))
        state = dict(zip(trainable, out[1:]))

    weights = {name: np.asarray(value) for name, value in state.items() if not name.endswith(("adam_v", "adam_h"))}
    tuned = optkit.onnx.with_initializers(model, weights)
    path = os.path.join(args.out, "finetuned.onnx")
    onnx.save(tuned, path)
    logits = optkit.onnx.prepare(tuned).run([x_test])[0]
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    before = float(np.mean(np.argmax(infer.run([x_test])[0], axis=1) == y_test))
    ort_accuracy = onnx_runtime_accuracy(path, input_name, x_test, y_test)
    print(f"first training step (load, compile, run): {first_step_s:.1f} s")
    print(f"test accuracy: {before:.3f} before, {accuracy:.3f} after {args.steps} steps"
          + ("" if ort_accuracy is None else f" (ONNX Runtime on the saved file: {ort_accuracy:.3f})"))
    print(f"fine-tuned model: {path}")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(losses) + 1), losses, label=f"Adam node, lr {args.lr:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("softmax cross-entropy (batch)")
    ax.set_title(f"{pathlib.Path(args.model).stem} fine-tuned on digits: test accuracy {accuracy:.2f}")
    ax.legend(loc="upper right")
    plot = os.path.join(args.out, "onnx_finetune_loss.png")
    fig.savefig(plot, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return {"losses": losses, "accuracy": accuracy, "accuracy_before": before, "ort_accuracy": ort_accuracy,
            "first_step_s": first_step_s, "path": path, "plot": plot}


if __name__ == "__main__":
    main()
