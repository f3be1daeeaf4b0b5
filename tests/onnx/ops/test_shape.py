"""Data movement (optkit/onnx/_ops/shape.py) beyond ONNX's node cases.
"""


import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.defs  # noqa: E402
import onnx.reference  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import helper  # noqa: E402

from tests.onnx.helpers import check_against_reference  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(0)



@pytest.mark.parametrize("jit", [True, False])
def test_a_split_into_one_part_is_its_input_for_the_next_node(jit):
    """``Split`` with one output (torchvision's SSD splits its box regressions per image, one image) feeds the
    next node the array itself (a one-output handler's 1-tuple is unwrapped), as ONNX's reference does."""
    x = RNG.normal(size=(1, 6, 4)).astype(np.float32)
    split = helper.make_node("Split", ["x", "sizes"], ["part"], axis=0)
    squeeze = helper.make_node("Squeeze", ["part", "axes"], ["y"])
    graph = helper.make_graph([split, squeeze], "g", [_info("x", x.dtype, x.shape)],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              initializer=[onnx.numpy_helper.from_array(np.array([1], np.int64), "sizes"),
                                           onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    check_against_reference(model, {"x": x}, jit)
