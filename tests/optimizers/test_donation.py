"""Donation (issue 7, point 5): the README's jitted step donates the parameters and the state.

DirectML lets every output alias its input; in JAX that is buffer donation. For each optimizer
the README's step (``jax.jit(step, donate_argnums=(0, 1))``) must use every donated buffer (no
"Some donated buffers were not usable" warning: each state leaf comes back with its own shape
and dtype), actually donate (the inputs are deleted), and give bitwise the undonated results.
"""

from __future__ import annotations

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit

OPTIMIZERS = {
    "adagrad": lambda: optkit.adagrad(0.05),
    "adagrad-norm-decay": lambda: optkit.adagrad(0.05, decay_factor=0.1, norm_coefficient=0.01),
    "adam": lambda: optkit.adam(1e-3),
    "adam-norm-coefficients": lambda: optkit.adam(1e-3, norm_coefficient=0.01, norm_coefficient_post=0.01),
    "momentum": lambda: optkit.momentum(0.05, 0.9),
    "momentum-nesterov": lambda: optkit.momentum(0.05, 0.9, nesterov=True, norm_coefficient=0.01),
    "adafactor": lambda: optkit.adafactor(),
    "adafactor-b1-decay": lambda: optkit.adafactor(b1=0.9, weight_decay_rate=0.01),
    "adam-bfloat16-float32-state": lambda: optkit.adam(1e-3, mu_dtype=jnp.float32, nu_dtype=jnp.float32),
    "adagrad-bfloat16-float32-state": lambda: optkit.adagrad(0.05, accumulator_dtype=jnp.float32),
    "adafactor-bfloat16-float32-state": lambda: optkit.adafactor(nu_dtype=jnp.float32),
    "adam-inject-hyperparams": lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=1e-3),
    "adam-clip-chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optkit.adam(1e-3)),
    "muon-partition": lambda: optax.partition(
        {"muon": optkit.muon(0.02), "adam": optkit.adam(1e-3)},
        lambda p: jax.tree.map(lambda a: "muon" if a.ndim == 2 else "adam", p)),
    "schedule-free-adamw": lambda: optkit.schedule_free_adamw(1e-3, warmup_steps=2, weight_decay=0.01),
    "adam8bit": lambda: optkit.adam8bit(1e-3, min_8bit_size=32),  # the kernel's moments in 8 bits
}


def _model(name):
    """The README's Flax NNX step, with a small Linear layer."""
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)
    if "bfloat16" in name:
        params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    return nnx, graphdef, params


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_donated_step_uses_every_buffer_and_equals_the_undonated_step(name):
    nnx, graphdef, params = _model(name)
    tx = OPTIMIZERS[name]()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, 8), jnp.int32)

    def step(params, opt_state, x, y):
        def loss_fn(params):
            logits = nnx.merge(graphdef, params)(x.astype(jax.tree.leaves(params)[0].dtype))
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    plain = jax.jit(step)
    donated = jax.jit(step, donate_argnums=(0, 1))
    p_ref, s_ref = params, tx.init(params)
    p_don, s_don = jax.tree.map(jnp.copy, p_ref), jax.tree.map(jnp.copy, s_ref)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            inputs = (p_don, s_don)
            p_ref, s_ref, loss_ref = plain(p_ref, s_ref, x, y)
            p_don, s_don, loss_don = donated(p_don, s_don, x, y)
            # donation happened: the donated arrays are gone
            assert all(leaf.is_deleted() for leaf in jax.tree.leaves(inputs))
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "donated buffers were not usable" in m], messages
    chex.assert_trees_all_equal((p_don, s_don, loss_don), (p_ref, s_ref, loss_ref))
    chex.assert_trees_all_equal_dtypes(s_don, tx.init(params))
