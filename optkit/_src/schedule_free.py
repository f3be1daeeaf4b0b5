"""Schedule-free AdamW exactly as ``schedulefree.AdamWScheduleFree`` (1.4.1) computes it (SPEC.md section 9).

SPEC 9, with ``k`` the updates already made, ``y`` the training-mode parameters (what the model is trained at),
``z`` the base sequence and ``v`` the second moment, every leaf::

    sched  = (k + 1) / warmup_steps if k < warmup_steps else 1
    lr     = learning_rate * sched;   lr_max = max(lr_max, lr)
    weight = (k + 1)^r * lr_max^weight_lr_power;   weight_sum += weight;   c = weight / weight_sum (0 if 0/0)
    v      = b2 * v + (1 - b2) * g^2
    g_n    = g / (sqrt(v / (1 - b2^(k+1))) + eps) + weight_decay * y
    y_new  = y + c * (z - y) + lr * (b1 * (1 - c) - 1) * g_n
    z_new  = z - lr * g_n
    eval:  x = y + (1 - 1 / b1) * (z - y)                 (optimizer.eval())
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optkit._src import hyperparams, sharding, trees
from optkit._src.numerics import compute_dtype, map_leaves

__all__ = ["ScheduleFreeAdamWState", "schedule_free_adamw", "schedule_free_eval_params"]


class ScheduleFreeAdamWState(NamedTuple):
    """State of :func:`schedule_free_adamw`.

    Attributes:
      count: int32 scalar, the updates made so far (the reference's ``k``).
      b1: the interpolation ``b1`` (kept so that :func:`schedule_free_eval_params` needs only the state).
      weight_sum: the sum of the steps' weights (the reference's ``weight_sum``), a float scalar.
      lr_max: the largest learning rate used so far (the reference's ``lr_max``; 0 before the first step).
      z: the base sequence (the reference's ``state["z"]``), one leaf per parameter, in its dtype.
      nu: the second moments (the reference's ``exp_avg_sq``), one leaf per parameter, in its dtype.
    """

    count: jax.Array
    b1: jax.Array
    weight_sum: jax.Array
    lr_max: jax.Array
    z: optax.Params
    nu: optax.Updates


def _scalar_dtype(params: Any) -> Any:
    """The scalars' dtype: float64 where some parameter is float64 (JAX's 64-bit mode), else float32."""
    return compute_dtype(*(jnp.result_type(leaf) for leaf in jax.tree.leaves(params)))


def schedule_free_adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    warmup_steps: int = 0,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
) -> optax.GradientTransformation:
    """Schedule-free AdamW (Defazio et al., 2024) exactly as ``schedulefree.AdamWScheduleFree`` 1.4.1 (SPEC.md 9).

    The parameters this updates are the reference's *training-mode* parameters ``y`` (where gradients are
    taken); :func:`schedule_free_eval_params` gives what ``optimizer.eval()`` puts in the model, to evaluate or
    save. Its arguments have ``optax.contrib.schedule_free_adamw``'s names, so the two swap; they differ in
    ``r`` (Optax has none), in holding ``y`` rather than recomputing it from ``z`` and ``x`` (Optax divides by
    ``b1``), and in ``warmup_steps=0`` meaning none: the docs page "Muon, schedule-free AdamW and 8-bit Adam"
    tables it.

    Args:
      learning_rate: the reference's ``lr``, >= 0: a float or an Optax schedule (called with the count; the
        warmup multiplies it).
      b1: the interpolation between ``z`` and the average, in (0, 1) (the reference's ``betas[0]``).
      b2: the second moment's decay, in [0, 1).
      eps: added to the root of the second moment, >= 0.
      weight_decay: decoupled at ``y`` (added to the normalized gradient), >= 0.
      warmup_steps: linear warmup over this many steps (an int, >= 0; 0: none).
      r: the weights' polynomial power in the step, >= 0 (the reference's ``r``).
      weight_lr_power: the weights' power of the largest learning rate so far, >= 0.

    Returns:
      An ``optax.GradientTransformation`` whose state is ``(ScheduleFreeAdamWState,)``; ``update`` needs
      ``params`` (``y`` enters every step). Every numeric argument works under ``optax.inject_hyperparams``;
      on sharded parameters ``z`` and ``nu`` are sharded like them.

    Raises:
      ValueError: a hyperparameter out of range; ``params=None`` at update.
      TypeError: non-floating leaves, a non-integer ``warmup_steps``.

    Example (train at ``y``, evaluate at ``x``):
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optkit.schedule_free_adamw(0.01, warmup_steps=10)
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> state = tx.init(params)
      >>> updates, state = tx.update({"w": jnp.array([0.5, 0.5])}, state, params)
      >>> params = optax.apply_updates(params, updates)
      >>> eval_params = optkit.schedule_free_eval_params(state, params)
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    hyperparams.check_scalar("b1", b1, low=0.0, high=1.0, low_open=True, high_open=True)
    hyperparams.check_scalar("b2", b2, low=0.0, high=1.0, high_open=True)
    hyperparams.check_scalar("eps", eps, low=0.0)
    hyperparams.check_scalar("weight_decay", weight_decay, low=0.0)
    hyperparams.check_scalar("r", r, low=0.0)
    hyperparams.check_scalar("weight_lr_power", weight_lr_power, low=0.0)
    hyperparams.check_step_count("warmup_steps", warmup_steps)

    def init_fn(params):
        trees.check_floating(params, "params")
        dtype = _scalar_dtype(params)
        return ScheduleFreeAdamWState(
            jnp.zeros([], jnp.int32), jnp.asarray(b1, dtype), jnp.zeros([], dtype), jnp.zeros([], dtype),
            jax.tree.map(lambda p: sharding.full_like(p, 0) + p, params),
            jax.tree.map(lambda p: sharding.full_like(p, 0), params))

    def update_fn(updates, state, params=None):
        state = trees.check_state(state, ScheduleFreeAdamWState, "schedule_free_adamw")
        hyperparams.check_count(state.count, "schedule_free_adamw")
        trees.check_update_inputs("schedule_free_adamw", updates, {"state.z": state.z, "state.nu": state.nu},
                                  params, "y (the training-mode parameters)")
        dtype = state.weight_sum.dtype
        k = state.count.astype(dtype)
        warmup = jnp.asarray(warmup_steps, dtype)
        sched = jnp.where(k < warmup, (k + 1) / jnp.maximum(warmup, 1), 1)
        base = learning_rate(state.count) if callable(learning_rate) else learning_rate
        lr = jnp.asarray(base, dtype) * sched
        lr_max = jnp.maximum(state.lr_max, lr)
        weight = (k + 1) ** jnp.asarray(r, dtype) * lr_max ** jnp.asarray(weight_lr_power, dtype)
        weight_sum = state.weight_sum + weight
        c = jnp.where(weight_sum > 0, weight / jnp.where(weight_sum > 0, weight_sum, 1), 0)
        beta1, beta2 = jnp.asarray(b1, dtype), jnp.asarray(b2, dtype)
        correction = 1 - beta2 ** (k + 1)

        def per_leaf(g, y, z, v):
            leaf = compute_dtype(g.dtype, y.dtype, z.dtype, v.dtype)
            g, y_c, z_c, v_c = (a.astype(leaf) for a in (g, y, z, v))
            v_new = v_c * beta2.astype(leaf) + (1 - beta2.astype(leaf)) * g * g
            normalized = g / (jnp.sqrt(v_new / correction.astype(leaf)) + jnp.asarray(eps, leaf))
            normalized = normalized + jnp.asarray(weight_decay, leaf) * y_c
            c_l, lr_l = c.astype(leaf), lr.astype(leaf)
            y_new = y_c + c_l * (z_c - y_c)
            y_new = y_new + lr_l * (beta1.astype(leaf) * (1 - c_l) - 1) * normalized
            z_new = z_c - lr_l * normalized
            return (y_new - y_c).astype(y.dtype), z_new.astype(z.dtype), v_new.astype(v.dtype)

        new_updates, z, nu = map_leaves(per_leaf, 3, updates, params, state.z, state.nu)
        return new_updates, ScheduleFreeAdamWState(optax.safe_increment(state.count), state.b1, weight_sum, lr_max,
                                                   z, nu)

    return optax.chain(optax.GradientTransformation(init_fn, update_fn))


def _find_state(state: Any) -> ScheduleFreeAdamWState:
    found = [s for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, ScheduleFreeAdamWState))
             if isinstance(s, ScheduleFreeAdamWState)]
    if len(found) != 1:
        raise ValueError(f"schedule_free_eval_params: state must hold one ScheduleFreeAdamWState (the state of "
                         f"optkit.schedule_free_adamw, alone or inside optax.chain, inject_hyperparams or "
                         f"nnx.Optimizer's opt_state), found {len(found)}")
    return found[0]


def schedule_free_eval_params(state: Any, params: optax.Params) -> optax.Params:
    """The parameters to evaluate or save: what ``AdamWScheduleFree.eval()`` puts in the model (SPEC.md 9).

    ``x = y + (1 - 1 / b1) * (z - y)`` for every leaf, with ``y = params`` (the training-mode parameters that
    :func:`schedule_free_adamw` updates) and ``z`` from the state. Nothing is modified: training goes on from
    ``params`` as they are (the reference's ``train()`` would recompute ``y`` from ``x``, which is not exact in
    floating point).

    Args:
      state: the state of :func:`schedule_free_adamw`, or any state holding exactly one (an ``optax.chain``'s,
        ``inject_hyperparams``', an ``nnx.Optimizer``'s ``opt_state``).
      params: the training-mode parameters, with the structure and shapes of the state's ``z`` (Flax boxes
        such as ``nnx.Param`` are kept around the results).

    Returns:
      A tree like ``params`` of the evaluation parameters, each leaf in its parameter's dtype.

    Raises:
      ValueError: ``state`` holds no, or several, schedule-free states; ``params`` does not match ``z``.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> tx = optkit.schedule_free_adamw(0.1)
      >>> state = tx.init({"w": jnp.zeros(2)})
      >>> optkit.schedule_free_eval_params(state, {"w": jnp.ones(2)})["w"]  # 1 + (1 - 1/0.9) * (0 - 1)
      Array([1.111..., 1.111...], dtype=float32)
    """
    found = _find_state(state)
    ys = sharding.leaves_with_paths(params)
    zs = sharding.leaves_with_paths(found.z)
    trees.check_same_paths([trees.keystr(p) for p, _ in ys], [trees.keystr(p) for p, _ in zs], "params",
                           "the state's z")
    b1 = sharding.unbox(found.b1)
    values = iter([_eval_leaf(jnp.asarray(y), jnp.asarray(sharding.unbox(z)), b1) for (_, y), (_, z) in zip(ys, zs)])
    return jax.tree.map(lambda leaf: sharding.rebox(leaf, next(values)) if sharding.is_box(leaf) else next(values),
                        params, is_leaf=sharding.is_box)


def _eval_leaf(y: jax.Array, z: jax.Array, b1: Any) -> jax.Array:
    if y.shape != z.shape:
        raise ValueError(f"schedule_free_eval_params: params leaf of shape {y.shape} against z of shape {z.shape}")
    dtype = compute_dtype(y.dtype, z.dtype)
    y_c, z_c = y.astype(dtype), z.astype(dtype)
    return (y_c + (1 - 1 / jnp.asarray(b1, dtype)) * (z_c - y_c)).astype(y.dtype)
