"""A float16 language model as users export it (a GPT-NeoX from a transformers config, ``model.half()``, torch.onnx's
dynamo exporter; ``tests/onnx/models/make_fp16.py``), against ONNX Runtime's float16 output and torch's float64
logits of the same weights.

Each arithmetic node gives ONNX Runtime's float16 values bit for bit on the same inputs. The whole model is farther
from float64 than ONNX Runtime is (2.2x, measured): ONNX Runtime's CPU provider has no float16 kernel for most of
these operators (Mul, Add, MatMul, Pow, Neg, Concat, LayerNormalization...) and inserts Casts that run them in
float32, removing the Cast pairs between neighbours, so chains of them keep float32 between nodes where optkit rounds
each node's result to float16. The bound below keeps the gap from growing; closing it is open work.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper, shape_inference  # noqa: E402

import optkit.onnx  # noqa: E402

FOLDER = pathlib.Path(__file__).parent / "models" / "fp16"
NAME = "torch_dynamo_gpt_neox_fp16"
RECORD = json.loads((FOLDER / "versions.json").read_text())["models"][NAME]
ARITHMETIC = {"Add", "Mul", "MatMul", "Pow", "Tanh", "Softmax", "LayerNormalization", "Where", "IsNaN"}


def _data():
    return onnx.load(str(FOLDER / f"{NAME}.onnx")), np.load(FOLDER / f"{NAME}.npz")


def test_the_float16_model_stays_near_onnx_runtime_and_float64():
    model, data = _data()
    (got,) = optkit.onnx.prepare(model).run([data["input_ids"]])
    assert got.dtype == np.float16 and got.shape == data["output"].shape
    truth = data["float64"]
    ours = np.abs(got.astype(np.float64) - truth).max()
    theirs = np.abs(data["output"].astype(np.float64) - truth).max()
    assert theirs == pytest.approx(RECORD["ort_error_vs_float64"])
    # Measured: 8.4e-3 from float64 against ONNX Runtime's 3.9e-3 (2.2x); 7.1e-3 from ONNX Runtime's output, on
    # logits of magnitude up to 6.3 (a float16 step there is 3.9e-3).
    assert ours <= 2.5 * theirs, (ours, theirs)
    np.testing.assert_allclose(got.astype(np.float64), data["output"].astype(np.float64), rtol=0, atol=1e-2)


def test_each_arithmetic_node_gives_onnx_runtimes_float16_values_on_the_same_inputs():
    """Every Add, Mul, MatMul, Pow, Tanh, Softmax, LayerNormalization, Where and IsNaN of the model, alone, fed
    the values ONNX Runtime computed for its inputs: optkit's output equals ONNX Runtime's, bit for bit."""
    model, data = _data()
    inferred = shape_inference.infer_shapes(model)
    info = {v.name: v for v in inferred.graph.value_info}
    names = [o for node in inferred.graph.node for o in node.output if o in info]
    probe = onnx.ModelProto()
    probe.CopyFrom(inferred)
    del probe.graph.output[:]
    probe.graph.output.extend(info[name] for name in names)
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip(names, session.run(None, {"input_ids": data["input_ids"]})))
    values.update((t.name, numpy_helper.to_array(t)) for t in model.graph.initializer)
    checked = 0
    for node in model.graph.node:
        if node.op_type not in ARITHMETIC or not all(name in values for name in [*node.input, *node.output] if name):
            continue
        floats = [name for name in node.input if name and values[name].dtype == np.float16]
        constants = [numpy_helper.from_array(values[name], name) for name in node.input
                     if name and name not in floats]
        graph = helper.make_graph(
            [node], "one",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT16, values[n].shape) for n in floats],
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
             for n in node.output], initializer=constants)
        one = helper.make_model(graph, opset_imports=model.opset_import)
        feeds = {n: values[n] for n in floats}
        want = onnxruntime.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds)
        got = optkit.onnx.prepare(one).run(feeds)
        for name, g, w in zip(node.output, got, want):
            assert g.dtype == w.dtype, name
            np.testing.assert_array_equal(g, w, err_msg=f"{node.op_type} {node.name} -> {name}")
        checked += 1
    assert checked >= 60, checked
