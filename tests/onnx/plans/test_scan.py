"""Repeated layers as one scanned layer (``scan_layers``): the blocks found, and the values, gradients and random
draws of the scanned form against NumPy's formula, the unrolled form and ONNX Runtime's expected outputs."""

from __future__ import annotations

import logging
import warnings

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from flax import nnx
from onnx import helper, numpy_helper

import optkit
import optkit.onnx
from tests.onnx.helpers import ONNX_TESTS, onnx_info, onnx_model

MODELS = ONNX_TESTS / "models"
WIDTH = 4


def _chain(layers, *, seed=0, dropout=False, reshape_per_layer=False, dtype=np.float32):
    """``layers`` blocks of 10 nodes, each ``h -> g * sigmoid(g)`` with ``g = scale_k * (tanh(mask * (h @ W_k +
    b_k)) + h)``, the mask read by every block and each block's ``tanh`` part also a graph output (as a KV cache
    is); the NumPy weights."""
    rng = np.random.default_rng(seed)
    nodes, inits, outs, weights = [], [], [], []
    x = "x"
    for k in range(layers):
        w, b, s = (rng.standard_normal((WIDTH, WIDTH)).astype(dtype) / 2, rng.standard_normal(WIDTH).astype(dtype),
                   (1 + rng.random(WIDTH) / 2).astype(dtype))
        weights.append((w, b, s))
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(b, f"b{k}"),
                  numpy_helper.from_array(s, f"s{k}")]
        t = f"l{k}/"
        nodes += [helper.make_node("MatMul", [x, f"W{k}"], [t + "a"], name=t + "MatMul"),
                  helper.make_node("Add", [t + "a", f"b{k}"], [t + "c"], name=t + "Add"),
                  helper.make_node("Mul", [t + "c", "mask"], [t + "d"], name=t + "Mask"),
                  helper.make_node("Tanh", [t + "d"], [f"state{k}"], name=t + "Tanh"),
                  helper.make_node("Add", [f"state{k}", x], [t + "f"], name=t + "Residual"),
                  helper.make_node("Mul", [t + "f", f"s{k}"], [t + "g"], name=t + "Scale")]
        if dropout:
            nodes.append(helper.make_node("Dropout", [t + "g", "ratio", "training"], [t + "g2"], name=t + "Dropout"))
        elif reshape_per_layer:  # a shape each layer spells differently: needed before running, so not scannable
            shape = np.array([-1, WIDTH] if k % 2 else [WIDTH, -1], np.int64)
            inits.append(numpy_helper.from_array(shape, f"shape{k}"))
            nodes.append(helper.make_node("Reshape", [t + "g", f"shape{k}"], [t + "g2"], name=t + "Reshape"))
        else:
            nodes.append(helper.make_node("Identity", [t + "g"], [t + "g2"], name=t + "Identity"))
        nodes.append(helper.make_node("Relu", [t + "g2"], [t + "r"], name=t + "Relu"))
        nodes += [helper.make_node("Sigmoid", [t + "r"], [t + "sig"], name=t + "Sigmoid"),
                  helper.make_node("Mul", [t + "r", t + "sig"], [f"h{k}"], name=t + "Swish")]
        outs.append(onnx_info(f"state{k}", dtype, [WIDTH, WIDTH]))
        x = f"h{k}"
    inits += [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
              numpy_helper.from_array(np.array(True), "training")]
    nodes.append(helper.make_node("ReduceSum", [x], ["y"], keepdims=0, name="Sum"))
    inputs = [onnx_info("x", dtype, [WIDTH, WIDTH]), onnx_info("mask", dtype, [WIDTH, WIDTH])]
    model = onnx_model(nodes, inputs, [onnx_info("y", dtype, []), *outs], inits)
    return model, weights


def _formula(weights, x, mask):
    """NumPy's float64 value of :func:`_chain` (no dropout): ``y`` and the per-layer states."""
    h, states = x.astype(np.float64), []
    for w, b, s in weights:
        state = np.tanh(mask * (h @ w + b))
        g = np.maximum(s * (state + h), 0)
        h = g / (1 + np.exp(-g))
        states.append(state)
    return h.sum(), states


def _feeds(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), (rng.random((WIDTH, WIDTH)) > 0.3).astype(
        np.float32)


def test_a_chain_of_identical_blocks_is_found_as_one_run():
    apply_fn, _ = optkit.onnx.to_jax(_chain(5)[0], scan_layers=True)
    (run,) = apply_fn._layers.runs
    assert (len(run.blocks), len(run.blocks[0]), len(run.carry)) == (5, 10, 1)
    assert run.blocks[0][0].name == "l0/MatMul" and run.blocks[4][-1].name == "l4/Swish"
    assert len(run.layer_names) == 3  # W_k, b_k, s_k; the mask is read by every block: an invariant
    assert run.stacked_outputs == ((3, 0),)  # each block's state, read as a graph output
    unrolled, _ = optkit.onnx.to_jax(_chain(5)[0], scan_layers=False)
    assert not unrolled._layers


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
@pytest.mark.parametrize("layers", [2, 5])
def test_values_and_gradients_equal_the_formula_and_the_unrolled_form(layers, jit):
    variant = jax.jit if jit else (lambda f: f)
    model, weights = _chain(layers)
    x, mask = _feeds()
    scanned, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=False)
    unrolled, _ = optkit.onnx.to_jax(model, scan_layers=False)
    assert len(scanned._layers.runs) == 1
    y, *states = variant(scanned)(params, x, mask)
    want_y, want_states = _formula(weights, x, mask)
    np.testing.assert_allclose(y, want_y, rtol=1e-5)
    for got, want in zip(states, want_states, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def loss(fn):
        return lambda p, x: fn(p, x, mask)[0] + sum(jnp.sum(s ** 2) for s in fn(p, x, mask)[1:])

    grads = variant(jax.grad(loss(scanned), argnums=(0, 1)))(params, x)
    want = jax.jit(jax.grad(loss(unrolled), argnums=(0, 1)))(params, x)
    chex.assert_trees_all_close(grads, want, rtol=1e-5, atol=1e-6)


def test_a_value_inside_a_layer_named_in_outputs_is_computed_with_its_run_unrolled():
    """``outputs=`` may name a value inside a repeated layer (not a graph output): the run holding it runs unrolled
    and the value is NumPy's; runs that hold no such value stay scanned."""
    model, weights = _chain(5)
    x, mask = _feeds()
    fn, params = optkit.onnx.to_jax(model, outputs=["l2/c", "y"], scan_layers=True)
    assert fn._layers.unrolled == {0}
    inner, y = jax.jit(fn)(params, x, mask)
    h = x.astype(np.float64)
    for w, b, s_ in weights[:2]:
        g = np.maximum(s_ * (np.tanh(mask * (h @ w + b)) + h), 0)
        h = g / (1 + np.exp(-g))
    np.testing.assert_allclose(inner, h @ weights[2][0] + weights[2][1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, _formula(weights, x, mask)[0], rtol=1e-5)
    scanned, _ = optkit.onnx.to_jax(model, outputs=["state3", "y"], scan_layers=True)
    assert not scanned._layers.unrolled  # a graph output the scan gives


@hypothesis.settings(max_examples=4, deadline=None)
@hypothesis.given(layers=st.integers(2, 7), seed=st.integers(0, 2**16))
def test_any_depth_is_one_run_with_the_formula_values(layers, seed):
    model, weights = _chain(layers, seed=seed)
    x, mask = _feeds(seed)
    apply_fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True)
    assert [len(run.blocks) for run in apply_fn._layers.runs] == [layers]
    np.testing.assert_allclose(apply_fn(params, x, mask), _formula(weights, x, mask)[0], rtol=2e-5)


def test_in_float64_the_scanned_values_equal_the_formula_to_rounding():
    with jax.enable_x64(True):
        model, weights = _chain(4, dtype=np.float64)
        x, mask = (v.astype(np.float64) for v in _feeds())
        apply_fn, params = optkit.onnx.to_jax(model, scan_layers=True)
        assert apply_fn._layers.runs
        y, *states = apply_fn(params, x, mask)
        want_y, want_states = _formula(weights, x, mask)
        np.testing.assert_allclose(y, want_y, rtol=1e-13)
        chex.assert_trees_all_close(list(states), want_states, rtol=1e-13, atol=1e-15)


def test_random_nodes_draw_what_they_draw_unrolled():
    model, _ = _chain(3, dropout=True)
    x, mask = _feeds()
    scanned, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=False)
    unrolled, _ = optkit.onnx.to_jax(model, outputs="y", scan_layers=False)
    assert scanned._layers.runs
    key = jax.random.key(7)
    got = jax.jit(jax.value_and_grad(lambda p: scanned(p, x, mask, rng=key)))(params)
    want = jax.jit(jax.value_and_grad(lambda p: unrolled(p, x, mask, rng=key)))(params)
    chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)
    other = scanned(params, x, mask, rng=jax.random.key(8))
    assert not np.isclose(float(other), float(got[0]))  # the key is used: another key, other masks


def test_a_run_the_scan_cannot_trace_runs_unrolled_and_says_why(caplog):
    model, weights = _chain(4, reshape_per_layer=True)
    x, mask = _feeds()
    apply_fn, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True)
    assert apply_fn._layers.runs  # found: the shapes are initializers of each block
    with caplog.at_level(logging.INFO, logger="optkit.onnx"):
        y = apply_fn(params, x, mask)
    np.testing.assert_allclose(y, _formula(weights, x, mask)[0], rtol=1e-5)
    assert apply_fn._layers.unrolled == {0}
    assert any("runs unrolled: 4 blocks of 10 nodes from 'l0/MatMul'" in r.getMessage() for r in caplog.records)


def test_remat_layers_gives_the_same_gradients():
    model, _ = _chain(4)
    x, mask = _feeds()
    plain, params = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=False)
    remat, _ = optkit.onnx.to_jax(model, outputs="y", scan_layers=True, stacked_params=False, remat_layers=True)
    assert "remat" in str(jax.make_jaxpr(jax.grad(lambda p: remat(p, x, mask)))(params))
    assert "remat" not in str(jax.make_jaxpr(jax.grad(lambda p: plain(p, x, mask)))(params))
    chex.assert_trees_all_close(jax.grad(lambda p: remat(p, x, mask))(params),
                                jax.grad(lambda p: plain(p, x, mask))(params), rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [({"scan_layers": "yes"}, "scan_layers must be True, False or None"),
                                          ({"remat_layers": 1}, "remat_layers must be True or False")])
def test_bad_options_are_refused_naming_them(kwargs, match):
    with pytest.raises(TypeError, match=match):
        optkit.onnx.to_jax(_chain(2)[0], **kwargs)


def test_by_default_only_runs_of_sixteen_blocks_or_more_are_scanned():
    for layers, scanned in ((15, False), (16, True)):
        apply_fn, params = optkit.onnx.to_jax(_chain(layers)[0], outputs="y")
        assert bool(apply_fn._layers) is scanned
        assert bool(apply_fn.stacked) is scanned  # (stacked_params=None: held stacked where scanned)
        assert [len(r.blocks) for r in optkit.onnx.to_jax(_chain(layers)[0], scan_layers=True)[0]._layers.runs] == [
            layers]
    model, weights = _chain(16)
    x, mask = _feeds()
    np.testing.assert_allclose(apply_fn(params, x, mask), _formula(weights, x, mask)[0], rtol=1e-4)


def test_prepare_scans_and_matches_the_formula():
    model, weights = _chain(3)
    x, mask = _feeds()
    rep = optkit.onnx.prepare(model, scan_layers=True)
    assert rep._layers.runs and not optkit.onnx.prepare(model, scan_layers=False)._layers
    np.testing.assert_allclose(rep.run([x, mask]).y, _formula(weights, x, mask)[0], rtol=1e-5)


def trained_module(model, tx, **options):
    """``(losses, module)``: three ``nnx.jit`` steps of ``OnnxModule(model, outputs="y", **options)`` in an
    ``nnx.Optimizer`` with ``tx``, on :func:`_feeds` (loss ``(y - 1) ** 2``)."""
    x, mask = _feeds()
    module = optkit.onnx.OnnxModule(model, outputs="y", **options)
    optimizer = nnx.Optimizer(module, tx, wrt=nnx.Param)

    @nnx.jit
    def step(module, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: (m(x, mask) - 1.0) ** 2)(module)
        optimizer.update(module, grads)
        return loss

    return [float(step(module, optimizer)) for _ in range(3)], module


def test_an_onnx_module_trains_the_scanned_model_as_the_unrolled_one():
    model, _ = _chain(4)

    def trained(scan):
        return trained_module(model, optax.chain(optax.clip_by_global_norm(1.0), optkit.adam(1e-2)),
                              scan_layers=scan, stacked_params=False if scan else None)

    (losses, scanned), (want, unrolled) = trained(True), trained(False)
    assert scanned.apply_fn._layers.runs and not unrolled.apply_fn._layers
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    chex.assert_trees_all_close(nnx.state(scanned, nnx.Param), nnx.state(unrolled, nnx.Param), rtol=1e-5,
                                atol=1e-6)


# ------------------------------------------------------------------ exported models

EXPORTS = {  # the fixture, its runs as (blocks, nodes per block), and whether gradients are compared too
    "torch_torchscript_bert": ([(2, 45)], True),
    "torch_dynamo_bert": ([(2, 37)], False),
    "torch_dynamo_gpt2": ([(2, 44)], True),
    "torch_dynamo_llama": ([(2, 65)], True),
    "torch_dynamo_llama_opset23": ([(2, 43)], False),
    "torch_torchscript_vit": ([(2, 45)], False),
    "torch_dynamo_transformer_encoder": ([(2, 40)], False),
    "torch_torchscript_mobilenet_v3_small": ([(2, 24), (2, 24)], False),
    "quantized/ort_int8_gpt2": ([(2, 64)], True),
    "quantized/ort_int4_llama": ([(2, 65)], False),
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exported_models_scan_their_layers_with_onnx_runtimes_values_and_the_unrolled_gradients(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the dynamo exporter's shared constants)
        scanned, params = optkit.onnx.to_jax(model, scan_layers=True, stacked_params=False)
        unrolled, _ = optkit.onnx.to_jax(model, scan_layers=False)
    runs, gradients = EXPORTS[name]
    assert [(len(r.blocks), len(r.blocks[0])) for r in scanned._layers.runs] == runs
    data = np.load(MODELS / f"{name}.npz")
    feeds = {info.name: data[info.name] for info in scanned.inputs if info.name in data}
    out = scanned(params, feeds)
    out = out if isinstance(out, tuple) else (out,)
    expected = [data[o] if o in data else data[f"output:{o}"] for o in scanned.outputs]
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    assert not scanned._layers.unrolled
    if not gradients:  # (the same scan code as the others: compared on four exports, for the suite's time)
        return
    weights = np.random.default_rng(0).standard_normal(np.shape(out[0])).astype(np.float32)

    def loss(fn):
        def value(p):
            y = fn(p, feeds)
            return jnp.sum((y[0] if isinstance(y, tuple) else y).astype(jnp.float32) * weights)
        return value

    got = jax.jit(jax.grad(loss(scanned)))(params)
    want = jax.jit(jax.grad(loss(unrolled)))(params)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want))
    chex.assert_trees_all_close(got, want, atol=1e-5 * scale, rtol=1e-4)


def test_a_mask_the_exporter_computes_inside_the_first_layer_is_hoisted_so_every_layer_scans():
    """torch.onnx's dynamo exporter writes LLaMA's attention-mask ``Where`` among the first layer's nodes, which every
    layer then reads: the first layer had one node more than the others and ran unrolled before the scan. A node
    computed from the graph inputs (and small or non-float constants) alone is run first, so all layers scan."""
    model, weights = _chain(4)
    for node in model.graph.node:
        node.input[:] = ["mask2" if name == "mask" else name for name in node.input]
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    model.graph.node.insert(1, helper.make_node("Mul", ["mask", "one"], ["mask2"], name="l0/MaskScale"))
    x, mask = _feeds()
    apply_fn, params = optkit.onnx.to_jax(model, scan_layers=True)
    assert [len(run.blocks) for run in apply_fn._layers.runs] == [4]
    assert [node.name for node in apply_fn._layers.hoisted] == ["l0/MaskScale"]
    np.testing.assert_allclose(apply_fn(params, x, mask)[0], _formula(weights, x, mask)[0], rtol=1e-5)
