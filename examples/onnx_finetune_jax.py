"""Fine-tune an exported ONNX model as a JAX function with any optimizer, data-parallel, on digits.

The model is ``tests/onnx/models/torch_torchscript_resnet18.onnx`` (torchvision's ResNet-18 layout,
random weights, exported by torch.onnx at opset 17; ``--model`` for another exported classifier
with one ``[N, 3, 32, 32]`` input). :func:`optkit.onnx.to_jax` gives ``apply_fn(params, x)`` and the
dict of its trainable initializers; the training step is plain JAX (``jax.value_and_grad``, the
optimizer's ``update``, ``optax.apply_updates``) compiled by ``jax.jit``, with the batch sharded
over a ``data`` axis of every device present and the parameters replicated. The optimizer is
chosen by ``--optimizer``: ``optkit.adafactor`` (default), an ``optax.adamw`` chain with global-norm
clipping and a cosine schedule, ``optkit.adam``, or ``optkit.adam8bit`` (bitsandbytes' 8-bit moments, a
quarter of Adam's state, rounded through bitsandbytes' CPU table: see ``make_optimizer``). The trained
parameters are written back into the ONNX model (:func:`optkit.onnx.with_initializers`), saved, and run by
ONNX Runtime when it is installed, which must give optkit's test accuracy.

Run from the repository root::

    python examples/onnx_finetune_jax.py                          # about a minute on 2 CPU cores
    python examples/onnx_finetune_jax.py --optimizer adamw --steps 60
    python examples/onnx_finetune_jax.py --optimizer adam8bit
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/onnx_finetune_jax.py  # 4 devices
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import matplotlib

matplotlib.use("Agg")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from tqdm import tqdm  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.onnx_finetune import DEFAULT_MODEL, any_batch, images, onnx_runtime_accuracy  # noqa: E402


def make_optimizer(name: str, lr: float | None, steps: int) -> optax.GradientTransformation:
    """The optimizer ``--optimizer`` names, with ``--lr`` or its default learning rate."""
    if name == "adafactor":  # the paper's relative step size unless a learning rate is given
        return optkit.adafactor(lr)
    if name == "adamw":
        schedule = optax.cosine_decay_schedule(lr or 3e-3, steps)
        return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))
    if name == "adam":
        return optkit.adam(lr or 3e-3)
    if name == "adam8bit":
        # The CPU table's rounding: the nearest-code one stores second moments of 0 under first moments that are not
        # in this model's last 3x3 convolutions (1x1 maps: 8 of 9 taps get no gradient), and m / eps diverges.
        return optkit.adam8bit(lr or 3e-3, rounding="table")
    raise ValueError(f"--optimizer must be adafactor, adamw, adam or adam8bit, got {name!r}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="an exported classifier (default: ResNet-18 "
                                                                   "layout from tests/onnx/models)")
    parser.add_argument("--optimizer", default="adafactor", choices=["adafactor", "adamw", "adam", "adam8bit"],
                        help="optkit.adafactor (default), an optax.adamw chain, optkit.adam or optkit.adam8bit")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the optimizer's)")
    parser.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="examples per step, a multiple of the device count (default 64)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="folder for the plot and the fine-tuned model (default examples/out)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and batches (default 0)")
    args = parser.parse_args(argv)
    devices = jax.devices()
    if args.batch_size % len(devices):
        parser.error(f"--batch-size {args.batch_size} is not a multiple of the {len(devices)} devices")
    os.makedirs(args.out, exist_ok=True)

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(images(digits.data), digits.target.astype(np.int32),
                                                        test_size=0.25, random_state=args.seed)
    model = any_batch(optkit.onnx.load_model(args.model))
    apply_fn, params = optkit.onnx.to_jax(model)
    tx = make_optimizer(args.optimizer, args.lr, args.steps)

    mesh = jax.make_mesh((len(devices),), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    def loss_fn(p, x, y):
        logits = apply_fn(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    predict = jax.jit(lambda p, x: jnp.argmax(apply_fn(p, x), axis=-1))
    params = jax.device_put(params, replicated)
    state = jax.device_put(tx.init(params), replicated)
    before = float(np.mean(np.asarray(predict(params, x_test)) == y_test))
    rng = np.random.default_rng(args.seed)
    losses, first_step_s, t0 = [], None, time.perf_counter()
    for _ in tqdm(range(args.steps), desc=f"fine-tuning ({args.optimizer}, {len(devices)} devices)", leave=False):
        batch = rng.choice(len(x_train), args.batch_size, replace=False)
        x, y = jax.device_put((x_train[batch], y_train[batch]), batch_sharding)
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0

    accuracy = float(np.mean(np.asarray(predict(params, x_test)) == y_test))
    tuned = optkit.onnx.with_initializers(model, jax.device_get(params))
    path = os.path.join(args.out, f"finetuned_{args.optimizer}.onnx")
    onnx.save(tuned, path)
    ort_accuracy = onnx_runtime_accuracy(path, model.graph.input[0].name, x_test, y_test)
    print(f"first training step (compile and run): {first_step_s:.1f} s; {len(devices)} device(s)")
    print(f"test accuracy: {before:.3f} before, {accuracy:.3f} after {args.steps} steps of {args.optimizer}"
          + ("" if ort_accuracy is None else f" (ONNX Runtime on the saved file: {ort_accuracy:.3f})"))
    print(f"fine-tuned model: {path}")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(losses) + 1), losses, label=args.optimizer)
    ax.set_xlabel("step")
    ax.set_ylabel("softmax cross-entropy (batch)")
    ax.set_title(f"{pathlib.Path(args.model).stem} as a JAX function: test accuracy {accuracy:.2f}")
    ax.legend(loc="upper right")
    plot = os.path.join(args.out, f"onnx_finetune_jax_{args.optimizer}.png")
    fig.savefig(plot, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return {"losses": losses, "accuracy": accuracy, "accuracy_before": before, "ort_accuracy": ort_accuracy,
            "first_step_s": first_step_s, "path": path, "plot": plot, "devices": len(devices)}


if __name__ == "__main__":
    main()
