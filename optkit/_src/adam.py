"""Adam exactly as DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` defines it, with ONNX Adam's
extra coefficients (SPEC.md sections 2 and 3)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optkit._src import checks, sharding
from optkit._src.ops import (
    adam_bias_correction,
    adam_leaf,
    compute_dtype,
    map_leaves,
    params_needed_for,
    per_dtype,
)

__all__ = ["ScaleByDmlAdamState", "scale_by_dml_adam", "adam"]


class ScaleByDmlAdamState(NamedTuple):
    """State of :func:`scale_by_dml_adam`.

    Attributes:
      count: int32 scalar, the number of updates made so far; the update being
        made uses DirectML's ``T = count + 1``.
      mu: first moments (DirectML's ``M``, ONNX Adam's ``V``), in ``mu_dtype``
        or each parameter's dtype.
      nu: second moments (DirectML's ``V``, ONNX Adam's ``H``), in ``nu_dtype``
        or each parameter's dtype.
    """

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_dml_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    norm_coefficient: float | None = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
    """The epsilon-hat Adam direction of DirectML and ONNX, before the learning rate.

    With ``T = count + 1`` (SPEC 2, Decision (T)) and, per parameter::

        G_reg  = norm_coefficient * X + G                  # ONNX Adam; G when None
        M      = b1 * M + (1 - b1) * G_reg
        V      = b2 * V + (1 - b2) * G_reg * G_reg
        Alpha  = sqrt(1 - b2^T) / (1 - b1^T)
        update = Alpha * M / (sqrt(V) + eps)

    Unlike ``optax.scale_by_adam``, ``eps`` is added to ``sqrt(V)`` of the
    *uncorrected* second moment ("epsilon-hat", Kingma & Ba 2015, end of
    section 2). With ``eps = 0`` a coordinate whose ``M`` and ``V`` are both 0
    gets update 0.

    Args:
      b1: DirectML ``Beta1`` / ONNX ``alpha``, in [0, 1).
      b2: DirectML ``Beta2`` / ONNX ``beta``, in [0, 1).
      eps: DirectML ``Epsilon`` / ONNX ``epsilon``, >= 0.
      norm_coefficient: ONNX ``norm_coefficient``, >= 0, or None (default: no
        term, ONNX's 0.0). Unless it is None or 0, ``update`` needs ``params``;
        a value given to ``optax.inject_hyperparams`` (even 0.0) always needs them.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      nu_dtype: dtype of the second moment; None keeps each parameter's dtype.
        Keep it float32 for 16-bit parameters (README "Precision"). The
        arithmetic is float32 either way, but a float16 ``V`` overflows once
        ``b2 * V + (1 - b2) * G^2`` reaches 65520 (a single ``|G| >= 8094``
        for b2 = 0.999, or a sustained ``|G|`` near 256), after which that
        coordinate's updates are 0; it also stays 0 for ``|G| < 5.5e-3``
        (steps up to ``1 / sqrt(1 - b2)`` times too large); a bfloat16 ``V``
        stalls (8 bits cannot hold a change of ``1 - b2``).

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByDmlAdamState`;
      updates have the gradients' dtypes (arithmetic in float32 or wider).

    Raises:
      ValueError: a hyperparameter out of range (at construction); mismatched
        trees or shapes, or ``params=None`` with ``norm_coefficient != 0`` (at update).
      TypeError: non-floating leaves or state dtypes.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_dml_adam(), optax.scale_by_learning_rate(1e-3))
      >>> state = tx.init({"w": jnp.ones(3)})
    """
    checks.check_decay("b1", b1)
    checks.check_decay("b2", b2)
    checks.check_scalar("eps", eps, low=0.0)
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0, allow_none=True)
    mu_dtype = checks.check_dtype("mu_dtype", mu_dtype)
    nu_dtype = checks.check_dtype("nu_dtype", nu_dtype)
    params_reason = params_needed_for("norm_coefficient", norm_coefficient)
    use_params = params_reason is not None

    def init_fn(params):
        checks.check_floating(params, "params")
        mu = sharding.tree_zeros_like(params, mu_dtype)
        nu = sharding.tree_zeros_like(params, nu_dtype)
        return ScaleByDmlAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def update_fn(updates, state, params=None):
        state = checks.check_state(state, ScaleByDmlAdamState, "scale_by_dml_adam")
        checks.check_count(state.count, "scale_by_dml_adam")
        checks.check_update_inputs(
            "scale_by_dml_adam", updates, {"state.mu": state.mu, "state.nu": state.nu},
            params, params_reason,
        )
        count = optax.safe_increment(state.count)
        # One scalar per dtype, not per leaf: with thousands of leaves the
        # per-leaf scalar ops dominated tracing.
        bias_correction = per_dtype(lambda dtype: adam_bias_correction(count, b1, b2, dtype))

        def leaf(g, m, v, x):
            dtype = compute_dtype(g.dtype, m.dtype, v.dtype, None if x is None else x.dtype)
            direction, m_new, v_new = adam_leaf(
                g, m, v, x, b1=b1, b2=b2, eps=eps, norm_coefficient=norm_coefficient, dtype=dtype
            )
            update = bias_correction(dtype) * direction
            return update.astype(g.dtype), m_new.astype(m.dtype), v_new.astype(v.dtype)

        new_updates, mu, nu = map_leaves(
            leaf, 3, updates, state.mu, state.nu, params if use_params else None
        )
        return new_updates, ScaleByDmlAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def _scale_by_norm_coefficient_post(norm_coefficient_post: float | None) -> optax.GradientTransformation:
    """ONNX Adam's post-step shrinkage: ``X_new = (1 - c) * (X + u)``, as an update.

    Returns ``(1 - c) * u - c * X`` so that ``X + update`` is the spec's ``X_new``.
    It is always in :func:`adam`'s chain (so the chain's state has the same
    structure whether or not the coefficient is traced) and is the identity
    when the coefficient is known to be 0.
    """

    def update_fn(updates, state, params=None):
        reason = params_needed_for("norm_coefficient_post", norm_coefficient_post)
        if reason is None:
            return updates, state
        checks.check_params_given(params, "adam", reason)
        checks.check_same_shapes(params, updates, "params", "updates")

        def leaf(u, x):
            dtype = compute_dtype(u.dtype, x.dtype)
            c = jnp.asarray(norm_coefficient_post, dtype)
            return ((1 - c) * u.astype(dtype) - c * x.astype(dtype)).astype(u.dtype)

        return jax.tree.map(leaf, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    norm_coefficient: float | None = None,
    norm_coefficient_post: float | None = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adam exactly as DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (the epsilon-hat form).

    ``optax.apply_updates(X, updates)`` gives (SPEC.md sections 2 and 3), with
    ``T = count + 1``::

        G_reg = norm_coefficient * X + G
        M     = b1 * M + (1 - b1) * G_reg
        V     = b2 * V + (1 - b2) * G_reg * G_reg
        Alpha = sqrt(1 - b2^T) / (1 - b1^T)
        X_new = (1 - norm_coefficient_post) * (X - learning_rate * Alpha * M / (sqrt(V) + eps))

    With both norm coefficients 0 (the default) this is DirectML's Adam, also
    TensorFlow 1's ``AdamOptimizer`` and Keras 3's ``Adam``; with them it is
    ONNX ``ai.onnx.preview.training::Adam``.

    How it differs from ``optax.adam`` and ``torch.optim.Adam``: they compute
    ``lr * M_hat / (sqrt(V_hat) + eps)`` with bias-corrected ``M_hat``, ``V_hat``,
    so their ``eps`` is ``eps * sqrt(1 - b2^T)`` here; the two agree when
    ``eps = 0``.

    Args:
      learning_rate: DirectML ``LearningRate`` / ONNX ``R``, >= 0: a float or
        an Optax schedule.
      b1: ``Beta1`` / ONNX ``alpha``, in [0, 1).
      b2: ``Beta2`` / ONNX ``beta``, in [0, 1).
      eps: ``Epsilon``, >= 0 (default 1e-8; ONNX's schema default is 1e-6).
      norm_coefficient: ONNX ``norm_coefficient`` (L2 term in the gradient), >= 0,
        or None (default: no term).
      norm_coefficient_post: ONNX ``norm_coefficient_post`` (shrinkage after
        the step), in [0, 1), or None (default: no shrinkage). Either
        coefficient needs ``params`` in ``update`` unless it is None or 0;
        a value given to ``optax.inject_hyperparams`` (even 0.0) always needs them.
      mu_dtype, nu_dtype: dtypes of the moments; None keeps each parameter's.
        float32 for 16-bit parameters: see :func:`scale_by_dml_adam`.

    A NaN or infinite gradient element makes that element's update NaN and
    its moments non-finite for good; wrap the optimizer in
    ``optax.apply_if_finite`` to skip such steps (README "Non-finite
    gradients"). ``b1`` and ``b2`` close to 1 are fine in float32 (the bias
    correction is computed from ``1 - b``).

    Returns:
      An ``optax.GradientTransformation``: ``optax.chain`` of
      :func:`scale_by_dml_adam`, ``optax.scale_by_learning_rate`` and the
      post-step shrinkage (the identity when ``norm_coefficient_post`` is None or 0). Every numeric
      argument works under ``optax.inject_hyperparams``. On sharded parameters
      (``jax.sharding``) the moments get each parameter's sharding, also from
      ``jax.jit(tx.init)``; the count is replicated.

    Raises:
      ValueError: b1/b2 outside [0, 1), a negative learning rate, eps or
        norm_coefficient, norm_coefficient_post outside [0, 1); mismatched
        trees; ``params=None`` where a norm coefficient needs them.
      TypeError: non-floating leaves or moment dtypes.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.array([1.0, -2.0])}
      >>> tx = optkit.adam(1e-3)
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
      >>> updates, state = tx.update(grads, state, params)
      >>> params = optax.apply_updates(params, updates)
    """
    checks.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    checks.check_scalar(
        "norm_coefficient_post", norm_coefficient_post, low=0.0, high=1.0, high_open=True, allow_none=True
    )
    return optax.chain(
        scale_by_dml_adam(
            b1, b2, eps, norm_coefficient=norm_coefficient, mu_dtype=mu_dtype, nu_dtype=nu_dtype
        ),
        optax.scale_by_learning_rate(learning_rate),
        _scale_by_norm_coefficient_post(norm_coefficient_post),
    )
