"""Momentum exactly as ONNX ``ai.onnx.preview.training::Momentum`` defines it (SPEC.md section 4).

SPEC 4, for one tensor, with ``T`` the number of updates already made::

    G_reg    = norm_coefficient * X + G
    beta_adj = beta if T > 0 else 1
    V_new    = alpha * V + beta_adj * G_reg
    standard: X_new = X - R * V_new
    nesterov: X_new = X - R * (G_reg + alpha * V_new)

:func:`_momentum_leaf` is that formula, once; :func:`_beta_adj` is the step's
scalar. The spec operator :func:`onnx_momentum` scales the direction by ``R``
and subtracts; the Optax transformation :func:`scale_by_onnx_momentum` returns
the direction and leaves ``R`` to ``optax.scale_by_learning_rate``
(:func:`momentum`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optkit._src import checks, sharding
from optkit._src.numerics import compute_dtype, map_leaves, per_dtype

__all__ = ["ScaleByOnnxMomentumState", "OnnxMomentumOutputs", "onnx_momentum", "scale_by_onnx_momentum", "momentum"]

MODES = ("standard", "nesterov")  # ONNX Momentum's ``mode``: ``nesterov=False`` / ``True``


# ---------------------------------------------------------------------------
# The formula


def _beta_adj(T: Any, beta: Any, dtype: Any) -> jax.Array:
    """``beta if T > 0 else 1`` in ``dtype`` (SPEC 4: the first update uses the whole gradient)."""
    return jnp.where(jnp.asarray(T) > 0, jnp.asarray(beta, dtype), jnp.ones([], dtype))


def _momentum_leaf(g, v, x, *, rate, alpha, beta_adj, nesterov, norm_coefficient, dtype):
    """SPEC 4 for one tensor: ``(rate * direction, V_new)`` in ``dtype``.

    ``direction`` is ``V_new`` (standard) or ``G_reg + alpha * V_new``
    (nesterov); ``x`` is the parameter, or None when ``norm_coefficient`` is
    known to be 0; ``rate`` is the step's scalar, or None for 1.
    """
    g = g.astype(dtype)
    g_reg = g if x is None else norm_coefficient * x.astype(dtype) + g
    v_new = alpha * v.astype(dtype) + beta_adj * g_reg
    direction = g_reg + alpha * v_new if nesterov else v_new
    return (direction if rate is None else rate * direction), v_new


# ---------------------------------------------------------------------------
# The spec operator


class OnnxMomentumOutputs(NamedTuple):
    """Outputs of :func:`onnx_momentum`: all ``X_new``, then all ``V_new``."""

    X_new: Any
    V_new: Any


def onnx_momentum(
    R: Any,
    T: Any,
    X: Any,
    G: Any,
    V: Any,
    *,
    alpha: float,
    beta: float,
    mode: str,
    norm_coefficient: float,
) -> OnnxMomentumOutputs:
    """ONNX ``ai.onnx.preview.training::Momentum`` (version 1), several tensors at once.

    Computes, for every tensor (SPEC.md section 4)::

        G_reg    = norm_coefficient * X + G
        beta_adj = beta if T > 0 else 1
        V_new    = alpha * V + beta_adj * G_reg
        standard: X_new = X - R * V_new
        nesterov: X_new = X - R * (G_reg + alpha * V_new)

    All four attributes are required, as in the ONNX schema.

    Args:
      R: the learning rate, a float scalar, >= 0.
      T: the number of updates already made, an integer scalar (0 at the first update).
      X: the tensors to optimize; G: their gradients; V: their momenta (same
        pytree and shapes).
      alpha: ONNX ``alpha``, the momentum decay, >= 0.
      beta: ONNX ``beta``, the gradient's coefficient after the first step, >= 0.
      mode: ``"standard"`` or ``"nesterov"``.
      norm_coefficient: L2 coefficient added to the gradient, >= 0.

    Returns:
      ``OnnxMomentumOutputs(X_new, V_new)`` with ``X``'s structure, leaves in
      their inputs' dtypes.

    Raises:
      ValueError: an unknown ``mode``, and as :func:`onnx_adagrad`.
      TypeError: as :func:`onnx_adagrad`.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> X_new, V_new = optkit.ops.onnx_momentum(
      ...     jnp.float32(0.1), 0, [jnp.ones(2)], [jnp.ones(2)], [jnp.zeros(2)],
      ...     alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
    """
    checks.check_scalar("alpha", alpha, low=0.0)
    checks.check_scalar("beta", beta, low=0.0)
    checks.check_choice("mode", mode, MODES)
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0)
    R = checks.check_rate_scalar("R", R)
    T = checks.check_step_count("T", T)
    checks.check_tensors("X", X, G=G, V=V)
    use_x = not checks.is_concrete_zero(norm_coefficient)
    beta_adj = per_dtype(lambda dtype: _beta_adj(T, beta, dtype))

    def leaf(x, g, v):
        dtype = compute_dtype(x.dtype, g.dtype, v.dtype)
        step, v_new = _momentum_leaf(g, v, x if use_x else None, rate=R.astype(dtype), alpha=alpha,
                                     beta_adj=beta_adj(dtype), nesterov=mode == "nesterov",
                                     norm_coefficient=norm_coefficient, dtype=dtype)
        return (x.astype(dtype) - step).astype(x.dtype), v_new.astype(v.dtype)

    return OnnxMomentumOutputs(*map_leaves(leaf, 2, X, G, V))


# ---------------------------------------------------------------------------
# The Optax transformation


class ScaleByOnnxMomentumState(NamedTuple):
    """State of :func:`scale_by_onnx_momentum`.

    Attributes:
      count: int32 scalar, the number of updates made so far (ONNX's ``T``;
        0 at the first update, where ``beta`` is replaced by 1).
      trace: the momenta (ONNX's ``V``), in ``accumulator_dtype`` or each
        parameter's dtype.
    """

    count: jax.Array
    trace: optax.Updates


def scale_by_onnx_momentum(
    alpha: float = 0.9,
    beta: float = 1.0,
    *,
    nesterov: bool = False,
    norm_coefficient: float | None = None,
    accumulator_dtype: Any = None,
) -> optax.GradientTransformation:
    """ONNX Momentum's direction, before the learning rate (SPEC.md section 4).

    With ``T = count`` (0 at the first update)::

        G_reg    = norm_coefficient * X + G
        beta_adj = beta if T > 0 else 1
        V_new    = alpha * V + beta_adj * G_reg
        update   = V_new                       (standard)
        update   = G_reg + alpha * V_new       (nesterov)

    Args:
      alpha: ONNX ``alpha``, the decay of the momentum, >= 0.
      beta: ONNX ``beta``, the gradient's coefficient from the second update on, >= 0.
      nesterov: ONNX ``mode``: False for "standard", True for "nesterov".
      norm_coefficient: ONNX ``norm_coefficient``, >= 0, or None (default: no
        term, ONNX's 0.0). Unless it is None or 0, ``update`` needs ``params``;
        a value given to ``optax.inject_hyperparams`` (even 0.0) always needs them.
      accumulator_dtype: dtype of ``V``; None keeps each parameter's dtype.
        A float16 ``V`` overflows when ``|V|`` reaches 65520 (``V -> beta * G /
        (1 - alpha)``: a sustained ``|G| >= 6552`` for alpha = 0.9, beta = 1).
        The update is ``V`` itself, in the gradients' dtype, so float16
        gradients that large overflow it even with float32 state; pass
        float32 gradients then (README "Precision").

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByOnnxMomentumState`.

    Raises:
      ValueError: a negative hyperparameter (at construction); mismatched trees
        or ``params=None`` with ``norm_coefficient != 0`` (at update).
      TypeError: non-floating leaves, a non-bool ``nesterov``.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_onnx_momentum(0.9), optax.scale_by_learning_rate(0.1))
      >>> state = tx.init({"w": jnp.ones(3)})
    """
    checks.check_scalar("alpha", alpha, low=0.0)
    checks.check_scalar("beta", beta, low=0.0)
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0, allow_none=True)
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {nesterov!r}")
    accumulator_dtype = checks.check_dtype("accumulator_dtype", accumulator_dtype)
    params_reason = checks.params_needed_for("norm_coefficient", norm_coefficient)
    use_params = params_reason is not None

    def init_fn(params):
        checks.check_floating(params, "params")
        trace = sharding.tree_zeros_like(params, accumulator_dtype)
        return ScaleByOnnxMomentumState(count=jnp.zeros([], jnp.int32), trace=trace)

    def update_fn(updates, state, params=None):
        state = checks.check_state(state, ScaleByOnnxMomentumState, "scale_by_onnx_momentum")
        checks.check_count(state.count, "scale_by_onnx_momentum")
        checks.check_update_inputs(
            "scale_by_onnx_momentum", updates, {"state.trace": state.trace},
            params, params_reason,
        )
        beta_adj = per_dtype(lambda dtype: _beta_adj(state.count, beta, dtype))

        def leaf(g, v, x):
            dtype = compute_dtype(g.dtype, v.dtype, None if x is None else x.dtype)
            direction, v_new = _momentum_leaf(g, v, x, rate=None, alpha=alpha, beta_adj=beta_adj(dtype),
                                              nesterov=nesterov, norm_coefficient=norm_coefficient, dtype=dtype)
            return direction.astype(g.dtype), v_new.astype(v.dtype)

        new_updates, trace = map_leaves(
            leaf, 2, updates, state.trace, params if use_params else None
        )
        count = optax.safe_increment(state.count)
        return new_updates, ScaleByOnnxMomentumState(count=count, trace=trace)

    return optax.GradientTransformation(init_fn, update_fn)


def momentum(
    learning_rate: optax.ScalarOrSchedule,
    alpha: float = 0.9,
    beta: float = 1.0,
    *,
    nesterov: bool = False,
    norm_coefficient: float | None = None,
    accumulator_dtype: Any = None,
) -> optax.GradientTransformation:
    """Momentum exactly as ONNX ``ai.onnx.preview.training::Momentum`` (version 1) defines it.

    ``optax.apply_updates(X, updates)`` gives (SPEC.md section 4), with ``T``
    the number of updates already made::

        G_reg    = norm_coefficient * X + G
        beta_adj = beta if T > 0 else 1
        V_new    = alpha * V + beta_adj * G_reg
        standard: X_new = X - R * V_new
        nesterov: X_new = X - R * (G_reg + alpha * V_new)

    How it differs from its neighbours: with ``beta = 1`` and standard mode it
    is ``optax.sgd(R, momentum=alpha)`` and ``torch.optim.SGD(lr=R,
    momentum=alpha)``; ``beta = 1 - alpha`` gives the exponential-average form
    (except the first step, where ONNX uses the full gradient). ONNX's
    Nesterov form equals ``optax.sgd(..., nesterov=True)`` and PyTorch's.

    Args:
      learning_rate: ONNX ``R``, >= 0: a float or an Optax schedule.
      alpha: ONNX ``alpha``, >= 0.
      beta: ONNX ``beta``, >= 0.
      nesterov: ONNX ``mode == "nesterov"``.
      norm_coefficient: ONNX ``norm_coefficient``, >= 0, or None (default: no
        term); see :func:`scale_by_onnx_momentum` for when ``update`` needs ``params``.
      accumulator_dtype: dtype of ``V``; None keeps each parameter's dtype
        (see :func:`scale_by_onnx_momentum` for float16).

    A NaN gradient element makes that element's update and ``V`` NaN for
    good, an infinite one makes them infinite for good; wrap the optimizer
    in ``optax.apply_if_finite`` to skip such steps (README "Non-finite
    gradients").

    Returns:
      An ``optax.GradientTransformation``: ``optax.chain`` of
      :func:`scale_by_onnx_momentum` and ``optax.scale_by_learning_rate``.
      On sharded parameters (``jax.sharding``) ``V`` gets each parameter's
      sharding, also from ``jax.jit(tx.init)``; the count is replicated.

    Raises:
      ValueError, TypeError: as :func:`scale_by_onnx_momentum`, and for a
      negative ``learning_rate``.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> tx = optkit.momentum(0.1, alpha=0.9)
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
      >>> updates, state = tx.update(grads, state, params)
      >>> params = optax.apply_updates(params, updates)
    """
    checks.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    return optax.chain(
        scale_by_onnx_momentum(
            alpha, beta, nesterov=nesterov, norm_coefficient=norm_coefficient,
            accumulator_dtype=accumulator_dtype,
        ),
        optax.scale_by_learning_rate(learning_rate),
    )
