"""A BERT as ONNX Runtime's transformer optimizer fuses it (``EmbedLayerNormalization``, ``Attention``,
``SkipLayerNormalization``, ``BiasGelu``; and the float16 conversion it offers; tests/onnx/models/make_optimized.py)
runs as ONNX Runtime runs it on a padded batch, is differentiated in its float weights and trains."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

OPTIMIZED = ONNX_TESTS / "models" / "optimized"
FEEDS = ("input_ids", "attention_mask", "token_type_ids")


def _saved(name):
    data = np.load(OPTIMIZED / f"{name}.npz")
    return {k: data[k] for k in FEEDS}, data["output"]


def test_the_optimized_bert_gives_onnx_runtimes_output_on_a_padded_batch():
    model = onnx.load(str(OPTIMIZED / "ort_optimized_bert.onnx"))
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"} <= {
        n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    feeds, want = _saved("ort_optimized_bert")
    assert feeds["attention_mask"].min() == 0  # a padded sequence
    (got,) = optkit.onnx.prepare(model).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_its_float16_conversion_gives_onnx_runtimes_float16_output_bit_for_bit():
    """The float16 file (Casts kept at the inputs and output) against ONNX Runtime's output, jitted, op by op and
    through ``to_jax``: equal, bit for bit. ONNX Runtime runs MatMul, Attention and BiasGelu in float32 and keeps
    float32 between them (optkit.onnx._plans.float16), and its float16 SkipLayerNormalization sums in float32 and rounds
    once; rounding each node to float16 and summing in float16, as optkit did before, put 39% of the outputs a
    float16 step away."""
    feeds, want = _saved("ort_optimized_bert_fp16")
    model = onnx.load(str(OPTIMIZED / "ort_optimized_bert_fp16.onnx"))
    for jit in (True, False):
        (got,) = optkit.onnx.prepare(model, jit=jit).run(feeds)
        np.testing.assert_array_equal(got, want, err_msg=f"jit={jit}")
    apply_fn, params = optkit.onnx.to_jax(model)
    np.testing.assert_array_equal(np.asarray(jax.jit(apply_fn)(params, feeds)), want)


def test_the_optimized_berts_gradient_matches_central_differences_and_it_trains():
    model = onnx.load(str(OPTIMIZED / "ort_optimized_bert.onnx"))
    apply_fn, params = optkit.onnx.to_jax(model)
    assert any("qkv_weight" in k for k in params)  # the fused Attention weights are trained
    feeds, _ = _saved("ort_optimized_bert")
    target = jnp.asarray(np.random.default_rng(3).normal(size=(2, 8, 32)), jnp.float32)

    def loss(p):
        return jnp.mean((apply_fn(p, feeds) - target) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    rng = np.random.default_rng(0)
    direction = {k: jnp.asarray(rng.normal(size=np.shape(v)), jnp.float32) for k, v in params.items()}
    eps = 1e-3
    moved = [{k: v + s * eps * direction[k] for k, v in params.items()} for s in (1, -1)]
    want = (float(loss(moved[0])) - float(loss(moved[1]))) / (2 * eps)
    got = sum(float(jnp.sum(grads[k] * direction[k])) for k in params)
    np.testing.assert_allclose(got, want, rtol=2e-2)
    tx = optax.adam(1e-2)
    state, losses = tx.init(params), []

    @jax.jit
    def step(p, s):
        value, g = jax.value_and_grad(loss)(p)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    for _ in range(3):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert losses[-1] < losses[0], losses


def test_ort_float16_converters_out_of_order_graph_is_sorted_as_onnx_runtime_sorts_it():
    """ONNX Runtime's float16 converter (keep_io_types) appends the input's Cast at the end of the graph:
    onnx.checker refuses that order, ONNX Runtime sorts the nodes, and so does optkit (on a copy)."""
    path = OPTIMIZED / "ort_fp16_mlp.onnx"
    model = onnx.load(str(path))
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    before = model.SerializeToString()
    data = np.load(OPTIMIZED / "ort_fp16_mlp.npz")
    (got,) = optkit.onnx.prepare(model).run([data["input"]])
    assert model.SerializeToString() == before  # the caller's model is not modified
    want = data["output"].astype(np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=2 * 2.0 ** -10 * np.abs(want).max())
    assert [n.op_type for n in optkit.onnx.load_model(str(path)).graph.node][0] == "Cast"


def test_nodes_out_of_order_inside_a_branch_are_sorted_and_a_cycle_is_still_refused():
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Mul", ["t", "x"], ["y"]), helper.make_node("Add", ["x", "x"], ["t"])],
                             "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "else", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other),
             helper.make_node("Greater", ["s", "zero"], ["c"])]  # the If before its condition too
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
                              [onnx.numpy_helper.from_array(np.float32(0), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([1.0, -2.0], np.float32)
    rep = optkit.onnx.prepare(model)
    np.testing.assert_array_equal(rep.run([x, np.float32(1)])[0], 2 * x * x)
    np.testing.assert_array_equal(rep.run([x, np.float32(-1)])[0], -x)
    cycle = helper.make_graph([helper.make_node("Neg", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])], "c",
                              [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])])
    with pytest.raises(ValueError, match="topologically sorted"):
        optkit.onnx.prepare(helper.make_model(cycle, opset_imports=[helper.make_opsetid("", 17)]))
