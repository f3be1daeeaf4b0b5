"""Momentum exactly as ONNX ``ai.onnx.preview.training::Momentum`` defines it (SPEC.md section 4).

SPEC 4, for one tensor, with ``T`` the number of updates already made::

    G_reg    = norm_coefficient * X + G
    beta_adj = beta if T > 0 else 1
    V_new    = alpha * V + beta_adj * G_reg
    standard: X_new = X - R * V_new
    nesterov: X_new = X - R * (G_reg + alpha * V_new)

:func:`momentum_leaf` is that formula; :func:`onnx_momentum` (the spec's
operator) and :func:`scale_by_onnx_momentum` / :func:`momentum` (Optax
transformations) are it, through :mod:`optkit._src.elementwise`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike, DTypeLike

from optkit._src import elementwise, hyperparams, trees

__all__ = ["ScaleByOnnxMomentumState", "OnnxMomentumOutputs", "onnx_momentum", "scale_by_onnx_momentum", "momentum"]

MODES = ("standard", "nesterov")  # ONNX Momentum's ``mode``: ``nesterov=False`` / ``True``


def momentum_leaf(x, g, v, *, r, scale, alpha, beta_adj, nesterov, norm_coefficient):
    """SPEC 4 for one tensor: ``(X_new - X, V_new)``, with ``r`` the step's scalar (see elementwise)."""
    if norm_coefficient is not None:
        g = norm_coefficient * x + g                                        # G_reg
    v = alpha * v + beta_adj * g                                            # V_new
    direction = g + alpha * v if nesterov else v                            # nesterov / standard
    return r * direction * scale, v


def _beta_adj(T: jax.Array, beta: ArrayLike, dtype: Any) -> jax.Array:
    """``beta if T > 0 else 1`` in ``dtype`` (SPEC 4: the first update uses the whole gradient)."""
    return jnp.where(jnp.asarray(T) > 0, jnp.asarray(beta, dtype), jnp.ones([], dtype))


def _check(alpha, beta, norm_coefficient, allow_none):
    hyperparams.check_scalar("alpha", alpha, low=0.0)
    hyperparams.check_scalar("beta", beta, low=0.0)
    hyperparams.check_scalar("norm_coefficient", norm_coefficient, low=0.0, allow_none=allow_none)


class OnnxMomentumOutputs(NamedTuple):
    """Outputs of :func:`onnx_momentum`: all ``X_new``, then all ``V_new``."""

    X_new: Any
    V_new: Any


def onnx_momentum(
    R: ArrayLike,
    T: ArrayLike,
    X: chex.ArrayTree,
    G: chex.ArrayTree,
    V: chex.ArrayTree,
    *,
    alpha: float,
    beta: float,
    mode: str,
    norm_coefficient: float,
) -> OnnxMomentumOutputs:
    """ONNX ``ai.onnx.preview.training::Momentum`` (version 1), several tensors at once.

    Computes SPEC.md section 4 (the formula: this module's docstring, the
    Momentum docs page) for every tensor. All four attributes are required, as in the ONNX schema.

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
    _check(alpha, beta, norm_coefficient, allow_none=False)
    hyperparams.check_choice("mode", mode, MODES)
    R = hyperparams.check_rate_scalar("R", R)
    T = hyperparams.check_step_count("T", T)
    trees.check_tensors("X", X, G=G, V=V)
    return OnnxMomentumOutputs(*elementwise.spec_operator(
        momentum_leaf, X, G, [V], scalars=lambda dtype: {"r": R.astype(dtype), "beta_adj": _beta_adj(T, beta, dtype)},
        alpha=alpha, nesterov=mode == "nesterov", norm_coefficient=elementwise.coefficient(norm_coefficient)))


class ScaleByOnnxMomentumState(NamedTuple):
    """State of :func:`scale_by_onnx_momentum` and :func:`momentum`.

    Attributes:
      count: int32 scalar, the number of updates made so far (ONNX's ``T``;
        0 at the first update, where ``beta`` is replaced by 1).
      trace: the momenta (ONNX's ``V``), in ``accumulator_dtype`` or each
        parameter's dtype.
    """

    count: jax.Array
    trace: optax.Updates


def _transformation(name, learning_rate, alpha, beta, nesterov, norm_coefficient, accumulator_dtype):
    _check(alpha, beta, norm_coefficient, allow_none=True)
    hyperparams.check_flag("nesterov", nesterov)
    accumulator_dtype = hyperparams.check_dtype("accumulator_dtype", accumulator_dtype)
    return elementwise.transformation(
        name, momentum_leaf, ScaleByOnnxMomentumState, moments=[(0, accumulator_dtype)],
        scalars=lambda count, dtype: {"r": 1.0, "beta_adj": _beta_adj(count, beta, dtype)},
        learning_rate=learning_rate, coefficients={"norm_coefficient": norm_coefficient}, alpha=alpha,
        nesterov=nesterov)


def scale_by_onnx_momentum(
    alpha: float = 0.9,
    beta: float = 1.0,
    *,
    nesterov: bool = False,
    norm_coefficient: float | None = None,
    accumulator_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """ONNX Momentum's direction, before the learning rate (SPEC.md section 4).

    SPEC 4's step for each parameter before the learning rate, with ``T =
    state.count`` (0 at the first update): ``V_new`` (standard) or ``G_reg +
    alpha * V_new`` (nesterov); chained with ``optax.scale_by_learning_rate(R)``
    the update is ONNX's ``X_new - X``.

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
        float32 gradients then (docs/usage.md).

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
    return _transformation("scale_by_onnx_momentum", None, alpha, beta, nesterov, norm_coefficient,
                           accumulator_dtype)


def momentum(
    learning_rate: optax.ScalarOrSchedule,
    alpha: float = 0.9,
    beta: float = 1.0,
    *,
    nesterov: bool = False,
    norm_coefficient: float | None = None,
    accumulator_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """Momentum exactly as ONNX ``ai.onnx.preview.training::Momentum`` (version 1) defines it.

    ``optax.apply_updates(X, updates)`` gives ONNX's ``X_new`` (SPEC.md section 4,
    the formula in this module's docstring and on the Momentum docs page),
    with ``R = learning_rate`` and ``T = state.count``, the updates already made.

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
    in ``optax.apply_if_finite`` to skip such steps (docs/usage.md).

    Returns:
      An ``optax.GradientTransformation`` whose state is
      ``(ScaleByOnnxMomentumState,)`` (a tuple, as Optax's aliases' states
      are; the schedule is called with its ``count``). Every numeric
      argument works under ``optax.inject_hyperparams``.
      On sharded parameters (``jax.sharding``) ``V`` gets each parameter's
      sharding, also from ``jax.jit(tx.init)``; the count is replicated.

    Raises:
      ValueError, TypeError: as :func:`scale_by_onnx_momentum`, and for a
        negative ``learning_rate``.

    Example (Nesterov, after Optax's gradient clipping; ONNX's first step uses the whole gradient):
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optax.clip_by_global_norm(1.0), optkit.momentum(0.1, alpha=0.9, nesterov=True))
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> updates, state = tx.update({"w": jnp.array([0.6, -0.8])}, tx.init(params), params)
      >>> updates["w"]  # -R * (G + alpha * V) with V = G
      Array([-0.114...,  0.152...], dtype=float32)
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    return optax.chain(_transformation("momentum", learning_rate, alpha, beta, nesterov, norm_coefficient,
                                       accumulator_dtype))
