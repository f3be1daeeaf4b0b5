"""A model quantized to QDQ by ONNX Runtime's own tool (tests/onnx/models/make_quantized.py) runs in optkit.onnx as
ONNX Runtime runs it, and is differentiated through its fake quantization by the straight-through estimator.

ONNX's node cases check QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear themselves
(tests/onnx/onnx_backend_cases.txt); here the whole model, and the gradient of each QDQ pair against the
estimator written out in NumPy.
"""

from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import optkit.onnx  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

QUANTIZED = pathlib.Path(__file__).parent / "models" / "quantized"


@pytest.mark.parametrize("jit", [True, False])
def test_an_onnx_runtime_qdq_model_gives_onnx_runtimes_output(jit):
    model = onnx.load(str(QUANTIZED / "ort_qdq_cnn.onnx"))
    data = np.load(QUANTIZED / "ort_qdq_cnn.npz")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    (got,) = optkit.onnx.prepare(model, jit=jit).run([data["input"]])
    want = data["output"]
    # ONNX Runtime runs the QDQ pattern as integer kernels (QLinearConv): its rounding may put an activation
    # one quantization step away from the float computation of the same graph.
    scale = max(float(numpy_helper.to_array(i)) for i in model.graph.initializer
                if i.name.endswith("_scale") and not i.dims)
    np.testing.assert_allclose(got, want, atol=4 * scale * np.max(np.abs(want)) + 1e-6)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.999


def test_the_gradient_flows_through_every_qdq_pair_to_the_input():
    model = onnx.load(str(QUANTIZED / "ort_qdq_cnn.onnx"))
    data = np.load(QUANTIZED / "ort_qdq_cnn.npz")
    apply_fn, params = optkit.onnx.to_jax(model)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(apply_fn(params, x) ** 2)))(jnp.asarray(data["input"]))
    assert grad.shape == data["input"].shape and np.all(np.isfinite(grad)) and np.count_nonzero(grad) > 0


def _qdq_model(zero_point=True, zero=10, opset=19):
    """QuantizeLinear then DequantizeLinear with scale 0.1 and the zero point ``zero`` (a Python int: uint8)."""
    inits = [numpy_helper.from_array(np.float32(0.1), "s")]
    if zero_point:
        inits.append(numpy_helper.from_array(np.asarray(zero, np.uint8 if isinstance(zero, int) else None), "z"))
    names = ["s", "z"] if zero_point else ["s"]
    nodes = [helper.make_node("QuantizeLinear", ["x", *names], ["q"]),
             helper.make_node("DequantizeLinear", ["q", *names], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("zero_point", [True, False])
def test_a_qdq_pair_is_fake_quantization_with_the_straight_through_gradient(zero_point):
    x = np.array([0.04, -0.5, 30.0, -2.0, 0.25, 12.0], np.float32)
    z, low, high = (10, 0, 255) if zero_point else (0, 0, 255)  # uint8 without a zero point
    level = np.round(x.astype(np.float64) / 0.1) + z
    want_y = (np.clip(level, low, high) - z) * np.float32(0.1)
    want_grad = ((level >= low) & (level <= high)).astype(np.float32)
    apply_fn, params = optkit.onnx.to_jax(_qdq_model(zero_point))
    np.testing.assert_allclose(apply_fn(params, x), want_y, rtol=1e-6)
    np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(apply_fn(params, v)))(jnp.asarray(x)), want_grad)
    np.testing.assert_allclose(optkit.onnx.prepare(_qdq_model(zero_point)).run([x]).y, want_y, rtol=1e-6)


@pytest.mark.parametrize("name, low, high", [("int4", -8, 7), ("uint4", 0, 15), ("int2", -2, 1)])
def test_a_low_bit_qdq_pair_saturates_to_its_range_and_passes_the_gradient_inside_it(name, low, high):
    """4- and 2-bit integer QDQ pairs (opset 21): ONNX's reference gives the values; the straight-through
    gradient is 1 where the level lies inside the type's range and 0 where it saturates."""
    x = np.array([0.04, -0.5, 0.3, -2.0, 0.25, 1.2], np.float32)
    model = _qdq_model(zero=np.zeros((), getattr(ml_dtypes, name)), opset=21)
    want_y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    level = np.round(x.astype(np.float64) / 0.1)
    apply_fn, params = optkit.onnx.to_jax(model)
    np.testing.assert_array_equal(np.asarray(jax.jit(apply_fn)(params, x)), want_y)
    grad = jax.grad(lambda v: jnp.sum(apply_fn(params, v)))(jnp.asarray(x))
    np.testing.assert_array_equal(grad, ((level >= low) & (level <= high)).astype(np.float32))
    assert np.any(level < low) or np.any(level > high)  # the case saturates somewhere


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_a_float8_qdq_pair_equals_onnx_reference(name):
    x = np.array([0.04, -0.5, 30.0, -2.0, 0.25, 1e6], np.float32)
    model = _qdq_model(zero=np.zeros((), getattr(ml_dtypes, name)), opset=21)
    want_y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    apply_fn, params = optkit.onnx.to_jax(model)
    np.testing.assert_array_equal(np.asarray(jax.jit(apply_fn)(params, x)), want_y)
    assert np.isfinite(want_y).all()  # 1e6 saturates to the type's largest value
