"""scikit-learn models as skl2onnx converts them (``ai.onnx.ml`` operators; tests/onnx/models/make_sklearn.py) give
ONNX Runtime's labels and scores, jitted and not, and the linear models' outputs differentiate to their
coefficients."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import onnxruntime  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

SKLEARN = ONNX_TESTS / "models" / "sklearn"
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


def _tree_ensemble_v5(aggregate, post):
    """ONNX's own set-membership ``TreeEnsemble`` (ai.onnx.ml 5) node case with ``aggregate_function`` and
    ``post_transform`` set."""
    import onnx.backend.test.loader as loader
    from onnx import helper

    name = "test_ai_onnx_ml_tree_ensemble_set_membership"
    (case,) = [c for c in loader.load_model_tests(kind="node") if c.name == name]
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name not in ("aggregate_function", "post_transform")]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("aggregate_function", aggregate),
                           helper.make_attribute("post_transform", post)])
    return model


# ONNX Runtime numbers post_transform as its own enum (1 LOGISTIC, 2 SOFTMAX); the operator page says 1 SOFTMAX,
# 2 LOGISTIC, which optkit follows: ONNX Runtime's value for the other number is optkit's.
_ORT_POST = {0: 0, 1: 2, 2: 1, 3: 3, 4: 4}


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3], ids=["average", "sum", "min", "max"])
@pytest.mark.parametrize("post", [0, 1, 2], ids=["none", "softmax", "logistic"])
def test_tree_ensemble_5_gives_onnx_runtimes_scores(aggregate, post, jit):
    """Version 5's ``TreeEnsemble`` (set membership splits, leaves indexed apart, a NaN feature) against ONNX
    Runtime, for every aggregate function and the post transforms (numbered as the operator page numbers them)."""
    # members of the two sets ({1.2, 3.7, 8, 9}, {12, 7}), a missing value, a value in neither, above the split
    x = np.array([[1.2], [8.0], [12.0], [np.nan], [5.0], [20.0]], np.float32)
    model = _tree_ensemble_v5(aggregate, post)
    want = onnxruntime.InferenceSession(_tree_ensemble_v5(aggregate, _ORT_POST[post]).SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    got = optkit.onnx.prepare(model, jit=jit).run({"X": x})[0]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
