"""optkit/_src/adagrad.py: optkit.adagrad over 120 steps and ops.onnx_adagrad, against SPEC 1's NumPy
transcription (tests/oracles.py) in float32 and float64, jitted and not."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

import optkit
from tests import oracles
from tests.trajectories import (
    ADAGRAD_CONFIGS,
    _assert_close,
    _random_tensors,
    _run_optkit,
    _run_oracle,
    check_spec_operator,
    check_trajectory,
)
from tests.trajectories import SHAPES_OPS as SHAPES


class AdagradTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(config=ADAGRAD_CONFIGS, dtype=[np.float32, np.float64])
    def test_adagrad(self, config, dtype):
        lr = 0.1
        h0 = config.get("initial_accumulator_value", 0.0)

        def leaf(x, g, moments, t):
            x, h = oracles.adagrad(lr, t, x, g, moments[0], decay_factor=config.get("decay_factor", 0.0),
                                   epsilon=config.get("eps", 1e-6),
                                   norm_coefficient=config.get("norm_coefficient", 0.0))
            return x, (h,)

        check_trajectory(lambda: optkit.adagrad(lr, **config), leaf, lambda p: (np.full_like(p, h0),),
                         ["sum_of_squares"], dtype, self.variant)

    @chex.variants(with_jit=True, without_jit=True)
    def test_schedule_learning_rate(self):
        """A schedule gives R_t = schedule(t) at update t (0-based), as the oracle feeds."""
        # A schedule whose values are exact in float64 (optax's built-in schedules compute in
        # float32, which would hide the comparison under float32 rounding).
        def schedule(count):
            return jnp.where(count < 40, 0.1, jnp.where(count < 80, 0.05, 0.025))

        def leaf(x, g, h, t):
            rate = 0.1 if t < 40 else 0.05 if t < 80 else 0.025
            return oracles.adagrad(rate, t, x, g, h, decay_factor=0.05, epsilon=1e-6,
                                   norm_coefficient=0.0)

        with jax.enable_x64(True):
            want, _ = _run_oracle(leaf, np.zeros_like)
            got, _ = _run_optkit(optkit.adagrad(schedule, decay_factor=0.05), np.float64, self.variant)
        _assert_close(got, want, np.float64)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 7)
    def test_onnx_adagrad_float64(self, T):
        rng = np.random.default_rng(T)
        X, G = _random_tensors(rng, SHAPES, np.float64), _random_tensors(rng, SHAPES, np.float64)
        H = _random_tensors(rng, SHAPES, np.float64, positive=True)
        attrs = dict(decay_factor=0.3, epsilon=1e-5, norm_coefficient=0.02)
        check_spec_operator(self.variant, lambda R, T, X, G, H: optkit.ops.onnx_adagrad(R, T, X, G, H, **attrs),
                            lambda R, T, x, g, h: oracles.adagrad(float(R), int(T), x, g, h, **attrs),
                            [X, G, H], (np.float64(0.05), np.int64(T)))

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
