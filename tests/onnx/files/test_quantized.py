"""A model quantized to QDQ by ONNX Runtime's own tool (tests/onnx/models/make_quantized.py) runs in optkit.onnx as
ONNX Runtime runs it, and is differentiated through its fake quantization by the straight-through estimator.

ONNX's node cases check QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear themselves
(tests/onnx/onnx_backend_cases.txt); here the whole model, and the gradient of each QDQ pair against the
estimator written out in NumPy.
"""

from __future__ import annotations

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
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

QUANTIZED = ONNX_TESTS / "models" / "quantized"


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


# ------------------------------------------------------------------ dynamic quantization (quantize_dynamic)

DYNAMIC = ("llama", "gpt2", "bert", "phi3")  # phi3: onnxruntime-genai's builder's model (GroupQueryAttention)


def _feeds(model, data):
    return {i.name: data[i.name] for i in model.graph.input}


@pytest.mark.parametrize("name", DYNAMIC)
def test_an_onnx_runtime_dynamically_quantized_export_gives_onnx_runtimes_outputs(name):
    model = onnx.load(str(QUANTIZED / f"ort_int8_{name}.onnx"))
    data = np.load(QUANTIZED / f"ort_int8_{name}.npz")
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    got = optkit.onnx.prepare(model).run(_feeds(model, data))
    for out, value in zip(model.graph.output, got):
        want = data[f"output:{out.name}"]
        # the same integer products as ONNX Runtime's kernels; the float parts round alike to float32
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _dynamic_matmul_model(w, w_zero_point, w_scale):
    """``quantize_dynamic``'s pattern: DynamicQuantizeLinear(x) into MatMulInteger with an int8 weight, the
    int32 product cast to float and multiplied by the two scales."""
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(w_zero_point, "W_zero_point"),
             numpy_helper.from_array(w_scale, "W_scale")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "q_scale", "q_zero_point"]),
             helper.make_node("MatMulInteger", ["q", "W", "q_zero_point", "W_zero_point"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["acc_float"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["q_scale", "W_scale"], ["scales"]),
             helper.make_node("Mul", ["acc_float", "scales"], ["y"])]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
def test_a_dynamically_quantized_matmul_is_differentiated_by_the_straight_through_estimator(jit, per_column):
    """The gradient of ``sum(g * y)`` in ``x``, the estimator written out in NumPy (float64): the centered
    level ``q - z`` counts as ``x / s``, ``s = (max(x, 0) - min(x, 0)) / 255`` with its own derivative (one
    element each at the largest and the smallest ``x``), and ``y = (q - z) @ (W - W_z) * s * W_s``."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 5)).astype(np.float32)
    g = rng.normal(size=(3, 4))
    w = rng.integers(-128, 128, size=(5, 4)).astype(np.int8)
    w_zero_point = rng.integers(-3, 4, size=4).astype(np.int8) if per_column else np.int8(2)
    w_scale = np.float32(0.02)
    model = _dynamic_matmul_model(w, np.asarray(w_zero_point), w_scale)

    # NumPy: the forward pass as the operators define it, then the estimator
    s = np.float32((np.float32(max(x.max(), 0)) - np.float32(min(x.min(), 0))) / np.float32(255))
    z = np.clip(np.round(-min(x.min(), 0) / s), 0, 255)
    level = np.round(x / s) + z
    centered_w = w.astype(np.float64) - np.asarray(w_zero_point, np.float64)
    product = (np.clip(level, 0, 255) - z) @ centered_w
    want_y = product * np.float64(np.float32(s * w_scale))
    inside = (level >= 0) & (level <= 255)
    ds_dx = np.zeros_like(x, np.float64)
    ds_dx.flat[np.argmax(x)] += 1 / 255 if x.max() > 0 else 0
    ds_dx.flat[np.argmin(x)] -= 1 / 255 if x.min() < 0 else 0
    surrogate = (np.where(inside, x / s, 0.0)) @ centered_w  # what the estimator differentiates for q - z
    want_grad = w_scale * (np.where(inside, g @ centered_w.T, 0.0)
                           + np.sum(g * (product - surrogate)) * ds_dx)

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want_y, rtol=1e-6, atol=1e-6)
    apply_fn, params = optkit.onnx.to_jax(model)
    loss = lambda v: jnp.sum(jnp.asarray(g, jnp.float32) * apply_fn(params, v))  # noqa: E731
    grad_fn = jax.jit(jax.grad(loss)) if jit else jax.grad(loss)
    np.testing.assert_allclose(apply_fn(params, x), want_y, rtol=1e-6, atol=1e-6)
    grad = np.asarray(grad_fn(jnp.asarray(x)))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5 * np.abs(want_grad).max())
    # forward mode gives the same derivative
    dx = rng.normal(size=x.shape).astype(np.float32)
    _, tangent = jax.jvp(loss, (jnp.asarray(x),), (jnp.asarray(dx),))
    np.testing.assert_allclose(float(tangent), float(np.sum(want_grad * dx)), rtol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_an_int8_exports_gradient_is_the_float_exports_within_its_rounding(name):
    """The float parameters that ``quantize_dynamic`` leaves (norms, biases) get the gradient that the float
    export gives them, to the few percent that rounding the activations and weights to 8 bits moves it; the
    integer path alone gave them gradients unrelated to it (relative error about 1, cosine near 0)."""
    source = {"llama": "torch_dynamo_llama", "gpt2": "torch_dynamo_gpt2"}[name]
    int8 = onnx.load(str(QUANTIZED / f"ort_int8_{name}.onnx"))
    data = np.load(QUANTIZED / f"ort_int8_{name}.npz")
    feeds = list(_feeds(int8, data).values())
    grads = []
    for model in (int8, onnx.load(str(QUANTIZED.parent / f"{source}.onnx"))):
        apply_fn, params = optkit.onnx.to_jax(model, trainable=[t.name for t in int8.graph.initializer
                                                                 if t.data_type == TensorProto.FLOAT
                                                                 and len(t.dims) == 1 and t.dims[0] > 1])
        grads.append(jax.jit(jax.grad(lambda p, f=apply_fn: jnp.mean(jnp.sin(f(p, *feeds)))))(params))
    assert len(grads[0]) >= 5 and set(grads[0]) == set(grads[1])
    for key in grads[0]:
        got, want = np.ravel(grads[0][key]), np.ravel(grads[1][key])
        assert np.linalg.norm(got - want) < 0.1 * np.linalg.norm(want), key
