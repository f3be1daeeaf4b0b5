"""``checks=True``: out-of-range gather and scatter indices raise naming the node, as ONNX Runtime raises;
in-range indices give ONNX Runtime's values; the default keeps NaN for floats (never another element)."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import checkify  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402

DATA = np.arange(20, dtype=np.float32).reshape(5, 4)
CASES = {  # op: (extra inputs, attributes, indices in range, indices out of range, output shape)
    "Gather": ([], {"axis": 0}, np.array([[0, 4], [-5, 1]]), np.array([[0, 5], [1, 1]]), [2, 2, 4]),
    "GatherElements": ([], {"axis": 1}, np.array([[0, 3], [-1, 2]]), np.array([[0, 4], [1, 2]]), [2, 2]),
    "GatherND": ([], {}, np.array([[4, 3], [0, -4]]), np.array([[4, 3], [-6, 0]]), [2]),
    "ScatterElements": (["updates"], {"axis": 0}, np.array([[4, 0, 1, 2]]), np.array([[0, 0, 7, 0]]), [5, 4]),
    "ScatterND": (["updates"], {}, np.array([[1], [-1]]), np.array([[1], [5]]), [5, 4]),
}


def _model(op):
    extra, attrs, good, _, out_shape = CASES[op]
    inputs = ["data", "indices", *extra]
    graph_inputs = [helper.make_tensor_value_info("indices", TensorProto.INT64, list(good.shape))]
    inits = [numpy_helper.from_array(DATA, "data")]
    if extra:
        shape = list(good.shape) if op == "ScatterElements" else [good.shape[0], 4]
        inits.append(numpy_helper.from_array(np.full(shape, -1.0, np.float32), "updates"))
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], name=f"my_{op}", **attrs)], "g", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.x64
@pytest.mark.parametrize("op", sorted(CASES))
def test_out_of_range_indices_raise_naming_the_node_as_onnx_runtime_raises(op):
    model = _model(op)
    _, _, good, bad, _ = CASES[op]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"indices": good})
    for jit in (True, False):
        rep = optkit.onnx.prepare(model, checks=True, jit=jit)
        np.testing.assert_array_equal(rep.run([good])[0], want)
        with pytest.raises(ValueError, match=rf"node 'my_{op}' .* an index is out of range"):
            rep.run([bad])
    with pytest.raises(Exception, match="(?i)out of range|out of bounds|must be within|invalid ind"):  # ORT too
        session.run(None, {"indices": bad})
    if op.startswith("Gather"):  # the default: no check, the missing element is NaN, never another element
        got = optkit.onnx.prepare(model).run([bad])[0]
        assert np.isnan(got).any() and set(got[~np.isnan(got)].ravel()) <= set(DATA.ravel())


def test_to_jax_checks_eagerly_and_under_a_callers_checkify():
    model = _model("Gather")
    _, _, good, bad, _ = CASES["Gather"]
    apply_fn, params = optkit.onnx.to_jax(model, checks=True)
    np.testing.assert_array_equal(apply_fn(params, good), DATA[np.where(good < 0, good + 5, good)])
    with pytest.raises(ValueError, match="node 'my_Gather'"):
        apply_fn(params, bad)

    gathered, _ = optkit.onnx.to_jax(model, checks=True, trainable=["data"])

    def loss(x, ids):  # a gradient through the checked gather, inside the caller's jit and checkify
        return jnp.sum(gathered({"data": x}, ids))

    checked = jax.jit(checkify.checkify(jax.grad(loss), errors=checkify.user_checks))
    err, grad = checked(jnp.asarray(DATA), jnp.asarray(good.astype(np.int32)))
    err.throw()
    want = np.zeros_like(DATA)
    np.add.at(want, np.where(good < 0, good + 5, good).ravel(), 1.0)
    np.testing.assert_array_equal(grad, want)
    err, _ = checked(jnp.asarray(DATA), jnp.asarray(bad.astype(np.int32)))
    with pytest.raises(ValueError, match="node 'my_Gather'"):
        err.throw()
    with pytest.raises(ValueError, match="checkify"):  # inside a jit without checkify: JAX says what to do
        jax.jit(lambda ids: apply_fn(params, ids))(bad)
