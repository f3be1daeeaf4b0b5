"""What every element-wise optimizer (adagrad, adam, momentum) does alike: params optional without norm
terms, low-precision parameters with float32 state, user inputs never mutated. Each algorithm's own
tests are in tests/optimizers/test_adagrad.py, test_adam.py and test_momentum.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

import optkit


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
