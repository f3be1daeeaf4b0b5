"""Resize in optkit.onnx beyond ONNX's node cases (tests/onnx/onnx_backend_cases.txt runs those, all 40): the output
size is bounded before anything is computed, and a bilinear upsampling (what segmentation heads export) runs
compiled as it runs op by op and differentiates."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64


def _resize_model(sizes, mode="linear"):
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, name="up")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", "H", "W"])],
        [numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_a_resize_to_a_huge_size_is_refused_before_anything_is_computed():
    for jit in (True, False):
        with pytest.raises(optkit.onnx.TensorTooLargeError, match=r"node 'up' .*the resized output"):
            optkit.onnx.prepare(_resize_model([1, 2, 10**6, 10**6]), jit=jit).run([np.ones((1, 2, 4, 4), np.float32)])


def test_bilinear_upsampling_runs_compiled_as_op_by_op_and_differentiates():
    model = _resize_model([1, 2, 8, 8])
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    compiled = optkit.onnx.prepare(model).run([x]).y
    np.testing.assert_allclose(compiled, optkit.onnx.prepare(model, jit=False).run([x]).y, rtol=1e-6)
    # half_pixel bilinear x2: the interior output (1, 1) is 3/4 of input (0, 0) and 1/4 of (1, 0) per axis.
    want = (0.75 * 0.75 * x[0, 0, 0, 0] + 0.75 * 0.25 * (x[0, 0, 1, 0] + x[0, 0, 0, 1]) + 0.0625 * x[0, 0, 1, 1])
    np.testing.assert_allclose(compiled[0, 0, 1, 1], want, rtol=1e-5)
    apply_fn, params = optkit.onnx.to_jax(model)
    grad = jax.grad(lambda v: jnp.sum(apply_fn(params, v)))(jnp.asarray(x))
    np.testing.assert_allclose(grad, np.full(x.shape, 4.0), rtol=1e-5)  # each input spreads to 4 outputs' worth
