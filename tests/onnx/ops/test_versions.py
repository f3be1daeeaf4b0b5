"""Operator versions below the newest, which ONNX's node cases do not reach (they use each operator's newest
version): single-node models against ``onnx.reference.ReferenceEvaluator``, compiled and not.
"""


import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import JIT, check_against_reference, node_model  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64



# ---------------------------------------------------------------------------
# operator versions below the newest (ONNX's node cases use the newest)

RNG = np.random.default_rng(0)
X345 = RNG.normal(size=(3, 4, 5)).astype(np.float32)


def _softmax_2d(x, axis, log):
    """Softmax before opset 13: x coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])], rows
    normalized (written out here: ReferenceEvaluator implements only the opset-13 form)."""
    axis %= x.ndim
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    flat = flat - flat.max(axis=1, keepdims=True)
    out = flat - np.log(np.exp(flat).sum(axis=1, keepdims=True)) if log else \
        np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)
    return out.reshape(x.shape)


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("op, opset, axis", [
    ("Softmax", 11, None), ("Softmax", 11, 2), ("Softmax", 11, -2), ("Softmax", 1, 0),
    ("LogSoftmax", 11, 0), ("LogSoftmax", 12, None),
])
def test_softmax_before_opset_13_coerces_to_2d(op, opset, axis, jit):
    model = node_model(op, {"x": X345}, {} if axis is None else {"axis": axis}, opset=opset)
    (got,) = optkit.onnx.prepare(model, jit=jit).run([X345])
    np.testing.assert_allclose(got, _softmax_2d(X345, 1 if axis is None else axis, op == "LogSoftmax"),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("op, opset, attrs", [
    ("Softmax", 13, {"axis": 1}),  # a single axis from opset 13
    ("LogSoftmax", 13, {}),
    ("ReduceSum", 11, {"axes": [0, 2], "keepdims": 0}),
    ("ReduceMean", 13, {"axes": [-1]}),
    ("ReduceMax", 12, {}),
    ("Flatten", 9, {"axis": 2}),
    ("Unsqueeze", 11, {"axes": [0, -1]}),
    ("LeakyRelu", 6, {"alpha": 0.2}),
])
def test_older_operator_versions(op, opset, attrs, jit):
    check_against_reference(node_model(op, {"x": X345}, attrs, opset=opset), {"x": X345}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_squeeze_with_axes_attribute(jit):
    x = RNG.normal(size=(1, 3, 1)).astype(np.float32)
    check_against_reference(node_model("Squeeze", {"x": x}, {"axes": [-1]}, opset=11), {"x": x}, jit)
    check_against_reference(node_model("Squeeze", {"x": x}, opset=11), {"x": x}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_axes_input_from_initializer(jit):
    """Axes given as an input (opset 13/18) from an initializer are read at load time."""
    axes = ("axes", np.array([1], np.int64))
    for op, opset in [("ReduceSum", 13), ("ReduceMean", 18), ("ReduceMax", 18), ("Unsqueeze", 13)]:
        model = node_model(op, {"x": X345}, opset=opset, initializers=[axes])
        check_against_reference(model, {"x": X345}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_gemm_with_every_attribute(jit):
    feeds = {"a": RNG.normal(size=(4, 3)).astype(np.float32), "b": RNG.normal(size=(5, 4)).astype(np.float32),
             "c": RNG.normal(size=(1, 5)).astype(np.float32)}
    attrs = {"transA": 1, "transB": 1, "alpha": 0.5, "beta": -2.0}
    for opset in (9, 11, 13):
        check_against_reference(node_model("Gemm", feeds, attrs, opset=opset), feeds, jit)


def _numpy_conv(x, w, b, strides, pads, dilations, group):
    """ONNX Conv written out as loops (ReferenceEvaluator does not run group > 1)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    for o in range(m):
        g = o // (m // group)
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * strides[0]:i * strides[0] + (kh - 1) * dilations[0] + 1:dilations[0],
                           j * strides[1]:j * strides[1] + (kw - 1) * dilations[1] + 1:dilations[1]]
                y[:, o, i, j] = np.sum(patch * w[o], axis=(1, 2, 3)) + b[o]
    return y


@pytest.mark.parametrize("jit", JIT)
def test_conv_groups_dilations_and_asymmetric_pads(jit):
    x, w = RNG.normal(size=(2, 4, 7, 6)).astype(np.float32), RNG.normal(size=(6, 2, 3, 2)).astype(np.float32)
    b = RNG.normal(size=6).astype(np.float32)
    attrs = {"group": 2, "dilations": [2, 1], "strides": [1, 2], "pads": [1, 0, 2, 1]}
    model = node_model("Conv", {"x": x, "w": w, "b": b}, attrs, opset=11)
    (got,) = optkit.onnx.prepare(model, jit=jit).run([x, w, b])
    np.testing.assert_allclose(got, _numpy_conv(x, w, b, [1, 2], [1, 0, 2, 1], [2, 1], 2), rtol=1e-5, atol=1e-5)
    # SAME_LOWER: output ceil(in / stride), the odd padding at the beginning.
    model = node_model("Conv", {"x": x, "w": w, "b": b}, {"auto_pad": "SAME_LOWER", "strides": [2, 1], "group": 2})
    (got,) = optkit.onnx.prepare(model, jit=jit).run([x, w, b])
    np.testing.assert_allclose(got, _numpy_conv(x, w, b, [2, 1], [1, 1, 1, 0], [1, 1], 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", JIT)
def test_pools_at_opset_11(jit):
    x = RNG.normal(size=(1, 2, 6, 5)).astype(np.float32)
    for op, attrs in [("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
                      ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1,
                                       "ceil_mode": 1, "strides": [2, 2]}),
                      ("AveragePool", {"kernel_shape": [2, 2], "pads": [0, 1, 1, 0]})]:
        check_against_reference(node_model(op, {"x": x}, attrs, opset=11), {"x": x}, jit)
# ---------------------------------------------------------------------------
# Versions of the operators added for exported models (issue 23) that ONNX's node cases do not
# reach (they use the newest version), each against onnx.reference.

def _f32(*shape, low=None):
    x = RNG.normal(size=shape).astype(np.float32)
    return np.abs(x) + 0.5 if low == "positive" else x


def _i64(*values):
    return np.array(values, np.int64)


_X = _f32(2, 3, 4)
_IMG = _f32(2, 3, 5, 5)
_SEQ = _f32(5, 2, 3)
OLDER_VERSIONS = [
    # op, opset, feeds, initializers, attrs, outputs
    ("Split", 11, {"x": _X}, [], {"axis": 2, "split": [1, 3]}, 2),
    ("Split", 11, {"x": _X}, [], {"axis": -1}, 2),
    ("Split", 13, {"x": _X}, [("s", _i64(3, 1))], {"axis": 2}, 2),
    ("Split", 18, {"x": _f32(2, 7)}, [], {"axis": 1, "num_outputs": 3}, 3),
    ("Pad", 2, {"x": _X}, [], {"pads": [0, 1, 0, 0, 2, 1], "value": 1.5}, 1),
    ("Pad", 2, {"x": _X}, [], {"pads": [0, 1, 1, 0, 1, 1], "mode": "reflect"}, 1),
    ("Pad", 11, {"x": _X}, [("p", _i64(0, 0, 1, 0, 0, 2)), ("v", np.array(-1.0, np.float32))], {}, 1),
    ("Pad", 13, {"x": _X}, [("p", _i64(1, 0, 1, 0, 1, 2))], {"mode": "edge"}, 1),
    ("Clip", 6, {"x": _X}, [], {"min": -0.5, "max": 0.5}, 1),
    ("Clip", 11, {"x": _X}, [("lo", np.array(-0.2, np.float32))], {}, 1),
    ("Dropout", 7, {"x": _X}, [], {"ratio": 0.3}, 1),
    ("Dropout", 10, {"x": _X}, [], {}, 2),
    ("Dropout", 12, {"x": _X}, [("r", np.array(0.4, np.float32))], {}, 2),
    ("BatchNormalization", 14, {"x": _IMG}, [("s", _f32(3)), ("b", _f32(3)), ("m", _f32(3)),
                                             ("v", _f32(3, low="positive"))], {"training_mode": 1}, 3),
    ("GatherND", 11, {"x": _X}, [("i", np.array([[0, 2], [1, -1]], np.int64))], {}, 1),
    ("Mod", 10, {"a": np.array([7, -7, 5], np.int32)}, [("b", np.array([3, 3, -2], np.int32))], {}, 1),
    ("Mod", 13, {"a": _X}, [("b", _f32(4, low="positive"))], {"fmod": 1}, 1),
    ("Range", 11, {}, [("a", np.array(1.0, np.float32)), ("l", np.array(4.2, np.float32)),
                       ("d", np.array(0.5, np.float32))], {}, 1),
    ("ArgMax", 11, {"x": _X}, [], {"axis": 1, "keepdims": 0}, 1),
    ("ArgMin", 11, {"x": _X}, [], {"axis": -1}, 1),
    ("Expand", 8, {"x": _f32(3, 1)}, [("s", _i64(2, 1, 4))], {}, 1),
    ("Tile", 6, {"x": _X}, [("r", _i64(2, 1, 3))], {}, 1),
    ("Gemm", 6, {"a": _f32(3, 4), "b": _f32(4, 5)}, [("c", _f32(5))], {"broadcast": 1, "alpha": 0.5}, 1),
    ("PRelu", 7, {"x": _X}, [("s", _f32(4))], {}, 1),
    ("PRelu", 9, {"x": _X}, [("s", _f32(3, 1))], {}, 1),
    ("Elu", 6, {"x": _X}, [], {"alpha": 0.7}, 1),
    ("Selu", 6, {"x": _X}, [], {}, 1),
    ("HardSigmoid", 6, {"x": _X}, [], {"alpha": 0.3, "beta": 0.4}, 1),
    ("IsNaN", 9, {"x": np.array([1.0, np.nan, np.inf], np.float32)}, [], {}, 1),
    ("IsInf", 10, {"x": np.array([1.0, np.nan, np.inf, -np.inf], np.float32)}, [], {"detect_negative": 0}, 1),
    ("Sum", 6, {"x": _X, "y": _X + 1}, [], {}, 1),
    ("Mean", 8, {"x": _X, "y": _f32(3, 4)}, [], {}, 1),
    ("Max", 6, {"x": _X, "y": -_X}, [], {}, 1),
    ("ConvTranspose", 11, {"x": _f32(1, 2, 3, 3)}, [("w", _f32(2, 3, 3, 3))],
     {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}, 1),
    ("ConvTranspose", 11, {"x": _f32(1, 2, 3, 3)}, [("w", _f32(2, 1, 3, 3))],
     {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 1),
    ("InstanceNormalization", 6, {"x": _IMG}, [("s", _f32(3)), ("b", _f32(3))], {}, 1),
    # onnx.reference's LRN loops over the batch axis for the channels: right only when N == C
    ("LRN", 1, {"x": _f32(3, 3, 2, 2)}, [], {"size": 3, "alpha": 1e-3}, 1),
    ("Softplus", 1, {"x": _X}, [], {}, 1),
    ("RNN", 7, {"x": _SEQ}, [("w", _f32(1, 4, 3)), ("r", _f32(1, 4, 4)), ("b", _f32(1, 8))], {"hidden_size": 4}, 2),
    ("GRU", 7, {"x": _SEQ}, [("w", _f32(1, 12, 3)), ("r", _f32(1, 12, 4))], {"hidden_size": 4}, 2),
    ("GRU", 7, {"x": _SEQ}, [("w", _f32(1, 12, 3)), ("r", _f32(1, 12, 4)), ("b", _f32(1, 24))],
     {"hidden_size": 4, "linear_before_reset": 1}, 2),
    ("LSTM", 7, {"x": _SEQ}, [("w", _f32(1, 16, 3)), ("r", _f32(1, 16, 4)), ("b", _f32(1, 32))],
     {"hidden_size": 4}, 3),
]


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("op, opset, feeds, inits, attrs, outputs", OLDER_VERSIONS,
                         ids=[f"{row[0]}-{row[1]}-{i}" for i, row in enumerate(OLDER_VERSIONS)])
def test_operator_versions_against_reference(op, opset, feeds, inits, attrs, outputs, jit):
    model = node_model(op, feeds, attrs, opset=opset, n_outputs=outputs, initializers=inits)
    check_against_reference(model, feeds, jit, rtol=1e-5)


def _numpy_conv_transpose_1d(x, w, stride, dilation, pads, group):
    """ConvTranspose by its definition: each input element adds x * W to the outputs it reaches."""
    n, c, length = x.shape
    m = w.shape[1] * group
    k = w.shape[2]
    full = stride * (length - 1) + (k - 1) * dilation + 1
    out = np.zeros((n, m, full), np.float64)
    per = c // group
    for ci in range(c):
        g = ci // per
        for mo in range(w.shape[1]):
            for i in range(length):
                for j in range(k):
                    out[:, g * w.shape[1] + mo, i * stride + j * dilation] += x[:, ci, i] * w[ci, mo, j]
    return out[:, :, pads[0]:full - pads[1]]


@pytest.mark.parametrize("jit", JIT)
def test_conv_transpose_grouped_against_its_definition(jit):
    """Grouped, dilated, strided 1-D ConvTranspose (onnx.reference fails on groups) against a NumPy loop."""
    x, w = _f32(2, 4, 5), _f32(4, 3, 3)
    model = node_model("ConvTranspose", {"x": x}, {"group": 2, "dilations": [2], "strides": [3], "pads": [1, 2]},
                        opset=17, initializers=[("w", w)])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": x})
    np.testing.assert_allclose(got, _numpy_conv_transpose_1d(x, w, 3, 2, (1, 2), 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", JIT)
def test_batch_normalization_9_and_negative_pads(jit):
    """BatchNormalization-9 with only Y is inference (onnx.reference uses the batch statistics there), and
    Pad's negative pads crop (NumPy's pad cannot express them)."""
    s, b, m, v = _f32(3), _f32(3), _f32(3), _f32(3, low="positive")
    model = node_model("BatchNormalization", {"x": _IMG}, {"epsilon": 1e-3}, opset=9,
                        initializers=[("s", s), ("b", b), ("m", m), ("v", v)])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": _IMG})
    c = (slice(None), None, None)
    np.testing.assert_allclose(got, s[c] * (_IMG - m[c]) / np.sqrt(v[c] + 1e-3) + b[c], rtol=1e-5, atol=1e-6)
    model = node_model("Pad", {"x": _X}, {"mode": "edge"}, opset=13,
                        initializers=[("p", _i64(1, 0, -1, 0, 1, 2))])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": _X})
    np.testing.assert_array_equal(got, np.pad(_X[:, :, 1:], [(1, 0), (0, 1), (0, 2)], mode="edge"))


def test_gather_nd_on_an_initializer_with_computed_indices_runs_compiled():
    """An initializer (a NumPy array) gathered by indices computed while running (a Whisper-style decoder's
    embedding lookup) used to reach JAX's indexed update as a NumPy array (no ``.at``)."""
    from onnx import numpy_helper

    graph = helper.make_graph(
        [helper.make_node("GatherND", ["table", "idx"], ["y"])], "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out = optkit.onnx.prepare(model).run([np.array([[3], [1]], np.int64)]).y
    np.testing.assert_array_equal(out, [[9, 10, 11], [3, 4, 5]])
