"""ONNX's string tensors in optkit.onnx (optkit/onnx/_ops/text.py): NumPy object arrays of str computed on the host,
against ONNX Runtime's CPU provider on the same models and feeds, compiled (``prepare``) and op by op: the string
operators chained, a string comparison steering a compiled float computation (one compile per string value), and
bad feeds named. ONNX's own node cases (``string_*``, ``strnormalizer_*``, ``regex_full_match_*``, ``equal_string*``)
run in tests/onnx/ops/test_backend.py."""

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import onnx_model  # noqa: E402

S, F, I64, B = TensorProto.STRING, TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _strings(*items):
    return np.array(items, dtype=object)


@pytest.mark.parametrize("jit", [True, False])
def test_string_operators_chained_match_onnx_runtime(jit):
    nodes = [helper.make_node("StringNormalizer", ["text"], ["kept"], case_change_action="LOWER",
                              stopwords=["the", "a"], locale="C.UTF-8"),
             helper.make_node("StringConcat", ["kept", "suffix"], ["tagged"]),
             helper.make_node("RegexFullMatch", ["kept"], ["is_word"], pattern=r"[a-z]+"),
             helper.make_node("StringSplit", ["text"], ["pieces", "counts"], delimiter="-", maxsplit=1)]
    model = onnx_model(nodes, [helper.make_tensor_value_info("text", S, ["n"]),
                               helper.make_tensor_value_info("suffix", S, [])],
                       [helper.make_tensor_value_info("tagged", S, ["m"]),
                        helper.make_tensor_value_info("is_word", B, ["m"]),
                        helper.make_tensor_value_info("pieces", S, ["n", "k"]),
                        helper.make_tensor_value_info("counts", I64, ["n"])], opsets=(("", 20),))
    text, suffix = _strings("The", "Quick-Brown", "a", "fox-7-x", "Ünïcode"), np.array("/tag", dtype=object)
    want = _ort(model, {"text": text, "suffix": suffix})
    with jax.enable_x64(True):  # (the counts are INT64: int32 with JAX's 64-bit mode off)
        got = optkit.onnx.prepare(model, jit=jit).run([text, suffix])
    assert want[0].tolist() == ["quick-brown/tag", "fox-7-x/tag", "ünïcode/tag"]
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tolist() == w.tolist()


def test_a_string_comparison_steers_a_compiled_float_computation_one_compile_per_value():
    nodes = [helper.make_node("Equal", ["label", "wanted"], ["same"]),
             helper.make_node("Cast", ["same"], ["weight"], to=F),
             helper.make_node("Mul", ["x", "weight"], ["y"])]
    model = onnx_model(nodes, [helper.make_tensor_value_info("label", S, [3]),
                               helper.make_tensor_value_info("wanted", S, [3]),
                               helper.make_tensor_value_info("x", F, [3])],
                       [helper.make_tensor_value_info("y", F, [3])], opsets=(("", 19),))
    rep = optkit.onnx.prepare(model)
    x = np.array([1.5, -2.0, 4.0], np.float32)
    for label in (_strings("cat", "dog", "cat"), _strings("cat", "cat", "cow"), _strings("cat", "dog", "cat")):
        feeds = {"label": label, "wanted": _strings("cat", "cat", "cat"), "x": x}
        np.testing.assert_array_equal(rep.run(feeds).y, _ort(model, feeds)[0])
    assert len(rep._functions) == 2  # one compile per distinct string value
    with pytest.raises(TypeError, match="graph input 'label' is declared string"):
        rep.run({"label": np.zeros(3, np.float32), "wanted": _strings("a", "b", "c"), "x": x})
    with pytest.raises(ValueError, match="graph input 'label' is declared with shape"):
        rep.run({"label": _strings("a", "b"), "wanted": _strings("a", "b", "c"), "x": x})


def _encoder(in_type, out_type, **attrs):
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    return onnx_model([node], [helper.make_tensor_value_info("x", in_type, [5])],
                      [helper.make_tensor_value_info("y", out_type, [5])], opsets=(("", 19), ("ai.onnx.ml", 4)))


@pytest.mark.parametrize("case", ["string_to_int", "int_to_string", "float_to_int_nan"])
def test_label_encoders_match_onnx_runtime(case):
    """What skl2onnx writes for scikit-learn's LabelEncoder (string classes to ids) and the reverse mapping, on the
    host; a numeric mapping traced (a NaN key matches NaN, as in ONNX Runtime)."""
    if case == "string_to_int":
        model = _encoder(S, I64, keys_strings=["cat", "dog", "émeu"], values_int64s=[3, 1, 2], default_int64=-7)
        x = _strings("dog", "cow", "émeu", "cat", "")
    elif case == "int_to_string":
        model = _encoder(I64, S, keys_int64s=[3, 1, 2], values_strings=["cat", "dog", "émeu"], default_string="?")
        x = np.array([1, 5, 2, 3, 3], np.int64)
    else:
        model = _encoder(F, I64, keys_floats=[0.5, float("nan"), -1.0], values_int64s=[10, 20, 30])
        x = np.array([np.nan, 0.5, 2.0, -1.0, np.nan], np.float32)
    want = _ort(model, {"x": x})[0]
    with jax.enable_x64(True):
        got = optkit.onnx.prepare(model).run([x]).y
        if case == "float_to_int_nan":
            np.testing.assert_array_equal(jax.jit(optkit.onnx.to_jax(model)[0])({}, x), want)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
