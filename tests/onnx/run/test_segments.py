"""Value-dependent output sizes under ``prepare``'s default compile: compiled segments around such nodes.

Expectations come from ONNX Runtime (CPU provider) on the same model and feeds; the split itself is read
from the ``optkit.onnx`` logger (which nodes ran between segments, how many segments compiled).
"""

import logging

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._base.errors import ValueDependentError  # noqa: E402

RNG = np.random.default_rng(46)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _messages(caplog, text):
    return [r.getMessage() for r in caplog.records if r.name == "optkit.onnx" and text in r.getMessage()]


def _gather_positives():
    """y = x[x > 0] (NonZero -> Transpose -> GatherND), z = reshape(x * x, shape(x)): a shape computed before the
    split feeds a Reshape after it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("GatherND", ["x", "t"], ["y"]),
             helper.make_node("Mul", ["x", "x"], ["xx"]),
             helper.make_node("Flatten", ["xx"], ["f"], axis=0),
             helper.make_node("Reshape", ["f", "s"], ["z"])]
    return _model(nodes, [_info("x", TensorProto.FLOAT, [2, 3])],
                  [_info("y", TensorProto.FLOAT, ["n"]), _info("z", TensorProto.FLOAT, [2, 3])])


def test_nonzero_runs_between_compiled_segments_each_compiled_once_per_shape(caplog):
    model = _gather_positives()
    rep = optkit.onnx.prepare(model)
    x = np.array([[1, -2, 3], [0, 5, -1]], np.float32)
    with caplog.at_level(logging.INFO, logger="optkit.onnx"):
        for feed in (x, -x, x, 2 * x, -x):
            got = rep.run([feed])
            want = _ort(model, {"x": feed})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
    # Only NonZero runs outside the compiled segments (the Shape feeding the Reshape stays a constant), and
    # the segment after it compiles once per length of its input: 3 positives, then 2.
    assert _messages(caplog, "runs between compiled segments") == [
        "node 'NonZero#2' runs between compiled segments (its output size depends on values)"]
    assert len(_messages(caplog, "compiled a segment")) == 3


@pytest.mark.parametrize("case", ["Unique", "Compress", "Range", "If"])
def test_value_dependent_nodes_under_the_default_compile_match_onnx_runtime(case):
    x = RNG.integers(-3, 4, (12,)).astype(np.float32)
    vec = _info("x", TensorProto.FLOAT, [12])
    if case == "Unique":
        nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Unique", ["a"], ["u", "i", "inv", "c"])]
        outs = [_info("u", TensorProto.FLOAT, ["n"]), _info("i", TensorProto.INT64, ["n"]),
                _info("inv", TensorProto.INT64, [12]), _info("c", TensorProto.INT64, ["n"])]
    elif case == "Compress":
        nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("Compress", ["x", "m"], ["c"]),
                 helper.make_node("Exp", ["c"], ["y"])]
        outs = [_info("y", TensorProto.FLOAT, ["n"])]
    elif case == "Range":  # 0, 1, ... up to the input's maximum
        nodes = [helper.make_node("ReduceMax", ["x"], ["hi"], keepdims=0),
                 helper.make_node("Range", ["zero", "hi", "one"], ["r"]), helper.make_node("Mul", ["r", "r"], ["y"])]
        outs = [_info("y", TensorProto.FLOAT, ["n"])]
    else:  # an If whose branches differ in shape, on a computed condition
        then = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["t"], axis=0)], "then", [],
                                 [_info("t", TensorProto.FLOAT, [24])])
        other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                                  [_info("e", TensorProto.FLOAT, [12])])
        nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                 helper.make_node("Greater", ["s", "zero"], ["cond"]),
                 helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
        outs = [_info("y", TensorProto.FLOAT, ["n"])]
    inits = [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    used = {name for node in nodes for name in node.input}
    model = _model(nodes, [vec], outs, [t for t in inits if t.name in used])
    rep = optkit.onnx.prepare(model)
    for feed in (x, -x, x + 2):
        for g, w in zip(rep.run([feed]), _ort(model, {"x": feed}), strict=True):
            assert g.shape == w.shape and g.dtype == jax.dtypes.canonicalize_dtype(w.dtype)  # int64: x64 off
            np.testing.assert_allclose(g, w, rtol=1e-6)  # Exp: XLA's and ONNX Runtime's differ in the last bit


def test_detector_post_processing_matches_onnx_runtime():
    """Scores -> NonMaxSuppression -> the kept boxes gathered and scaled, as an SSD or YOLO export ends."""
    n = 40
    centers = RNG.uniform(0, 10, (n, 2)).astype(np.float32)
    sizes = RNG.uniform(0.5, 3, (n, 2)).astype(np.float32)
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1)[None]
    logits = RNG.normal(size=(1, 3, n)).astype(np.float32)
    nodes = [helper.make_node("Sigmoid", ["logits"], ["scores"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "thr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["idx"], axis=1),
             helper.make_node("Squeeze", ["boxes", "zero"], ["b"]),
             helper.make_node("Gather", ["b", "idx"], ["kept"], axis=0),
             helper.make_node("Mul", ["kept", "scale"], ["out"])]
    inits = [helper.make_tensor("max", TensorProto.INT64, [1], [5]),
             helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.4]),
             helper.make_tensor("thr", TensorProto.FLOAT, [1], [0.3]),
             helper.make_tensor("two", TensorProto.INT64, [], [2]),
             helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
             helper.make_tensor("scale", TensorProto.FLOAT, [], [2.0])]
    inputs = [_info("boxes", TensorProto.FLOAT, [1, n, 4]), _info("logits", TensorProto.FLOAT, [1, 3, n])]
    outputs = [_info("sel", TensorProto.INT64, ["k", 3]), _info("out", TensorProto.FLOAT, ["k", 4])]
    model = _model(nodes, inputs, outputs, inits)
    rep = optkit.onnx.prepare(model)
    for feed in (logits, logits - 3.0):
        got = rep.run([boxes, feed])
        want = _ort(model, {"boxes": boxes, "logits": feed})
        np.testing.assert_array_equal(got.sel, want[0])
        np.testing.assert_allclose(got.out, want[1], rtol=1e-6)
    assert len(got.sel) < len(rep.run([boxes, logits]).sel)  # the threshold keeps fewer boxes the second time


def test_inside_jax_jit_the_error_names_the_node_and_what_runs_it():
    apply_fn, params = optkit.onnx.to_jax(_gather_positives())
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueDependentError, match=r"node 'NonZero#2'.*prepare\(model\)\.run\(\.\.\.\) runs it"):
        jax.jit(apply_fn)(params, x)
    rep = optkit.onnx.prepare(_gather_positives())
    with pytest.raises(ValueDependentError, match="NonZero#2"):
        jax.jit(lambda v: rep.run([v], as_numpy=False))(x)


def test_index_checks_hold_in_the_segments():
    """``checks=True``: an index out of range after the split raises, naming the Gather."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
             helper.make_node("Gather", ["table", "s"], ["y"])]
    model = _model(nodes, [_info("x", TensorProto.FLOAT, [4])], [_info("y", TensorProto.FLOAT, [])],
                   [helper.make_tensor("table", TensorProto.FLOAT, [3], [1, 2, 3])])
    rep = optkit.onnx.prepare(model, checks=True)
    np.testing.assert_array_equal(rep.run([np.array([1, 1, 0, 0], np.float32)]).y, 2.0)  # table[0 + 1]
    with pytest.raises(ValueError, match="Gather"):
        rep.run([np.array([1, 1, 1, 1], np.float32)])  # 0 + 1 + 2 + 3 = 6, out of range
