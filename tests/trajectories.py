"""Shared by the per-algorithm test modules: a gradient sequence over a small tree, the optimizer run
and the oracle run over it, closeness in float32 and float64, and random tensors for the spec ops."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def _random_tensors(rng, shapes, dtype, positive=False):
    out = []
    for shape in shapes:
        a = rng.standard_normal(shape)
        out.append(np.abs(a).astype(dtype) if positive else a.astype(dtype))
    return out


SHAPES_OPS = [(3,), (2, 4), (), (1, 2, 3)]


def check_trajectory(make_tx, oracle_leaf, init_moments, state_fields, dtype, variant):
    """The trajectory test every element-wise optimizer shares: ``make_tx()`` over :data:`STEPS` steps
    against the spec's NumPy transcription, parameters and every state field.

    ``oracle_leaf(x, g, moments, t) -> (x_new, moments_new)`` is one float64 step of the spec for one
    leaf (``t`` the updates already made, ``moments`` a tuple); ``init_moments(p)`` the starting moments
    (a tuple); ``state_fields`` the names of the moments in the optimizer's state, in that order.
    """
    want, want_state = _run_oracle(oracle_leaf, init_moments)
    got, state = _with_dtype(dtype, lambda: _run_optkit(make_tx(), dtype, variant))
    _assert_close(got, want, dtype)
    for i, field in enumerate(state_fields):
        _assert_close(getattr(state[0], field), {k: v[i] for k, v in want_state.items()}, dtype)
    assert int(state[0].count) == STEPS
    assert all(v.dtype == dtype for v in jax.tree.leaves(got))


def check_spec_operator(variant, op, oracle, tensors, scalars=()):
    """A spec operator over the :data:`SHAPES_OPS` tensors in float64 (jitted or not, by ``variant``)
    against its NumPy transcription applied tensor by tensor, to 1e-13.

    ``op(*scalars, *tensors)`` returns the output trees (lists over the shapes); ``oracle(*scalars,
    *one_tensor_each)`` one tuple of arrays per tensor.
    """
    with jax.enable_x64(True):
        outs = variant(op)(*scalars, *tensors)
    for i, shape in enumerate(SHAPES_OPS):
        want = oracle(*scalars, *(t[i] for t in tensors))
        for got, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(got[i], w, rtol=1e-13, atol=1e-14)
            assert np.asarray(got[i]).dtype == np.float64 and np.shape(got[i]) == shape
