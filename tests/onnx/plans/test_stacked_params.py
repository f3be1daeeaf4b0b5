"""Scanned layers' weights held stacked (``to_jax(..., scan_layers=True, stacked_params=True)``): one parameter with
a leading layer axis per per-layer weight, which no call stacks again. Expectations: NumPy's float64 formula of the
chain of tests/onnx/plans/test_scan.py, the per-layer form's values, gradients and optimizer steps, ONNX Runtime on
the file written back, and the program itself (no concatenation of the weights)."""

from __future__ import annotations

import re
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from flax import nnx

import optkit
import optkit.onnx
from tests.onnx.plans.test_scan import MODELS, _chain, _feeds, _formula, trained_module

ort = pytest.importorskip("onnxruntime")


def test_each_per_layer_weight_is_one_stacked_parameter_named_by_its_first_and_last_layer():
    model, weights = _chain(5)
    apply_fn, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=True)
    assert {name: value.shape for name, value in params.items()} == {
        "W0...W4": (5, 4, 4), "b0...b4": (5, 4), "s0...s4": (5, 4)}
    assert apply_fn.stacked["W0...W4"] == ("W0", "W1", "W2", "W3", "W4")
    assert apply_fn.param_names == tuple(params)
    for k, (w, _, s) in enumerate(weights):
        np.testing.assert_array_equal(params["W0...W4"][k], w)
        np.testing.assert_array_equal(params["s0...s4"][k], s)
    unstacked = apply_fn.unstacked(params)
    assert sorted(unstacked) == sorted(f"{n}{k}" for n in "Wbs" for k in range(5))
    assert "W0...W4" in params  # not changed


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_values_and_gradients_are_the_formula_and_the_per_layer_forms(jit):
    variant = jax.jit if jit else (lambda f: f)
    model, weights = _chain(4)
    x, mask = _feeds()
    stacked, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=True)
    per_layer, flat = optkit.onnx.to_jax(model, scan_layers=False)
    y, *states = variant(stacked)(params, x, mask)
    want_y, want_states = _formula(weights, x, mask)
    np.testing.assert_allclose(y, want_y, rtol=1e-5)
    chex.assert_trees_all_close(list(states), want_states, rtol=1e-5, atol=1e-6)

    def loss(fn):
        return lambda p: fn(p, x, mask)[0] + sum(jnp.sum(s ** 2) for s in fn(p, x, mask)[1:])

    grads = variant(jax.grad(loss(stacked)))(params)
    assert grads["W0...W3"].shape == (4, 4, 4)
    chex.assert_trees_all_close(stacked.unstacked(grads), jax.jit(jax.grad(loss(per_layer)))(flat), rtol=1e-5,
                                atol=1e-6)


def test_in_float64_the_stacked_values_equal_the_formula_to_rounding():
    with jax.enable_x64(True):
        model, weights = _chain(3, dtype=np.float64)
        x, mask = (v.astype(np.float64) for v in _feeds())
        apply_fn, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=True)
        assert params["W0...W2"].dtype == jnp.float64
        np.testing.assert_allclose(apply_fn(params, x, mask)[0], _formula(weights, x, mask)[0], rtol=1e-13)


def test_the_program_reads_the_stacked_weights_without_stacking_them():
    model, _ = _chain(6)
    x, mask = _feeds()

    def concatenations(stacked_params):
        fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=stacked_params)
        jaxpr = jax.make_jaxpr(jax.grad(lambda p: fn(p, x, mask)))(params)
        return len(re.findall(r"= (?:concatenate|stack|unstack)\[", str(jaxpr)))  # (JAX 0.10: stack, unstack)

    assert concatenations(False) >= 3  # W, b and s stacked at every call (and unstacked on the way back)
    assert concatenations(True) == 0
    # nor slices each layer's weights out of them (blocks run unrolled would read those; here none does)
    fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=True)
    before_scan = str(jax.make_jaxpr(lambda p: fn(p, x, mask))(params)).split("= scan[")[0]
    assert "= slice[" not in before_scan and "= squeeze[" not in before_scan


def test_training_steps_equal_the_per_layer_ones_under_chain_and_inject_hyperparams():
    model, _ = _chain(4)
    x, mask = _feeds()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optkit.adam)(learning_rate=1e-2))

    def trained(stacked_params):
        fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=stacked_params)
        state = tx.init(params)

        @jax.jit
        def step(p, s):
            loss, grads = jax.value_and_grad(lambda q: (fn(q, x, mask) - 1.0) ** 2)(p)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss

        losses = []
        for _ in range(3):
            params, state, loss = step(params, state)
            losses.append(float(loss))
        return losses, fn.unstacked(params)

    (losses, got), (want_losses, want) = trained(True), trained(False)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)


def test_with_initializers_writes_the_layers_back_as_onnx_runtime_reads_them():
    model, _ = _chain(3)
    x, mask = _feeds()
    fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=True)
    trained = {name: value * 1.5 for name, value in params.items()}
    written = optkit.onnx.with_initializers(fn, trained)
    assert written == optkit.onnx.with_initializers(model, fn.unstacked(trained))
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["y"], {"x": x, "mask": mask})[0], fn(trained, x, mask), rtol=1e-5)
    with pytest.raises(ValueError, match=r"'W0...W2' is not an initializer.*pass apply_fn as model"):
        optkit.onnx.with_initializers(model, trained)


def test_an_onnx_module_holds_stacked_params_trains_them_and_writes_them_back():
    model, _ = _chain(4)

    def trained(stacked_params):
        return trained_module(model, optkit.adam(1e-2), scan_layers=True, stacked_params=stacked_params)

    (losses, stacked), (want, per_layer) = trained(True), trained(False)
    assert stacked.params["W0...W3"].get_metadata()["onnx_name"] == ("W0", "W1", "W2", "W3")
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert optkit.onnx.with_initializers(model, stacked) == optkit.onnx.with_initializers(
        model, nnx.state(per_layer, nnx.Param))


def test_a_run_the_scan_cannot_trace_still_trains_its_stacked_weights_unrolled():
    model, weights = _chain(4, reshape_per_layer=True)  # (a per-layer shape: the scanned trace fails)
    x, mask = _feeds()
    fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=True)
    assert "W0...W3" in params
    np.testing.assert_allclose(fn(params, x, mask), _formula(weights, x, mask)[0], rtol=1e-5)
    assert fn._layers.unrolled == {0}
    per_layer, flat = optkit.onnx.to_jax(model, outputs="y", scan_layers=False)
    chex.assert_trees_all_close(fn.unstacked(jax.grad(lambda p: fn(p, x, mask))(params)),
                                jax.grad(lambda p: per_layer(p, x, mask))(flat), rtol=1e-5, atol=1e-6)


def test_scanned_runs_hold_stacked_params_by_default_and_lora_adapters_keep_their_names():
    model, _ = _chain(3)
    assert "W0...W2" in optkit.onnx.to_jax(model, scan_layers=True)[1]
    assert "W0" in optkit.onnx.to_jax(model, scan_layers=True, stacked_params=False)[1]
    assert "W0" in optkit.onnx.to_jax(model)[1]  # (3 layers: not scanned by default)
    lora = optkit.onnx.LoRA(2, targets=["W*"])
    fn, params = optkit.onnx.to_jax(model, scan_layers=True, lora=lora)
    assert sorted(params) == sorted(f"W{k}.lora_{m}" for k in range(3) for m in "AB") and not fn.stacked
    fn, params = optkit.onnx.to_jax(model, scan_layers=True, lora=lora, stacked_params=True)
    assert sorted(params) == ["W0.lora_A...W2.lora_A", "W0.lora_B...W2.lora_B"]


def test_weights_some_layers_freeze_keep_their_names():
    model, _ = _chain(3)
    _, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=True, frozen=["b1"])
    assert sorted(params) == ["W0...W2", "b0", "b2", "s0...s2"]


@pytest.mark.parametrize("name", ["torch_dynamo_llama", "torch_torchscript_bert"])
def test_exported_models_train_stacked_as_per_layer(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the dynamo exporter's shared constants)
        stacked, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=True)
        per_layer, flat = optkit.onnx.to_jax(model, scan_layers=False)
    assert len(params) < len(flat) and stacked.stacked
    data = np.load(MODELS / f"{name}.npz")
    feeds = {info.name: data[info.name] for info in stacked.inputs if info.name in data}
    np.testing.assert_allclose(stacked(params, feeds), data["output"], rtol=2e-4, atol=2e-4)
    weights = np.random.default_rng(0).standard_normal(data["output"].shape).astype(np.float32)
    got = jax.jit(jax.grad(lambda p: jnp.sum(stacked(p, feeds) * weights)))(params)
    want = jax.jit(jax.grad(lambda p: jnp.sum(per_layer(p, feeds) * weights)))(flat)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want))
    chex.assert_trees_all_close(stacked.unstacked(got), want, atol=1e-5 * scale, rtol=1e-4)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"stacked_params": True, "scan_layers": False}, ValueError, "needs scan_layers=True"),
    ({"stacked_params": 1, "scan_layers": True}, TypeError, "stacked_params must be True, False or None")])
def test_bad_options_are_refused_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        optkit.onnx.to_jax(_chain(2)[0], **kwargs)


def test_a_stacked_parameter_of_another_shape_is_refused_naming_it():
    fn, params = optkit.onnx.to_jax(_chain(3)[0], outputs="y", scan_layers=True, stacked_params=True)
    x, mask = _feeds()
    with pytest.raises(ValueError, match=r"params\['W0...W2'\] has shape \(2, 4, 4\), the initializer \(3, 4, 4\)"):
        fn({**params, "W0...W2": params["W0...W2"][:2]}, x, mask)
