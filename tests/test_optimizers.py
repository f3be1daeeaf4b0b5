"""optkit.adagrad / adam / momentum as Optax transformations, over 120 steps, against SPEC.md.

The oracle iterates the NumPy transcription of each SPEC section (tests/oracles.py)
in float64 with the same gradient sequence, feeding T = number of updates made.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import parameterized

import optkit
from tests import oracles

STEPS = 120
SHAPES = {"w": (4, 3), "b": (3,), "s": ()}


def _init_params(dtype):
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def _grads(params, t, zeros=True):
    """A deterministic gradient sequence: a quadratic's gradient plus step-dependent noise.

    Some coordinates get exactly zero gradient on even steps, which exercises the
    accumulators' zero paths.
    """
    out = {}
    for i, (k, p) in enumerate(sorted(params.items())):
        p = np.asarray(p, np.float64)
        noise = np.sin(np.arange(p.size).reshape(p.shape) * 0.7 + t * 0.31 + i)
        g = 0.5 * p + noise
        if zeros and p.ndim and t % 2 == 0:
            g = np.where(np.arange(p.size).reshape(p.shape) % 3 == 0, 0.0, g)
        out[k] = g
    return out


def _run_optkit(tx, dtype, variant, steps=STEPS, zeros=True):
    params = jax.tree.map(jnp.asarray, _init_params(dtype))
    state = tx.init(params)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = variant(step)
    for t in range(steps):
        grads = jax.tree.map(lambda g, p: jnp.asarray(g, p.dtype), _grads(params, t, zeros), params)
        params, state = step(params, state, grads)
    return params, state


def _run_oracle(update_leaf, init_state_leaf, steps=STEPS):
    params = _init_params(np.float64)
    state = {k: init_state_leaf(p) for k, p in params.items()}
    for t in range(steps):
        grads = _grads(params, t)
        for k in params:
            params[k], state[k] = update_leaf(params[k], grads[k], state[k], t)
    return params, state


def _assert_close(got, want, dtype):
    for k in want:
        g = np.asarray(got[k], np.float64)
        if dtype == np.float64:
            np.testing.assert_allclose(g, want[k], rtol=1e-12, atol=1e-13, err_msg=k)
        else:
            np.testing.assert_allclose(g, want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def _with_dtype(dtype, fn):
    if dtype == np.float64:
        with jax.enable_x64(True):
            return fn()
    return fn()


ADAGRAD_CONFIGS = [
    dict(),
    dict(decay_factor=0.1, norm_coefficient=0.01, eps=1e-5),
    dict(initial_accumulator_value=0.1, eps=0.0),
]
ADAM_CONFIGS = [
    dict(),
    dict(b1=0.0, b2=0.5, eps=1e-3),
    dict(norm_coefficient=0.01, norm_coefficient_post=0.001, eps=1e-6),
]
MOMENTUM_CONFIGS = [
    dict(),
    dict(alpha=0.5, beta=0.3, norm_coefficient=0.02),
    dict(alpha=0.9, beta=1.0, nesterov=True),
    dict(alpha=0.8, beta=0.2, nesterov=True, norm_coefficient=0.01),
]


class TrajectoryTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(config=ADAGRAD_CONFIGS, dtype=[np.float32, np.float64])
    def test_adagrad(self, config, dtype):
        lr = 0.1
        eps = config.get("eps", 1e-6)
        h0 = config.get("initial_accumulator_value", 0.0)

        def leaf(x, g, h, t):
            return oracles.adagrad(
                lr, t, x, g, h, decay_factor=config.get("decay_factor", 0.0), epsilon=eps,
                norm_coefficient=config.get("norm_coefficient", 0.0),
            )

        want, want_state = _run_oracle(leaf, lambda p: np.full_like(p, h0))
        got, state = _with_dtype(dtype, lambda: _run_optkit(optkit.adagrad(lr, **config), dtype, self.variant))
        _assert_close(got, want, dtype)
        _assert_close(state[0].sum_of_squares, want_state, dtype)
        assert int(state[0].count) == STEPS
        assert all(v.dtype == dtype for v in jax.tree.leaves(got))

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

        want, want_state = _run_oracle(leaf, lambda p: (np.zeros_like(p), np.zeros_like(p)))
        got, state = _with_dtype(dtype, lambda: _run_optkit(optkit.adam(lr, **config), dtype, self.variant))
        _assert_close(got, want, dtype)
        _assert_close(state[0].mu, {k: v[0] for k, v in want_state.items()}, dtype)
        _assert_close(state[0].nu, {k: v[1] for k, v in want_state.items()}, dtype)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(config=MOMENTUM_CONFIGS, dtype=[np.float32, np.float64])
    def test_momentum(self, config, dtype):
        lr = 0.05
        cfg = dict(alpha=0.9, beta=1.0, nesterov=False, norm_coefficient=0.0) | config

        def leaf(x, g, v, t):
            return oracles.onnx_momentum(
                lr, t, x, g, v, alpha=cfg["alpha"], beta=cfg["beta"],
                mode="nesterov" if cfg["nesterov"] else "standard", norm_coefficient=cfg["norm_coefficient"],
            )

        want, want_state = _run_oracle(leaf, np.zeros_like)
        got, state = _with_dtype(dtype, lambda: _run_optkit(optkit.momentum(lr, **config), dtype, self.variant))
        _assert_close(got, want, dtype)
        _assert_close(state[0].trace, want_state, dtype)

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


class IndependentImplementationTest(chex.TestCase):
    """Where SPEC's formulas coincide with Optax's, the two libraries agree."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_adam_with_zero_eps_equals_optax_adam(self):
        # With eps = 0 the epsilon-hat and optax forms are the same formula. (Gradients are
        # kept nonzero: optax gives 0/0 = NaN where M = V = 0, optkit gives 0.)
        with jax.enable_x64(True):
            got, _ = _run_optkit(optkit.adam(0.01, eps=0.0), np.float64, self.variant, 60, zeros=False)
            want, _ = _run_optkit(optax.adam(0.01, eps=0.0), np.float64, self.variant, 60, zeros=False)
        chex.assert_trees_all_close(got, want, rtol=1e-12, atol=1e-13)

    @chex.variants(with_jit=True, without_jit=True)
    def test_momentum_equals_optax_sgd(self):
        with jax.enable_x64(True):
            for nesterov in (False, True):
                got, _ = _run_optkit(optkit.momentum(0.05, 0.9, nesterov=nesterov), np.float64, self.variant, 60)
                want, _ = _run_optkit(optax.sgd(0.05, momentum=0.9, nesterov=nesterov), np.float64,
                                      self.variant, 60)
                chex.assert_trees_all_close(got, want, rtol=1e-12, atol=1e-13)

    def test_adam_differs_from_optax_adam_where_eps_matters(self):
        """A guard that the epsilon-hat form is really used: with large eps the two differ."""
        got, _ = _run_optkit(optkit.adam(0.01, eps=0.1), np.float32, lambda f: f, steps=5)
        want, _ = _run_optkit(optax.adam(0.01, eps=0.1), np.float32, lambda f: f, steps=5)
        assert not np.allclose(got["w"], want["w"], rtol=1e-4)


class ParamsAndStateTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_params_none_allowed_without_norm_terms(self):
        for tx in (optkit.adagrad(0.1), optkit.adam(0.1), optkit.momentum(0.1)):
            params = {"a": jnp.ones(3)}
            state = tx.init(params)
            updates, _ = self.variant(lambda g, s, tx=tx: tx.update(g, s))(params, state)
            assert np.all(np.isfinite(updates["a"]))

    @chex.variants(with_jit=True, without_jit=True)
    def test_low_precision_params_with_float32_state(self):
        for dtype in (jnp.bfloat16, jnp.float16):
            params = {"w": jnp.linspace(-1, 1, 8, dtype=dtype)}
            for tx in (
                optkit.adagrad(0.1, accumulator_dtype=jnp.float32),
                optkit.adam(0.01, mu_dtype=jnp.float32, nu_dtype=jnp.float32),
                optkit.momentum(0.1, accumulator_dtype=jnp.float32),
            ):
                state = tx.init(params)
                assert all(x.dtype in (jnp.float32, jnp.int32) for x in jax.tree.leaves(state))
                grads = {"w": jnp.full(8, 300.0, dtype)}  # 300^2 overflows float16
                updates, state = self.variant(tx.update)(grads, state, params)
                assert updates["w"].dtype == dtype
                assert np.all(np.isfinite(np.asarray(updates["w"], np.float32)))
                assert np.all(np.isfinite(np.asarray(jax.tree.leaves(state)[1], np.float32)))

    def test_user_inputs_are_not_mutated(self):
        params = {"w": np.linspace(-1, 1, 6).astype(np.float32)}
        grads = {"w": np.ones(6, np.float32)}
        before = (params["w"].copy(), grads["w"].copy())
        for tx in (optkit.adagrad(0.1, norm_coefficient=0.1), optkit.adam(0.1, norm_coefficient_post=0.1),
                   optkit.momentum(0.1, norm_coefficient=0.1)):
            state = tx.init(params)
            tx.update(grads, state, params)
        np.testing.assert_array_equal(params["w"], before[0])
        np.testing.assert_array_equal(grads["w"], before[1])
