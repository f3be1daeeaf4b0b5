"""Non-finite gradients (issue 7, point 2): what each optimizer does with NaN and +-inf, and
``optax.apply_if_finite`` around each one.

The behaviour without a guard is what the README section "Non-finite gradients" documents:
adagrad, adam and momentum are element-wise, so only the coordinates that saw a NaN or an
infinity are affected (and stay affected: their state is no longer finite); adafactor
normalises a whole tensor by statistics over its rows, columns and RMS, so one bad element
makes the whole tensor's update NaN, and the tensor stays NaN (its statistics and its
parameters, through RMS(X), are NaN). Wrapped in ``optax.apply_if_finite``, a step with a
non-finite update leaves the parameters and the optimizer's state exactly as they were, and
the run continues bit for bit as if the step had not happened.
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

OPTIMIZERS = {
    "adagrad": lambda: optkit.adagrad(0.1),
    "adam": lambda: optkit.adam(0.1),
    "momentum": lambda: optkit.momentum(0.1),
    "adafactor": lambda: optkit.adafactor(),
    "adafactor-b1": lambda: optkit.adafactor(b1=0.9),
    "adam-norm-coefficients": lambda: optkit.adam(0.1, norm_coefficient=0.01, norm_coefficient_post=0.01),
    "adagrad-bf16-f32-state": lambda: optkit.adagrad(0.1, accumulator_dtype=jnp.float32),
}


def _params(dtype=jnp.float32):
    return {"m": jnp.linspace(0.5, 1.5, 6, dtype=dtype).reshape(2, 3), "v": jnp.linspace(-1.0, 1.0, 3, dtype=dtype)}


def _g(seed):
    """Float32 gradients for :func:`_params`."""
    return random_grads(_params(), seed, jnp.float32)


def _poison(grads, value, leaf="m"):
    index = (0, 0) if leaf == "m" else (0,)
    return {**grads, leaf: grads[leaf].at[index].set(value)}


def _steps(tx, grads_list, transform, params=None):
    params = _params() if params is None else params
    state = tx.init(params)
    update = transform(tx.update)
    history = []
    for g in grads_list:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
        history.append((updates, params, state))
    return history


# ---------------------------------------------------------------------------
# without a guard: the documented behaviour


def _finite(tree):
    return np.array([bool(np.all(np.isfinite(np.asarray(x, np.float32)))) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", ["adagrad", "adam", "momentum"])
def test_elementwise_optimizers_affect_only_the_bad_coordinate(name, bad):
    tx = OPTIMIZERS[name]()
    clean = _steps(tx, [_g(0), _g(1)], jax.jit)
    dirty = _steps(tx, [_poison(_g(0), bad), _g(1)], jax.jit)
    for step in range(2):
        u_clean, u_dirty = clean[step][0], dirty[step][0]
        # every other coordinate (and the other tensor) is exactly the clean run's
        np.testing.assert_array_equal(np.asarray(u_dirty["v"]), np.asarray(u_clean["v"]))
        np.testing.assert_array_equal(np.asarray(u_dirty["m"]).ravel()[1:], np.asarray(u_clean["m"]).ravel()[1:])
    first, second = float(dirty[0][0]["m"][0, 0]), float(dirty[1][0]["m"][0, 0])
    expected = {
        # NaN: the state's coordinate is NaN from then on.
        ("adagrad", "nan"): (np.nan, np.nan), ("adam", "nan"): (np.nan, np.nan),
        ("momentum", "nan"): (np.nan, np.nan),
        # inf: Adagrad's H becomes inf; inf/inf is NaN now, and G/inf = 0 (a frozen coordinate) later.
        ("adagrad", "inf"): (np.nan, 0.0), ("adagrad", "-inf"): (np.nan, 0.0),
        # Adam: M = +-inf, V = inf, inf/inf = NaN now and on every later step.
        ("adam", "inf"): (np.nan, np.nan), ("adam", "-inf"): (np.nan, np.nan),
        # Momentum: V = +-inf, the step is -+inf now and on every later step.
        ("momentum", "inf"): (-np.inf, -np.inf), ("momentum", "-inf"): (np.inf, np.inf),
    }[(name, "nan" if np.isnan(bad) else ("inf" if bad > 0 else "-inf"))]
    np.testing.assert_array_equal([first, second], expected)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_adafactor_bad_element_makes_its_whole_tensor_nan(bad):
    tx = OPTIMIZERS["adafactor"]()
    clean = _steps(tx, [_g(0), _g(1)], jax.jit)
    dirty = _steps(tx, [_poison(_g(0), bad), _g(1)], jax.jit)
    assert np.all(np.isnan(np.asarray(dirty[0][0]["m"])))  # row/column statistics and RMS(U) are shared
    np.testing.assert_array_equal(np.asarray(dirty[0][0]["v"]), np.asarray(clean[0][0]["v"]))  # other leaves
    # the factored statistics stay non-finite: the tensor's later updates are NaN too
    assert np.all(np.isnan(np.asarray(dirty[1][0]["m"])))
    # an unfactored tensor too (RMS(U) is over the whole tensor); the tensor's parameters are
    # NaN after that step, and RMS(X) keeps every later update of the tensor NaN
    dirty_vector = _steps(tx, [_poison(_g(0), bad, "v"), _g(1)], jax.jit)
    assert np.all(np.isnan(np.asarray(dirty_vector[0][0]["v"])))
    assert np.all(np.isnan(np.asarray(dirty_vector[1][0]["v"])))
    np.testing.assert_array_equal(np.asarray(dirty_vector[1][0]["m"]), np.asarray(clean[1][0]["m"]))


# ---------------------------------------------------------------------------
# optax.apply_if_finite


@pytest.mark.parametrize("bad, transform", [
    pytest.param(np.nan, jax.jit, id="nan-jit"), pytest.param(np.inf, jax.jit, id="inf-jit"),
    pytest.param(-np.inf, lambda f: f, id="-inf-nojit")])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_apply_if_finite_skips_the_step_and_keeps_params_and_state(name, bad, transform):
    dtype = jnp.bfloat16 if "bf16" in name else jnp.float32
    params = _params(dtype)
    grads = [random_grads(_params(), i, dtype) for i in range(4)]
    bad_grads = _poison(grads[2], bad, leaf="v")
    guarded = optax.apply_if_finite(OPTIMIZERS[name](), max_consecutive_errors=3)
    history = _steps(guarded, grads[:2] + [bad_grads] + grads[2:], transform, params)

    # the bad step: zero updates, same params, same inner state (bit for bit), one error counted
    updates, params_after, state_after = history[2]
    _, params_before, state_before = history[1]
    assert all(np.all(np.asarray(u, np.float32) == 0) for u in jax.tree.leaves(updates))
    chex.assert_trees_all_equal(params_after, params_before)
    chex.assert_trees_all_equal(state_after.inner_state, state_before.inner_state)
    assert int(state_after.notfinite_count) == 1 and int(state_after.total_notfinite) == 1
    assert not bool(state_after.last_finite)

    # and the run goes on as if the bad step had not been made. (The guard runs the inner
    # update inside lax.cond, which compiles it even without jit, so the reference is jitted.)
    unguarded = _steps(OPTIMIZERS[name](), grads, jax.jit, params)
    chex.assert_trees_all_equal(history[-1][1], unguarded[-1][1])
    chex.assert_trees_all_equal(history[-1][2].inner_state, unguarded[-1][2])
    assert int(history[-1][2].notfinite_count) == 0


def test_apply_if_finite_without_the_guard_the_state_is_poisoned():
    """The reason for the guard: unguarded, one NaN gradient leaves NaN in Adam's state."""
    history = _steps(optkit.adam(0.1), [_poison(_g(0), np.nan), _g(1)], jax.jit)
    assert not _finite(history[-1][2][0].mu).all() and not _finite(history[-1][1]).all()
