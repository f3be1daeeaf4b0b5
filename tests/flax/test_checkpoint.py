"""Checkpoints (issue 7, point 4): stop mid-run, save, restore, resume, bit for bit.

The optimizer state is saved with Orbax (``orbax.checkpoint.StandardCheckpointer``) and with
``flax.serialization``, restored into the abstract state ``jax.eval_shape(tx.init, params)``
(no optimizer state is materialised before the restore), and the run resumed: parameters and
state are bitwise those of the uninterrupted run, for every optimizer.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit
from tests.helpers import random_grads

ocp = pytest.importorskip("orbax.checkpoint")
serialization = pytest.importorskip("flax.serialization")

OPTIMIZERS = {
    "adagrad": lambda: optkit.adagrad(0.1, decay_factor=0.01, norm_coefficient=0.01),
    "adam": lambda: optkit.adam(1e-2, norm_coefficient=0.01, norm_coefficient_post=0.001),
    "momentum": lambda: optkit.momentum(0.05, 0.9, nesterov=True),
    "adafactor": lambda: optkit.adafactor(),
    "adafactor-b1-decay": lambda: optkit.adafactor(b1=0.9, weight_decay_rate=0.01, factored_dims="largest"),
    "adam-inject-hyperparams": lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=1e-2, b1=0.8),
    "adam-bfloat16-float32-state": lambda: optkit.adam(1e-2, mu_dtype=jnp.float32, nu_dtype=jnp.float32),
    "adafactor-bfloat16-float32-state": lambda: optkit.adafactor(nu_dtype=jnp.float32),
}


def _params(name):
    rng = np.random.default_rng(0)
    dtype = jnp.bfloat16 if "bfloat16" in name else jnp.float32
    return {"w": jnp.asarray(rng.standard_normal((4, 6)), dtype), "b": jnp.asarray(rng.standard_normal(6), dtype),
            "t": jnp.asarray(rng.standard_normal((2, 3, 5)), dtype)}


def _make_step(tx):
    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    return step


def _run(step, params, state, first, count):
    for i in range(first, first + count):
        params, state = step(params, state, random_grads(params, 100 + i))
    return params, state


def _save_restore_orbax(tree, target, path):
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "checkpoint", tree)
        checkpointer.wait_until_finished()
        return checkpointer.restore(path / "checkpoint", target)


def _save_restore_flax(tree, target, path):
    (path / "checkpoint.msgpack").write_bytes(serialization.to_bytes(tree))
    return serialization.from_bytes(target, (path / "checkpoint.msgpack").read_bytes())


@pytest.mark.parametrize("fmt", ["orbax", "flax"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_resume_from_a_checkpoint_is_bit_identical(name, fmt, tmp_path):
    tx = OPTIMIZERS[name]()
    params0 = _params(name)
    step = _make_step(tx)
    uninterrupted = _run(step, params0, tx.init(params0), 0, 6)

    params, state = _run(step, params0, tx.init(params0), 0, 3)
    # a fresh process knows only the parameters' shapes: the target is abstract
    target = {"params": jax.eval_shape(lambda: params0), "opt_state": jax.eval_shape(tx.init, params0)}
    save_restore = _save_restore_orbax if fmt == "orbax" else _save_restore_flax
    restored = save_restore({"params": params, "opt_state": state}, target, tmp_path)

    assert jax.tree.structure(restored) == jax.tree.structure(target)
    as_spec = lambda tree: jax.tree.map(lambda a: (np.shape(a), np.dtype(a.dtype)), tree)  # noqa: E731
    assert as_spec(restored) == as_spec(target)
    chex.assert_trees_all_equal(restored["opt_state"], state)

    resumed = _run(step, restored["params"], restored["opt_state"], 3, 3)
    chex.assert_trees_all_equal(resumed, uninterrupted)
