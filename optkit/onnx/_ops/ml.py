"""ONNX's ``ai.onnx.ml`` operators that skl2onnx writes for scikit-learn models: ``LinearRegressor``,
``LinearClassifier``, ``Scaler``, ``Normalizer``, ``Binarizer``, ``Imputer``, ``ArrayFeatureExtractor``,
``TreeEnsembleRegressor`` and ``TreeEnsembleClassifier`` (versions 1 and 3), ``LabelEncoder`` (versions 2 and 4;
string keys or values on the host, :mod:`optkit.onnx._ops.text`).

Formulas from the ``ai.onnx.ml`` operator pages, their details (binary classifiers' two scores, the post
transforms, a missing value's branch) as ONNX Runtime's CPU kernels compute them, each checked against ONNX
Runtime on skl2onnx's conversions of models trained on scikit-learn's data sets (tests/onnx/test_ml.py).
Class labels are integers (``classlabels_ints``); string labels, and ``ZipMap``'s sequence of maps, are not
run (skl2onnx writes tensors instead with ``options={id(model): {"zipmap": False}}`` and integer targets). The
float coefficients are attributes, constants of the graph; the outputs are differentiable in the inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._errors import RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._ops._common import aligned, take
from optkit.onnx._ops._registry import Family
from optkit.onnx._ops._values import STRING, is_string

OPS = Family("ml", "ai.onnx.ml")


def _floats(ctx, name, default=None):
    value = ctx.attrs.get(name, default)
    return None if value is None else np.asarray(value, np.float64)


def _transform(ctx, name):
    """The ``post_transform`` attribute as a function of the scores (N, E)."""
    kind = ctx.attrs.get("post_transform", "NONE")
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


_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "LEAF")


class _Trees:
    """A tree ensemble's nodes as arrays over one global node index, and each leaf's weights per output."""

    def __init__(self, ctx, outputs: int, prefix: str):
        a = ctx.attrs
        if "nodes_values_as_tensor" in a or f"{prefix}_weights_as_tensor" in a:
            raise ctx.unsupported("the *_as_tensor attributes (double thresholds) are not run")
        trees, ids = np.asarray(a["nodes_treeids"], np.int64), np.asarray(a["nodes_nodeids"], np.int64)
        key = {(int(t), int(n)): i for i, (t, n) in enumerate(zip(trees, ids))}
        modes = [m.decode() if isinstance(m, bytes) else m for m in a["nodes_modes"]]
        bad = sorted(set(modes) - set(_MODES))
        if bad:
            raise ctx.error(f"unknown nodes_modes {bad}")
        count = len(ids)
        self.mode = np.asarray([_MODES.index(m) for m in modes], np.int32)
        self.feature = np.asarray(a.get("nodes_featureids", [0] * count), np.int64)
        self.value = np.asarray(a.get("nodes_values", [0.0] * count), np.float64)
        missing = a.get("nodes_missing_value_tracks_true")
        self.missing_true = np.asarray(missing if missing else [0] * count, bool)

        def child(name):
            out = np.zeros(count, np.int64)
            for i, (t, n) in enumerate(zip(trees, a.get(name, [0] * count))):
                out[i] = key.get((int(t), int(n)), i) if self.mode[i] != 6 else i
            return out

        self.true, self.false = child("nodes_truenodeids"), child("nodes_falsenodeids")
        first: dict[int, int] = {}  # each tree's root: its smallest node id
        for t, n in key:
            first[t] = min(n, first.get(t, n))
        self.roots = np.asarray([key[(t, first[t])] for t in sorted(first)], np.int64)
        weights = np.zeros((count, outputs), np.float64)
        for t, n, o, w in zip(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"], a[f"{prefix}_ids"],
                              a[f"{prefix}_weights"]):
            if not 0 <= int(o) < outputs:
                raise ctx.error(f"{prefix}_ids {int(o)} is outside the {outputs} outputs")
            weights[key[(int(t), int(n))], int(o)] += w
        self.weights = weights
        self.depth = self._depth()

    def _depth(self) -> int:
        depth = {}
        order = list(self.roots)
        for r in order:
            depth[int(r)] = 0
        while order:
            i = int(order.pop())
            if self.mode[i] != 6:
                for c in (int(self.true[i]), int(self.false[i])):
                    if c not in depth:
                        depth[c] = depth[i] + 1
                        order.append(c)
        return max(depth.values(), default=0)

    def leaves(self, x):
        """(N, trees) the leaf each row reaches in each tree."""
        node = jnp.broadcast_to(jnp.asarray(self.roots), (x.shape[0], len(self.roots)))
        node = aligned((x, node), skip=(1,))[1]  # (split as the rows are, under explicit mesh axes)
        mode, feature = jnp.asarray(self.mode), jnp.asarray(self.feature)
        value = jnp.asarray(self.value, x.dtype)
        true, false, missing_true = jnp.asarray(self.true), jnp.asarray(self.false), jnp.asarray(self.missing_true)
        for _ in range(self.depth):
            m, v = take(mode, node, 0), take(value, node, 0)
            f = jnp.take_along_axis(x, take(feature, node, 0), axis=1)
            go = jnp.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                            [f <= v, f < v, f >= v, f > v, f == v, f != v], False)
            go = jnp.where(jnp.isnan(f), take(missing_true, node, 0), go)
            node = jnp.where(m == 6, node, jnp.where(go, take(true, node, 0), take(false, node, 0)))
        return node


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
    trees = _Trees(ctx, outputs, "target")
    base = _floats(ctx, "base_values", [0.0] * outputs)
    transform = _transform(ctx, "TreeEnsembleRegressor")

    def tree_ensemble_regressor(x):
        x = _features(ctx, x)
        return transform(_tree_scores(ctx, trees, x, base)).astype(jnp.float32)

    return tree_ensemble_regressor


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
    trees = _Trees(ctx, max(outputs, max(used, default=0) + 1), "class")
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
