"""optkit.onnx.to_jax and OnnxModule: exported ONNX models as JAX functions, trained by Optax and optkit.

On every model real exporters wrote (tests/onnx/models): ``apply_fn`` matches ONNX Runtime's output saved at
export, and ``jax.grad`` through it matches the framework's float64 gradients saved at export; under
``jax.jit`` with JAX's 64-bit mode off, as users run it. Training: ``optkit.adafactor``, an
``optax.adamw`` chain and ``optkit.adam`` lower the loss, each on every third model in turn (each of the
three on convolutional, recurrent and transformer models; compiling each optimizer's update for each model
took 60% of this module's time); ``OnnxModule`` in ``nnx.Optimizer`` gives the
steps of the plain path; the trained values go back to ONNX through ``with_initializers``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("onnx")

import chex  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

MODELS = ONNX_TESTS / "models"
EXPORTED = sorted(p.stem for p in MODELS.glob("*.onnx"))
VERSIONS = json.loads((MODELS / "versions.json").read_text())


def _load(name):
    return onnx.load(str(MODELS / f"{name}.onnx")), np.load(MODELS / f"{name}.npz")


def _x64_off():
    """The tests run as users do: JAX's default 32-bit mode (jax.jit then gives int32 for int64 values)."""
    return jax.enable_x64(False)


OPTIMIZERS = {
    "optkit.adafactor": lambda: optkit.adafactor(1e-2),
    "optax.adamw chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-4)),
    "optkit.adam": lambda: optkit.adam(1e-3),
}


@pytest.mark.parametrize(("name", "optimizer"), [(name, list(OPTIMIZERS)[i % len(OPTIMIZERS)])
                                                 for i, name in enumerate(EXPORTED)])
def test_every_exported_model_matches_onnx_runtime_differentiates_and_trains(name, optimizer):
    """One compiled ``value_and_grad`` of ``loss = sum(output * C)`` per model: its output against ONNX Runtime's,
    its gradients against the framework's float64 ones, then four steps of ``optimizer`` lower the loss."""
    model, data = _load(name)
    apply_fn, params = optkit.onnx.to_jax(model)
    wanted = {key.split(":", 1)[1]: data[key] for key in data.files if key.startswith("grad:")}
    first = model.graph.input[0].name
    with _x64_off():
        def loss(p, x):
            out = apply_fn(p, x)
            return jnp.sum(out * data["C"]), out

        argnums = (0, 1) if "input" in wanted and np.issubdtype(data["input"].dtype, np.floating) else 0
        value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))
        (_, got), grads = value_and_grad(params, data["input"])
        want = data["output"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5 * np.max(np.abs(want)))
        by_name = dict(grads[0]) if argnums == (0, 1) else dict(grads)
        if argnums == (0, 1):
            by_name["input"] = grads[1]
        compared = [key for key in wanted if key in by_name]
        assert compared, f"{name}: none of the saved gradients {sorted(wanted)} is a parameter"
        for key in compared:
            g, w = np.asarray(by_name[key]), wanted[key]
            assert g.shape == w.shape, key
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4 * np.max(np.abs(w)), err_msg=f"{name}: d/d {key}")
        assert first not in params
        tx = OPTIMIZERS[optimizer]()
        update = jax.jit(lambda g, s, p: _applied(p, *tx.update(g, s, p)))
        p, state, losses = params, jax.jit(tx.init)(params), []
        for _ in range(4):
            (value, _), grads = value_and_grad(p, data["input"])
            p, state = update(grads[0] if argnums == (0, 1) else grads, state, p)
            losses.append(float(value))
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], (optimizer, losses)


def _applied(params, updates, state):
    return optax.apply_updates(params, updates), state


def _mse_step(apply_fn, tx):
    def loss(p, x, y):
        return jnp.mean((apply_fn(p, x) - y) ** 2)

    @jax.jit
    def step(p, state, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    return step


def test_the_trained_model_goes_back_to_onnx_with_the_same_outputs():
    model, data = _load("torch_torchscript_mlp")
    apply_fn, params = optkit.onnx.to_jax(model)
    params = {k: v * 1.5 for k, v in params.items()}
    new = optkit.onnx.with_initializers(model, params)
    want = apply_fn(params, data["input"])
    (got,) = optkit.onnx.prepare(new).run([data["input"]])
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6, atol=1e-6)
    assert set(params) <= {i.name for i in model.graph.initializer}
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                                  numpy_helper.to_array(onnx.load(str(MODELS / "torch_torchscript_mlp.onnx"))
                                                        .graph.initializer[0]))  # the model was not changed


def test_with_initializers_takes_a_path_and_to_jaxs_apply_fn_wherever_it_takes_a_model(tmp_path):
    """``to_jax(path)`` is the documented pattern: ``with_initializers`` and ``make_training_model`` take the same
    path, and ``apply_fn`` itself (its model), giving what they give for the ModelProto."""
    path = str(MODELS / "torch_torchscript_mlp.onnx")
    apply_fn, params = optkit.onnx.to_jax(path)
    params = {k: v * 1.5 for k, v in params.items()}
    want = optkit.onnx.with_initializers(onnx.load(path), params)
    for given in (path, pathlib.Path(path), apply_fn):
        assert optkit.onnx.with_initializers(given, params).SerializeToString() == want.SerializeToString()
    assert optkit.onnx.make_training_model(path).SerializeToString() == optkit.onnx.make_training_model(
        onnx.load(path)).SerializeToString()
    with pytest.raises(TypeError, match="model must be an onnx.ModelProto, a path"):
        optkit.onnx.with_initializers(3, params)


# Every optimizer optkit exports, as a user would construct it for a small fine-tuning run.
OPTKIT_OPTIMIZERS = {
    "adafactor": lambda: optkit.adafactor(1e-2),
    "t5x_adafactor": lambda: optkit.t5x_adafactor(1e-2),
    "adam": lambda: optkit.adam(1e-3),
    "adagrad": lambda: optkit.adagrad(1e-2),
    "momentum": lambda: optkit.momentum(1e-2, alpha=0.9),
}


@pytest.mark.parametrize("optimizer", list(OPTKIT_OPTIMIZERS))
def test_nnx_optimizer_steps_equal_the_plain_steps(optimizer):
    # T5X's Adafactor refuses parameters of rank > 2 without a factor rule: the MLP (matrices and vectors) for it.
    model, data = _load("torch_torchscript_mlp" if optimizer == "t5x_adafactor" else "torch_torchscript_cnn")
    x = data["input"]
    y = np.zeros(data["output"].shape, np.float32)
    apply_fn, params = optkit.onnx.to_jax(model)
    make = OPTKIT_OPTIMIZERS[optimizer]
    tx = make()
    with _x64_off():
        step = _mse_step(apply_fn, tx)
        state = tx.init(params)
        for _ in range(3):
            params, state, _ = step(params, state, x, y)

        module = optkit.onnx.OnnxModule(model)
        optimizer = nnx.Optimizer(module, make(), wrt=nnx.Param)

        @nnx.jit
        def nnx_step(module, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(module)
            optimizer.update(module, grads)
            return loss

        for _ in range(3):
            nnx_step(module, optimizer, x, y)
    got = {name: param[...] for name, param in module.params.items()}
    chex.assert_trees_all_close(got, params, rtol=1e-6, atol=1e-7)
    assert all(p.get_metadata()["onnx_name"] == n for n, p in module.params.items())
    # The module's state writes back into the ONNX model like the plain dict.
    new = optkit.onnx.with_initializers(model, nnx.state(module, nnx.Param))
    by_name = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    for name, value in params.items():
        np.testing.assert_allclose(by_name[name], np.asarray(value), rtol=1e-6, atol=1e-7)


def test_an_int64_input_takes_int32_under_jit_and_the_reverse_within_range():
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)
    graph = helper.make_graph([node], "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "table")])
    apply_fn, params = optkit.onnx.to_jax(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with _x64_off():
        rows = jax.jit(apply_fn)(params, jnp.array([3, 1], jnp.int32))
        np.testing.assert_array_equal(rows, [[6, 7], [2, 3]])
        grads = jax.grad(lambda p: apply_fn(p, np.array([3, 3], np.int32)).sum())(params)
        np.testing.assert_array_equal(grads["table"], [[0, 0], [0, 0], [0, 0], [2, 2]])
    node32 = helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)
    graph32 = helper.make_graph([node32], "embed",
                                [helper.make_tensor_value_info("ids", TensorProto.INT32, ["N"])],
                                [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 2])],
                                [numpy_helper.from_array(np.zeros((4, 2), np.float32), "table")])
    apply32, params32 = optkit.onnx.to_jax(helper.make_model(graph32, opset_imports=[helper.make_opsetid("", 17)]))
    assert apply32(params32, np.array([1], np.int64)).shape == (1, 2)
    with pytest.raises(ValueError, match=r"'ids' is declared int32, whose range is \[-2147483648, 2147483647\]; "
                                         r"the value 4294967296 does not fit"):
        apply32(params32, np.array([2**32], np.int64))


def _linear(trainable_bias=True):
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "W"),
         numpy_helper.from_array(np.full(2, -1.0, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_trainable_frozen_and_outputs_choose_what_apply_fn_takes_and_returns():
    apply_fn, params = optkit.onnx.to_jax(_linear(), frozen=["b"], outputs="z")
    assert list(params) == ["W"] and apply_fn.param_names == ("W",)
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(apply_fn(params, x), [[2.0, 2.0]])
    both, _ = optkit.onnx.to_jax(_linear(), trainable=["W"], outputs=["z", "y"])
    z, y = both(params, {"x": x})
    np.testing.assert_array_equal(y, [[2.0, 2.0]])
    everything, all_params = optkit.onnx.to_jax(_linear())
    assert sorted(all_params) == ["W", "b"] and len(everything(all_params, x)) == 2
    # vmap over a stack of parameter sets (an ensemble) and a stack of batches.
    stacked = {k: jnp.stack([v, 2 * v]) for k, v in all_params.items()}
    out = jax.vmap(everything, in_axes=(0, None))(stacked, x)
    np.testing.assert_array_equal(out[0][:, 0, 0], [3 - 1, 6 - 2])


@pytest.mark.parametrize("call, error, match", [
    (lambda f, p: f({"W": p["W"]}, np.ones((1, 3), np.float32)), ValueError, r"params lacks \['b'\]"),
    (lambda f, p: f({**p, "c": 1.0}, np.ones((1, 3), np.float32)), ValueError, "not trainable initializers: .'c'."),
    (lambda f, p: f({**p, "W": p["W"].astype(jnp.bfloat16)}, np.ones((1, 3), np.float32)), TypeError,
     r"params\['W'\] is bfloat16, the initializer float32"),
    (lambda f, p: f({**p, "W": jnp.ones((2, 2))}, np.ones((1, 3), np.float32)), ValueError, r"shape \(2, 2\)"),
    (lambda f, p: f(p, np.ones((1, 3), np.float64)), TypeError, "'x' is declared float32, fed float64"),
    (lambda f, p: f(p, np.ones((1, 4), np.float32)), ValueError, r"'x' is declared with shape \(N, 3\)"),
    (lambda f, p: f(p), ValueError, r"graph inputs \['x'\] are not fed"),
    (lambda f, p: f(p, {"q": 1}), ValueError, "'q' is not a graph input"),
    (lambda f, p: f([1.0], np.ones((1, 3), np.float32)), TypeError, "params must be a mapping"),
])
def test_bad_calls_are_refused_naming_the_argument(call, error, match):
    apply_fn, params = optkit.onnx.to_jax(_linear())
    with pytest.raises(error, match=match):
        call(apply_fn, params)
    with pytest.raises(error, match=match):
        jax.jit(lambda p: call(apply_fn, p))(params)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(trainable=["nope"]), ValueError, "trainable name 'nope' is not an initializer"),
    (dict(trainable="W"), TypeError, "trainable must be a sequence of initializer names"),
    (dict(outputs=["y", "w"]), ValueError, r"outputs \['w'\] are neither graph outputs nor values"),
])
def test_bad_choices_are_refused_at_load(kwargs, error, match):
    with pytest.raises(error, match=match):
        optkit.onnx.to_jax(_linear(), **kwargs)


def test_the_bounds_of_prepare_apply():
    with pytest.raises(optkit.onnx.TensorTooLargeError):
        optkit.onnx.to_jax(_linear(), max_tensor_bytes=16)
    apply_fn, params = optkit.onnx.to_jax(_linear(), max_tensor_bytes=64)
    with pytest.raises(optkit.onnx.TensorTooLargeError):
        apply_fn(params, np.ones((100, 3), np.float32))


def test_onnx_module_sharding_rule_sets_the_metadata():
    module = optkit.onnx.OnnxModule(_linear(), sharding=lambda name, shape: (None, "model") if len(shape) == 2
                                    else None)
    assert module.params["W"].get_metadata()["out_sharding"] == (None, "model")
    assert "out_sharding" not in module.params["b"].get_metadata()
    with pytest.raises(ValueError, match="one mesh axis name or None per axis"):
        optkit.onnx.OnnxModule(_linear(), sharding=lambda name, shape: ("model",))


@pytest.mark.parametrize("loss", ["binary_cross_entropy_with_logits", "l1", "mean_squared_error"])
def test_make_training_model_losses_equal_their_formulas(loss):
    """ONNX Runtime's BCEWithLogitsLoss, L1Loss and MSELoss, as the training graph computes them, against
    NumPy; ``frozen`` keeps a parameter out of the Gradient and optimizer nodes."""
    train = optkit.onnx.make_training_model(_linear(), loss=loss, output="y", frozen=["b"], optimizer="adagrad")
    assert [i.name for i in train.graph.input if i.name.startswith(("W", "b"))] == ["W", "W.adagrad_h"]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    target = rng.uniform(size=(5, 2)).astype(np.float32)
    out = optkit.onnx.prepare(train).run({"x": x, "target": target, "R": np.float32(0.0), "T": np.int64(0)})
    logits = x.astype(np.float64) @ np.ones((3, 2)) - 1.0
    want = {"binary_cross_entropy_with_logits": np.mean(np.log1p(np.exp(-logits)) + (1 - target) * logits),
            "l1": np.mean(np.abs(logits - target)), "mean_squared_error": np.mean((logits - target) ** 2)}[loss]
    np.testing.assert_allclose(float(out.loss), want, rtol=1e-6)


def test_masks_stay_constants_by_default():
    """Exporters write attention masks as -inf or as float32's lowest value (torch.onnx dynamo's GPT-2):
    neither is a default parameter of to_jax or make_training_model; naming one trains it."""
    masks = {"mask_min": np.full((2, 2), np.finfo(np.float32).min, np.float32),
             "mask_inf": np.array([[0.0, -np.inf], [0.0, 0.0]], np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "mask_min"], ["a"]),
             helper.make_node("Add", ["a", "mask_inf"], ["y"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                              [numpy_helper.from_array(np.eye(2, dtype=np.float32), "W"),
                               *(numpy_helper.from_array(v, k) for k, v in masks.items())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert list(optkit.onnx.to_jax(model)[1]) == ["W"]
    train = optkit.onnx.make_training_model(model, loss="mean_squared_error")
    assert [o.name for o in train.graph.output][1:2] == ["W.new"] and len(train.graph.output) == 4
    assert sorted(optkit.onnx.to_jax(model, trainable=["W", "mask_min"])[1]) == ["W", "mask_min"]
