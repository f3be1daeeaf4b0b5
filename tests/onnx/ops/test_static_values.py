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


def _causal_mask_model():
    """Y = X + Where(mask, 0, -inf), the mask built from X's shape as exporters write it: Range, two Unsqueezes,
    LessOrEqual, then And, Or, Xor and Not with constants (each leaving the mask as it is)."""
    def const(name, value):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), np.shape(value),
            np.asarray(value).ravel().tolist()))

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), const("one", np.int64(1)), const("zero", np.int64(0)),
        helper.make_node("Gather", ["s", "one"], ["t"]), helper.make_node("Range", ["zero", "t", "one"], ["r"]),
        const("axis0", np.array([0], np.int64)), const("axis1", np.array([1], np.int64)),
        helper.make_node("Unsqueeze", ["r", "axis0"], ["row"]), helper.make_node("Unsqueeze", ["r", "axis1"], ["col"]),
        helper.make_node("LessOrEqual", ["row", "col"], ["m0"]), const("true", np.bool_(True)),
        const("false", np.bool_(False)), helper.make_node("And", ["m0", "true"], ["m1"]),
        helper.make_node("Or", ["m1", "false"], ["m2"]), helper.make_node("Xor", ["m2", "false"], ["m3"]),
        helper.make_node("Not", ["m3"], ["m4"]), helper.make_node("Not", ["m4"], ["mask"]),
        const("keep", np.float32(0.0)), const("drop", np.float32(-np.inf)),
        helper.make_node("Where", ["mask", "keep", "drop"], ["bias"]), helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", np.float32, ["N", "T", "T"])],
                              [_info("y", np.float32, ["N", "T", "T"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_folded_mask_is_computed_on_the_host(caplog):
    """Comparisons, logic and Where on values known before running are folded with NumPy: the same mask, and no
    XLA program compiled for them while the caller's step is traced (one per operator and shape before)."""
    apply_fn, params = optkit.onnx.to_jax(_causal_mask_model())
    x = RNG.normal(size=(2, 13, 13)).astype(np.float32)
    expected = x + np.where(np.tril(np.ones((13, 13), bool)), np.float32(0), np.float32(-np.inf))
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        traced = jax.jit(apply_fn).trace(params, x)
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [m for m in compiled if any(f"jit({op})" in m for op in (
        "logical_and", "logical_or", "logical_xor", "logical_not", "less_equal", "_where", "where"))], compiled
    np.testing.assert_array_equal(traced.lower().compile()(params, x), expected)
    np.testing.assert_array_equal(apply_fn(params, jnp.asarray(x)), expected)


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int32, np.int64, np.float32, np.float64])
def test_folding_on_the_host_equals_jax_numpy_bit_for_bit(dtype, x64):
    """Each operator folded with NumPy gives jax.numpy's values and dtype (int64 wrapping to int32 with x64 off, as
    JAX converts it; integers wrapping on overflow) or is left to jax.numpy (floats outside Where)."""
    from optkit.onnx._ops import elementwise

    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    low, high = (info.min, info.max) if info else (-3, 3)
    a = np.concatenate([[low, high, 0], RNG.integers(low, high, 9, endpoint=True)]).astype(dtype).reshape(3, 4)
    b = np.concatenate([[high, -1 if low < 0 else 1, low], RNG.integers(low, high, 1, endpoint=True)]).astype(dtype)
    cond = RNG.random((3, 1)) < 0.5
    with jax.enable_x64(x64):
        for fn in elementwise._ON_HOST:
            args = (cond, a, b) if fn is jnp.where else (a,) if fn in (jnp.logical_not, jnp.negative, jnp.abs) \
                else (a, b)
            try:
                want = np.asarray(fn(*args))
            except TypeError:  # (JAX refuses the dtype for this function: so must the fold)
                with pytest.raises(TypeError):
                    elementwise._one_function(None, fn)(*args)
                continue
            got = elementwise._one_function(None, fn)(*args)
            assert isinstance(got, (np.ndarray, np.generic)) == (
                elementwise._on_host(args, selects=fn is jnp.where) is not None)
            assert np.asarray(got).dtype == want.dtype, fn.__name__
            np.testing.assert_array_equal(got, want, err_msg=fn.__name__)


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
