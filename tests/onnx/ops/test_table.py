"""The op table of optkit.onnx (optkit/onnx/_ops/_registry.py): every row an ONNX operator version, lookup by
opset, attributes with the schema's defaults, element types and casts.
"""


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
from optkit.onnx._load import protos as _protos  # noqa: E402
from optkit.onnx._load.files import ORT_DEFAULT_DOMAIN_OPS  # noqa: E402
from optkit.onnx._ops import TABLE  # noqa: E402
from tests.onnx.helpers import node_model  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(0)



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
    model = node_model("Cast", {"x": np.zeros(2, np.float32)}, {"to": TensorProto.COMPLEX64})
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
    model = node_model("Cast", {"x": x}, {"to": TensorProto.FLOAT8E8M0, "saturate": saturate,
                                            "round_mode": round_mode}, opset=25)
    got = optkit.onnx.prepare(model).run([x])[0]
    want = onnx.numpy_helper.to_float8e8m0(x, bool(saturate), round_mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
