"""optkit transformations inside Optax combinators and Flax, like any Optax optimizer."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

import optkit
from tests.helpers import sin_grads

PARAMS = {"w": jnp.array([[0.5, -1.0], [2.0, 0.25]]), "b": jnp.array([0.1, -0.2])}


FACTORIES = {
    "adagrad": lambda: optkit.adagrad(0.1, decay_factor=0.1, norm_coefficient=0.01),
    "adam": lambda: optkit.adam(0.05, norm_coefficient=0.01, norm_coefficient_post=0.01),
    "momentum": lambda: optkit.momentum(0.1, 0.9, 0.5, nesterov=True, norm_coefficient=0.01),
}


def _run(tx, grads_seq, params=PARAMS, jit=True):
    state = tx.init(params)
    update = jax.jit(tx.update) if jit else tx.update
    for g in grads_seq:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


class CompositionTest(chex.TestCase):
    @parameterized.parameters(*FACTORIES)
    def test_chain_with_clip_by_global_norm(self, name):
        grads = [sin_grads(PARAMS, t) for t in range(5)]
        got, _ = _run(optax.chain(optax.clip_by_global_norm(0.5), FACTORIES[name]()), grads)
        clipped = [optax.tree.scale(jnp.minimum(1.0, 0.5 / optax.tree.norm(gs)), gs) for gs in grads]
        want, _ = _run(FACTORIES[name](), clipped)
        chex.assert_trees_all_close(got, want, rtol=1e-6)

    @parameterized.parameters(*FACTORIES)
    def test_multi_steps_averages_then_steps(self, name):
        micro = [sin_grads(PARAMS, t) for t in range(6)]
        got, _ = _run(optax.MultiSteps(FACTORIES[name](), every_k_schedule=3), micro)
        means = [jax.tree.map(lambda *g: sum(g) / 3, *micro[i : i + 3]) for i in (0, 3)]
        want, _ = _run(FACTORIES[name](), means)
        chex.assert_trees_all_close(got, want, rtol=1e-5)

    @parameterized.parameters(*FACTORIES)
    def test_masked(self, name):
        mask = {"w": True, "b": False}
        tx = optax.masked(FACTORIES[name](), mask)
        state = tx.init(PARAMS)
        updates, _ = jax.jit(tx.update)(sin_grads(PARAMS, 1), state, PARAMS)
        # Unmasked leaves pass through untouched; masked ones get the optimizer's update.
        chex.assert_trees_all_equal(updates["b"], sin_grads(PARAMS, 1)["b"])
        inner = FACTORIES[name]()
        w = {"w": PARAMS["w"]}
        inner_updates, _ = inner.update({"w": sin_grads(PARAMS, 1)["w"]}, inner.init(w), w)
        chex.assert_trees_all_close(updates["w"], inner_updates["w"], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("adagrad", optkit.adagrad, dict(learning_rate=0.1, decay_factor=0.1, norm_coefficient=0.01, eps=1e-6,
                              initial_accumulator_value=0.1)),
        ("adam", optkit.adam, dict(learning_rate=0.05, b1=0.8, b2=0.99, eps=1e-6, norm_coefficient=0.01,
                           norm_coefficient_post=0.01)),
        ("momentum", optkit.momentum, dict(learning_rate=0.1, alpha=0.8, beta=0.5, norm_coefficient=0.01)),
    )
    def test_inject_hyperparams_every_numeric_argument(self, factory, kwargs):
        """Every numeric hyperparameter can be injected and gives the same numbers."""
        grads = [sin_grads(PARAMS, t) for t in range(4)]
        want, _ = _run(factory(**kwargs), grads, jit=False)
        tx = optax.inject_hyperparams(factory)(**kwargs)
        state = tx.init(PARAMS)
        assert set(kwargs) <= set(state.hyperparams)
        params = PARAMS
        update = self.variant(tx.update)
        for g in grads:
            updates, state = update(g, state, params)
            params = optax.apply_updates(params, updates)
        chex.assert_trees_all_close(params, want, rtol=1e-5, atol=1e-6)

    def test_inject_hyperparams_learning_rate_can_change(self):
        tx = optax.inject_hyperparams(optkit.adam)(learning_rate=0.1)
        state = tx.init(PARAMS)
        updates, state = tx.update(sin_grads(PARAMS, 0), state, PARAMS)
        state.hyperparams["learning_rate"] = jnp.asarray(0.0)
        updates, state = jax.jit(tx.update)(sin_grads(PARAMS, 1), state, PARAMS)
        chex.assert_trees_all_equal(updates, jax.tree.map(jnp.zeros_like, updates))

    def test_inject_hyperparams_without_params_names_the_argument(self):
        # A coefficient given to inject_hyperparams (even 0.0) is a JAX array that may be nonzero: it
        # needs params, eagerly and jitted alike; the error names it.
        tx = optax.inject_hyperparams(optkit.adagrad)(learning_rate=0.1, norm_coefficient=0.0)
        state = tx.init(PARAMS)
        for update in (jax.jit(tx.update), tx.update):
            with pytest.raises(ValueError, match="params=None, but norm_coefficient"):
                update(sin_grads(PARAMS, 0), state)
        tx = optax.inject_hyperparams(optkit.adagrad, static_args=("norm_coefficient",))(
            learning_rate=0.1, norm_coefficient=0.0)
        updates, _ = jax.jit(tx.update)(sin_grads(PARAMS, 0), tx.init(PARAMS))
        assert np.all(np.isfinite(updates["w"]))

    @parameterized.parameters(optkit.adagrad, optkit.adam, optkit.momentum)
    def test_inject_hyperparams_without_a_coefficient_needs_no_params(self, factory):
        # A coefficient the user did not pass is None (off): not injected, no params needed, and
        # the numbers are those of the plain optimizer without params.
        tx = optax.inject_hyperparams(factory)(learning_rate=0.1)
        state = tx.init(PARAMS)
        assert not any(k.startswith("norm_coefficient") for k in state.hyperparams)
        updates, _ = jax.jit(tx.update)(sin_grads(PARAMS, 0), state)
        plain = factory(0.1)
        want, _ = plain.update(sin_grads(PARAMS, 0), plain.init(PARAMS))
        chex.assert_trees_all_close(updates, want, rtol=1e-6)

    def test_flax_nnx_optimizer_step(self):
        nnx = pytest.importorskip("flax.nnx")

        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
        loss = lambda m: jnp.mean((m(x) - y) ** 2)  # noqa: E731
        before = nnx.state(model, nnx.Param)
        before = jax.tree.map(jnp.array, nnx.to_pure_dict(before))
        grads = nnx.grad(loss)(model)
        opt = nnx.Optimizer(model, optkit.adam(0.1), wrt=nnx.Param)
        opt.update(model, grads)
        after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        g = nnx.to_pure_dict(grads)
        tx = optkit.adam(0.1)
        want_updates, _ = tx.update(g, tx.init(before), before)
        chex.assert_trees_all_close(after, optax.apply_updates(before, want_updates), rtol=1e-6)
