"""scikit-learn models converted by skl2onnx, for tests/onnx/files/test_ml.py.

Linear models, scalers, normalizers, an imputer and a binarizer, random forests, gradient boosting and a decision
tree, fitted on data sets that scikit-learn ships (iris, diabetes, breast cancer; a copy of iris with missing
values for the imputer), converted by ``skl2onnx.to_onnx`` (opset 17, ``ai.onnx.ml`` 3; classifiers with
``zipmap=False``, so their probabilities are a tensor). ``sklearn/<name>.onnx``; ``<name>.npz`` holds the input
and ONNX Runtime's outputs (``output:<name>``) and scikit-learn's own predictions (``sklearn``); ``versions.json``
the versions. skl2onnx is not one of optkit's dependencies (``pip install skl2onnx``)::

    python tests/onnx/models/make_sklearn.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "sklearn"


def models():
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Binarizer, MinMaxScaler, Normalizer, StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    iris, iris_y = load_iris(return_X_y=True)
    diabetes, diabetes_y = load_diabetes(return_X_y=True)
    cancer, cancer_y = load_breast_cancer(return_X_y=True)
    missing = iris.copy()
    missing[::7, 1] = np.nan
    return {
        "scaler_logistic": (make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)), iris, iris_y),
        "logistic_binary": (LogisticRegression(max_iter=3000), cancer, cancer_y),
        "linear": (LinearRegression(), diabetes, diabetes_y),
        "minmax_l2_ridge": (make_pipeline(MinMaxScaler(), Normalizer(), Ridge()), diabetes, diabetes_y),
        "l1_ridge": (make_pipeline(Normalizer("l1"), Ridge()), diabetes, diabetes_y),
        "max_ridge": (make_pipeline(Normalizer("max"), Ridge()), np.abs(diabetes), diabetes_y),
        "impute_binarize_logistic": (make_pipeline(SimpleImputer(), Binarizer(threshold=3.0), LogisticRegression()),
                                     missing, iris_y),
        "forest": (RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0), iris, iris_y),
        "forest_binary": (RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0), cancer, cancer_y),
        "forest_regressor": (RandomForestRegressor(n_estimators=4, max_depth=3, random_state=0), diabetes, diabetes_y),
        "boosting_regressor": (GradientBoostingRegressor(n_estimators=5, max_depth=3, random_state=0), diabetes,
                               diabetes_y),
        "boosting": (GradientBoostingClassifier(n_estimators=5, max_depth=3, random_state=0), iris, iris_y),
        "boosting_binary": (GradientBoostingClassifier(n_estimators=5, max_depth=3, random_state=0), cancer,
                            cancer_y),
        "tree": (DecisionTreeClassifier(max_depth=5, random_state=0), iris, iris_y),
    }


def main() -> None:
    import onnx
    import onnxruntime
    import skl2onnx
    import sklearn
    from skl2onnx import to_onnx

    OUT.mkdir(exist_ok=True)
    made = {}
    for name, (model, x, y) in models().items():
        x = x.astype(np.float32)
        model.fit(x, y)
        options = {id(model): {"zipmap": False}} if hasattr(model, "predict_proba") else None
        converted = to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        onnx.save(converted, str(OUT / f"{name}.onnx"))
        session = onnxruntime.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs = session.run(None, {converted.graph.input[0].name: x})
        np.savez(OUT / f"{name}.npz", input=x, sklearn=model.predict(x),
                 **{f"output:{o.name}": v for o, v in zip(converted.graph.output, outputs)})
        made[name] = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in converted.graph.node})
    (OUT / "versions.json").write_text(json.dumps(
        {"skl2onnx": skl2onnx.__version__, "scikit-learn": sklearn.__version__, "onnxruntime": onnxruntime.__version__,
         "onnx": onnx.__version__, "models": made}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(made, indent=1))


if __name__ == "__main__":
    main()
