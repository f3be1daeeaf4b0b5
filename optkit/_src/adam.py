"""Adam exactly as DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` defines it, with ONNX Adam's
extra coefficients (SPEC.md sections 2 and 3).

For one tensor, with ``T`` the update being made (DirectML) or the number of
updates already made (ONNX, where ``T = 0`` skips the bias correction)::

    G_reg = norm_coefficient * X + G                     # ONNX Adam; G for DirectML
    M     = b1 * M + (1 - b1) * G_reg
    V     = b2 * V + (1 - b2) * G_reg * G_reg
    Alpha = sqrt(1 - b2^T) / (1 - b1^T)                  # 1 where T = 0
    X     = X - LearningRate * Alpha * M / (sqrt(V) + eps)
    X     = (1 - norm_coefficient_post) * X              # ONNX Adam

:func:`adam_leaf` is that formula; :func:`dml_adam` and :func:`onnx_adam`
(the specs' operators) and :func:`scale_by_dml_adam` / :func:`adam` (Optax
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
from optkit._src.numerics import guarded_ratio, one_minus_power

__all__ = [
    "ScaleByDmlAdamState",
    "DmlAdamOutputs",
    "OnnxAdamOutputs",
    "dml_adam",
    "onnx_adam",
    "scale_by_dml_adam",
    "adam",
]


def adam_leaf(x, g, m, v, *, r, scale, b1, b2, eps, norm_coefficient, norm_coefficient_post=None):
    """SPEC 2 and 3 for one tensor: ``(X_new - X, M, V)``, with ``r`` the step's scalar (see elementwise).

    ``M`` is the first moment (DirectML's M, ONNX Adam's V), ``V`` the second
    (DirectML's V, ONNX Adam's H). Where ``M`` and ``V`` are both 0 the step is
    0 (:func:`~optkit._src.numerics.guarded_ratio`).
    """
    if norm_coefficient is not None:
        g = norm_coefficient * x + g                                        # G_reg
    m = b1 * m + (1 - b1) * g                                               # M
    v = b2 * v + (1 - b2) * g * g                                           # V
    update = r * guarded_ratio(m, jnp.sqrt(v), eps) * scale
    if norm_coefficient_post is not None:
        c = jnp.asarray(norm_coefficient_post, update.dtype)
        update = (1 - c) * update - c * x                                   # X_new = (1 - c) (X + update)
    return update, m, v


def _bias_correction(T: jax.Array, b1: ArrayLike, b2: ArrayLike, dtype: Any) -> jax.Array:
    """DirectML's ``Alpha = sqrt(1 - b2^T) / (1 - b1^T)`` in ``dtype``; 1 where T = 0.

    SPEC 2, Decision (T): T = 0 would divide 0 by 0; the ONNX Adam rule (SPEC 3)
    uses the learning rate unscaled there. A traced ``b1`` or ``b2`` outside
    [0, 1) gives NaN (:func:`~optkit._src.hyperparams.nan_unless_decays`).
    """
    t = jnp.asarray(T).astype(dtype)
    t_pos = jnp.maximum(t, jnp.ones_like(t))  # T = 0 is replaced below; keeps 0 * log(0) out
    alpha = jnp.sqrt(one_minus_power(b2, t_pos, dtype)) / one_minus_power(b1, t_pos, dtype)
    return hyperparams.nan_unless_decays(jnp.where(t > 0, alpha, jnp.ones_like(alpha)), b1, b2)


def _check_decays(b1_name, b1, b2_name, b2, eps_name, eps):
    hyperparams.check_decay(b1_name, b1)
    hyperparams.check_decay(b2_name, b2)
    hyperparams.check_scalar(eps_name, eps, low=0.0)


class DmlAdamOutputs(NamedTuple):
    """Outputs of :func:`dml_adam`: DirectML's Output{Parameters,FirstMoment,SecondMoment}Tensor."""

    X: Any
    M: Any
    V: Any


class OnnxAdamOutputs(NamedTuple):
    """Outputs of :func:`onnx_adam`: ``X_new``, ``V_new`` (first moments), ``H_new`` (second)."""

    X_new: Any
    V_new: Any
    H_new: Any


def dml_adam(
    X: chex.ArrayTree,
    M: chex.ArrayTree,
    V: chex.ArrayTree,
    G: chex.ArrayTree,
    T: ArrayLike,
    *,
    learning_rate: float,
    beta1: float,
    beta2: float,
    epsilon: float,
) -> DmlAdamOutputs:
    """DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (feature level 3_0), over pytrees.

    Computes SPEC.md section 2 (the formula: this module's docstring without
    ONNX's coefficients, with ``b1 = beta1``, ``b2 = beta2``, ``eps = epsilon``;
    the "epsilon-hat" Adam of Kingma & Ba, end of their section 2).
    The operator does not advance ``T``; the caller does. At ``T = 0`` the
    formula's Alpha is 0/0; optkit uses Alpha = 1 there (SPEC 2, Decision (T)).
    DirectML allows outputs to alias inputs; in JAX, donate ``X``, ``M``, ``V``
    with ``jax.jit(..., donate_argnums=...)`` for the same in-place update.

    Args:
      X: InputParametersTensor, an array or pytree of arrays (float32 or
        float16; float64 and bfloat16 also work).
      M: InputFirstMomentTensor, same pytree/shapes (zeros at the first step).
      V: InputSecondMomentTensor, same pytree/shapes (zeros at the first step).
      G: GradientTensor, same pytree/shapes.
      T: TrainingStepTensor, an integer scalar (DirectML: UINT32), >= 0.
      learning_rate: LearningRate, >= 0.
      beta1: Beta1, in [0, 1).
      beta2: Beta2, in [0, 1).
      epsilon: Epsilon, >= 0 (1e-8 or FLT_EPSILON typical for float32).

    Returns:
      ``DmlAdamOutputs(X, M, V)``: the updated parameters and moments, each leaf
      in its input's dtype (16-bit tensors are computed in float32).

    Raises:
      ValueError, TypeError: as :func:`onnx_adagrad`.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> X, M, V = optkit.ops.dml_adam(jnp.ones(3), jnp.zeros(3), jnp.zeros(3),
      ...     jnp.ones(3), 1, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8)
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0)
    _check_decays("beta1", beta1, "beta2", beta2, "epsilon", epsilon)
    T = hyperparams.check_step_count("T", T)
    trees.check_tensors("X", X, M=M, V=V, G=G)
    X_new, M_new, V_new = elementwise.spec_operator(
        adam_leaf, X, G, [M, V],
        scalars=lambda dtype: {"r": jnp.asarray(learning_rate, dtype) * _bias_correction(T, beta1, beta2, dtype)},
        b1=beta1, b2=beta2, eps=epsilon, norm_coefficient=None)
    return DmlAdamOutputs(X_new, M_new, V_new)


def onnx_adam(
    R: ArrayLike,
    T: ArrayLike,
    X: chex.ArrayTree,
    G: chex.ArrayTree,
    V: chex.ArrayTree,
    H: chex.ArrayTree,
    *,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> OnnxAdamOutputs:
    """ONNX ``ai.onnx.preview.training::Adam`` (version 1), several tensors at once.

    Computes SPEC.md section 3 (the formula: this module's docstring, with
    ``M = V``, ``V = H``, ``b1 = alpha``, ``b2 = beta``; the Adam docs page)
    for every tensor; ``T = 0`` skips the bias correction.

    Args:
      R: the learning rate, a float scalar, >= 0.
      T: the number of updates already made, an integer scalar (0 at the first
        update, where the bias correction is skipped).
      X: the tensors to optimize (an array or pytree of arrays).
      G: their gradients; V: their first moments; H: their second moments
        (each the same pytree and shapes as ``X``).
      alpha: ONNX ``alpha``, the first-moment decay (Optax's ``b1``), in [0, 1).
      beta: ONNX ``beta``, the second-moment decay (Optax's ``b2``), in [0, 1).
      epsilon: ONNX ``epsilon`` (default 1e-6), >= 0.
      norm_coefficient: L2 coefficient added to the gradient, >= 0.
      norm_coefficient_post: shrinkage applied after the step, in [0, 1).

    Returns:
      ``OnnxAdamOutputs(X_new, V_new, H_new)``, each with ``X``'s structure and
      each leaf in its input's dtype.

    Raises:
      ValueError, TypeError: as :func:`onnx_adagrad`, and for ``alpha``/``beta``
        outside [0, 1) or ``norm_coefficient_post`` outside [0, 1).

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> X_new, V_new, H_new = optkit.ops.onnx_adam(
      ...     jnp.float32(0.1), 0, [jnp.ones(2)], [jnp.ones(2)], [jnp.zeros(2)], [jnp.zeros(2)])
    """
    _check_decays("alpha", alpha, "beta", beta, "epsilon", epsilon)
    hyperparams.check_scalar("norm_coefficient", norm_coefficient, low=0.0)
    hyperparams.check_scalar("norm_coefficient_post", norm_coefficient_post, low=0.0, high=1.0, high_open=True)
    R = hyperparams.check_rate_scalar("R", R)
    T = hyperparams.check_step_count("T", T)
    trees.check_tensors("X", X, G=G, V=V, H=H)
    return OnnxAdamOutputs(*elementwise.spec_operator(
        adam_leaf, X, G, [V, H], scalars=lambda dtype: {"r": R.astype(dtype) * _bias_correction(T, alpha, beta, dtype)},
        b1=alpha, b2=beta, eps=epsilon, norm_coefficient=elementwise.coefficient(norm_coefficient),
        norm_coefficient_post=elementwise.coefficient(norm_coefficient_post)))


class ScaleByDmlAdamState(NamedTuple):
    """State of :func:`scale_by_dml_adam` and :func:`adam`.

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


def _transformation(name, learning_rate, b1, b2, eps, norm_coefficient, norm_coefficient_post, mu_dtype,
                    nu_dtype) -> optax.GradientTransformation:
    _check_decays("b1", b1, "b2", b2, "eps", eps)
    hyperparams.check_scalar("norm_coefficient", norm_coefficient, low=0.0, allow_none=True)
    hyperparams.check_scalar("norm_coefficient_post", norm_coefficient_post, low=0.0, high=1.0, high_open=True,
                             allow_none=True)
    moments = [(0, hyperparams.check_dtype("mu_dtype", mu_dtype)), (0, hyperparams.check_dtype("nu_dtype", nu_dtype))]
    return elementwise.transformation(
        name, adam_leaf, ScaleByDmlAdamState, moments=moments,
        # DirectML's T is the update being made: count + 1 (SPEC 2, Decision (T)).
        scalars=lambda count, dtype: {"r": _bias_correction(optax.safe_increment(count), b1, b2, dtype)},
        learning_rate=learning_rate,
        coefficients={"norm_coefficient": norm_coefficient, "norm_coefficient_post": norm_coefficient_post},
        b1=b1, b2=b2, eps=eps)


def scale_by_dml_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    norm_coefficient: float | None = None,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """The epsilon-hat Adam direction of DirectML and ONNX, before the learning rate.

    SPEC 2's step for each parameter without ``LearningRate``, with ``T =
    count + 1`` (SPEC 2, Decision (T)): ``update = Alpha * M / (sqrt(V) + eps)``
    (the formula: this module's docstring). Chained with ``optax.scale_by_learning_rate(LearningRate)`` the update is
    DirectML's ``X - X_old``. Unlike ``optax.scale_by_adam``, ``eps`` is added to ``sqrt(V)`` of the
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
        Keep it float32 for 16-bit parameters (docs/usage.md). The
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
    return _transformation("scale_by_dml_adam", None, b1, b2, eps, norm_coefficient, None, mu_dtype, nu_dtype)


def adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    norm_coefficient: float | None = None,
    norm_coefficient_post: float | None = None,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
    """Adam exactly as DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (the epsilon-hat form).

    ``optax.apply_updates(X, updates)`` gives DirectML's ``X`` (SPEC.md sections
    2 and 3, the formula in this module's docstring and on the Adam docs
    page), with ``LearningRate = learning_rate`` and ``T = count + 1``.

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
    ``optax.apply_if_finite`` to skip such steps (docs/usage.md). ``b1`` and ``b2`` close to 1 are fine in
    float32 (the bias
    correction is computed from ``1 - b``).

    Returns:
      An ``optax.GradientTransformation`` whose state is
      ``(ScaleByDmlAdamState,)`` (a tuple, as Optax's aliases' states are;
      the schedule is called with its ``count``). Every numeric argument
      works under ``optax.inject_hyperparams``. On sharded parameters
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
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    return optax.chain(_transformation("adam", learning_rate, b1, b2, eps, norm_coefficient, norm_coefficient_post,
                                       mu_dtype, nu_dtype))
