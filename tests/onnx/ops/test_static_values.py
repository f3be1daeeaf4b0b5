"""Static values: the shapes and axes XLA needs before running, folded from constants, compiled per fed value, or
refused by name when only known at run time; initializers as defaults; run_node.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._base import values as _values  # noqa: E402
from tests.onnx.helpers import JIT, node_model  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(0)



# ---------------------------------------------------------------------------
# static values: shapes and axes XLA needs before running


def _reshape_from_shape_model():
    """Y = Reshape(X, Concat(Gather(Shape(X), 0), [-1])): PyTorch-style shape arithmetic."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
        helper.make_node("Gather", ["s", "zero"], ["batch"]),
        helper.make_node("Constant", [], ["minus_one"], value_ints=[-1]),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", np.float32, ["N", 4, 5])], [_info("y", np.float32, ["N", 20])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("jit", JIT)
def test_shape_arithmetic_is_folded(jit):
    rep = optkit.onnx.prepare(_reshape_from_shape_model(), jit=jit)
    for n in (3, 2):
        x = RNG.normal(size=(n, 4, 5)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], x.reshape(n, 20))


def test_static_input_fed_at_run_time_compiles_per_value():
    """A Reshape shape that is a graph input becomes a compile-time constant, one compile per value."""
    x = np.arange(12, dtype=np.float32)
    model = node_model("Reshape", {"x": x, "shape": np.array([3, 4], np.int64)})
    rep = optkit.onnx.prepare(model)
    for shape in ([3, 4], [2, -1], [3, 4]):
        np.testing.assert_array_equal(rep.run([x, np.array(shape, np.int64)])[0], x.reshape(shape))
    assert len(rep._functions) == 2


def test_traced_static_value_is_a_clear_error():
    graph = optkit.onnx.to_graph(node_model("Reshape", {"x": np.zeros(4, np.float32),
                                                          "shape": np.array([2, 2], np.int64)}))
    fn = jax.jit(graph.as_function(["x", "shape"], "out0"))
    with jax.enable_x64(True), pytest.raises(ValueError, match="input 'shape' must be known before the graph runs"):
        fn(jnp.zeros(4, jnp.float32), jnp.array([2, 2]))


@pytest.mark.parametrize("jit", JIT)
def test_initializer_is_a_default_that_a_feed_overrides(jit):
    """ONNX IR: a graph input with an initializer of the same name may be left unfed."""
    x = np.array([1.0, 2.0], np.float32)
    model = node_model("Add", {"x": x, "y": x}, initializers=[("y", np.array([10.0, 20.0], np.float32))])
    del model.graph.node[0].input[2:]  # Add(x, y); y has a default
    rep = optkit.onnx.prepare(model, jit=jit)
    np.testing.assert_array_equal(rep.run([x])[0], [11.0, 22.0])
    np.testing.assert_array_equal(rep.run([x, x])[0], [2.0, 4.0])


def test_run_node_and_named_outputs():
    node = helper.make_node("Sub", ["a", "b"], ["c"])
    a, b = np.array([3, 4], np.int64), np.array([1, 1], np.int64)
    out = optkit.onnx.run_node(node, [a, b])
    np.testing.assert_array_equal(out["c"], [2, 3])
    assert out[0].dtype == np.int64
    node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X2", "V2"], alpha=0.9, beta=1.0,
                            mode="standard", norm_coefficient=0.0, domain=_values.TRAINING_DOMAIN)
    ones = np.ones(2, np.float32)
    x2, v2 = optkit.onnx.Backend.run_node(node, [np.float32(0.1), np.int64(0), ones, ones, ones])
    np.testing.assert_allclose(x2, 1 - 0.1 * 1.9)


def test_device_support():
    assert optkit.onnx.Backend.supports_device("CPU")
    assert not optkit.onnx.Backend.supports_device("TPU")
    with pytest.raises(ValueError, match="device must be 'CPU' or 'CUDA"):
        optkit.onnx.prepare(_reshape_from_shape_model(), device="TPU")


def test_to_graph_returns_an_optkit_graph():
    graph = optkit.onnx.to_graph(_reshape_from_shape_model())
    assert isinstance(graph, optkit.Graph)
    assert graph.inputs == ("x",) and graph.outputs == ("y",)
    assert [node.name for node in graph.nodes][-1] == "Reshape#5"
