"""ONNX Runtime's own on-device training, run once to give the migration guide its reference losses.

``python -m benchmarks.ort_training_reference --env DIR`` builds (once) a virtual environment in ``DIR`` with
``onnxruntime-training==1.19.2`` (the last release; ONNX Runtime's training API is deprecated since 1.20),
``numpy<2``, ``onnx==1.16.2`` and torch (a CPU build; ``onnxruntime.training`` imports it), and runs ONNX
Runtime's canonical flow in it:
``onnxruntime.training.artifacts.generate_artifacts`` on the torch-exported MLP of ``tests/onnx/models``
(``torch_torchscript_mlp.onnx``, 64 -> 32 -> GELU -> 10, its batch axis made symbolic), then
``api.CheckpointState.load_checkpoint``, ``api.Module`` and ``api.Optimizer`` for 50 steps over
scikit-learn's digits (pixels / 16; 32 samples a step, in order), with each of ``LossType.MSELoss`` (one-hot
targets) and ``LossType.CrossEntropyLoss`` (labels), and each of ``OptimType.AdamW`` and ``OptimType.SGD``
(learning rate 0.01). The per-step losses, the recipe, the package versions and the SHA-256 of the model and
data are written to ``tests/onnx/ort_training_reference.json`` (committed); ``tests/onnx/api/test_migration.py``
runs each port the docs give against them.

The data (digits, made here with scikit-learn) and the model travel to the child as files; nothing is
downloaded but the packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "onnx" / "models" / "torch_torchscript_mlp.onnx"
OUT = ROOT / "tests" / "onnx" / "ort_training_reference.json"
# onnxruntime.training imports torch (for its ORTModule parts; the on-device API runs without it): a CPU build.
PACKAGES = ["onnxruntime-training==1.19.2", "numpy<2", "onnx==1.16.2", "torch"]
STEPS, BATCH, LEARNING_RATE = 50, 32, 0.01
LOSSES = ("MSELoss", "CrossEntropyLoss")
OPTIMIZERS = ("AdamW", "SGD")


def symbolic_batch_model() -> bytes:
    """The committed MLP with its batch axis named ``batch`` (the export fixed it at 4)."""
    import onnx

    model = onnx.load(str(MODEL))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    return model.SerializeToString()


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: pixels / 16 as float32 (1797, 64), labels int64."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def batches(x: np.ndarray, y: np.ndarray, loss: str):
    """The ``STEPS`` batches of ``BATCH`` samples, in order; targets one-hot (MSELoss) or labels."""
    for step in range(STEPS):
        index = np.arange(step * BATCH, (step + 1) * BATCH) % len(x)
        target = np.eye(10, dtype=np.float32)[y[index]] if loss == "MSELoss" else y[index]
        yield x[index], target


def _child(workdir: str) -> None:
    """Runs in the onnxruntime-training environment: every loss x optimizer, its losses as JSON on stdout."""
    import onnx
    import onnxruntime
    from onnxruntime.training import api, artifacts

    data = np.load(os.path.join(workdir, "digits.npz"))
    x, y = data["x"], data["y"]
    results = {}
    for loss in LOSSES:
        for optimizer in OPTIMIZERS:
            out = os.path.join(workdir, f"{loss}-{optimizer}")
            os.makedirs(out)
            model = onnx.load(os.path.join(workdir, "model.onnx"))
            trainable = [t.name for t in model.graph.initializer]
            artifacts.generate_artifacts(model, requires_grad=trainable, frozen_params=[],
                                         loss=getattr(artifacts.LossType, loss),
                                         optimizer=getattr(artifacts.OptimType, optimizer), artifact_directory=out)
            state = api.CheckpointState.load_checkpoint(os.path.join(out, "checkpoint"))
            module = api.Module(os.path.join(out, "training_model.onnx"), state, os.path.join(out, "eval_model.onnx"))
            opt = api.Optimizer(os.path.join(out, "optimizer_model.onnx"), module)
            opt.set_learning_rate(LEARNING_RATE)
            module.train()
            losses = []
            for inputs, target in batches(x, y, loss):
                losses.append(float(module(inputs, target)))
                opt.step()
                module.lazy_reset_grad()
            optimizer_graph = onnx.load(os.path.join(out, "optimizer_model.onnx"))
            nodes = [{"op_type": n.op_type, "domain": n.domain,
                      "attributes": {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}}
                     for n in optimizer_graph.graph.node if n.op_type in ("AdamWOptimizer", "SGDOptimizerV2")]
            results[f"{loss}/{optimizer}"] = {"losses": losses, "optimizer_nodes": nodes}
    versions = {"onnxruntime-training": onnxruntime.__version__, "onnx": onnx.__version__,
                "numpy": np.__version__, "python": sys.version.split()[0], "torch": __import__("torch").__version__}
    print(json.dumps({"results": results, "versions": versions}, default=float))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=False, default=os.path.join(tempfile.gettempdir(), "ort-training-env"),
                        help="the virtual environment to build (once) and run ONNX Runtime's training in")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    python = os.path.join(args.env, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", args.env], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PACKAGES], check=True)
    with tempfile.TemporaryDirectory() as workdir:
        model = symbolic_batch_model()
        pathlib.Path(workdir, "model.onnx").write_bytes(model)
        x, y = digits()
        np.savez(os.path.join(workdir, "digits.npz"), x=x, y=y)
        done = subprocess.run([python, os.path.abspath(__file__), "--child", workdir], capture_output=True,
                              text=True, cwd=workdir)
        if done.returncode:
            raise SystemExit(f"ONNX Runtime's training run failed:\n{done.stderr[-5000:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    record = {
        "recipe": {"model": str(MODEL.relative_to(ROOT)) + " (batch axis made symbolic)", "data":
                   "sklearn.datasets.load_digits: data / 16 as float32, target int64",
                   "steps": STEPS, "batch": BATCH, "batches": "samples [32 t, 32 t + 32) at step t",
                   "learning_rate": LEARNING_RATE, "flow": "artifacts.generate_artifacts(requires_grad=every "
                   "initializer) -> api.CheckpointState.load_checkpoint -> api.Module(train) -> api.Optimizer"
                   " (set_learning_rate) -> per step: module(x, target), optimizer.step(), "
                   "module.lazy_reset_grad()",
                   "targets": "MSELoss: one-hot float32 (N, 10); CrossEntropyLoss: int64 labels (N,)"},
        "versions": child["versions"],
        "sha256": {"model": hashlib.sha256(model).hexdigest(),
                   "digits_x": hashlib.sha256(x.tobytes()).hexdigest(),
                   "digits_y": hashlib.sha256(y.tobytes()).hexdigest()},
        "results": child["results"],
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")
    for name, result in record["results"].items():
        print(f"{name}: loss {result['losses'][0]:.6f} -> {result['losses'][-1]:.6f}; {result['optimizer_nodes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
