"""scikit-learn models as skl2onnx converts them (``ai.onnx.ml`` operators; tests/onnx/models/make_sklearn.py) give
ONNX Runtime's labels and scores, jitted and not, and the linear models' outputs differentiate to their
coefficients."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402

import optkit.onnx  # noqa: E402

SKLEARN = pathlib.Path(__file__).parent / "models" / "sklearn"
NAMES = sorted(p.stem for p in SKLEARN.glob("*.onnx"))


def test_the_fixtures_cover_the_families_skl2onnx_writes():
    ops = {n.op_type for name in NAMES for n in onnx.load(str(SKLEARN / f"{name}.onnx")).graph.node
           if n.domain == "ai.onnx.ml"}
    assert {"LinearClassifier", "LinearRegressor", "Scaler", "Normalizer", "Binarizer", "Imputer",
            "TreeEnsembleClassifier", "TreeEnsembleRegressor"} <= ops, ops


# Op by op too for one model of each kind: each case compiles its own program.
CASES = [(name, True) for name in NAMES] + [(name, False) for name in ("scaler_logistic", "forest", "linear")]


@pytest.mark.parametrize("name, jit", CASES)
def test_a_skl2onnx_model_gives_onnx_runtimes_labels_and_scores(name, jit):
    model = onnx.load(str(SKLEARN / f"{name}.onnx"))
    data = np.load(SKLEARN / f"{name}.npz")
    got = optkit.onnx.prepare(model, jit=jit).run([data["input"]])
    for output, value in zip(model.graph.output, got):
        want = data[f"output:{output.name}"]
        if np.issubdtype(want.dtype, np.integer):  # labels: exactly (int32 while JAX's 64-bit mode is off)
            np.testing.assert_array_equal(value, want, err_msg=output.name)
        else:
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=output.name)
    if np.issubdtype(data["sklearn"].dtype, np.integer):  # and scikit-learn's own predictions
        np.testing.assert_array_equal(got[0], data["sklearn"])


def test_a_linear_regressors_output_differentiates_to_its_coefficients():
    model = onnx.load(str(SKLEARN / "linear.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "LinearRegressor")
    coefficients = np.asarray(next(a.floats for a in node.attribute if a.name == "coefficients"))
    apply_fn, params = optkit.onnx.to_jax(model)
    x = jnp.asarray(np.load(SKLEARN / "linear.npz")["input"][:3])
    grad = jax.grad(lambda v: jnp.sum(apply_fn(params, v)))(x)
    np.testing.assert_allclose(grad, np.broadcast_to(coefficients, x.shape), rtol=1e-6)


def test_string_labels_and_zipmap_are_refused_by_name():
    from onnx import TensorProto, helper

    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            coefficients=[1.0, 2.0, -1.0, 0.5], intercepts=[0.0, 1.0], classlabels_strings=["a", "b"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("label", TensorProto.STRING, [1]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    with pytest.raises(optkit.onnx.UnsupportedOpError, match="classlabels_strings"):
        optkit.onnx.prepare(model).run([np.ones((1, 2), np.float32)])
