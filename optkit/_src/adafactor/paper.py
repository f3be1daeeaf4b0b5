"""Adafactor for one tensor, written as Shazeer & Stern (2018) write it (SPEC.md section 5).

:func:`adafactor_leaf` is the definition a reader can hold beside SPEC 5 and
the paper's Algorithms 4 and 5; :mod:`optkit._src.adafactor.fast` computes the
same numbers in fewer passes over memory, and the tests hold the two equal.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from optkit._src.adafactor.state import FactoredSecondMoment, FullSecondMoment

__all__ = ["adafactor_leaf"]


def _rms(a: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(a * a))


def adafactor_leaf(g: jax.Array, x: jax.Array, nu: FactoredSecondMoment | FullSecondMoment, m: jax.Array | None, *,
                   axes: tuple[int, int] | None, b2: Any, rho: Any, eps1: Any, eps2: Any, d: Any | None,
                   multiply_by_parameter_scale: bool = True, b1: Any | None = None,
                   weight_decay_rate: Any | None = None) -> tuple[jax.Array, Any, jax.Array | None]:
    """SPEC 5, one step of one tensor: ``(X_t, new statistics, new first moment)``.

    Args:
      g, x: ``G_t`` and ``X_{t-1}``, in the dtype to compute in.
      nu: the statistics ``R_{t-1}, C_{t-1}`` (as means, ``v_row``/``v_col``) or ``V_{t-1}``.
      m: the first moment, with ``b1``.
      axes: ``(row axis, column axis)`` of a factored tensor, None for a full second moment.
      b2, rho: the step's ``b2_t`` and ``rho_t`` (or learning rate).
      eps1, eps2, d: ``epsilon_1``, ``epsilon_2`` and the clipping threshold (None: no clipping).
      multiply_by_parameter_scale, b1, weight_decay_rate: the options of SPEC 5.

    Returns:
      ``X_t``, the new statistics node, and the new first moment (None without ``b1``).
    """
    g2 = g * g + eps1
    if axes is None:
        v = b2 * nu.v + (1 - b2) * g2                                                 # V_t
        new_nu: Any = FullSecondMoment(v)
    else:
        row, col = axes
        r = b2 * nu.v_row + (1 - b2) * jnp.mean(g2, axis=col)                         # R_t (a mean over columns)
        c = b2 * nu.v_col + (1 - b2) * jnp.mean(g2, axis=row)                         # C_t (a mean over rows)
        mean_r = jnp.mean(r, axis=row if row < col else row - 1, keepdims=True)      # 1_n^T R_t / n
        v = jnp.expand_dims(r, col) * jnp.expand_dims(c, row) / jnp.expand_dims(mean_r, col)   # R_t C_t / 1^T R_t
        new_nu = FactoredSecondMoment(r, c)
    u = jnp.where(v == 0, 0.0, g / jnp.sqrt(jnp.where(v == 0, 1.0, v)))                 # U_t = G_t / sqrt(V_t)
    if d is not None:
        u = u / jnp.maximum(1.0, _rms(u) / d)                                         # U_t / max(1, RMS(U_t) / d)
    alpha = rho * jnp.maximum(eps2, _rms(x)) if multiply_by_parameter_scale else rho  # alpha_t
    update = alpha * u
    new_m = None
    if b1 is not None:
        update = new_m = b1 * m + (1 - b1) * update                                   # M_t
    if weight_decay_rate is not None:
        update = update + weight_decay_rate * alpha * x
    return x - update, new_nu, new_m                                                  # X_t
