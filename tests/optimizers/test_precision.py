"""Low precision (issue 7, point 3): bfloat16 and float16 parameters, 16-bit or float32 state.

optkit computes every leaf in float32 or wider (``ops.compute_dtype``) and stores the state in
its own dtype, so what 16-bit storage costs is the rounding of the parameters and of the state,
and the range of the state. The README section "Precision" states the numbers tested here:

- 16-bit parameters with float32 state follow the float32 run: over 200 steps every parameter
  stays within ``32 * eps(dtype) * max|X_float32|`` of it (bfloat16: 0.25, float16: 0.031);
- float16 state overflows where the *stored* value passes 65504, not where ``G * G`` does
  (``G * G`` is formed in float32): Adagrad's ``H`` at a single ``|G| >= 256``, Adam's ``V`` at a
  single ``|G| >= sqrt(65520 / (1 - b2))`` (8094 for b2 = 0.999) or a sustained ``|G|`` near 256,
  Momentum's ``V`` at ``|G| >= 65520 (1 - alpha) / beta``, Adafactor's statistics at an RMS over a
  row or column of 256; past that the coordinate's update is 0 for good (or inf for momentum);
- float16 state also underflows: gradients below about 5e-3 (Adam, b2 = 0.999) or 1.7e-4
  (Adagrad) leave ``V``/``H`` at 0 and the steps come out about 14 times too large after 200
  steps; bfloat16 state has the range but only 8 bits: Adam's ``V`` and Adagrad's ``H`` stall;
- float32 state survives all of these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit

F16_MAX = 65504.0


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    xs = jnp.asarray(rng.standard_normal((32, 8)), jnp.float32)
    w_true = rng.standard_normal((8, 4))
    ys = jnp.asarray(np.asarray(xs) @ w_true + 0.1 * rng.standard_normal((32, 4)), jnp.float32)
    params = {"w": jnp.asarray(rng.standard_normal((8, 4)) * 0.1, jnp.float32), "b": jnp.zeros(4, jnp.float32)}
    return xs, ys, params


def _trajectory(tx, dtype, steps=200, seed=0):
    """Parameters (as float32) after each of ``steps`` steps of least squares; gradients are
    computed in float32 from the (rounded) parameters and handed over in the parameters' dtype."""
    xs, ys, params = _problem(seed)

    def loss(p):
        p = jax.tree.map(lambda a: a.astype(jnp.float32), p)
        return jnp.mean((xs @ p["w"] + p["b"] - ys) ** 2)

    def step(carry, _):
        p, s = carry
        g = jax.tree.map(lambda gi, pi: gi.astype(pi.dtype), jax.grad(loss)(p), p)
        u, s = tx.update(g, s, p)
        p = optax.apply_updates(p, u)
        return (p, s), jax.tree.map(lambda a: a.astype(jnp.float32), p)

    p = jax.tree.map(lambda a: a.astype(dtype), params)
    (p, s), history = jax.jit(lambda p, s: jax.lax.scan(step, (p, s), None, length=steps))(p, tx.init(p))
    return history, s


def _worst_relative(history, reference):
    """max over steps of max|X_t - X32_t| / max|X32_t| (over all leaves), and its parts."""
    leaves = zip(jax.tree.leaves(history), jax.tree.leaves(reference))
    err = np.max([np.max(np.abs(a - b), axis=tuple(range(1, a.ndim))) for a, b in leaves], axis=0)
    scale = np.max([np.max(np.abs(b), axis=tuple(range(1, b.ndim))) for b in jax.tree.leaves(reference)], axis=0)
    return float(np.max(err / scale)), err, scale


MIXED = {
    "adagrad": lambda sd: optkit.adagrad(0.1, accumulator_dtype=sd),
    "adam": lambda sd: optkit.adam(1e-2, mu_dtype=sd, nu_dtype=sd),
    "momentum": lambda sd: optkit.momentum(1e-2, 0.9, accumulator_dtype=sd),
    "adafactor": lambda sd: optkit.adafactor(1e-2, multiply_by_parameter_scale=False, nu_dtype=sd, mu_dtype=sd),
    "adafactor-relative-step": lambda sd: optkit.adafactor(nu_dtype=sd),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(MIXED))
def test_16bit_params_with_float32_state_follow_the_float32_run(name, dtype):
    reference, _ = _trajectory(MIXED[name](jnp.float32), jnp.float32)
    history, state = _trajectory(MIXED[name](jnp.float32), dtype)
    assert all(leaf.dtype in (jnp.float32, jnp.int32) for leaf in jax.tree.leaves(state))
    worst, err, scale = _worst_relative(history, reference)
    tolerance = 32 * float(jnp.finfo(dtype).eps)  # README "Precision": bfloat16 0.25, float16 0.031
    assert np.all(np.isfinite(err)) and worst <= tolerance, (name, worst, tolerance)
    # and the run does move: the tolerance is far below the distance travelled
    travelled = max(float(np.max(np.abs(b[-1] - b[0]))) for b in jax.tree.leaves(reference))
    assert travelled > 2 * tolerance * float(np.max(scale))


# ---------------------------------------------------------------------------
# float16 state: overflow, measured where optkit really overflows


def _run_constant(tx, grads, params):
    """Apply the list of gradients; return (updates per step as float32, final state)."""
    state = tx.init(params)

    def step(s, g):
        u, s = tx.update(g, s, params)
        return s, jax.tree.map(lambda a: a.astype(jnp.float32), u)

    state, updates = jax.jit(lambda s, gs: jax.lax.scan(step, s, gs))(state, grads)
    return updates, state


def _state_finite(state):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(state)
               if jnp.issubdtype(leaf.dtype, jnp.floating))


def _spike(value, steps=3, shape=(4,)):
    """One gradient of ``value`` then ones, in float16."""
    g = np.ones((steps, *shape), np.float32)
    g[0] = value
    return jnp.asarray(g, jnp.float16)


@pytest.mark.parametrize("name, tx16, tx32, below, above, after", [
    # H_1 = G^2 in float16: the largest float16 is 65504 (65520 rounds to inf): |G| = 256
    ("adagrad", lambda: optkit.adagrad(0.1), lambda: optkit.adagrad(0.1, accumulator_dtype=jnp.float32),
     255.9, 256.0, 0.0),
    # V_1 = (1 - b2) G^2: sqrt(65520 / 0.001) = 8094.4, not 256 (8092 and 8096 are float16 numbers)
    ("adam", lambda: optkit.adam(1e-3), lambda: optkit.adam(1e-3, nu_dtype=jnp.float32), 8092.0, 8096.0, 0.0),
    # the row and column means of G^2 (b2_1 = 0): |G| = 256 over the whole matrix
    ("adafactor", lambda: optkit.adafactor(), lambda: optkit.adafactor(nu_dtype=jnp.float32), 255.9, 256.0,
     np.nan),
])
def test_float16_state_overflows_at_a_single_gradient_and_float32_state_survives(
        name, tx16, tx32, below, above, after):
    shape = (2, 4)
    params = jnp.zeros(shape, jnp.float16)
    for value, overflows in ((below, False), (above, True)):
        updates, state = _run_constant(tx16(), _spike(value, shape=shape), params)
        assert _state_finite(state) is not overflows, (name, value)
        if overflows:
            # afterwards: Adagrad and Adam silently freeze (G / inf = 0), Adafactor gives NaN
            np.testing.assert_array_equal(np.asarray(updates[-1]), np.full(shape, after), err_msg=name)
    # float32 state: the same spike, and 2.5 times larger, pass; later steps still move
    for value in (above, 2.5 * above):
        updates, state = _run_constant(tx32(), _spike(value, shape=shape), params)
        assert _state_finite(state) and np.all(np.isfinite(np.asarray(updates)))
        assert np.all(np.asarray(updates[-1]) != 0)


def test_float16_adam_state_overflows_at_sustained_gradients_near_256():
    """V_t = (1 - b2^t) G^2 for a constant G: |G| = 1000 overflows float16 at step 68."""
    params = jnp.zeros(3, jnp.float16)
    grads = jnp.full((80, 3), 1000.0, jnp.float16)
    updates16, state16 = _run_constant(optkit.adam(1e-3), grads, params)
    t_overflow = int(np.ceil(np.log(1 - 65520 / 1e6) / np.log(0.999)))  # 68
    assert not _state_finite(state16)
    assert np.all(np.asarray(updates16[t_overflow - 2]) != 0) and np.all(np.asarray(updates16[t_overflow:]) == 0)
    updates32, state32 = _run_constant(optkit.adam(1e-3, nu_dtype=jnp.float32), grads, params)
    assert _state_finite(state32)
    np.testing.assert_allclose(np.asarray(updates32[-1]), -1e-3, rtol=1e-2)  # Adam's step of constant G


def test_float16_momentum_state_and_update_overflow_at_65520_times_1_minus_alpha():
    """V -> G / (1 - alpha): |G| = 7000 passes 65504 at step 27 (alpha = 0.9). float32 state keeps V;
    optkit.momentum scales it by the learning rate before the update is cast to the float16 gradients'
    dtype, so its updates stay finite, while scale_by_onnx_momentum's direction (V itself, in the
    gradients' dtype) overflows float16; float32 gradients (updates are float32) survive both."""
    params = jnp.zeros(3, jnp.float16)
    grads = jnp.full((30, 3), 7000.0, jnp.float16)
    _, state16 = _run_constant(optkit.momentum(1e-3), grads, params)
    assert not _state_finite(state16)
    updates, state32 = _run_constant(optkit.momentum(1e-3, accumulator_dtype=jnp.float32), grads, params)
    assert _state_finite(state32) and np.all(np.isfinite(np.asarray(updates[-1])))
    direction = optax.chain(optkit.scale_by_onnx_momentum(accumulator_dtype=jnp.float32),
                            optax.scale_by_learning_rate(1e-3))
    updates, state32 = _run_constant(direction, grads, params)
    assert _state_finite(state32) and not np.all(np.isfinite(np.asarray(updates[-1])))
    updates, _ = _run_constant(optkit.momentum(1e-3, accumulator_dtype=jnp.float32), grads.astype(jnp.float32), params)
    assert np.all(np.isfinite(np.asarray(updates))) and np.asarray(updates).dtype == np.float32
    assert np.all((params + updates[-1].astype(jnp.float16)) < 0)


# ---------------------------------------------------------------------------
# 16-bit state: underflow and stalls


def _last_ratio(tx16, tx32, value, steps, dtype):
    params = jnp.zeros(3, dtype)
    grads = jnp.full((steps, 3), value, dtype)
    u16, _ = _run_constant(tx16, grads, params)
    u32, _ = _run_constant(tx32, grads, params)
    return float(u16[-1, 0] / u32[-1, 0])


def test_float16_second_moments_underflow_and_steps_grow():
    """(1 - b2) G^2 below half the smallest float16 (2^-25) is stored as 0: Adam's V stays 0 for
    |G| < 5.5e-3 and the step is sqrt((1 - b2^t) / (1 - b2)) too large (13.4 at t = 200).
    Adagrad's H stays 0 for |G| < 1.7e-4: the step is sqrt(t) too large (14.1 at t = 200)."""
    ratio = _last_ratio(optkit.adam(1e-3), optkit.adam(1e-3, nu_dtype=jnp.float32), 1e-3, 200, jnp.float16)
    np.testing.assert_allclose(ratio, np.sqrt((1 - 0.999**200) / 0.001), rtol=0.01)
    ratio = _last_ratio(optkit.adagrad(0.1), optkit.adagrad(0.1, accumulator_dtype=jnp.float32), 1e-4, 200, jnp.float16)
    np.testing.assert_allclose(ratio, np.sqrt(200), rtol=0.02)
    # above the underflow, float16 state is accurate to its rounding
    ratio = _last_ratio(optkit.adam(1e-3), optkit.adam(1e-3, nu_dtype=jnp.float32), 0.05, 200, jnp.float16)
    np.testing.assert_allclose(ratio, 1.0, rtol=0.01)


def test_bfloat16_second_moments_stall():
    """bfloat16 has float32's range but 8 bits: Adagrad's H + 1 rounds back to 256 from H = 256,
    so after 1000 steps of G = 1 its step is sqrt(1000 / 256) = 1.98 times too large; Adam's V
    (b2 = 0.999) stalls below G^2 too. float32 state (accumulator_dtype, nu_dtype) does not."""
    ratio = _last_ratio(optkit.adagrad(0.1), optkit.adagrad(0.1, accumulator_dtype=jnp.float32), 1.0, 1000,
                        jnp.bfloat16)
    np.testing.assert_allclose(ratio, np.sqrt(1000 / 256), rtol=0.02)
    ratio = _last_ratio(optkit.adam(1e-3), optkit.adam(1e-3, nu_dtype=jnp.float32), 1.0, 3000, jnp.bfloat16)
    assert ratio > 1.5


def test_float16_adam_state_leaves_the_float32_run_on_the_same_problem():
    """The same least-squares run with Adam's moments in float16 (the default for float16
    parameters): once the gradients shrink below the underflow, V is 0 and the steps are too
    large; the run departs from float32's by far more than the tolerance above."""
    reference, _ = _trajectory(MIXED["adam"](jnp.float32), jnp.float32)
    history, _ = _trajectory(MIXED["adam"](None), jnp.float16)
    worst, _, _ = _worst_relative(history, reference)
    assert worst > 100 * 32 * float(jnp.finfo(jnp.float16).eps)
