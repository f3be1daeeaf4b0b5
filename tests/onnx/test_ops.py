"""The op table of optkit.onnx: lookup by opset, attributes, dtypes, static values, and the
operator versions ONNX's node cases do not reach (they use each operator's newest version).

Single-node models are checked against ``onnx.reference.ReferenceEvaluator``,
compiled and not.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.defs  # noqa: E402
import onnx.reference  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._base import values as _values  # noqa: E402
from optkit.onnx._base.errors import ValueDependentError  # noqa: E402
from optkit.onnx._load import protos as _protos  # noqa: E402
from optkit.onnx._load.files import ORT_DEFAULT_DOMAIN_OPS  # noqa: E402
from optkit.onnx._ops import TABLE  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

JIT = [pytest.param(True, id="jit"), pytest.param(False, id="nojit")]


def _node_model(op, feeds, attrs=None, opset=17, n_outputs=1, initializers=()):
    """A one-node model whose inputs are ``feeds`` (name -> array) plus ``initializers``."""
    inputs = [_info(name, value.dtype, value.shape) for name, value in feeds.items()]
    inits = [onnx.numpy_helper.from_array(value, name) for name, value in initializers]
    names = list(feeds) + [name for name, _ in initializers]
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outputs, **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)  # types the outputs, as the checker requires


def _check_against_reference(model, feeds, jit, rtol=1e-6):
    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    got = optkit.onnx.prepare(model, jit=jit).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-7)


# ---------------------------------------------------------------------------
# the table


def test_every_row_is_an_onnx_operator_version():
    """Each (domain, op_type, since_version) row is a version ONNX defines, so lookup can tell
    an implemented version from a newer one."""
    rows = optkit.onnx.supported_ops()
    assert len(rows) > 150
    for domain, op, version in rows:
        if domain == "com.microsoft" or (domain == "" and op in ORT_DEFAULT_DOMAIN_OPS):
            # ONNX Runtime's contrib operators (tests/onnx/test_contrib.py runs each against ONNX Runtime):
            # ONNX has no schema for them, and ONNX Runtime's are all version 1.
            assert version == 1, (domain, op, version)
            continue
        schema = onnx.defs.get_schema(op, version, domain)
        assert schema.since_version == version, (domain, op, version)


def test_required_operators_are_in_the_table():
    ops = {op for _, op, _ in optkit.onnx.supported_ops()}
    required = """Add Sub Mul Div Neg Abs Pow Sqrt Exp Log Relu LeakyRelu Sigmoid Tanh Softmax LogSoftmax
        MatMul Gemm Conv MaxPool AveragePool GlobalAveragePool Flatten Reshape Transpose Concat Identity
        Constant ReduceSum ReduceMean ReduceMax Cast Gather Unsqueeze Squeeze SoftmaxCrossEntropyLoss
        NegativeLogLikelihoodLoss Adagrad Adam Momentum Gradient""".split()
    assert not set(required) - ops


@pytest.mark.parametrize("op, opset, version", [
    ("Softmax", 11, 11), ("Softmax", 12, 11), ("Softmax", 13, 13), ("Softmax", 21, 13),
    ("ReduceSum", 12, 11), ("ReduceSum", 13, 13), ("ReduceMean", 17, 13), ("ReduceMean", 18, 18),
    ("Add", 7, 7), ("Add", 13, 13), ("Add", 25, 14), ("Unsqueeze", 12, 11), ("Unsqueeze", 13, 13),
])
def test_lookup_picks_newest_version_not_above_opset(op, opset, version):
    assert TABLE.lookup("", op, opset)[1] == version
    assert TABLE.lookup("ai.onnx", op, opset)[1] == version


def test_lookup_refuses_a_newer_onnx_version_it_does_not_implement(monkeypatch):
    monkeypatch.setitem(TABLE._versions, ("", "Relu"), [6, 13])  # as if Relu-14 were not implemented
    assert TABLE.lookup("", "Relu", 13)[1] == 13
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"Relu \(domain 'ai.onnx', opset 14\) means Relu-14"):
        TABLE.lookup("", "Relu", 14)


def test_lookup_errors_name_type_domain_and_opset():
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"DFT \(domain 'ai.onnx', opset 13\)"):
        TABLE.lookup("", "DFT", 13)
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"Adam \(domain 'ai.onnx', opset 13\)"):
        TABLE.lookup("", "Adam", 13)
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"Softmax \(domain 'ai.onnx', opset 0\)"):
        TABLE.lookup("", "Softmax", 0)


def test_parse_attributes_fills_schema_defaults_and_decodes():
    node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], mode="nesterov", alpha=0.5,
                            beta=1.0, norm_coefficient=0.0, domain=_values.TRAINING_DOMAIN)
    schema = onnx.defs.get_schema("Momentum", 1, _values.TRAINING_DOMAIN)
    attrs = _protos.parse_attributes(node, schema, "here")
    assert attrs == {"mode": "nesterov", "alpha": 0.5, "beta": 1.0, "norm_coefficient": 0.0}
    node = helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["Y", "W"], domain=_values.TRAINING_DOMAIN)
    attrs = _protos.parse_attributes(node, onnx.defs.get_schema("Adagrad", 1, _values.TRAINING_DOMAIN), "here")
    assert attrs == {"decay_factor": 0.0, "epsilon": pytest.approx(1e-6), "norm_coefficient": 0.0}
    del node.attribute[:]
    node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=_values.TRAINING_DOMAIN)
    with pytest.raises(ValueError, match="here: the required attribute '.*' is missing"):
        _protos.parse_attributes(node, schema, "here")


@pytest.mark.parametrize("elem_type, dtype", [
    (TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64), (TensorProto.INT64, np.int64),
    (TensorProto.BOOL, np.bool_), (TensorProto.FLOAT16, np.float16), (TensorProto.UINT8, np.uint8),
    (TensorProto.BFLOAT16, jnp.bfloat16),
])
def test_onnx_dtype(elem_type, dtype):
    assert _values.onnx_dtype(elem_type, "x") == np.dtype(dtype)


@pytest.mark.parametrize("elem_type", [TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.COMPLEX128])
def test_onnx_dtype_refuses(elem_type):
    name = TensorProto.DataType.Name(elem_type)
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=f"x has element type {name}"):
        _values.onnx_dtype(elem_type, "x")


def test_cast_to_unsupported_type_fails_at_load():
    model = _node_model("Cast", {"x": np.zeros(2, np.float32)}, {"to": TensorProto.COMPLEX64})
    with pytest.raises(optkit.onnx.UnsupportedOpError, match="attribute 'to' has element type COMPLEX64"):
        optkit.onnx.prepare(model)


@pytest.mark.parametrize("elem_type", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT8E8M0,
                                       TensorProto.FLOAT4E2M1, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2,
                                       TensorProto.UINT2])
def test_low_bit_types_are_ml_dtypes_types(elem_type):
    assert _values.onnx_dtype(elem_type, "x") == helper.tensor_dtype_to_np_dtype(elem_type)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8e8m0_rounds_as_onnx_reference(round_mode, saturate):
    """Every exponent and the rounding boundaries around it: ONNX's reference bit manipulation."""
    x = np.concatenate([2.0 ** np.arange(-127, 128), 1.5 * 2.0 ** np.arange(-20, 20), [3.4e38, np.inf, np.nan, 0.0],
                        RNG.uniform(0, 100, 50)]).astype(np.float32)
    model = _node_model("Cast", {"x": x}, {"to": TensorProto.FLOAT8E8M0, "saturate": saturate,
                                            "round_mode": round_mode}, opset=25)
    got = optkit.onnx.prepare(model).run([x])[0]
    want = onnx.numpy_helper.to_float8e8m0(x, bool(saturate), round_mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


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
    model = _node_model(op, {"x": X345}, {} if axis is None else {"axis": axis}, opset=opset)
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
    _check_against_reference(_node_model(op, {"x": X345}, attrs, opset=opset), {"x": X345}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_squeeze_with_axes_attribute(jit):
    x = RNG.normal(size=(1, 3, 1)).astype(np.float32)
    _check_against_reference(_node_model("Squeeze", {"x": x}, {"axes": [-1]}, opset=11), {"x": x}, jit)
    _check_against_reference(_node_model("Squeeze", {"x": x}, opset=11), {"x": x}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_axes_input_from_initializer(jit):
    """Axes given as an input (opset 13/18) from an initializer are read at load time."""
    axes = ("axes", np.array([1], np.int64))
    for op, opset in [("ReduceSum", 13), ("ReduceMean", 18), ("ReduceMax", 18), ("Unsqueeze", 13)]:
        model = _node_model(op, {"x": X345}, opset=opset, initializers=[axes])
        _check_against_reference(model, {"x": X345}, jit)


@pytest.mark.parametrize("jit", JIT)
def test_gemm_with_every_attribute(jit):
    feeds = {"a": RNG.normal(size=(4, 3)).astype(np.float32), "b": RNG.normal(size=(5, 4)).astype(np.float32),
             "c": RNG.normal(size=(1, 5)).astype(np.float32)}
    attrs = {"transA": 1, "transB": 1, "alpha": 0.5, "beta": -2.0}
    for opset in (9, 11, 13):
        _check_against_reference(_node_model("Gemm", feeds, attrs, opset=opset), feeds, jit)


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
    model = _node_model("Conv", {"x": x, "w": w, "b": b}, attrs, opset=11)
    (got,) = optkit.onnx.prepare(model, jit=jit).run([x, w, b])
    np.testing.assert_allclose(got, _numpy_conv(x, w, b, [1, 2], [1, 0, 2, 1], [2, 1], 2), rtol=1e-5, atol=1e-5)
    # SAME_LOWER: output ceil(in / stride), the odd padding at the beginning.
    model = _node_model("Conv", {"x": x, "w": w, "b": b}, {"auto_pad": "SAME_LOWER", "strides": [2, 1], "group": 2})
    (got,) = optkit.onnx.prepare(model, jit=jit).run([x, w, b])
    np.testing.assert_allclose(got, _numpy_conv(x, w, b, [2, 1], [1, 1, 1, 0], [1, 1], 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", JIT)
def test_pools_at_opset_11(jit):
    x = RNG.normal(size=(1, 2, 6, 5)).astype(np.float32)
    for op, attrs in [("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
                      ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1,
                                       "ceil_mode": 1, "strides": [2, 2]}),
                      ("AveragePool", {"kernel_shape": [2, 2], "pads": [0, 1, 1, 0]})]:
        _check_against_reference(_node_model(op, {"x": x}, attrs, opset=11), {"x": x}, jit)


# ---------------------------------------------------------------------------
# static values: shapes and axes XLA needs before running


def _reshape_from_shape_model():
    """Y = Reshape(X, Concat(Gather(Shape(X), 0), [-1])): PyTorch-style shape arithmetic."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
        helper.make_node("Gather", ["s", "zero"], ["batch"]),
        helper.make_node("Constant", [], ["minus_one"], value_ints=[-1]),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", np.float32, ["N", 4, 5])], [_info("y", np.float32, ["N", 20])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("jit", JIT)
def test_shape_arithmetic_is_folded(jit):
    rep = optkit.onnx.prepare(_reshape_from_shape_model(), jit=jit)
    for n in (3, 2):
        x = RNG.normal(size=(n, 4, 5)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], x.reshape(n, 20))


def test_static_input_fed_at_run_time_compiles_per_value():
    """A Reshape shape that is a graph input becomes a compile-time constant, one compile per value."""
    x = np.arange(12, dtype=np.float32)
    model = _node_model("Reshape", {"x": x, "shape": np.array([3, 4], np.int64)})
    rep = optkit.onnx.prepare(model)
    for shape in ([3, 4], [2, -1], [3, 4]):
        np.testing.assert_array_equal(rep.run([x, np.array(shape, np.int64)])[0], x.reshape(shape))
    assert len(rep._functions) == 2


def test_traced_static_value_is_a_clear_error():
    graph = optkit.onnx.to_graph(_node_model("Reshape", {"x": np.zeros(4, np.float32),
                                                          "shape": np.array([2, 2], np.int64)}))
    fn = jax.jit(graph.as_function(["x", "shape"], "out0"))
    with jax.enable_x64(True), pytest.raises(ValueError, match="input 'shape' must be known before the graph runs"):
        fn(jnp.zeros(4, jnp.float32), jnp.array([2, 2]))


@pytest.mark.parametrize("jit", JIT)
def test_initializer_is_a_default_that_a_feed_overrides(jit):
    """ONNX IR: a graph input with an initializer of the same name may be left unfed."""
    x = np.array([1.0, 2.0], np.float32)
    model = _node_model("Add", {"x": x, "y": x}, initializers=[("y", np.array([10.0, 20.0], np.float32))])
    del model.graph.node[0].input[2:]  # Add(x, y); y has a default
    rep = optkit.onnx.prepare(model, jit=jit)
    np.testing.assert_array_equal(rep.run([x])[0], [11.0, 22.0])
    np.testing.assert_array_equal(rep.run([x, x])[0], [2.0, 4.0])


def test_run_node_and_named_outputs():
    node = helper.make_node("Sub", ["a", "b"], ["c"])
    a, b = np.array([3, 4], np.int64), np.array([1, 1], np.int64)
    out = optkit.onnx.run_node(node, [a, b])
    np.testing.assert_array_equal(out["c"], [2, 3])
    assert out[0].dtype == np.int64
    node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X2", "V2"], alpha=0.9, beta=1.0,
                            mode="standard", norm_coefficient=0.0, domain=_values.TRAINING_DOMAIN)
    ones = np.ones(2, np.float32)
    x2, v2 = optkit.onnx.Backend.run_node(node, [np.float32(0.1), np.int64(0), ones, ones, ones])
    np.testing.assert_allclose(x2, 1 - 0.1 * 1.9)


def test_device_support():
    assert optkit.onnx.Backend.supports_device("CPU")
    assert not optkit.onnx.Backend.supports_device("TPU")
    with pytest.raises(ValueError, match="device must be 'CPU' or 'CUDA"):
        optkit.onnx.prepare(_reshape_from_shape_model(), device="TPU")


def test_to_graph_returns_an_optkit_graph():
    graph = optkit.onnx.to_graph(_reshape_from_shape_model())
    assert isinstance(graph, optkit.Graph)
    assert graph.inputs == ("x",) and graph.outputs == ("y",)
    assert [node.name for node in graph.nodes][-1] == "Reshape#5"


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
    model = _node_model(op, feeds, attrs, opset=opset, n_outputs=outputs, initializers=inits)
    _check_against_reference(model, feeds, jit, rtol=1e-5)


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
    model = _node_model("ConvTranspose", {"x": x}, {"group": 2, "dilations": [2], "strides": [3], "pads": [1, 2]},
                        opset=17, initializers=[("w", w)])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": x})
    np.testing.assert_allclose(got, _numpy_conv_transpose_1d(x, w, 3, 2, (1, 2), 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", JIT)
def test_batch_normalization_9_and_negative_pads(jit):
    """BatchNormalization-9 with only Y is inference (onnx.reference uses the batch statistics there), and
    Pad's negative pads crop (NumPy's pad cannot express them)."""
    s, b, m, v = _f32(3), _f32(3), _f32(3), _f32(3, low="positive")
    model = _node_model("BatchNormalization", {"x": _IMG}, {"epsilon": 1e-3}, opset=9,
                        initializers=[("s", s), ("b", b), ("m", m), ("v", v)])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": _IMG})
    c = (slice(None), None, None)
    np.testing.assert_allclose(got, s[c] * (_IMG - m[c]) / np.sqrt(v[c] + 1e-3) + b[c], rtol=1e-5, atol=1e-6)
    model = _node_model("Pad", {"x": _X}, {"mode": "edge"}, opset=13,
                        initializers=[("p", _i64(1, 0, -1, 0, 1, 2))])
    (got,) = optkit.onnx.prepare(model, jit=jit).run({"x": _X})
    np.testing.assert_array_equal(got, np.pad(_X[:, :, 1:], [(1, 0), (0, 1), (0, 2)], mode="edge"))


def test_gather_nd_on_an_initializer_with_computed_indices_runs_compiled():
    """An initializer (a NumPy array) gathered by indices computed while running (a Whisper-style decoder's
    embedding lookup) used to reach JAX's indexed update as a NumPy array (no ``.at``)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("GatherND", ["table", "idx"], ["y"])], "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out = optkit.onnx.prepare(model).run([np.array([[3], [1]], np.int64)]).y
    np.testing.assert_array_equal(out, [[9, 10, 11], [3, 4, 5]])


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
    model = _node_model(op, {first: feeds[first]}, attrs, opset=opset,
                        initializers=[(name, feeds[name]) for name in static])
    for k, dim in enumerate(model.graph.output[0].type.tensor_type.shape.dim):
        dim.dim_param = f"d{k}"  # the node's own check, not the declared output's
    with pytest.raises(optkit.onnx.TensorTooLargeError, match=rf"node '{op}#0'"):
        optkit.onnx.prepare(model, jit=jit, max_tensor_bytes=2**30).run([feeds[first]])


def test_non_max_suppression_runs_compiled_around_it_and_op_by_op_and_is_refused_traced():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    model = _node_model("NonMaxSuppression", {"boxes": boxes, "scores": scores}, opset=11,
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


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "storage_order": 1},
    {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "storage_order": 1, "pads": [0, 1, 1, 0]},
])
def test_max_pool_indices_equal_onnx_runtime(attrs):
    """ONNX Runtime is the oracle: onnx.reference's indices are wrong with pads (negative) and storage_order=1."""
    onnxruntime = pytest.importorskip("onnxruntime")
    x = np.round(RNG.normal(size=(2, 3, 5, 6)), 1).astype(np.float32)  # rounded: ties inside windows
    model = _node_model("MaxPool", {"x": x}, attrs, opset=12, n_outputs=2)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    for jit in (True, False):
        got = optkit.onnx.prepare(model, jit=jit).run([x])
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int64


@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 2, 2, 2], "kernel_shape": [5, 5]}, 1),
    ({"dilations": [2, 2], "pads": [2, 1, 2, 1]}, 2),
])
def test_a_large_depthwise_convolution_equals_xla_grouped_convolution_with_its_gradients(attrs, multiplier):
    """Above 2**16 output elements on CPU a depthwise Conv is a sum of shifted slices (nn._depthwise): its value
    and its gradients equal XLA's grouped convolution in float64."""
    c, k = 16, attrs.get("kernel_shape", [3, 3])[0]
    x = RNG.normal(size=(2, c, 96, 96))
    w = RNG.normal(size=(c * multiplier, 1, k, k))
    model = _node_model("Conv", {"x": x, "w": w}, {"group": c, **attrs})
    rep = optkit.onnx.prepare(model)
    assert np.prod(rep.run([x, w])[0].shape) >= 2**16  # the shifted-slices path

    def xla(x, w):
        pads = attrs.get("pads", [0, 0, 0, 0])
        return jax.lax.conv_general_dilated(x, w, attrs.get("strides", [1, 1]),
                                            [(pads[0], pads[2]), (pads[1], pads[3])],
                                            rhs_dilation=attrs.get("dilations", [1, 1]), feature_group_count=c)

    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        np.testing.assert_allclose(rep.run([x, w])[0], np.asarray(xla(x, w)), rtol=1e-12, atol=1e-12)
        cot = RNG.normal(size=np.shape(xla(x, w)))
        got = jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1))(x, w)
        want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


def _depthwise_case(attrs, multiplier, c, size):
    """A float64 depthwise Conv node model of ``c`` channels on (2, c, size, size), its inputs and XLA's grouped
    convolution of the same attributes (the independent expectation)."""
    k = attrs.get("kernel_shape", [3, 3])[0]
    x = RNG.normal(size=(2, c, size, size))
    w = RNG.normal(size=(c * multiplier, 1, k, k))
    pads = attrs.get("pads", [0, 0, 0, 0])

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, attrs.get("strides", [1, 1]),
                                            [(pads[0], pads[2]), (pads[1], pads[3])],
                                            rhs_dilation=attrs.get("dilations", [1, 1]), feature_group_count=c)

    return x, w, _node_model("Conv", {"x": x, "w": w}, {"group": c, **attrs}), xla


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}, 1),
    ({"dilations": [2, 2], "pads": [2, 1, 2, 1]}, 2),
])
def test_a_large_depthwise_gradient_equals_the_analytic_one_in_both_modes(attrs, multiplier, channels_last,
                                                                          monkeypatch):
    """The shifted-slices depthwise Conv's own derivative (one variadic reduction over the taps for W, one
    convolution of the spread-out cotangent for X) gives XLA's grouped convolution's gradients in float64, in
    both layouts, jitted and not; forward mode (``jax.jvp``) gives its tangent."""
    from optkit.onnx._plans import layout as _layout

    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    x, w, model, xla = _depthwise_case(attrs, multiplier, 16, 96)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))
        assert np.prod(cot.shape) >= 2**16  # a large output, where speed matters
        for jit in (True, False):
            grad = jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1))
            got = (jax.jit(grad) if jit else grad)(x, w)
            want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
            for g, h in zip(got, want):
                np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(fn(params, x, w)), np.asarray(xla(x, w)), rtol=1e-12, atol=1e-12)
        _, tangent = jax.jvp(lambda w: fn(params, x, w), (w,), (w,))
        np.testing.assert_allclose(np.asarray(tangent), np.asarray(xla(x, w)), rtol=1e-10, atol=1e-10)  # linear in w


@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}, 2),
])
def test_a_small_depthwise_convolution_differentiates_as_xlas_grouped_one_in_every_mode(attrs, multiplier):
    """``to_jax``'s depthwise Conv (shifted slices and their compact derivative) at a small size: gradients, forward
    mode, the Hessian and ``jax.vmap`` of the gradient over the weights or over the input equal XLA's grouped
    convolution's in float64."""
    x, w, model, xla = _depthwise_case(attrs, multiplier, 4, 9)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))

        def derivatives(f):
            loss = functools.partial(lambda f, x, w: jnp.sum(f(x, w) ** 3 * cot), f)
            return (jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w), jax.jvp(lambda w: f(x, w), (w,), (w,))[1],
                    jax.hessian(lambda w: loss(x, w))(w),
                    jax.vmap(jax.grad(loss, argnums=1), (None, 0))(x, jnp.stack([w, 2 * w])),
                    jax.vmap(jax.grad(loss, argnums=(0, 1)), (0, None))(jnp.stack([x, 2 * x]), w))

        got, want = derivatives(lambda x, w: fn(params, x, w)), derivatives(xla)
    for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
def test_the_depthwise_gradient_is_one_reduction_and_one_convolution_not_one_per_tap(channels_last, monkeypatch):
    """The reverse-mode gradient of a 5x5 depthwise Conv is built from the compact gradients (the weight's as one
    variadic reduction over the taps, the input's as one convolution of the spread-out cotangent), not JAX's own
    derivative of the 25 taps (25 reductions, which XLA:CPU compiles slowly
    and runs one after another): counted in the lowered program, with the gradients equal to XLA's grouped
    convolution's in float64."""
    from optkit.onnx._plans import layout as _layout

    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    attrs = {"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}
    x, w, model, xla = _depthwise_case(attrs, 2, 4, 11)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))
        grad = jax.jit(jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1)))
        text = grad.lower(x, w).as_text()
        # pads that grow an array (the taps' transposes read back as negative pads, which XLA makes slices): X's
        # own padding, and the cotangent's spread and border; JAX's own derivative pads once per tap
        growing = [line for line in text.splitlines() if "stablehlo.pad" in line and "-" not in line.split("low")[1]]
        assert len(growing) <= 3 and text.count("stablehlo.reduce") <= 2, (len(growing), text.count("stablehlo.reduce"))
        got = grad(x, w)
        want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


def test_reverse_over_reverse_through_the_depthwise_gradient():
    """``jax.grad`` of ``jax.grad`` through the depthwise Conv's own derivative (JAX differentiates its variadic
    reduction) equals XLA's grouped convolution's, in float64; so does the gradient through ``OnnxModule`` in
    ``nnx``."""
    from flax import nnx

    x = RNG.normal(size=(4, 8, 96, 96))
    w = RNG.normal(size=(8, 1, 3, 3))
    model = _node_model("Conv", {"x": x}, {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]},
                        initializers=[("w", w)])

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)], feature_group_count=8)

    with jax.enable_x64(True):
        fn, params = optkit.onnx.to_jax(model)
        assert np.prod(np.shape(fn(params, x))) >= 2**16  # a large output
        inner = jax.grad(lambda p: jnp.sum(jnp.tanh(fn(p, x)) ** 2))
        got = jax.grad(lambda p: jnp.sum(inner(p)["w"] ** 2))(params)["w"]
        inner_xla = jax.grad(lambda w: jnp.sum(jnp.tanh(xla(x, w)) ** 2))
        want = jax.grad(lambda w: jnp.sum(inner_xla(w) ** 2))(w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
        module = optkit.onnx.OnnxModule(model)
        got = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(module)["params"]["w"][...]
        want = jax.grad(lambda w: jnp.mean(xla(x, w) ** 2))(w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


@pytest.mark.xla_structure
def test_convolutions_compile_to_xlas_own_kernel_on_cpu_unless_a_grouped_one_is_differentiated():
    """On CPU a model's graph is compiled with YNNPACK's convolutions off (XLA's own are faster here,
    benchmarks/RESULTS.md), except where a grouped convolution may be differentiated (a training graph, or
    to_jax's function), where YNNPACK's are 4x faster; the values are the same either way."""
    from optkit.onnx._backend import _option_accepted

    if jax.default_backend() != "cpu" or not _option_accepted():
        pytest.skip("XLA:CPU's YNNPACK option is not in this jaxlib")
    eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
    x = RNG.normal(size=(2, 32, 32, 32)).astype(np.float32)  # large enough for YNNPACK by default
    w = RNG.normal(size=(32, 32, 3, 3)).astype(np.float32)
    plain = _node_model("Conv", {"x": x, "w": w}, {"pads": [1] * 4})
    grouped = _node_model("Conv", {"x": x}, {"group": 32, "pads": [1] * 4},
                          initializers=[("w", RNG.normal(size=(32, 1, 3, 3)).astype(np.float32))])
    training = optkit.onnx.make_training_model(grouped, loss="mean_squared_error")
    assert optkit.onnx.prepare(plain)._options == eigen
    assert optkit.onnx.prepare(grouped)._options == eigen  # inference only
    assert optkit.onnx.prepare(training)._options is None

    rep = optkit.onnx.prepare(plain)
    got = rep.run([x, w])[0]
    (compiled,) = rep._functions.values()
    with jax.enable_x64(True):
        text = compiled.jitted.lower(x, w).compile().as_text()
    assert "__ynn_fusion" not in text and " convolution(" in text
    default = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)]))
    assert "__ynn_fusion" in default.lower(x, w).compile().as_text()  # what the option changes
    np.testing.assert_allclose(got, np.asarray(default(x, w)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_float16_softmax_is_computed_in_float32_and_rounded_once_as_onnx_runtime_does(op):
    """Over 4096 float16 values a row, ONNX Runtime's kernel (float32 inside) and optkit give the same float16
    results, within one float16 step of the float64 formula."""
    ort = pytest.importorskip("onnxruntime")
    x = (np.random.default_rng(0).normal(size=(8, 4096)) * 2 + 0.5).astype(np.float16)
    node = helper.make_node(op, ["x"], ["y"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = optkit.onnx.prepare(model).run([x])
    assert got.dtype == np.float16
    wide = x.astype(np.float64)
    exact = wide - wide.max(1, keepdims=True) - np.log(np.exp(wide - wide.max(1, keepdims=True)).sum(1, keepdims=True))
    exact = np.exp(exact) if op == "Softmax" else exact
    mismatched = np.mean(got != want)
    assert mismatched < 0.001, mismatched  # the same float16 values (float16 arithmetic: 20-48% differ)
    assert np.abs(got.astype(np.float64) - exact).max() <= np.spacing(np.abs(exact).max().astype(np.float16))


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("jit", [True, False])
def test_tfidf_vectorizer_matches_onnx_runtime_in_every_mode(mode, jit):
    """ONNX's node cases cover TF without weights; here IDF and TFIDF with weights, 1- to 3-grams with skips,
    int64 and int32 token ids, against ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    # unigrams 4 7 9; bigrams (4 7) (7 9) (1 4); the trigram (4 7 9); each to its own output column
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2, ngram_counts=[0, 3, 9],
                 pool_int64s=[4, 7, 9, 4, 7, 7, 9, 1, 4, 4, 7, 9], ngram_indexes=[5, 0, 1, 2, 3, 4, 6],
                 weights=[0.5, 2.0, 1.5, 0.25, 3.0, 1.0, 0.75])
    rng = np.random.default_rng(9)
    for dtype, shape in ((np.int64, (2, 17)), (np.int32, (23,))):
        x = rng.choice([1, 4, 7, 9, 11], size=shape).astype(dtype)
        model = helper.make_model(helper.make_graph(
            [helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], "g", [_info("x", dtype, list(shape))],
            [_info("y", np.float32, [*shape[:-1], 7])]), opset_imports=[helper.make_opsetid("", 17)])
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = optkit.onnx.prepare(model, jit=jit).run([x])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        assert want[0].shape[-1] == 7 and np.any(want[0])


def test_stft_of_a_2d_real_signal_matches_onnx_runtime():
    """torch's TorchScript export of torch.stft feeds STFT a (batch, length) signal, which ONNX Runtime runs as
    (batch, length, 1); so does optkit."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import numpy_helper

    x = np.random.default_rng(0).normal(size=(2, 32)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(4, np.int64), "step"),
             numpy_helper.from_array(np.hanning(8).astype(np.float32), "win")]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("STFT", ["x", "step", "win"], ["y"], onesided=1)], "g", [_info("x", np.float32, [2, 32])],
        [_info("y", np.float32, [2, 7, 5, 2])], initializer=inits), opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for jit in (True, False):
        np.testing.assert_allclose(optkit.onnx.prepare(model, jit=jit).run([x])[0], want, rtol=1e-5, atol=1e-5)


def _deform_conv_float64(x, w, offset, b, mask, kernel_shape, strides, dilations, pads, group, offset_group):
    """ONNX's DeformConv written out loop by loop in float64: each tap sampled bilinearly (0 outside the image)."""
    n, c, h, wd = x.shape
    oc, kh, kw = w.shape[0], *kernel_shape
    oh, ow = offset.shape[2:]
    off = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
    msk = mask.reshape(n, offset_group, kh, kw, oh, ow)

    def sample(img, y, xx):
        y0, x0, total = np.floor(y), np.floor(xx), 0.0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xc, wx in ((x0, 1 - (xx - x0)), (x0 + 1, xx - x0)):
                if 0 <= yy <= h - 1 and 0 <= xc <= wd - 1:
                    total += img[int(yy), int(xc)] * wy * wx
        return total

    out = np.zeros((n, oc, oh, ow)) + b[None, :, None, None]
    per_group, per_offset = c // group, c // offset_group
    for bi, o, i, j in np.ndindex(n, oc, oh, ow):
        g = o // (oc // group)
        for ci in range(g * per_group, (g + 1) * per_group):
            q = ci // per_offset
            for a, e in np.ndindex(kh, kw):
                y = i * strides[0] - pads[0] + a * dilations[0] + off[bi, q, a, e, 0, i, j]
                xx = j * strides[1] - pads[1] + e * dilations[1] + off[bi, q, a, e, 1, i, j]
                out[bi, o, i, j] += w[o, ci - g * per_group, a, e] * msk[bi, q, a, e, i, j] * sample(x[bi, ci], y, xx)
    return out


@pytest.mark.parametrize("jit", [True, False])
def test_deform_conv_matches_the_float64_formula_and_differentiates(jit):
    """DeformConv with groups, offset groups, strides, dilations, asymmetric pads, a mask and a bias against its
    formula in float64 loop by loop (and ONNX's reference evaluator, within its float32 sampling), and its gradients
    in X, W, offset and mask against float64 central differences."""
    from tests.onnx.helpers import assert_gradients_match_central_differences

    rng = np.random.default_rng(5)
    n, c, oc, h, w, group, og = 2, 4, 6, 7, 6, 2, 2
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1], group=group,
                 offset_group=og)
    oh, ow = (h + 3 - 2 - 1) // 2 + 1, (w + 1 - 2 - 1) // 1 + 1
    feeds = {"x": rng.normal(size=(n, c, h, w)), "w": rng.normal(size=(oc, c // group, 3, 2)),
             "offset": 1.5 * rng.normal(size=(n, og * 6 * 2, oh, ow)), "b": rng.normal(size=oc),
             "mask": rng.uniform(size=(n, og * 6, oh, ow))}
    node = helper.make_node("DeformConv", list(feeds), ["y"], **attrs)
    model = helper.make_model(helper.make_graph([node], "g", [_info(k, np.float64, v.shape) for k, v in feeds.items()],
                                                [_info("y", np.float64, [n, oc, oh, ow])]),
                              opset_imports=[helper.make_opsetid("", 22)])
    want = _deform_conv_float64(**feeds, **attrs)
    # ONNX's reference evaluator samples through its GridSample, which rounds to float32 (3e-7 off the float64 formula)
    np.testing.assert_allclose(onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    with jax.enable_x64(True):
        np.testing.assert_allclose(optkit.onnx.prepare(model, jit=jit).run(feeds)[0], want, rtol=1e-12, atol=1e-12)
        if jit:
            apply_fn, _ = optkit.onnx.to_jax(model, trainable=())
            args = {k: jnp.asarray(v) for k, v in feeds.items()}
            assert_gradients_match_central_differences(lambda *v: apply_fn({}, *v), args, ["x", "w", "offset", "mask"])


def _image_model(pixel_format="RGB", then=()):
    nodes = [helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=pixel_format), *then]
    outputs = [_info("image", np.uint8, ["h", "w", "c"])] + [_info(n.output[0], np.float32, []) for n in then[-1:]]
    return helper.make_model(helper.make_graph(nodes, "g", [_info("data", np.uint8, ["n"])], outputs),
                             opset_imports=[helper.make_opsetid("", 20)])


def _png(pixels):
    import io

    import PIL.Image

    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="PNG")
    return np.frombuffer(out.getvalue(), np.uint8)


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder_gives_the_pixels_and_feeds_a_compiled_graph(pixel_format):
    """A PNG of known pixels decoded (the pixels back, in each format; grayscale by ITU-R 601-2 luma, as Pillow and
    ONNX's reference do), then cast and averaged in the compiled part; one compile per image."""
    pytest.importorskip("PIL")
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    then = [helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["f"], ["mean"], keepdims=0)]
    rep = optkit.onnx.prepare(_image_model(pixel_format, then))
    image, mean = rep.run([_png(pixels)])
    want = {"RGB": pixels, "BGR": pixels[:, :, ::-1],
            "Grayscale": ((pixels.astype(np.int64) @ [19595, 38470, 7471] + 32768) >> 16).astype(np.uint8)[..., None]}
    np.testing.assert_array_equal(image, want[pixel_format])
    np.testing.assert_allclose(mean, want[pixel_format].mean(), rtol=1e-6)
    rep.run([_png(pixels[:3])])
    assert len(rep._functions) == 2


def test_image_decoder_refuses_bad_bytes_and_oversized_images_by_name():
    pytest.importorskip("PIL")
    with pytest.raises(ValueError, match=r"ImageDecoder.*cannot decode the image \(4 bytes\)"):
        optkit.onnx.prepare(_image_model()).run([np.array([1, 2, 3, 4], np.uint8)])
    big = _png(np.zeros((300, 400, 3), np.uint8))
    with pytest.raises(optkit.onnx.TensorTooLargeError, match="the decoded image"):
        optkit.onnx.prepare(_image_model(), max_tensor_bytes=100_000).run([big])


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
    _check_against_reference(model, {"x": x}, jit)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_flex_attention_with_a_score_mod_reading_the_outer_graph_is_the_formula_and_differentiates(jit):
    """``FlexAttention`` (``ai.onnx.preview`` 1): grouped-query heads, a ``score_mod`` adding a bias that the outer
    graph feeds (a captured value) and a ``prob_mod`` scaling, in float64: NumPy's formula, and ``jax.grad`` through
    ``to_jax`` equals central differences."""
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(1, 4, 3, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 5, 6))
    bias = rng.normal(size=(3, 5))
    f64 = TensorProto.DOUBLE
    score_mod = helper.make_graph([helper.make_node("Add", ["s", "bias"], ["t"])], "score_mod",
                                  [helper.make_tensor_value_info("s", f64, None)],
                                  [helper.make_tensor_value_info("t", f64, None)])
    prob_mod = helper.make_graph([helper.make_node("Mul", ["p", "half"], ["r"])], "prob_mod",
                                 [helper.make_tensor_value_info("p", f64, None)],
                                 [helper.make_tensor_value_info("r", f64, None)],
                                 [onnx.numpy_helper.from_array(np.array(0.5), "half")])
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", scale=0.3,
                            score_mod=score_mod, prob_mod=prob_mod)
    graph = helper.make_graph([node], "g", [_info(n, np.float64, a.shape) for n, a in
                                            (("Q", q), ("K", k), ("V", v), ("bias", bias))],
                              [_info("Y", np.float64, (1, 4, 3, 6))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26),
                                                    helper.make_opsetid("ai.onnx.preview", 1)])
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    scores = (q * np.sqrt(np.float32(0.3))) @ np.swapaxes(kk * np.sqrt(np.float32(0.3)), -1, -2) + bias
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want = 0.5 * e / e.sum(-1, keepdims=True) @ vv
    got = optkit.onnx.prepare(model, jit=jit).run([q, k, v, bias])[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    fn, params = optkit.onnx.to_jax(model)
    cot = rng.normal(size=want.shape)

    def loss(q, bias):
        return jnp.sum(fn(params, q, k, v, bias) * cot)

    grads = (jax.jit(jax.grad(loss, (0, 1))) if jit else jax.grad(loss, (0, 1)))(q, bias)
    for i, (arg, g) in enumerate(zip((q, bias), grads)):
        d = rng.normal(size=arg.shape) * 1e-6
        plus = [q, bias]
        minus = [q, bias]
        plus[i], minus[i] = arg + d, arg - d
        np.testing.assert_allclose(float(jnp.sum(g * d)), (float(loss(*plus)) - float(loss(*minus))) / 2,
                                   rtol=1e-6, atol=1e-12)
