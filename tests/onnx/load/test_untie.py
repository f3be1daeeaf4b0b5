"""Initializers an exporter shared between unrelated nodes: the warning, ``untie=`` and what it changes.

Independent expectation: untied, each copy's gradient is the part of the tied gradient that flows through its
own node, so the copies' gradients sum to the tied one (the chain rule), and the outputs are unchanged.
"""

import warnings

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402


def _two_layernorms():
    """Two LayerNormalization nodes reading one bias (as torch.onnx's dynamo exporter writes equal zero biases),
    and a weight read by a Gather and a MatMul (tied on purpose, as GPT-2's embedding): only the first is shared
    by deduplication."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "ln.weight"),
             numpy_helper.from_array(np.zeros(4, np.float32), "ln.bias"),
             numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "ln2.weight"),
             numpy_helper.from_array(rng.normal(size=(5, 4)).astype(np.float32), "E")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h0"]),
             helper.make_node("LayerNormalization", ["h0", "ln.weight", "ln.bias"], ["h1"], name="ln1", axis=-1),
             helper.make_node("Tanh", ["h1"], ["h2"]),
             helper.make_node("LayerNormalization", ["h2", "ln2.weight", "ln.bias"], ["h3"], name="ln2", axis=-1),
             helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
             helper.make_node("MatMul", ["h3", "Et"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_deduplicated_trainable_initializer_warns_and_untie_gives_each_node_its_copy():
    model = _two_layernorms()
    ids = np.array([0, 3, 1])
    with pytest.warns(UserWarning, match=r"'ln.bias' by 2 nodes \('ln1', 'ln2'\).*untie=True"):
        tied_fn, tied = optkit.onnx.to_jax(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # E (a Gather and a MatMul) is not called shared; untied, nothing warns
        untied_fn, untied = optkit.onnx.to_jax(model, untie=True)
    assert set(untied) == set(tied) | {"ln.bias.untied.1"}
    np.testing.assert_array_equal(untied_fn(untied, ids), tied_fn(tied, ids))

    def loss(fn):
        return lambda p: jnp.sum(jnp.sin(fn(p, ids)))

    g_tied = jax.grad(loss(tied_fn))(tied)
    g_untied = jax.grad(loss(untied_fn))(untied)
    np.testing.assert_allclose(g_untied["ln.bias"] + g_untied["ln.bias.untied.1"], g_tied["ln.bias"], rtol=1e-5,
                               atol=1e-6)
    assert not np.allclose(g_untied["ln.bias"], g_untied["ln.bias.untied.1"])  # they train apart now
    np.testing.assert_allclose(g_untied["E"], g_tied["E"], rtol=1e-6)  # the intended tie stays

    # The trained copies go back into the untied model, for ONNX Runtime.
    trained = {**untied, "ln.bias.untied.1": untied["ln.bias.untied.1"] + 1.0}
    written = optkit.onnx.with_initializers(untied_fn.model, trained)
    by_name = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
    np.testing.assert_array_equal(by_name["ln.bias.untied.1"], np.ones(4, np.float32))
    np.testing.assert_array_equal(by_name["ln.bias"], np.zeros(4, np.float32))


def test_untie_by_name_and_onnx_module():
    nnx = pytest.importorskip("flax.nnx")
    model = _two_layernorms()
    _, params = optkit.onnx.to_jax(model, untie=["E"])  # chosen by name: the Gather keeps E, the MatMul a copy
    assert "E.untied.1" in params and "ln.bias.untied.1" not in params
    module = optkit.onnx.OnnxModule(model, untie=True)
    assert "ln.bias.untied.1" in module.params and isinstance(module.params["ln.bias.untied.1"], nnx.Param)
    with pytest.raises(ValueError, match=r"untie: \['nope'\] are not initializers"):
        optkit.onnx.to_jax(model, untie=["nope"])
