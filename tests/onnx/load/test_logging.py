"""The ``optkit.onnx`` logger (load stages, tracing and first-call times at INFO), ``onnx.checker`` run once for a
ModelProto that ``load_model`` returned, and the progress bar over large external data."""

import logging
import re

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._load import tensors as _tensors  # noqa: E402


def _model(value=1.0):
    w = numpy_helper.from_array(np.full((3, 2), value, np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_logger_reports_load_trace_and_first_call_times(caplog):
    caplog.set_level(logging.INFO, logger="optkit.onnx")
    apply_fn, params = optkit.onnx.to_jax(_model(2.0))
    jax.jit(lambda p: apply_fn(p, jnp.ones((5, 3), jnp.float32)))(params)  # inside a caller's jit: traced there
    apply_fn, params = optkit.onnx.to_jax(_model(2.5))
    apply_fn(params, np.ones((1, 3), np.float32))  # called eagerly: optkit's jit traces, compiles and runs
    text = [r.getMessage() for r in caplog.records if r.name == "optkit.onnx"]
    assert any(t.startswith("loaded the ModelProto: read ") and "converted 1 nodes" in t for t in text), text
    assert any(t.startswith("traced the graph (1 nodes) in ") for t in text), text
    assert any(t.startswith("compiled the graph (1 nodes) for its first input shapes: ") for t in text), text
    assert any(t.startswith("traced inside a caller's transformation in ") for t in text), text


def _compiles(caplog):
    messages = [r.getMessage() for r in caplog.records if r.name == "optkit.onnx"]
    return [m for m in messages if "compiled the graph" in m]


def test_each_compile_is_logged_with_its_cause_and_time(caplog):
    """A new sequence length compiles again (issue 45): the log names the input whose shape changed, old and new,
    and the time; the same shapes again compile nothing; a new value of a shape input (static) is named."""
    caplog.set_level(logging.INFO, logger="optkit.onnx")
    apply_fn, params = optkit.onnx.to_jax(_model(1.5))
    for rows in (4, 4, 6, 6, 4):
        apply_fn(params, np.ones((rows, 3), np.float32))
    first, second = _compiles(caplog)
    stages = r"\(trace \d+\.\d\d s, lower \d+\.\d\d s, XLA compile \d+\.\d\d s, run \d+\.\d\d s\)"
    assert re.fullmatch(r"compiled the graph \(1 nodes\) for its first input shapes: \d+\.\d\d s " + stages,
                        first), first
    assert re.fullmatch(r"compiled the graph \(1 nodes\) for new input shapes: x float32\[4, 3\] -> float32\[6, 3\]: "
                        r"\d+\.\d\d s " + stages, second), second
    (record,) = [fn.first for fn in apply_fn._functions.values()]  # the stages add up to the call's time
    assert set(record) == {"trace", "lower", "compile", "run", "total"}
    assert record["trace"] + record["lower"] + record["compile"] + record["run"] == pytest.approx(record["total"])

    caplog.clear()
    w = numpy_helper.from_array(np.ones((3, 2), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"]),
                               helper.make_node("Reshape", ["y", "shape"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["A", "B"])], [w])
    rep = optkit.onnx.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    for rows, shape in ((4, [2, 4]), (4, [4, 2]), (6, [4, 3]), (6, [4, 3])):
        (got,) = rep.run([np.ones((rows, 3), np.float32), np.array(shape, np.int64)])
        assert got.shape == tuple(shape)
    messages = _compiles(caplog)
    assert len(messages) == 3, messages
    assert "for new static values of shape: " in messages[1], messages
    assert "for new static values of shape; new input shapes: x float32[4, 3] -> float32[6, 3]: " in messages[2]


def test_onnx_checker_runs_once_for_a_model_load_model_checked(monkeypatch):
    calls = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda proto, *a, **k: (calls.append(1), real(proto, *a, **k)))
    proto = optkit.onnx.load_model(_model(3.0).SerializeToString())
    assert len(calls) == 1
    optkit.onnx.to_jax(proto)
    optkit.onnx.prepare(proto)
    assert len(calls) == 1  # not again
    proto.graph.initializer[0].float_data.append(0.0)  # changed since: checked again (and refused)
    with pytest.raises(ValueError, match="onnx.checker rejects"):
        optkit.onnx.to_jax(proto)
    assert len(calls) == 2
    optkit.onnx.to_jax(_model(5.0))  # another model the caller built: checked
    assert len(calls) == 3


def test_large_external_data_is_read_with_a_progress_bar(tmp_path, monkeypatch):
    model = _model(4.0)
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    bars = []
    real = _tensors._progress

    def recording(total, what):
        bar = real(total, what)
        bars.append((total, what, bar))
        return bar

    monkeypatch.setattr(_tensors, "PROGRESS_BYTES", 0)
    monkeypatch.setattr(_tensors, "_progress", recording)
    apply_fn, params = optkit.onnx.to_jax(str(tmp_path / "m.onnx"))
    np.testing.assert_array_equal(params["W"], np.full((3, 2), 4.0, np.float32))
    ((total, what, bar),) = bars
    assert total == 24 and "reading the external data of" in what
    assert bar is None or bar.total == 24  # a tqdm bar over the bytes (None only where tqdm is not installed)
