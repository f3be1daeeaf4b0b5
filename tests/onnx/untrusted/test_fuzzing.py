"""ONNX input safety (issue 7, point 7): bad models are refused with a clear error, before any
computation.

The loader is fuzzed with hypothesis over mutated bytes of a small valid training model (bit
flips, overwritten, inserted and deleted bytes, truncation): whatever happens, only the
documented errors of ``optkit.onnx.prepare`` (``ValueError``, ``TypeError``,
``UnsupportedOpError``) may escape, each with a message; a mutant that still loads is run, and
running it may raise only the same errors. Then the named hazards one by one: cycles, huge
declared shapes, nodes whose output would be huge, unknown domains, text that is not UTF-8.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx import UnsupportedOpError  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402
from tests.onnx.helpers import onnx_model  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

TRAINING = "ai.onnx.preview.training"
DOCUMENTED = (ValueError, TypeError, UnsupportedOpError)


_model = functools.partial(onnx_model, opsets=(("", 17), (TRAINING, 1)))


def training_model():
    """MatMul, Reshape (static shape), Constant, Mul, ReduceSum, Gradient, Adam, Relu."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 10, "W")
    shape = numpy_helper.from_array(np.array([2, 2], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Y"]),
        helper.make_node("Reshape", ["Y", "shape"], ["Y2"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Mul", ["Y2", "c"], ["Y3"]),
        helper.make_node("ReduceSum", ["Y3"], ["L"], keepdims=0),
        helper.make_node("Gradient", ["X", "W"], ["dX", "dW"], domain=TRAINING, xs=["X", "W"], y="L"),
        helper.make_node("Adam", ["R", "T", "W", "dW", "V", "H"], ["W_new", "V_new", "H_new"], domain=TRAINING,
                         alpha=0.9, beta=0.999, epsilon=1e-6),
        helper.make_node("Relu", ["dX"], ["dXr"]),
    ]
    inputs = [_info("X", TensorProto.FLOAT, ["N", 3]), _info("R", TensorProto.FLOAT, []),
              _info("T", TensorProto.INT64, []), _info("V", TensorProto.FLOAT, [3, 2]),
              _info("H", TensorProto.FLOAT, [3, 2])]
    outputs = [_info("L", TensorProto.FLOAT, []), _info("dXr", TensorProto.FLOAT, ["N", 3]),
               _info("W_new", TensorProto.FLOAT, [3, 2]), _info("V_new", TensorProto.FLOAT, [3, 2]),
               _info("H_new", TensorProto.FLOAT, [3, 2])]
    return _model(nodes, inputs, outputs, [w, shape])


DATA = training_model().SerializeToString()


def _feeds(rep):
    """Values of every declared input: symbolic or unknown dimensions are 2."""
    feeds = {}
    for info in rep.inputs:
        shape = tuple(d if isinstance(d, int) else 2 for d in (info.shape or ()))
        if np.prod(shape, dtype=np.float64) > 1e6:
            return None
        feeds[info.name] = np.ones(shape, info.dtype)
    return feeds


def test_the_valid_model_loads_and_runs():
    rep = optkit.onnx.prepare(DATA)
    out = rep.run({"X": np.ones((2, 3), np.float32), "R": np.float32(0.1), "T": np.int64(1),
                   "V": np.zeros((3, 2), np.float32), "H": np.zeros((3, 2), np.float32)})
    assert np.all(np.isfinite(out.W_new)) and out.dXr.shape == (2, 3)


MUTATION = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                     st.floats(0, 1, exclude_max=True), st.integers(0, 255), st.integers(1, 4))


def _mutate(data: bytes, mutations) -> bytes:
    b = bytearray(data)
    for kind, where, byte, length in mutations:
        pos = int(where * len(b)) if b else 0
        if kind == "flip" and b:
            b[pos] ^= 1 << (byte % 8)
        elif kind == "set" and b:
            b[pos] = byte
        elif kind == "insert":
            b[pos:pos] = bytes([byte]) * length
        elif kind == "delete":
            del b[pos:pos + length]
        elif kind == "truncate":
            del b[pos:]
    return bytes(b)


@settings(max_examples=500)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_bytes_raise_only_documented_errors(mutations):
    data = _mutate(DATA, mutations)
    try:
        rep = optkit.onnx.prepare(data)
    except DOCUMENTED as err:
        assert type(err) in DOCUMENTED and str(err), repr(err)
        return
    feeds = _feeds(rep)
    if feeds is None:
        return
    try:
        outputs = rep.run(feeds)
    except DOCUMENTED as err:
        assert type(err) in DOCUMENTED and str(err), repr(err)
        return
    assert len(outputs) == len(rep.outputs)


@pytest.mark.parametrize("cut", range(0, len(DATA), 23))
def test_truncated_model_raises_only_documented_errors(cut):
    try:
        optkit.onnx.prepare(DATA[:cut])
    except DOCUMENTED as err:
        assert type(err) in DOCUMENTED and str(err)


# ---------------------------------------------------------------------------
# the named hazards


def _float(name, shape):
    return _info(name, TensorProto.FLOAT, shape)


def test_cycles_are_refused():
    two = _model([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
                 [], [_float("a", [3])])
    with pytest.raises(ValueError, match="onnx.checker rejects .* topologically sorted"):
        optkit.onnx.prepare(two)
    self_loop = _model([helper.make_node("Relu", ["x"], ["x"])], [_float("x", [3])], [_float("x", [3])])
    with pytest.raises(ValueError, match="single static assignment"):
        optkit.onnx.prepare(self_loop)
    # a Gradient whose y is computed from its own output: onnx.checker cannot see it, the Graph does
    gradient_cycle = _model([
        helper.make_node("Gradient", ["x"], ["d"], domain=TRAINING, xs=["x"], y="y", name="G"),
        helper.make_node("Add", ["x", "d"], ["y"], name="A"),
    ], [_float("x", [3])], [_float("y", [3])])
    with pytest.raises(ValueError, match="cycle: Gradient node 'G' differentiates through its own output"):
        optkit.onnx.prepare(gradient_cycle)


@pytest.mark.parametrize("where", ["input", "output", "value_info"])
def test_huge_declared_shapes_are_refused_at_load(where):
    huge = [10**6, 10**6]
    inputs = [_float("x", huge if where == "input" else ["N"])]
    outputs = [_float("y", huge if where == "output" else ["N"])]
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs, outputs)
    if where == "value_info":
        model.graph.value_info.append(_float("y", [10**6, 10**6]))
    name = {"input": "graph input 'x'", "output": "graph output 'y'", "value_info": "value_info 'y'"}[where]
    with pytest.raises(optkit.onnx.TensorTooLargeError,
                       match=rf"{name} has shape \(.*\): 1e\+12 elements of float32, 4e\+12 bytes, "
                             rf"more than optkit.onnx's limit of \d+ bytes \(.* GiB\) for one tensor"):
        optkit.onnx.prepare(model)


def test_negative_declared_dimension_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_float("x", [-3])], [_float("y", [3])])
    with pytest.raises(ValueError, match="graph input 'x' declares the negative dimension -3"):
        optkit.onnx.prepare(model)


def _broadcast_model(traced: bool):
    """a (n, 1) + b (1, n): 2 MB of inputs, a (n, n) output of 1 TiB."""
    n = 1 << 19
    b = numpy_helper.from_array(np.ones((1, n), np.float32), "b")
    initializers = [b] if traced else [b, numpy_helper.from_array(np.ones((n, 1), np.float32), "a")]
    inputs = [_float("a", ["N", 1])] if traced else []
    nodes = [helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    return _model(nodes, inputs, [_float("y", [])], initializers), n


@pytest.mark.parametrize("traced", [False, True], ids=["constants-folded", "traced"])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "nojit"])
def test_a_node_output_above_the_limit_is_refused_before_it_is_allocated(traced, jit):
    model, n = _broadcast_model(traced)
    rep = optkit.onnx.prepare(model, jit=jit)
    feeds = [np.ones((n, 1), np.float32)] if traced else []
    with pytest.raises(ValueError, match=r"node 'add' \(ai.onnx::Add-14, opset 17\): output 'c' has shape "
                                         r"\(524288, 524288\).*refused before anything is allocated"):
        rep.run(feeds)


def test_the_limit_is_max_tensor_bytes():
    """Below the limit the same graph runs: lower the limit, and a small broadcast is refused."""
    model = _model([helper.make_node("Add", ["a", "b"], ["c"], name="add")],
                   [_float("a", [4, 1]), _float("b", [1, 4])], [_float("c", [4, 4])])
    feeds = [np.ones((4, 1), np.float32), np.ones((1, 4), np.float32)]
    np.testing.assert_array_equal(optkit.onnx.run_model(model, feeds, max_tensor_bytes=64).c, np.full((4, 4), 2.0))
    with pytest.raises(optkit.onnx.TensorTooLargeError,
                       match=r"output 'c' has shape \(4, 4\): 16 elements of float32, 64 bytes"):
        optkit.onnx.run_model(model, feeds, max_tensor_bytes=63)


def test_unknown_domains():
    node = helper.make_node("Foo", ["x"], ["y"], domain="com.example")
    not_imported = _model([node], [_float("x", [3])], [_float("y", [3])])
    with pytest.raises(ValueError, match="the model does not import the domain 'com.example'"):
        optkit.onnx.prepare(not_imported)
    imported = _model([node], [_float("x", [3])], [_float("y", [3])],
                      opsets=(("", 17), ("com.example", 1)))
    with pytest.raises(UnsupportedOpError, match="unsupported operator Foo \\(domain 'com.example', opset 1\\); "
                                                 "optkit runs no operator of domain 'com.example'"):
        optkit.onnx.prepare(imported)
    unknown_op = _model([helper.make_node("Lion", ["x"], ["y"], domain=TRAINING)], [_float("x", [3])],
                        [_float("y", [3])])
    with pytest.raises(UnsupportedOpError, match="unsupported operator Lion \\(domain 'ai.onnx.preview.training', "
                                                 "opset 1\\); optkit runs these ai.onnx.preview.training operators"):
        optkit.onnx.prepare(unknown_op)


def test_text_that_is_not_utf8_is_refused():
    data = DATA.replace(b"Reshape", b"Resh\xffpe")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        optkit.onnx.prepare(data)
    momentum = _model([helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X2", "V2"], domain=TRAINING,
                                        alpha=0.9, beta=1.0, norm_coefficient=0.0, mode="standard")],
                      [_float("R", []), _info("T", TensorProto.INT64, []), _float("X", [2]), _float("G", [2]),
                       _float("V", [2])], [_float("X2", [2]), _float("V2", [2])])
    data = momentum.SerializeToString().replace(b"standard", b"st\xe9ndard")
    with pytest.raises(ValueError, match="attribute 'mode' is not valid UTF-8 text"):
        optkit.onnx.prepare(data)


def test_versions_from_the_future():
    relu = _model([helper.make_node("Relu", ["x"], ["y"])], [_float("x", [3])], [_float("y", [3])],
                  opsets=(("", 17),), ir_version=10**6)
    with pytest.raises(ValueError, match="ir_version 1000000 is higher than the checker's"):
        optkit.onnx.prepare(relu)


def _one_node(node, x_shape, init=None):
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(len(x_shape))])
    inits = [] if init is None else [numpy_helper.from_array(init[1], init[0])]
    return onnx_model([node], [_info("x", np.float32, x_shape)], [out], inits), np.ones(x_shape, np.float32)


# Mutants of real files that ONNX's checker accepts and that ended in JAX's own errors, naming no node.
NAMED = [
    ("Gemm with transA=2**62", lambda: _one_node(helper.make_node("Gemm", ["x", "W"], ["y"], transA=2**62,
                                                                  name="gemm0"), [2, 3], ("W", np.ones((3, 4),
                                                                                                  np.float32))),
     ValueError, "node 'gemm0'.*attribute 'transA' is 4611686018427387904; Gemm accepts one of \\[0, 1\\]"),
    ("Resize scales of inf", lambda: _one_node(helper.make_node("Resize", ["x", "", "s"], ["y"], name="resize0"),
                                               [1, 1, 2, 2], ("s", np.array([1, 1, np.inf, np.nan], np.float32))),
     ValueError, "node 'resize0'.*positive finite scale"),
    ("an initializer's dims [3, 4] -> [3, 4, 1]", lambda: _one_node(
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm0"), [2, 3], ("W", np.ones((3, 4, 1), np.float32))),
     (TypeError, ValueError), "node 'mm0'"),
    ("MatMul retyped Xor on floats", lambda: _one_node(
        helper.make_node("Xor", ["x", "W"], ["y"], name="xor0"), [2, 3], ("W", np.ones((3, 4), np.float32))),
     (TypeError, ValueError), "node 'xor0'"),
]


@pytest.mark.parametrize("make, kind, message", [case[1:] for case in NAMED], ids=[case[0] for case in NAMED])
def test_a_mutant_that_fails_inside_jax_names_its_node(make, kind, message):
    """A node whose computation fails inside JAX or NumPy (shapes that do not fit, a refused dtype, a value that
    overflows a conversion) is re-raised with the node named; the attributes ONNX defines a range for are
    checked by the operator's builder."""
    model, x = make()
    with pytest.raises(kind, match=message):
        optkit.onnx.prepare(model).run([x])


_MS = "com.microsoft"


def _contrib(node, inputs, inits=()):
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"][:len(inputs[0][1])])
    return onnx_model([node], [_info(name, np.float32, shape) for name, shape in inputs], [out],
                      [numpy_helper.from_array(v, k) for k, v in inits], opsets=(("", 17), (_MS, 1)))


@pytest.mark.parametrize("node, match", [
    (helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=_MS, num_heads=2**62, name="mha0"),
     "node 'mha0'.*attribute 'num_heads' is 4611686018427387904; MultiHeadAttention accepts from 1 to 65536"),
    (helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=_MS, num_heads=0, name="mha0"),
     "node 'mha0'.*'num_heads' is 0"),
    (helper.make_node("SkipLayerNormalization", ["q", "k", "g"], ["y"], domain=_MS, name="sln0"), None),
])
def test_contrib_attributes_outside_what_onnx_runtime_accepts_are_refused_at_load(node, match):
    """com.microsoft operators declare their attributes' ranges at registration (``Accepts``): checked once when
    the model loads, before anything is traced, the node named (a num_heads of 2**62 reached a reshape)."""
    inputs = [("q", [1, 4, 8]), ("k", [1, 4, 8]), ("v", [1, 4, 8])]
    if match is None:  # a skip 7 wide against an input 8 wide; a rank-3 scale: ranks are checked when traced
        model = _contrib(node, [("q", [1, 4, 8]), ("k", [1, 4, 7])], [("g", np.ones((1, 1, 8), np.float32))])
        with pytest.raises(ValueError, match="node 'sln0'.*input 2 has shape \\(1, 1, 8\\); SkipLayerNormalization "
                                             "takes rank 1"):
            optkit.onnx.prepare(model).run([np.ones((1, 4, 8), np.float32), np.ones((1, 4, 7), np.float32)])
        return
    with pytest.raises(ValueError, match=match):
        optkit.onnx.prepare(_contrib(node, inputs))


def test_matmul_nbits_bits_outside_2_4_8_are_refused_at_load():
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain=_MS, K=16, N=4, bits=3, block_size=16,
                            name="mnb0")
    model = _contrib(node, [("a", [2, 16])], [("b", np.zeros((4, 1, 8), np.uint8)), ("s", np.ones(4, np.float32))])
    with pytest.raises(ValueError, match="node 'mnb0'.*'bits' is 3; MatMulNBits accepts one of \\[2, 4, 8\\]"):
        optkit.onnx.prepare(model)
