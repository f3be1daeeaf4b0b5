"""The migration guide's ports (docs "Training ONNX models in JAX", "Coming from ONNX Runtime's training
packages") against ONNX Runtime's own training: ``tests/onnx/ort_training_reference.json``, written by
``python -m benchmarks.ort_training_reference`` with onnxruntime-training 1.19.2 (its recipe, versions and hashes
are in the file). Each documented port must give ONNX Runtime's 50 per-step losses to float32 rounding.
"""

import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("sklearn")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from benchmarks.ort_training_reference import LEARNING_RATE, batches, digits, symbolic_batch_model  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

REFERENCE = json.loads((ONNX_TESTS / "ort_training_reference.json").read_text())
LOSSES = {
    "MSELoss": lambda out, target: optax.squared_error(out, target).mean(),
    "CrossEntropyLoss": lambda out, target: optax.softmax_cross_entropy_with_integer_labels(out, target).mean(),
}
OPTIMIZERS = {
    "AdamW": lambda: optkit.adam(LEARNING_RATE, eps=1e-6),
    "SGD": lambda: optax.sgd(LEARNING_RATE),
}


@pytest.fixture(scope="module")
def setup():
    model = symbolic_batch_model()
    x, y = digits()
    assert hashlib.sha256(model).hexdigest() == REFERENCE["sha256"]["model"]
    assert hashlib.sha256(x.tobytes()).hexdigest() == REFERENCE["sha256"]["digits_x"]
    return model, x, y


def test_the_reference_was_made_by_onnx_runtime_training():
    assert REFERENCE["versions"]["onnxruntime-training"] == "1.19.2"
    assert set(REFERENCE["results"]) == {f"{loss}/{opt}" for loss in LOSSES for opt in OPTIMIZERS}
    (adamw,) = REFERENCE["results"]["MSELoss/AdamW"]["optimizer_nodes"]
    # What generate_artifacts wrote, which the port's arguments follow: optkit.adam(lr, eps=1e-6) is AdamW's
    # adam_mode 1 (the epsilon-hat form, bias correction in the step size) with weight_decay 0.
    assert adamw["attributes"]["adam_mode"] == 1 and adamw["attributes"]["weight_decay"] == 0.0
    assert abs(adamw["attributes"]["epsilon"] - 1e-6) < 1e-12


@pytest.mark.parametrize("name", sorted(REFERENCE["results"]))
def test_each_documented_port_gives_onnx_runtimes_losses(setup, name):
    model, x, y = setup
    loss_name, optimizer = name.split("/")
    apply_fn, params = optkit.onnx.to_jax(model)
    tx = OPTIMIZERS[optimizer]()
    loss_fn = LOSSES[loss_name]

    @jax.jit
    def step(p, state, inputs, target):
        value, grads = jax.value_and_grad(lambda p: loss_fn(apply_fn(p, inputs), target))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state, losses = tx.init(params), []
    for inputs, target in batches(x, y, loss_name):
        params, state, value = step(params, state, inputs, jnp.asarray(target))
        losses.append(float(value))
    want = np.asarray(REFERENCE["results"][name]["losses"])
    np.testing.assert_allclose(losses, want, rtol=2e-5, atol=1e-6, err_msg=name)


def test_the_training_graph_port_feeds_the_step_count_from_1(setup):
    """make_training_model's Adam node, fed T = t + 1 (ONNX Adam applies no bias correction at T = 0), and each
    step's new weights and moments fed back (optkit.onnx.next_feeds): ONNX Runtime's AdamW losses."""
    model, x, y = setup
    training = optkit.onnx.make_training_model(onnx.load_from_string(model), loss="mean_squared_error",
                                               optimizer="adam", optimizer_attributes={"epsilon": 1e-6})
    rep = optkit.onnx.prepare(training)
    feeds, losses = {}, []
    for t, (inputs, target) in enumerate(batches(x, y, "MSELoss")):
        feeds.update({"input": inputs, "target": target, "R": np.float32(LEARNING_RATE), "T": np.int64(t + 1)})
        out = rep.run(feeds)
        losses.append(float(out.loss))
        feeds = optkit.onnx.next_feeds(training, out)
    want = np.asarray(REFERENCE["results"]["MSELoss/AdamW"]["losses"])
    np.testing.assert_allclose(losses, want, rtol=2e-5, atol=1e-6)
    # T fed from 0 instead: every step's bias correction is one step behind, and the losses leave ONNX Runtime's.
    feeds, late = {}, []
    for t, (inputs, target) in enumerate(batches(x, y, "MSELoss")):
        feeds.update({"input": inputs, "target": target, "R": np.float32(LEARNING_RATE), "T": np.int64(t)})
        out = rep.run(feeds)
        late.append(float(out.loss))
        feeds = optkit.onnx.next_feeds(training, out)
    assert np.max(np.abs(np.asarray(late) - want)) > 1e-2
