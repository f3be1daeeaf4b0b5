"""Sizes derived from values (Range, NonZero, NonMaxSuppression...) bounded before anything is allocated, and run
compiled around them.
"""


import jax
import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.defs  # noqa: E402
import onnx.reference  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._base.errors import ValueDependentError  # noqa: E402
from tests.onnx.helpers import node_model  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(0)



# ---------------------------------------------------------------------------
# sizes derived from values are bounded before anything is allocated


@pytest.mark.parametrize("op, feeds, attrs, opset", [
    ("DFT", {"x": np.ones((1, 4, 1), np.float32), "dft_length": np.array(10**12, np.int64)}, {}, 20),
    ("AffineGrid", {"theta": np.ones((1, 2, 3), np.float32), "size": np.array([1, 1, 10**6, 10**6], np.int64)},
     {}, 20),
    ("Col2Im", {"x": np.ones((1, 4, 1), np.float32), "image_shape": np.array([10**6, 10**6], np.int64),
                "block_shape": np.array([1, 1], np.int64)}, {"strides": [10**6, 10**6]}, 18),
])
@pytest.mark.parametrize("jit", [True, False])
def test_a_size_from_values_is_refused_before_allocation(op, feeds, attrs, opset, jit):
    first, *static = feeds
    model = node_model(op, {first: feeds[first]}, attrs, opset=opset,
                        initializers=[(name, feeds[name]) for name in static])
    for k, dim in enumerate(model.graph.output[0].type.tensor_type.shape.dim):
        dim.dim_param = f"d{k}"  # the node's own check, not the declared output's
    with pytest.raises(optkit.onnx.TensorTooLargeError, match=rf"node '{op}#0'"):
        optkit.onnx.prepare(model, jit=jit, max_tensor_bytes=2**30).run([feeds[first]])


def test_non_max_suppression_runs_compiled_around_it_and_op_by_op_and_is_refused_traced():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    model = node_model("NonMaxSuppression", {"boxes": boxes, "scores": scores}, opset=11,
                        initializers=[("max", np.array([3], np.int64)), ("iou", np.array([0.5], np.float32))])
    want = onnx.reference.ReferenceEvaluator(model).run(None, {"boxes": boxes, "scores": scores})[0]
    np.testing.assert_array_equal(want, [[0, 0, 0], [0, 0, 2]])  # the second box overlaps the first by 0.82
    for jit in (False, True):
        got = optkit.onnx.prepare(model, jit=jit).run([boxes, scores])[0]
        np.testing.assert_array_equal(got, want)
    apply_fn, params = optkit.onnx.to_jax(model)
    with pytest.raises(ValueDependentError, match=r"NonMaxSuppression.*prepare\(model\)\.run"):
        jax.jit(apply_fn)(params, boxes, scores)


@pytest.mark.parametrize("op, want", [("Softmax", 1 / 1000), ("LogSoftmax", np.log(1 / 1000))])
def test_softmax_of_a_fused_average_is_not_nan(op, want):
    """The zoo SqueezeNet's last layers (GlobalAveragePool, then Softmax of 1000 equal logits of 1e10): XLA:CPU
    fused the average's multiplication into softmax's ``x - max`` (a fused multiply-add), which came out as
    +-365 instead of 0 and made every output NaN, depending on the thread schedule."""
    x = np.full((1, 1000, 13, 13), 1.0493425e10, np.float32) * RNG.uniform(0.5, 1.5, (1, 1, 13, 13)).astype(np.float32)
    pool = helper.make_node("GlobalAveragePool", ["x"], ["r"])
    graph = helper.make_graph([pool, helper.make_node(op, ["r"], ["y"])], "g", [_info("x", np.float32, x.shape)],
                              [_info("y", np.float32, [1, 1000, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    for _ in range(3):
        got = optkit.onnx.prepare(model).run([x])[0]
        np.testing.assert_allclose(got, np.full(got.shape, want, np.float32), rtol=1e-6)
