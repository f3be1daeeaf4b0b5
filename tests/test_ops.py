"""The spec ops against ONNX's own test cases and against NumPy transcriptions of SPEC.md.

SPEC sections: 1 (Adagrad), 2 (DirectML Adam), 3 (ONNX Adam), 4 (Momentum).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st
from onnx.backend.test.case.node import collect_testcases

import optkit
from tests import oracles

_ONNX_OPS = ("Adagrad", "Adam", "Momentum")


def _onnx_cases():
    """ONNX's conformance cases for the training optimizers (all feed T = 0).

    ``collect_testcases`` keeps one global list, filled on first use; asking
    for all cases (never one op type) keeps it whole for other test modules.
    """
    cases = {}
    for case in collect_testcases():
        node = case.model.graph.node
        if len(node) == 1 and node[0].op_type in _ONNX_OPS and node[0].domain == "ai.onnx.preview.training":
            cases[case.name] = case
    return [cases[name] for name in sorted(cases)]


def _attributes(node):
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


@pytest.mark.parametrize("case", _onnx_cases(), ids=lambda c: c.name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_onnx_conformance_cases(case, jit):
    """SPEC, Conformance data: ONNX's expected outputs for its 7 optimizer test cases."""
    (node,) = case.model.graph.node
    attrs = _attributes(node)
    for inputs, expected in case.data_sets:
        R, T, *tensors = inputs
        if node.op_type == "Adagrad":
            n = len(tensors) // 3
            X, G, H = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
            fn = lambda R, T, X, G, H: optkit.ops.onnx_adagrad(R, T, X, G, H, **attrs)  # noqa: E731
            args = (R, T, X, G, H)
        elif node.op_type == "Adam":
            n = len(tensors) // 4
            X, G, V, H = (tensors[i * n : (i + 1) * n] for i in range(4))
            fn = lambda R, T, X, G, V, H: optkit.ops.onnx_adam(R, T, X, G, V, H, **attrs)  # noqa: E731
            args = (R, T, X, G, V, H)
        else:
            n = len(tensors) // 3
            X, G, V = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
            fn = lambda R, T, X, G, V: optkit.ops.onnx_momentum(R, T, X, G, V, **attrs)  # noqa: E731
            args = (R, T, X, G, V)
        if jit:
            fn = jax.jit(fn)
        outputs = jax.tree.leaves(fn(*args))
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            assert got.dtype == want.dtype
            # Stricter than ONNX's runner (rtol 1e-3): float32 rounding only.
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def _random_tensors(rng, shapes, dtype, positive=False):
    out = []
    for shape in shapes:
        a = rng.standard_normal(shape)
        out.append(np.abs(a).astype(dtype) if positive else a.astype(dtype))
    return out


SHAPES = [(3,), (2, 4), (), (1, 2, 3)]


class OpsTest(chex.TestCase):
    """Each op against its NumPy transcription, several tensors at once, float64 exact."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 7)
    def test_onnx_adagrad_float64(self, T):
        rng = np.random.default_rng(T)
        X, G = _random_tensors(rng, SHAPES, np.float64), _random_tensors(rng, SHAPES, np.float64)
        H = _random_tensors(rng, SHAPES, np.float64, positive=True)
        attrs = dict(decay_factor=0.3, epsilon=1e-5, norm_coefficient=0.02)
        with jax.enable_x64(True):
            fn = self.variant(lambda R, T, X, G, H: optkit.ops.onnx_adagrad(R, T, X, G, H, **attrs))
            X_new, H_new = fn(np.float64(0.05), np.int64(T), X, G, H)
        for i in range(len(SHAPES)):
            want_x, want_h = oracles.adagrad(0.05, T, X[i], G[i], H[i], **attrs)
            np.testing.assert_allclose(X_new[i], want_x, rtol=1e-13, atol=1e-14)
            np.testing.assert_allclose(H_new[i], want_h, rtol=1e-13, atol=1e-14)
            assert X_new[i].dtype == np.float64 and X_new[i].shape == SHAPES[i]

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 9)
    def test_onnx_adam_float64(self, T):
        rng = np.random.default_rng(10 + T)
        X, G, V = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        H = _random_tensors(rng, SHAPES, np.float64, positive=True)
        attrs = dict(alpha=0.8, beta=0.95, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.05)
        with jax.enable_x64(True):
            fn = self.variant(lambda R, T, X, G, V, H: optkit.ops.onnx_adam(R, T, X, G, V, H, **attrs))
            X_new, V_new, H_new = fn(np.float64(0.1), np.int64(T), X, G, V, H)
        for i in range(len(SHAPES)):
            want = oracles.onnx_adam(0.1, T, X[i], G[i], V[i], H[i], **attrs)
            for got, w in zip((X_new[i], V_new[i], H_new[i]), want):
                np.testing.assert_allclose(got, w, rtol=1e-13, atol=1e-14)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 5)
    def test_dml_adam_float64(self, T):
        rng = np.random.default_rng(20 + T)
        X, M, G = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        V = _random_tensors(rng, SHAPES, np.float64, positive=True)
        with jax.enable_x64(True):
            fn = self.variant(
                lambda X, M, V, G, T: optkit.ops.dml_adam(
                    X, M, V, G, T, learning_rate=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-8
                )
            )
            X_new, M_new, V_new = fn(X, M, V, G, np.int64(T))
        for i in range(len(SHAPES)):
            want = oracles.dml_adam(
                X[i], M[i], V[i], G[i], T, LearningRate=1e-2, Beta1=0.9, Beta2=0.999, Epsilon=1e-8
            )
            for got, w in zip((X_new[i], M_new[i], V_new[i]), want):
                np.testing.assert_allclose(got, w, rtol=1e-13, atol=1e-14)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(T=[0, 1, 4], mode=["standard", "nesterov"])
    def test_onnx_momentum_float64(self, T, mode):
        rng = np.random.default_rng(30 + T)
        X, G, V = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        attrs = dict(alpha=0.9, beta=0.3, mode=mode, norm_coefficient=0.01)
        with jax.enable_x64(True):
            fn = self.variant(lambda R, T, X, G, V: optkit.ops.onnx_momentum(R, T, X, G, V, **attrs))
            X_new, V_new = fn(np.float64(0.1), np.int64(T), X, G, V)
        for i in range(len(SHAPES)):
            want_x, want_v = oracles.onnx_momentum(0.1, T, X[i], G[i], V[i], **attrs)
            np.testing.assert_allclose(X_new[i], want_x, rtol=1e-13, atol=1e-14)
            np.testing.assert_allclose(V_new[i], want_v, rtol=1e-13, atol=1e-14)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dml_adam_at_t0_uses_alpha_one(self):
        """SPEC 2, Decision (T): T = 0 would be 0/0; Alpha = 1 there."""
        X, M, V, G = jnp.ones(4), jnp.zeros(4), jnp.zeros(4), jnp.full(4, 2.0)
        fn = self.variant(
            lambda T: optkit.ops.dml_adam(X, M, V, G, T, learning_rate=0.5, beta1=0.9, beta2=0.99, epsilon=0.0)
        )
        X_new, M_new, V_new = fn(0)
        # M = 0.2, V = 0.04, sqrt(V) = 0.2: the step is exactly lr * 1 * 0.2 / 0.2.
        np.testing.assert_allclose(X_new, 1.0 - 0.5, rtol=1e-6)
        assert np.all(np.isfinite(X_new))
        np.testing.assert_allclose(M_new, 0.2, rtol=1e-6)
        np.testing.assert_allclose(V_new, 0.04, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_adagrad_zero_over_zero(self):
        """SPEC 1, Decision (0/0): epsilon = 0 with G_reg = H_new = 0 leaves X unchanged."""
        X = jnp.array([1.0, 2.0, 3.0])
        G = jnp.array([0.0, 0.5, 0.0])
        H = jnp.array([0.0, 0.0, 4.0])
        fn = self.variant(lambda X, G, H: optkit.ops.onnx_adagrad(0.1, 0, X, G, H, epsilon=0.0))
        X_new, H_new = fn(X, G, H)
        np.testing.assert_array_equal(X_new, np.array([1.0, 2.0 - 0.1 * 0.5 / 0.5, 3.0], np.float32))
        np.testing.assert_array_equal(H_new, [0.0, 0.25, 4.0])

    def test_dict_of_tensors_is_several_tensors(self):
        """A dict works as ONNX's variadic list: per-tensor results equal one-at-a-time calls."""
        rng = np.random.default_rng(5)
        tree = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
        grads = jax.tree.map(lambda x: x * 0.5, tree)
        acc = jax.tree.map(np.zeros_like, tree)
        X_new, _ = optkit.ops.onnx_adagrad(np.float32(0.1), 2, tree, grads, acc, decay_factor=0.1)
        for key in tree:
            (x_single,), _ = optkit.ops.onnx_adagrad(
                np.float32(0.1), 2, [tree[key]], [grads[key]], [acc[key]], decay_factor=0.1
            )
            np.testing.assert_array_equal(X_new[key], x_single)

    def test_inputs_are_not_mutated(self):
        rng = np.random.default_rng(6)
        X, G, V = ([rng.standard_normal(5).astype(np.float32)] for _ in range(3))
        H = [np.abs(rng.standard_normal(5)).astype(np.float32)]
        copies = [[a.copy() for a in t] for t in (X, G, V, H)]
        optkit.ops.onnx_adam(np.float32(0.1), 3, X, G, V, H)
        optkit.ops.onnx_momentum(np.float32(0.1), 3, X, G, V, alpha=0.9, beta=0.1, mode="nesterov",
                                 norm_coefficient=0.1)
        for orig, copy in zip((X, G, V, H), copies):
            np.testing.assert_array_equal(orig[0], copy[0])


@given(
    T=st.integers(0, 1000),
    R=st.floats(0, 10),
    decay_factor=st.floats(0, 5),
    epsilon=st.floats(0, 1),
    norm_coefficient=st.floats(0, 2),
    seed=st.integers(0, 2**16),
)
def test_onnx_adagrad_matches_formula_property(T, R, decay_factor, epsilon, norm_coefficient, seed):
    """Random hyperparameters: float64 outputs equal the formula to rounding, and are finite."""
    rng = np.random.default_rng(seed)
    X, G = rng.standard_normal((2, 6))
    H = np.abs(rng.standard_normal(6))
    G[0] = 0.0  # exercise zero gradients (with H > 0 unless the draw is 0)
    attrs = dict(decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
    with jax.enable_x64(True):
        X_new, H_new = optkit.ops.onnx_adagrad(np.float64(R), np.int64(T), X, G, H, **attrs)
    want_x, want_h = oracles.adagrad(R, T, X, G, H, **attrs)
    assert np.all(np.isfinite(X_new))
    np.testing.assert_allclose(X_new, want_x, rtol=1e-13, atol=1e-15 * max(1.0, R))
    np.testing.assert_allclose(H_new, want_h, rtol=1e-15)


@given(
    T=st.integers(0, 10_000),
    alpha=st.floats(0, 0.999),
    beta=st.floats(0, 0.999),
    epsilon=st.floats(1e-12, 1),
    norm_coefficient=st.floats(0, 1),
    norm_coefficient_post=st.floats(0, 0.9),
    seed=st.integers(0, 2**16),
)
def test_onnx_adam_matches_formula_property(T, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post, seed):
    rng = np.random.default_rng(seed)
    X, G, V = rng.standard_normal((3, 5))
    H = np.abs(rng.standard_normal(5))
    attrs = dict(alpha=alpha, beta=beta, epsilon=epsilon, norm_coefficient=norm_coefficient,
                 norm_coefficient_post=norm_coefficient_post)
    with jax.enable_x64(True):
        got = optkit.ops.onnx_adam(np.float64(0.01), np.int64(T), X, G, V, H, **attrs)
    want = oracles.onnx_adam(0.01, T, X, G, V, H, **attrs)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
