"""Random operators (optkit/onnx/_ops/randomness.py): jax.random, seeded by the node's seed (0 without one).
"""


import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.defs  # noqa: E402
import onnx.reference  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64



# ---------------------------------------------------------------------------
# random numbers: jax.random, seeded by the node's seed (0 without one)


def _random_model(op, attrs, x=None, opset=22):
    feeds = {} if x is None else {"x": x}
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    graph = helper.make_graph([node], "g", [_info(n, v.dtype, v.shape) for n, v in feeds.items()],
                              [helper.make_value_info("y", onnx.TypeProto())])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    return model, list(feeds.values())


@pytest.mark.parametrize("op, attrs, x, check", [
    ("RandomUniform", {"shape": [200, 500], "low": -2.0, "high": 3.0, "seed": 1.0}, None,
     lambda y: y.dtype == np.float32 and -2 <= y.min() and y.max() < 3 and abs(y.mean() - 0.5) < 0.02),
    ("RandomNormal", {"shape": [200, 500], "mean": 4.0, "scale": 2.0, "dtype": TensorProto.DOUBLE}, None,
     lambda y: y.dtype == np.float64 and abs(y.mean() - 4) < 0.02 and abs(y.std() - 2) < 0.02),
    ("RandomUniformLike", {"seed": 7.0}, np.zeros((300, 300), np.float16),
     lambda y: y.dtype == np.float16 and 0 <= y.min() and y.max() <= 1 and abs(float(y.mean()) - 0.5) < 0.02),
    ("RandomNormalLike", {"dtype": TensorProto.FLOAT}, np.zeros((300, 300), np.float64),
     lambda y: y.dtype == np.float32 and abs(y.mean()) < 0.02 and abs(y.std() - 1) < 0.02),
    ("Bernoulli", {"seed": 2.0}, np.tile(np.array([0.0, 0.25, 0.9, 1.0], np.float32), (20000, 1)),
     lambda y: y.dtype == np.float32 and np.allclose(y.mean(axis=0), [0, 0.25, 0.9, 1], atol=0.01)),
    ("Multinomial", {"sample_size": 20000, "seed": 3.0}, np.log(np.array([[0.2, 0.8], [0.7, 0.3]], np.float32)),
     lambda y: y.dtype == np.int32 and np.allclose(y.mean(axis=1), [0.8, 0.3], atol=0.01)),
])
def test_random_operators_draw_the_distribution_and_repeat_for_one_seed(op, attrs, x, check):
    model, feeds = _random_model(op, attrs, x, opset=22 if op != "Multinomial" else 7)
    y = optkit.onnx.prepare(model).run(feeds)[0]
    assert check(y), (op, y.dtype, y.mean())
    np.testing.assert_array_equal(optkit.onnx.prepare(model, jit=False).run(feeds)[0], y)  # the same draws
    other, _ = _random_model(op, {**attrs, "seed": 99.0}, x, opset=22 if op != "Multinomial" else 7)
    assert not np.array_equal(optkit.onnx.prepare(other).run(feeds)[0], y)  # another seed, other draws
