"""optkit/_src/adam.py: optkit.adam over 120 steps, ops.dml_adam and ops.onnx_adam, against SPEC 2 and 3's
NumPy transcriptions (tests/oracles.py) in float32 and float64, jitted and not; and Optax's Adam
where the two forms coincide."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

import optkit
from tests import oracles
from tests.trajectories import ADAM_CONFIGS, _random_tensors, _run_optkit, check_spec_operator, check_trajectory
from tests.trajectories import SHAPES_OPS as SHAPES


class AdamTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(config=ADAM_CONFIGS, dtype=[np.float32, np.float64])
    def test_adam(self, config, dtype):
        lr = 0.01
        b1, b2, eps = config.get("b1", 0.9), config.get("b2", 0.999), config.get("eps", 1e-8)
        nc, ncp = config.get("norm_coefficient", 0.0), config.get("norm_coefficient_post", 0.0)

        def leaf(x, g, mv, t):
            # The transformation's update number t (0-based) is the spec op's T = t + 1.
            if nc == 0 and ncp == 0:
                x, m, v = oracles.dml_adam(x, mv[0], mv[1], g, t + 1, LearningRate=lr, Beta1=b1,
                                           Beta2=b2, Epsilon=eps)
                return x, (m, v)
            x, m, v = oracles.onnx_adam(lr, t + 1, x, g, mv[0], mv[1], alpha=b1, beta=b2, epsilon=eps,
                                        norm_coefficient=nc, norm_coefficient_post=ncp)
            return x, (m, v)

        check_trajectory(lambda: optkit.adam(lr, **config), leaf, lambda p: (np.zeros_like(p), np.zeros_like(p)),
                         ["mu", "nu"], dtype, self.variant)

    @chex.variants(with_jit=True, without_jit=True)
    def test_adam_with_zero_eps_equals_optax_adam(self):
        # With eps = 0 the epsilon-hat and optax forms are the same formula. (Gradients are
        # kept nonzero: optax gives 0/0 = NaN where M = V = 0, optkit gives 0.)
        with jax.enable_x64(True):
            got, _ = _run_optkit(optkit.adam(0.01, eps=0.0), np.float64, self.variant, 60, zeros=False)
            want, _ = _run_optkit(optax.adam(0.01, eps=0.0), np.float64, self.variant, 60, zeros=False)
        chex.assert_trees_all_close(got, want, rtol=1e-12, atol=1e-13)

    def test_adam_differs_from_optax_adam_where_eps_matters(self):
        """A guard that the epsilon-hat form is really used: with large eps the two differ."""
        got, _ = _run_optkit(optkit.adam(0.01, eps=0.1), np.float32, lambda f: f, steps=5)
        want, _ = _run_optkit(optax.adam(0.01, eps=0.1), np.float32, lambda f: f, steps=5)
        assert not np.allclose(got["w"], want["w"], rtol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 9)
    def test_onnx_adam_float64(self, T):
        rng = np.random.default_rng(10 + T)
        X, G, V = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        H = _random_tensors(rng, SHAPES, np.float64, positive=True)
        attrs = dict(alpha=0.8, beta=0.95, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.05)
        check_spec_operator(
            self.variant, lambda R, T, X, G, V, H: optkit.ops.onnx_adam(R, T, X, G, V, H, **attrs),
            lambda R, T, x, g, v, h: oracles.onnx_adam(float(R), int(T), x, g, v, h, **attrs),
            [X, G, V, H], (np.float64(0.1), np.int64(T)))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 5)
    def test_dml_adam_float64(self, T):
        rng = np.random.default_rng(20 + T)
        X, M, G = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        V = _random_tensors(rng, SHAPES, np.float64, positive=True)
        check_spec_operator(
            self.variant,
            lambda T, X, M, V, G: optkit.ops.dml_adam(X, M, V, G, T, learning_rate=1e-2, beta1=0.9, beta2=0.999,
                                                      epsilon=1e-8),
            lambda T, x, m, v, g: oracles.dml_adam(x, m, v, g, int(T), LearningRate=1e-2, Beta1=0.9, Beta2=0.999,
                                                   Epsilon=1e-8),
            [X, M, V, G], (np.int64(T),))

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
