"""Adagrad exactly as ONNX ``ai.onnx.preview.training::Adagrad`` defines it (SPEC.md section 1).

SPEC 1, for one tensor, with ``T`` the number of updates already made::

    r     = R / (1 + T * decay_factor)
    G_reg = norm_coefficient * X + G
    H_new = H + G_reg * G_reg
    X_new = X - r * G_reg / (sqrt(H_new) + epsilon)

:func:`adagrad_leaf` is that formula; :func:`onnx_adagrad` (the spec's
operator) and :func:`scale_by_onnx_adagrad` / :func:`adagrad` (Optax
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
from optkit._src.numerics import guarded_ratio, is_concrete_zero

__all__ = ["ScaleByOnnxAdagradState", "OnnxAdagradOutputs", "onnx_adagrad", "scale_by_onnx_adagrad", "adagrad"]


def adagrad_leaf(x, g, h, *, r, scale, eps, norm_coefficient):
    """SPEC 1 for one tensor: ``(X_new - X, H_new)``, with ``r`` the step's scalar (see elementwise).

    Where ``G_reg`` and ``H_new`` are both 0 the update is 0 (:func:`~optkit._src.numerics.guarded_ratio`).
    """
    if norm_coefficient is not None:
        g = norm_coefficient * x + g                                        # G_reg
    h = h + g * g                                                           # H_new
    return r * guarded_ratio(g, jnp.sqrt(h), eps) * scale, h


def _decay(T: jax.Array, decay_factor: ArrayLike, dtype: Any) -> jax.Array:
    """``r / R = 1 / (1 + T * decay_factor)`` in ``dtype``."""
    return 1 / (1 + jnp.asarray(T).astype(dtype) * decay_factor)


def _check(decay_factor, epsilon_name, epsilon, norm_coefficient, allow_none):
    hyperparams.check_scalar("decay_factor", decay_factor, low=0.0)
    hyperparams.check_scalar(epsilon_name, epsilon, low=0.0)
    hyperparams.check_scalar("norm_coefficient", norm_coefficient, low=0.0, allow_none=allow_none)


class OnnxAdagradOutputs(NamedTuple):
    """Outputs of :func:`onnx_adagrad`: all ``X_new``, then all ``H_new``."""

    X_new: Any
    H_new: Any


def onnx_adagrad(
    R: ArrayLike,
    T: ArrayLike,
    X: chex.ArrayTree,
    G: chex.ArrayTree,
    H: chex.ArrayTree,
    *,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
) -> OnnxAdagradOutputs:
    """ONNX ``ai.onnx.preview.training::Adagrad`` (version 1), several tensors at once.

    Computes SPEC.md section 1 (the formula: this module's docstring, the
    Adagrad docs page) for every tensor. With ``epsilon = 0``, a coordinate whose ``G_reg`` and ``H_new`` are both 0
    keeps its value (SPEC 1, Decision (0/0)).

    Args:
      R: the learning rate, a float scalar (shape ``()``), >= 0.
      T: the number of updates already made, an integer scalar (0 at the first update).
      X: the tensors to optimize: one array or any pytree of arrays (a list is
        ONNX's ``X_1, X_2, ...``), float32 or float64 (float16/bfloat16 also work).
      G: their gradients, the same pytree and shapes as ``X``.
      H: their accumulated squared gradients, the same pytree and shapes.
      decay_factor: ONNX attribute ``decay_factor`` (default 0.0), >= 0.
      epsilon: ONNX attribute ``epsilon``; default 1e-6, the registered
        schema's default (SPEC 1, Decision (epsilon default)), >= 0.
      norm_coefficient: ONNX attribute ``norm_coefficient`` (default 0.0), >= 0.

    Returns:
      ``OnnxAdagradOutputs(X_new, H_new)``, each with ``X``'s structure; every
      leaf keeps its input's dtype.

    Raises:
      ValueError: trees or shapes differ (the message names the path), ``R`` or
        ``T`` not scalars, a negative ``R``/``T``/attribute.
      TypeError: a non-floating tensor, a non-integer ``T``.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> X_new, H_new = optkit.ops.onnx_adagrad(
      ...     jnp.float32(0.1), 0, [jnp.ones(2)], [jnp.ones(2)], [jnp.zeros(2)])
    """
    _check(decay_factor, "epsilon", epsilon, norm_coefficient, allow_none=False)
    R = hyperparams.check_rate_scalar("R", R)
    T = hyperparams.check_step_count("T", T)
    trees.check_tensors("X", X, G=G, H=H)
    return OnnxAdagradOutputs(*elementwise.spec_operator(
        adagrad_leaf, X, G, [H], scalars=lambda dtype: {"r": R.astype(dtype) * _decay(T, decay_factor, dtype)},
        eps=epsilon, norm_coefficient=elementwise.coefficient(norm_coefficient)))


class ScaleByOnnxAdagradState(NamedTuple):
    """State of :func:`scale_by_onnx_adagrad` and :func:`adagrad`.

    Attributes:
      count: int32 scalar, the number of updates made so far (ONNX's ``T``
        before this update; 0 at the first).
      sum_of_squares: the accumulated squared regularized gradients (ONNX's
        ``H``), one array per parameter, in ``accumulator_dtype`` or the
        parameter's dtype.
    """

    count: jax.Array
    sum_of_squares: optax.Updates


def _transformation(name, learning_rate, decay_factor, norm_coefficient, eps, initial_accumulator_value,
                    accumulator_dtype) -> optax.GradientTransformation:
    _check(decay_factor, "eps", eps, norm_coefficient, allow_none=True)
    hyperparams.check_scalar("initial_accumulator_value", initial_accumulator_value, low=0.0)
    accumulator_dtype = hyperparams.check_dtype("accumulator_dtype", accumulator_dtype)
    use_decay = not is_concrete_zero(decay_factor)
    return elementwise.transformation(
        name, adagrad_leaf, ScaleByOnnxAdagradState, moments=[(initial_accumulator_value, accumulator_dtype)],
        scalars=lambda count, dtype: {"r": _decay(count, decay_factor, dtype) if use_decay else 1.0},
        learning_rate=learning_rate, coefficients={"norm_coefficient": norm_coefficient}, eps=eps)


def scale_by_onnx_adagrad(
    *,
    decay_factor: float = 0.0,
    norm_coefficient: float | None = None,
    eps: float = 1e-6,
    initial_accumulator_value: float = 0.0,
    accumulator_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """ONNX Adagrad's direction, before the learning rate (SPEC.md section 1).

    SPEC 1's step for each parameter before the learning rate, with ``T =
    state.count`` (the updates already made); chained with
    ``optax.scale_by_learning_rate(R)`` the update is ONNX's ``X_new - X``.
    With ``eps = 0`` a coordinate where ``G_reg`` and ``H_new`` are both 0
    gets update 0 (SPEC 1, Decision (0/0)).

    Args:
      decay_factor: ONNX ``decay_factor``: the learning rate is divided by
        ``1 + T * decay_factor``; >= 0.
      norm_coefficient: ONNX ``norm_coefficient``, the L2 coefficient added to
        the gradient; >= 0, or None (default: no term, ONNX's 0.0). Unless it
        is None or 0, ``update`` needs ``params``; a value given to
        ``optax.inject_hyperparams`` (even 0.0) always needs them.
      eps: ONNX ``epsilon``, added to ``sqrt(H_new)``; >= 0. Default 1e-6, the
        ONNX schema's default (SPEC 1, Decision (epsilon default)).
      initial_accumulator_value: the starting value of ``H``; >= 0.
      accumulator_dtype: dtype of ``H`` (e.g. ``jnp.float32`` for bfloat16
        parameters); None keeps each parameter's dtype. Arithmetic runs in
        float32 or wider either way, but the stored ``H`` has the range of
        its dtype: a float16 ``H`` overflows at a single ``|G| >= 256``
        (``G^2 >= 65520``; that coordinate's updates are 0 afterwards) and
        stays 0 for ``|G| < 1.7e-4`` (steps ``sqrt(T)`` times too large); a
        bfloat16 ``H`` stalls (``256 + 1`` rounds to 256) (docs/usage.md).

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByOnnxAdagradState`.
      Updates have the gradients' dtypes.

    Raises:
      ValueError: a hyperparameter out of range (at construction); at
        ``update``: trees or shapes of grads, state and params that differ (the
        message names the path), or ``params=None`` with a nonzero
        ``norm_coefficient``.
      TypeError: a non-floating gradient or parameter leaf, or a non-floating
        ``accumulator_dtype``.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_onnx_adagrad(), optax.scale_by_learning_rate(0.1))
      >>> params = {"w": jnp.ones(3)}
      >>> state = tx.init(params)
      >>> updates, state = tx.update({"w": jnp.ones(3)}, state, params)
    """
    return _transformation("scale_by_onnx_adagrad", None, decay_factor, norm_coefficient, eps,
                           initial_accumulator_value, accumulator_dtype)


def adagrad(
    learning_rate: optax.ScalarOrSchedule,
    *,
    decay_factor: float = 0.0,
    norm_coefficient: float | None = None,
    eps: float = 1e-6,
    initial_accumulator_value: float = 0.0,
    accumulator_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """Adagrad exactly as ONNX ``ai.onnx.preview.training::Adagrad`` (version 1) defines it.

    ``optax.apply_updates(X, updates)`` gives ONNX's ``X_new`` (SPEC.md section 1,
    the formula in this module's docstring and on the Adagrad docs page), with
    ``R = learning_rate`` and ``T = state.count``, the updates already made.

    How it differs from its neighbours: ``optax.adagrad`` divides by
    ``sqrt(H + eps)`` (eps inside the root), starts ``H`` at 0.1 and has no
    decay or L2 term; ``torch.optim.Adagrad(lr, lr_decay=decay_factor,
    weight_decay=norm_coefficient, eps=eps)`` computes this same formula.

    Args:
      learning_rate: ONNX ``R``, >= 0: a float or an Optax schedule
        ``count -> rate``.
      decay_factor: ONNX ``decay_factor``, >= 0.
      norm_coefficient: ONNX ``norm_coefficient``, >= 0, or None (default: no
        term); see :func:`scale_by_onnx_adagrad` for when ``update`` needs ``params``.
      eps: ONNX ``epsilon``, >= 0; default 1e-6 (the schema's default).
      initial_accumulator_value: starting value of ``H``, >= 0.
      accumulator_dtype: dtype of ``H``; None keeps each parameter's dtype;
        float32 for 16-bit parameters (see :func:`scale_by_onnx_adagrad`).

    A NaN gradient element makes that element's update and ``H`` NaN for
    good; an infinite one makes the update NaN and ``H`` infinite (the
    element's later updates are 0). Wrap the optimizer in
    ``optax.apply_if_finite`` to skip such steps (docs/usage.md).

    Returns:
      An ``optax.GradientTransformation`` whose state is
      ``(ScaleByOnnxAdagradState,)`` (a tuple, as Optax's aliases' states
      are; the schedule is called with its ``count``). Every numeric
      argument works under ``optax.inject_hyperparams`` (values traced under
      ``jax.jit`` are not range-checked). On sharded parameters
      (``jax.sharding``) ``H`` gets each parameter's sharding, also from
      ``jax.jit(tx.init)``; the count is replicated.

    Raises:
      ValueError, TypeError: as :func:`scale_by_onnx_adagrad`, and for a
        negative ``learning_rate``.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> tx = optkit.adagrad(0.1)
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
      >>> updates, state = tx.update(grads, state, params)
      >>> params = optax.apply_updates(params, updates)
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    return optax.chain(_transformation("adagrad", learning_rate, decay_factor, norm_coefficient, eps,
                                       initial_accumulator_value, accumulator_dtype))
