"""The machinery of the element-wise optimizers (SPEC 1-4), written once.

Adagrad, Adam and Momentum are each one per-leaf formula, written in their
modules as their specs write them. This module turns such a formula into the
two forms optkit offers:

- :func:`spec_operator`: the spec's own operator (``optkit.ops``), with its
  inputs and outputs: several tensors at once, each output in its input's
  dtype, ``X_new = X + update``;
- :func:`transformation`: an ``optax.GradientTransformation`` whose state is
  the step ``count`` and one moment tree per state field, sharded like the
  parameters (:mod:`optkit._src.sharding`).

The formula's contract. ``leaf(x, g, *moments, r=..., scale=..., eps=..., **hyperparameters)``
gets every tensor in the leaf's compute dtype (at least float32,
:func:`~optkit._src.numerics.compute_dtype`) and returns ``(update,
*new_moments)`` with ``update = X_new - X = r * step * scale``, ``step`` being
the formula's direction (``G_reg / (sqrt(H_new) + eps)`` for Adagrad). ``r``
is the spec's step scalar and ``scale`` a scalar in the compute dtype: the
spec operators fold the spec's learning rate into ``r`` (as ONNX's ``r`` and
``r_adj`` do), negated, and pass ``scale = +1``; a transformation passes ``r`` without
the learning rate and ``scale = -learning_rate`` (its value at ``count``, for
a schedule), or ``scale = +1`` for the ``scale_by_*`` direction that
``optax.scale_by_learning_rate`` will scale. Negating ``r`` and multiplying
by ``+1`` are exact, so the forms round as the formula does. ``x`` is None when no term needs
the parameters; a coefficient that is off (None, or known to be 0) reaches
the formula as None; a formula with an epsilon calls it ``eps``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike

from optkit._src import hyperparams, sharding, trees
from optkit._src.numerics import compute_dtype, is_concrete_zero, map_leaves, per_dtype

__all__ = ["spec_operator", "transformation", "coefficient"]

Leaf = Callable[..., tuple[jax.Array, ...]]
Scalars = Callable[[np.dtype], Mapping[str, Any]]


def coefficient(value: Any) -> Any:
    """A spec operator's coefficient as the formula takes it: None when known to be 0 (no term)."""
    return None if value is None or is_concrete_zero(value) else value


def _scale(learning_rate: Any, dtype: np.dtype) -> jax.Array:
    """A transformation's ``scale``: ``-learning_rate`` in ``dtype``, or ``+1`` for None (the direction)."""
    return jnp.ones([], dtype) if learning_rate is None else -jnp.asarray(learning_rate, dtype)


def spec_operator(leaf: Leaf, X: Any, G: Any, moments: Sequence[Any], *, scalars: Scalars,
                  **hyperparameters: Any) -> tuple[Any, ...]:
    """``(X_new, *new_moments)`` of a spec operator over trees shaped like ``X`` (``r`` negated).

    Args:
      leaf: the per-leaf formula (see the module docstring).
      X, G: the parameters and their gradients (checked by the caller).
      moments: the state tensors, each a tree shaped like ``X``.
      scalars: ``dtype -> {"r": ..., other step scalars}``, with the spec's
        learning rate folded into ``r``; called once per dtype.
      hyperparameters: passed to ``leaf`` as they are.

    Returns:
      A tuple of trees with ``X``'s structure: ``X_new``, then the new moments,
      every leaf in its input's dtype.
    """
    def descending(dtype):  # r negated (exact), scale +1
        step = dict(scalars(dtype))
        return {**step, "r": -step["r"], "scale": jnp.ones([], dtype)}

    step_scalars = per_dtype(descending)

    def per_leaf(x, g, *ms):
        dtype = compute_dtype(x.dtype, g.dtype, *(m.dtype for m in ms))
        x_c = x.astype(dtype)
        update, *new = leaf(x_c, g.astype(dtype), *(m.astype(dtype) for m in ms), **step_scalars(dtype),
                            **hyperparameters)
        return ((x_c + update).astype(x.dtype), *(n.astype(m.dtype) for n, m in zip(new, ms)))

    return map_leaves(per_leaf, 1 + len(moments), X, G, *moments)


def transformation(
    name: str,
    leaf: Leaf,
    state_type: type[NamedTuple],
    *,
    moments: Sequence[tuple[Any, DTypeLike | None]],
    scalars: Callable[[jax.Array, np.dtype], Mapping[str, Any]],
    learning_rate: optax.ScalarOrSchedule | None = None,
    coefficients: Mapping[str, Any] | None = None,
    **hyperparameters: Any,
) -> optax.GradientTransformation:
    """An Optax transformation that applies ``leaf`` to every parameter.

    Args:
      name: the transformation's name, in error messages.
      leaf: the per-leaf formula (see the module docstring).
      state_type: a NamedTuple ``(count, *moments)``.
      moments: ``(initial value, dtype or None for the parameter's)`` of each
        moment field of ``state_type``, in order.
      scalars: ``(count, dtype) -> {"r": ..., other step scalars}``, ``count``
        being the number of updates already made; called once per dtype.
      learning_rate: None for the direction before the learning rate (the
        ``scale_by_*`` form); else a float or an Optax schedule (called with
        ``count``), and the update is ``X_new - X``.
      coefficients: the hyperparameters that scale a term of ``X`` (ONNX's
        norm coefficients); one that is on makes ``update`` need ``params``.
      hyperparameters: passed to ``leaf`` as they are.

    Returns:
      The transformation; updates have the gradients' dtypes.
    """
    coefficients = dict(coefficients or {})
    reasons = [hyperparams.params_needed_for(k, v) for k, v in coefficients.items()]
    params_reason = next((r for r in reasons if r is not None), None)
    terms = {k: (None if r is None else v) for (k, v), r in zip(coefficients.items(), reasons)}
    fields = state_type._fields[1:]

    def init_fn(params):
        trees.check_floating(params, "params")
        return state_type(jnp.zeros([], jnp.int32), *(
            jax.tree.map(lambda p, v=value, d=dtype: sharding.full_like(p, v, dtype=d), params)
            for value, dtype in moments))

    def update_fn(updates, state, params=None):
        state = trees.check_state(state, state_type, name)
        hyperparams.check_count(state.count, name)
        old = [getattr(state, field) for field in fields]
        trees.check_update_inputs(name, updates, {f"state.{f}": m for f, m in zip(fields, old)}, params,
                                  params_reason)
        rate = learning_rate(state.count) if callable(learning_rate) else learning_rate
        step = per_dtype(lambda dtype: {**scalars(state.count, dtype), "scale": _scale(rate, dtype)})

        def per_leaf(g, *ms_and_x):
            *ms, x = ms_and_x
            dtype = compute_dtype(g.dtype, *(m.dtype for m in ms), None if x is None else x.dtype)
            update, *new = leaf(None if x is None else x.astype(dtype), g.astype(dtype),
                                *(m.astype(dtype) for m in ms), **step(dtype), **terms, **hyperparameters)
            return (update.astype(g.dtype), *(n.astype(m.dtype) for n, m in zip(new, ms)))

        new_updates, *new_moments = map_leaves(per_leaf, 1 + len(old), updates, *old,
                                               params if params_reason is not None else None)
        return new_updates, state_type(optax.safe_increment(state.count), *new_moments)

    return optax.GradientTransformation(init_fn, update_fn)
