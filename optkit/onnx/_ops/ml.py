"""ONNX's ``ai.onnx.ml`` operators that skl2onnx writes for scikit-learn models: ``LinearRegressor``,
``LinearClassifier``, ``Scaler``, ``Normalizer``, ``Binarizer``, ``Imputer``, ``ArrayFeatureExtractor``,
``TreeEnsembleRegressor`` and ``TreeEnsembleClassifier`` (versions 1 and 3), ``TreeEnsemble`` (version 5, the
trees as arrays in :mod:`optkit.onnx._ops._trees`), ``LabelEncoder`` (versions 2 and 4; string keys or values on
the host, :mod:`optkit.onnx._ops.text`).

Formulas from the ``ai.onnx.ml`` operator pages, their details (binary classifiers' two scores, the post
transforms, a missing value's branch) as ONNX Runtime's CPU kernels compute them, each checked against ONNX
Runtime on skl2onnx's conversions of models trained on scikit-learn's data sets (tests/onnx/files/test_ml.py).
Class labels are integers (``classlabels_ints``); string labels, and ``ZipMap``'s sequence of maps, are not
run (skl2onnx writes tensors instead with ``options={id(model): {"zipmap": False}}`` and integer targets). The
float coefficients are attributes, constants of the graph; the outputs are differentiable in the inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.errors import RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._base.values import STRING, is_string
from optkit.onnx._ops._common import take
from optkit.onnx._ops._registry import Family
from optkit.onnx._ops._trees import Trees

OPS = Family("ml", "ai.onnx.ml")


def _floats(ctx, name, default=None):
    value = ctx.attrs.get(name, default)
    return None if value is None else np.asarray(value, np.float64)


def _transform(ctx, name, kind=None):
    """The ``post_transform`` attribute (or ``kind``) as a function of the scores (N, E)."""
    kind = kind or ctx.attrs.get("post_transform", "NONE")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "NONE":
        return lambda s: s
    if kind == "LOGISTIC":
        return jax.nn.sigmoid
    if kind == "SOFTMAX":
        return lambda s: jax.nn.softmax(s, axis=-1)
    if kind == "SOFTMAX_ZERO":  # the zeros of a row stay 0, the rest as a softmax of the non-zero scores
        def softmax_zero(s):
            top = jnp.max(jnp.where(s != 0, s, -jnp.inf), axis=-1, keepdims=True)
            e = jnp.where(s != 0, jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0)), 0)
            total = jnp.sum(e, axis=-1, keepdims=True)
            return e / jnp.where(total == 0, 1, total)
        return softmax_zero
    if kind == "PROBIT":
        return lambda s: jnp.sqrt(2.0).astype(s.dtype) * jax.scipy.special.erfinv(2 * s - 1)
    raise ctx.unsupported(f"{name}'s post_transform {kind!r} is not run")


def _labels(ctx):
    if ctx.attrs.get("classlabels_strings"):
        raise ctx.unsupported("string class labels (classlabels_strings) are not run; convert with integer targets")
    labels = ctx.attrs.get("classlabels_ints", ctx.attrs.get("classlabels_int64s"))
    if labels is None:
        raise ctx.error("integer class labels (classlabels_ints or classlabels_int64s) are required")
    return np.asarray(labels, np.int64)


def _features(ctx, x):
    x = jnp.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ctx.error(f"X must be (N, C), got {x.shape}")
    return x.astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)


@OPS.op("LinearRegressor", 1)
def _linear_regressor(ctx):
    """Y = X @ coefficients^T + intercepts, (N, targets), then ``post_transform``."""
    targets = int(ctx.attrs.get("targets", 1))
    coefficients, intercepts = _floats(ctx, "coefficients"), _floats(ctx, "intercepts", [0.0] * targets)
    transform = _transform(ctx, "LinearRegressor")

    def linear_regressor(x):
        x = _features(ctx, x)
        w = jnp.asarray(coefficients.reshape(targets, -1), x.dtype)
        if w.shape[1] != x.shape[1]:
            raise ctx.error(f"{w.size} coefficients do not fit {targets} targets of {x.shape[1]} features")
        return transform(x @ w.T + jnp.asarray(intercepts, x.dtype)).astype(jnp.float32)

    return linear_regressor


@OPS.op("LinearClassifier", 1)
def _linear_classifier(ctx):
    """Scores ``X @ coefficients^T + intercepts`` (N, E) and the label of the largest; with one row of
    coefficients for two labels (a binary model) the scores are ``[-s, s]`` (``[1 - t(s), t(s)]`` after a
    LOGISTIC or PROBIT transform) and the label is the second where ``s > 0``, as ONNX Runtime computes them.
    Outputs: the labels (N,) int64 and the transformed scores (N, E or 2)."""
    labels = _labels(ctx)
    coefficients, intercepts = _floats(ctx, "coefficients"), _floats(ctx, "intercepts")
    transform = _transform(ctx, "LinearClassifier")
    kind = ctx.attrs.get("post_transform", "NONE")
    kind = kind.decode() if isinstance(kind, bytes) else kind

    def linear_classifier(x):
        x = _features(ctx, x)
        w = jnp.asarray(coefficients.reshape(-1, x.shape[1]), x.dtype)
        scores = x @ w.T
        if intercepts is not None:
            scores = scores + jnp.asarray(intercepts, x.dtype)
        if w.shape[0] == 1 and len(labels) == 2:
            s = scores[:, 0]
            label = jnp.where(s > 0, labels[1], labels[0])
            if kind in ("LOGISTIC", "PROBIT"):
                t = transform(s)
                z = jnp.stack([1 - t, t], axis=1)
            else:
                z = transform(jnp.stack([-s, s], axis=1))
            return label, z.astype(jnp.float32)
        if w.shape[0] != len(labels):
            raise ctx.error(f"{w.shape[0]} rows of coefficients for {len(labels)} class labels")
        label = take(jnp.asarray(labels), jnp.argmax(scores, axis=1), 0)
        return label, transform(scores).astype(jnp.float32)

    return linear_classifier


@OPS.op("Scaler", 1)
def _scaler(ctx):
    """Y = (X - offset) * scale, per feature (or one value for all), float32."""
    offset, scale = _floats(ctx, "offset", [0.0]), _floats(ctx, "scale", [1.0])

    def scaler(x):
        x = _features(ctx, x)
        for what, v in (("offset", offset), ("scale", scale)):
            if v.size not in (1, x.shape[1]):
                raise ctx.error(f"{what} has {v.size} values for {x.shape[1]} features")
        return ((x - jnp.asarray(offset, x.dtype)) * jnp.asarray(scale, x.dtype)).astype(jnp.float32)

    return scaler


@OPS.op("Normalizer", 1)
def _normalizer(ctx):
    """Each row divided by its ``norm``: MAX (its largest value), L1 (the sum of magnitudes) or L2."""
    norm = ctx.attrs.get("norm", "MAX")
    norm = norm.decode() if isinstance(norm, bytes) else norm
    if norm not in ("MAX", "L1", "L2"):
        raise ctx.error(f"norm must be MAX, L1 or L2, got {norm!r}")

    def normalizer(x):
        x = _features(ctx, x)
        if norm == "MAX":
            d = jnp.max(x, axis=1, keepdims=True)
        elif norm == "L1":
            d = jnp.sum(jnp.abs(x), axis=1, keepdims=True)
        else:
            d = jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True))
        return (x / d).astype(jnp.float32)

    return normalizer


@OPS.op("Binarizer", 1)
def _binarizer(ctx):
    """1 where X > threshold (default 0), else 0, in X's type."""
    threshold = float(ctx.attrs.get("threshold", 0.0))

    def binarizer(x):
        x = jnp.asarray(x)
        return jnp.where(x > threshold, 1, 0).astype(x.dtype)

    return binarizer


@OPS.op("Imputer", 1)
def _imputer(ctx):
    """X with each ``replaced_value_float`` (default NaN) replaced by the feature's ``imputed_value_floats``."""
    if "imputed_value_int64s" in ctx.attrs:
        raise ctx.unsupported("integer imputation (imputed_value_int64s) is not run")
    imputed = _floats(ctx, "imputed_value_floats")
    if imputed is None:
        raise ctx.error("imputed_value_floats is required")
    replaced = float(ctx.attrs.get("replaced_value_float", float("nan")))

    def imputer(x):
        x = jnp.asarray(x)
        missing = jnp.isnan(x) if np.isnan(replaced) else x == replaced
        return jnp.where(missing, jnp.asarray(imputed, x.dtype), x)

    return imputer


@OPS.op("ArrayFeatureExtractor", 1)
def _array_feature_extractor(ctx):
    """The elements of X at ``Y``'s indices along its last axis (a 1-D X as one row)."""
    def array_feature_extractor(x, indices):
        x = jnp.asarray(x)
        if x.ndim == 1:
            x = x[None, :]
        index = jnp.reshape(jnp.asarray(indices), (-1,))
        return jnp.take(x, index, axis=-1, mode="fill")

    return array_feature_extractor


def _tree_scores(ctx, trees, x, base):
    """Each row's summed (or averaged) leaf weights plus ``base`` (N, outputs)."""
    aggregate = ctx.attrs.get("aggregate_function", "SUM")
    aggregate = aggregate.decode() if isinstance(aggregate, bytes) else aggregate
    leaves = trees.leaves(x)
    scores = jnp.sum(take(jnp.asarray(trees.weights, x.dtype), leaves, 0), axis=1)
    if aggregate == "AVERAGE":
        scores = scores / len(trees.roots)
    elif aggregate != "SUM":
        raise ctx.unsupported(f"aggregate_function {aggregate!r} is not run (SUM and AVERAGE are)")
    return scores + jnp.asarray(base, x.dtype)


@OPS.op("TreeEnsembleRegressor", 1, 3)
def _tree_ensemble_regressor(ctx):
    """The sum (or average) over trees of the leaf weights each row reaches, per target, plus
    ``base_values``, then ``post_transform`` (N, n_targets); a node's comparison by ``nodes_modes``, a missing
    value (NaN) to the branch ``nodes_missing_value_tracks_true`` says."""
    outputs = int(ctx.attrs.get("n_targets", 1))
    trees = Trees.from_nodes(ctx, outputs, "target")
    base = _floats(ctx, "base_values", [0.0] * outputs)
    transform = _transform(ctx, "TreeEnsembleRegressor")

    def tree_ensemble_regressor(x):
        x = _features(ctx, x)
        return transform(_tree_scores(ctx, trees, x, base)).astype(jnp.float32)

    return tree_ensemble_regressor


_POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


@OPS.op("TreeEnsemble", 5)
def _tree_ensemble(ctx):
    """Version 5's one tree operator: each row walks every tree from ``tree_roots`` to a leaf, whose
    ``leaf_weights`` entry goes to its ``leaf_targetids`` target; per target the ``aggregate_function`` over the
    trees (0 AVERAGE, 1 SUM, 2 MIN, 3 MAX; a target no tree reached is 0, as ONNX Runtime gives it; ONNX's
    reference leaves the dtype's largest or smallest value for MIN and MAX), then ``post_transform`` as the
    operator page numbers it (0 NONE, 1 SOFTMAX, 2 LOGISTIC, 3 SOFTMAX_ZERO, 4 PROBIT; ONNX Runtime 1.32 reads 1
    as LOGISTIC and 2 as SOFTMAX, and ONNX's reference applies none); (N, n_targets) in X's dtype. A missing value
    (NaN) takes the branch ``nodes_missing_value_tracks_true`` says, as ONNX Runtime."""
    outputs = int(ctx.attrs.get("n_targets", 1))
    trees = Trees.from_leaves(ctx, outputs)
    aggregate = int(ctx.attrs.get("aggregate_function", 1))
    post = int(ctx.attrs.get("post_transform", 0))
    if aggregate not in (0, 1, 2, 3) or not 0 <= post < len(_POST_TRANSFORMS):
        raise ctx.error(f"aggregate_function must be 0-3 and post_transform 0-4, got {aggregate} and {post}")
    transform = _transform(ctx, "TreeEnsemble", _POST_TRANSFORMS[post])

    def tree_ensemble(x):
        x = jnp.asarray(x)
        if x.ndim != 2:
            raise ctx.error(f"X must be (N, C), got {x.shape}")
        leaves = trees.leaves(x)
        weights = take(jnp.asarray(trees.weights, x.dtype), leaves, 0)  # (N, trees, targets)
        if aggregate in (0, 1):
            scores = jnp.sum(weights, axis=1) / (len(trees.roots) if aggregate == 0 else 1)
        else:
            reached = take(jnp.asarray(trees.reached), leaves, 0)
            info = jnp.finfo(x.dtype)
            fill = info.max if aggregate == 2 else info.min
            pick = jnp.min if aggregate == 2 else jnp.max
            scores = jnp.where(jnp.any(reached, axis=1), pick(jnp.where(reached, weights, fill), axis=1), 0)
        return transform(scores).astype(x.dtype)

    return tree_ensemble


@OPS.op("TreeEnsembleClassifier", 1, 3)
def _tree_ensemble_classifier(ctx):
    """Per class, the sum over trees of the leaf weights each row reaches plus ``base_values``; the label of the
    largest, and the scores after ``post_transform``. With weights for one class only and two labels (a binary
    model), as ONNX Runtime computes it: ``[1 - t, t]`` with ``t`` the LOGISTIC of the sum, or the sum itself when
    every weight is positive (a probability: random forests), the label the second where ``t > 0.5``; otherwise
    ``[-s, s]`` and the second label where ``s > 0``."""
    labels = _labels(ctx)
    used = {int(c) for c in ctx.attrs.get("class_ids", [])}
    binary = len(labels) == 2 and used <= {0} or (len(labels) == 2 and used == {1})
    outputs = 1 if binary else len(labels)
    trees = Trees.from_nodes(ctx, max(outputs, max(used, default=0) + 1), "class")
    base = _floats(ctx, "base_values", [0.0] * trees.weights.shape[1])
    transform = _transform(ctx, "TreeEnsembleClassifier")
    kind = ctx.attrs.get("post_transform", "NONE")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    positive = bool(np.all(np.asarray(ctx.attrs.get("class_weights", []), np.float64) >= 0))

    def tree_ensemble_classifier(x):
        x = _features(ctx, x)
        scores = _tree_scores(ctx, trees, x, base)
        if binary:
            s = scores[:, max(used, default=0)]
            if kind == "LOGISTIC" or kind == "NONE" and positive:  # a probability of the second class
                t = transform(s)
                return jnp.where(t > 0.5, labels[1], labels[0]), jnp.stack([1 - t, t], axis=1).astype(jnp.float32)
            z = transform(jnp.stack([-s, s], axis=1))
            return jnp.where(s > 0, labels[1], labels[0]), z.astype(jnp.float32)
        return take(jnp.asarray(labels), jnp.argmax(scores, axis=1), 0), transform(scores).astype(jnp.float32)

    return tree_ensemble_classifier


def _label_table(ctx, side: str):
    """``keys`` or ``values`` of a LabelEncoder as a NumPy array (object dtype for strings), from whichever of its
    ``<side>_tensor``, ``_strings``, ``_int64s``, ``_floats`` attributes is given."""
    a = ctx.attrs
    if a.get(f"{side}_tensor") is not None:
        return np.asarray(a[f"{side}_tensor"]).ravel()
    for suffix, dtype in (("strings", STRING), ("int64s", np.int64), ("floats", np.float32)):
        if a.get(f"{side}_{suffix}"):
            return np.asarray(list(a[f"{side}_{suffix}"]), dtype=dtype)
    raise ctx.error(f"give one of {side}_tensor, {side}_strings, {side}_int64s, {side}_floats")


@OPS.op("LabelEncoder", 2, 4)
def _label_encoder(ctx):
    """Each input element's ``values`` entry at its position in ``keys``, else the default (``default_tensor``,
    or ``default_string`` "_Unused", ``default_int64`` -1, ``default_float`` -0.0 by the values' type). String
    keys or values are mapped on the host (a string input is known before running); numeric ones traced. Float
    keys match NaN to NaN, as ONNX Runtime does."""
    keys, values = _label_table(ctx, "keys"), _label_table(ctx, "values")
    if len(keys) != len(values):
        raise ctx.error(f"{len(keys)} keys but {len(values)} values")
    a = ctx.attrs
    if a.get("default_tensor") is not None:
        default = np.asarray(a["default_tensor"]).ravel()[0]
    else:
        default = {STRING: a.get("default_string", "_Unused"), np.dtype(np.int64): a.get("default_int64", -1),
                   np.dtype(np.float32): a.get("default_float", -0.0)}.get(values.dtype, 0)
    table = dict(zip(keys.tolist(), values.tolist()))

    def label_encoder(x):
        if is_string(x) or values.dtype == STRING:
            if isinstance(x, jax.core.Tracer):  # prepare runs it between compiled segments, on concrete values
                raise ValueDependentError(ctx.message(f"its string values are made on the host from the input's "
                                                      f"values; {RUNS_IN_SEGMENTS}"))
            concrete = np.asarray(x)
            out = np.empty(concrete.shape, dtype=values.dtype)
            out.ravel()[:] = [table.get(k, default) for k in concrete.ravel().tolist()]
            return out
        x = jnp.asarray(x)
        out = jnp.full(x.shape, default, values.dtype)
        for key, value in zip(keys.tolist(), values.tolist()):
            hit = jnp.isnan(x) if isinstance(key, float) and np.isnan(key) else x == key
            out = jnp.where(hit, jnp.asarray(value, values.dtype), out)
        return out

    return label_encoder
