"""The specs' operators, with their own inputs and outputs, and the per-leaf formulas.

Each optimizer's arithmetic lives here once, as a per-leaf function that both
the spec op (``onnx_adagrad``, ``onnx_adam``, ``dml_adam``, ``onnx_momentum``)
and the Optax transformation (``optkit.adagrad`` ...) call. A per-leaf function
returns the spec's *direction* (the update before the learning-rate factor) and
the new state; the op multiplies by the spec's scalar step and subtracts, the
transformation hands the direction to ``optax.scale_by_learning_rate``.

Several tensors at once (ONNX's variadic inputs) are any pytree: a list of
arrays is the ONNX form, a dict of named arrays works the same way. ONNX views
several tensors as one concatenated tensor; the formulas are element-wise, so
applying them leaf by leaf is the same thing.

Arithmetic dtype: each leaf is computed in the promotion of its inputs' dtypes
with float32 (float16 and bfloat16 tensors are computed in float32, the way
fused GPU optimizers do, and stored back in their own dtype); the scalars
derived from the step count and hyperparameters are computed in that dtype too,
so a float64 run matches the float64 formula to rounding.

Performance (measured in ``benchmarks/RESULTS.md``): the formulas stay plain
element-wise ``jax.numpy`` per leaf, which XLA fuses and which shards like the
parameters. XLA:CPU emits one loop per array a step writes, so an Adam step
that ends in ``optax.apply_updates`` is three passes over memory (the moments,
then the parameters: 40 bytes a float32 parameter), exactly as for
``optax.adam``; Adagrad and Momentum are two. The parameters are written by
``optax.apply_updates``, outside the transformation, so no formulation of
``update`` can join them to the moments' pass. Trees of thousands of leaves
pay per array (in the compiled step and in compilation): ``FlatParams`` is the
switch for those.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from optkit._src import checks

__all__ = [
    "onnx_adagrad",
    "onnx_adam",
    "dml_adam",
    "onnx_momentum",
    "OnnxAdagradOutputs",
    "OnnxAdamOutputs",
    "DmlAdamOutputs",
    "OnnxMomentumOutputs",
]


# ---------------------------------------------------------------------------
# dtype and scalar helpers


def compute_dtype(*dtypes: Any) -> jnp.dtype:
    """The dtype a leaf's arithmetic runs in: its inputs' promotion, at least float32."""
    dtype = jnp.dtype(jnp.float32)
    for d in dtypes:
        if d is not None:
            dtype = jnp.promote_types(dtype, d)
    return dtype


def per_dtype(fn):
    """``fn(dtype)`` computed once per dtype (a memo for one ``update`` call).

    The scalars derived from the step count (bias correction, decay) are the
    same for every leaf of a dtype; computing them once keeps tracing a tree of
    thousands of leaves linear in the leaves' own arithmetic.
    """
    return functools.cache(fn)


def is_concrete_zero(value: Any) -> bool:
    """True if ``value`` is known now (not traced) to be exactly 0.

    Used to drop terms that cannot change the result (a zero ``norm_coefficient``
    means no ``params`` are needed); a traced value keeps the term.
    """
    try:
        number = checks.concrete_float(value)
    except TypeError:
        return False
    return number is not None and number == 0.0


def params_needed_for(name: str, value: Any) -> str | None:
    """Why ``params`` are needed for the term scaled by hyperparameter ``name``, or None.

    None when the term is off: ``value`` is None (the default of the
    transformations' coefficients) or a Python or NumPy 0. A JAX array is
    what ``optax.inject_hyperparams`` passes for every numeric hyperparameter
    it was given; under ``jax.jit`` its value is unknown, so whatever it is
    now (0.0 included) the term is kept and needs ``params``, eagerly and
    jitted alike, and the reason says so. A coefficient that was never given
    stays None and is not injected.
    """
    if value is None:
        return None
    if isinstance(value, jax.Array):
        if not isinstance(value, jax.core.Tracer) and value.ndim == 0 and float(value) != 0.0:
            return f"{name} != 0"
        return (
            f"{name} (a JAX array, as optax.inject_hyperparams passes each hyperparameter it is given, "
            f"so possibly nonzero under jax.jit; leave {name} unset for no term, or pass it in "
            f"static_args)"
        )
    if is_concrete_zero(value):
        return None
    return f"{name} != 0"


def is_concrete_positive(value: Any) -> bool:
    """True if ``value`` is known now (not traced) to be > 0."""
    try:
        number = checks.concrete_float(value)
    except TypeError:
        return False
    return number is not None and number > 0.0


def _guard_zero_over_zero(numerator, denominator_root, quotient, eps):
    """SPEC 1, Decision (0/0): where numerator and accumulator are both 0, the update is 0.

    Only needed when ``eps`` may be 0; with a concrete positive ``eps`` the
    denominator is never 0 and the guard would be a wasted pass.
    """
    if is_concrete_positive(eps):
        return quotient
    return jnp.where((numerator == 0) & (denominator_root == 0), jnp.zeros_like(quotient), quotient)


# ---------------------------------------------------------------------------
# Per-leaf formulas (shared by the ops and the transformations)


def regularized_grad(g, x, norm_coefficient):
    """``G_reg = norm_coefficient * X + G`` (SPEC 1, 3, 4); ``x=None`` means no term."""
    if x is None:
        return g
    return norm_coefficient * x + g


def adagrad_leaf(g, h, x, *, eps, norm_coefficient, dtype):
    """SPEC 1 for one tensor: returns ``(G_reg / (sqrt(H_new) + eps), H_new)`` in ``dtype``.

    ``x`` is the parameter, or None when ``norm_coefficient`` is known to be 0.
    """
    g = g.astype(dtype)
    x = None if x is None else x.astype(dtype)
    g_reg = regularized_grad(g, x, norm_coefficient)
    h_new = h.astype(dtype) + g_reg * g_reg
    root = jnp.sqrt(h_new)
    direction = _guard_zero_over_zero(g_reg, root, g_reg / (root + eps), eps)
    return direction, h_new


def adam_leaf(g, m, v, x, *, b1, b2, eps, norm_coefficient, dtype):
    """SPEC 2/3 for one tensor: returns ``(M_new / (sqrt(V_new) + eps), M_new, V_new)``.

    ``M`` is the first moment (DirectML's M, ONNX Adam's V), ``V`` the second
    (DirectML's V, ONNX Adam's H). The bias correction (DirectML's Alpha) is a
    scalar the caller applies.
    """
    g = g.astype(dtype)
    x = None if x is None else x.astype(dtype)
    g_reg = regularized_grad(g, x, norm_coefficient)
    m_new = b1 * m.astype(dtype) + (1 - b1) * g_reg
    v_new = b2 * v.astype(dtype) + (1 - b2) * g_reg * g_reg
    root = jnp.sqrt(v_new)
    direction = _guard_zero_over_zero(m_new, root, m_new / (root + eps), eps)
    return direction, m_new, v_new


def momentum_leaf(g, v, x, *, alpha, beta_adj, nesterov, norm_coefficient, dtype):
    """SPEC 4 for one tensor: returns ``(direction, V_new)``.

    ``direction`` is ``V_new`` (standard) or ``G_reg + alpha * V_new`` (nesterov);
    ``beta_adj`` is ``beta`` if T > 0 else 1, a scalar the caller computes.
    """
    g = g.astype(dtype)
    x = None if x is None else x.astype(dtype)
    g_reg = regularized_grad(g, x, norm_coefficient)
    v_new = alpha * v.astype(dtype) + beta_adj * g_reg
    direction = g_reg + alpha * v_new if nesterov else v_new
    return direction, v_new


def one_minus_power(b, t, dtype):
    """``1 - b^t`` in ``dtype`` for ``b`` in [0, 1) and ``t >= 1``, accurate when ``b`` is near 1.

    ``1 - b`` is formed before ``b`` is rounded to ``dtype`` (a Python float is
    a double), and ``1 - b^t = -expm1(t * log1p(-(1 - b)))``: ``1 - b^t`` written
    out loses the digits of ``1 - b`` (float32 rounds b = 1 - 1e-8 to 1, which
    made Adam's step infinite or zero, and b = 1 - 1e-7 to 1 - 1.19e-7, a 16%
    error in Alpha); this form keeps ``dtype``'s relative accuracy for every b.
    """
    return -jnp.expm1(t * jnp.log1p(-jnp.asarray(1 - b, dtype)))


def adam_bias_correction(step, b1, b2, dtype):
    """DirectML's ``Alpha = sqrt(1 - b2^T) / (1 - b1^T)`` in ``dtype``; 1 where T = 0.

    SPEC 2, Decision (T): T = 0 would divide 0 by 0; the ONNX Adam rule (SPEC 3)
    uses the learning rate unscaled there.
    """
    t = jnp.asarray(step).astype(dtype)
    t_pos = jnp.maximum(t, jnp.ones_like(t))  # T = 0 is replaced below; keeps 0 * log(0) out
    alpha = jnp.sqrt(one_minus_power(b2, t_pos, dtype)) / one_minus_power(b1, t_pos, dtype)
    return jnp.where(t > 0, alpha, jnp.ones_like(alpha))


def adagrad_decay(step, decay_factor, dtype):
    """``1 / (1 + T * decay_factor)`` in ``dtype`` (SPEC 1, the factor in ``r``)."""
    return 1 / (1 + jnp.asarray(step).astype(dtype) * decay_factor)


# ---------------------------------------------------------------------------
# Validation for the ops


# T and R of the spec ops; the checks live in checks.py with the other validation.
_check_step = checks.check_step_count
_check_rate = checks.check_rate_scalar


def _check_tensors(reference_name: str, reference: Any, **others: Any) -> None:
    checks.check_floating(reference, reference_name)
    if not jax.tree_util.tree_leaves(reference):
        raise ValueError(f"{reference_name} must hold at least one tensor, got {reference!r}")
    for name, tree in others.items():
        checks.check_same_shapes(tree, reference, name, reference_name)
        checks.check_floating(tree, name)


def map_leaves(fn, num_outputs: int, tree, *others):
    """Apply a multi-output per-leaf ``fn`` over trees shaped like ``tree``; a tuple of trees back.

    ``others`` may contain None (for example absent ``params``), which passes
    None to ``fn`` for every leaf. Leaves are converted with ``jnp.asarray``
    (a Python float parameter becomes a weakly typed float32 array).
    """
    treedef = jax.tree_util.tree_structure(tree)
    columns = [[jnp.asarray(leaf) for leaf in treedef.flatten_up_to(tree)]]
    for other in others:
        if other is None:
            columns.append([None] * treedef.num_leaves)
        else:
            columns.append([jnp.asarray(leaf) for leaf in treedef.flatten_up_to(other)])
    results = [fn(*leaves) for leaves in zip(*columns)]
    if not results:  # an empty tree gives empty trees
        return tuple(treedef.unflatten([]) for _ in range(num_outputs))
    return tuple(treedef.unflatten(list(outputs)) for outputs in zip(*results))


# ---------------------------------------------------------------------------
# The spec ops


class OnnxAdagradOutputs(NamedTuple):
    """Outputs of :func:`onnx_adagrad`: all ``X_new``, then all ``H_new``."""

    X_new: Any
    H_new: Any


class OnnxAdamOutputs(NamedTuple):
    """Outputs of :func:`onnx_adam`: ``X_new``, ``V_new`` (first moments), ``H_new`` (second)."""

    X_new: Any
    V_new: Any
    H_new: Any


class DmlAdamOutputs(NamedTuple):
    """Outputs of :func:`dml_adam`: DirectML's Output{Parameters,FirstMoment,SecondMoment}Tensor."""

    X: Any
    M: Any
    V: Any


class OnnxMomentumOutputs(NamedTuple):
    """Outputs of :func:`onnx_momentum`: all ``X_new``, then all ``V_new``."""

    X_new: Any
    V_new: Any


def onnx_adagrad(
    R: Any,
    T: Any,
    X: Any,
    G: Any,
    H: Any,
    *,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
) -> OnnxAdagradOutputs:
    """ONNX ``ai.onnx.preview.training::Adagrad`` (version 1), several tensors at once.

    Computes, for every tensor (SPEC.md section 1)::

        r     = R / (1 + T * decay_factor)
        G_reg = norm_coefficient * X + G
        H_new = H + G_reg * G_reg
        X_new = X - r * G_reg / (sqrt(H_new) + epsilon)

    With ``epsilon = 0``, a coordinate whose ``G_reg`` and ``H_new`` are both 0
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
    checks.check_scalar("decay_factor", decay_factor, low=0.0)
    checks.check_scalar("epsilon", epsilon, low=0.0)
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0)
    R = _check_rate("R", R)
    T = _check_step("T", T)
    _check_tensors("X", X, G=G, H=H)
    use_x = not is_concrete_zero(norm_coefficient)
    rate = per_dtype(lambda dtype: R.astype(dtype) * adagrad_decay(T, decay_factor, dtype))

    def leaf(x, g, h):
        dtype = compute_dtype(x.dtype, g.dtype, h.dtype)
        direction, h_new = adagrad_leaf(
            g, h, x if use_x else None, eps=epsilon, norm_coefficient=norm_coefficient, dtype=dtype
        )
        r = rate(dtype)
        x_new = x.astype(dtype) - r * direction
        return x_new.astype(x.dtype), h_new.astype(h.dtype)

    return OnnxAdagradOutputs(*map_leaves(leaf, 2, X, G, H))


def onnx_adam(
    R: Any,
    T: Any,
    X: Any,
    G: Any,
    V: Any,
    H: Any,
    *,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> OnnxAdamOutputs:
    """ONNX ``ai.onnx.preview.training::Adam`` (version 1), several tensors at once.

    Computes, for every tensor (SPEC.md section 3)::

        G_reg = norm_coefficient * X + G
        V_new = alpha * V + (1 - alpha) * G_reg
        H_new = beta * H + (1 - beta) * G_reg * G_reg
        r_adj = R * sqrt(1 - beta^T) / (1 - alpha^T)   if T > 0   else R
        X_new = (1 - norm_coefficient_post) * (X - r_adj * V_new / (sqrt(H_new) + epsilon))

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
    checks.check_scalar("alpha", alpha, low=0.0, high=1.0, high_open=True)
    checks.check_scalar("beta", beta, low=0.0, high=1.0, high_open=True)
    checks.check_scalar("epsilon", epsilon, low=0.0)
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0)
    checks.check_scalar("norm_coefficient_post", norm_coefficient_post, low=0.0, high=1.0, high_open=True)
    R = _check_rate("R", R)
    T = _check_step("T", T)
    _check_tensors("X", X, G=G, V=V, H=H)
    use_x = not is_concrete_zero(norm_coefficient)
    rate = per_dtype(lambda dtype: R.astype(dtype) * adam_bias_correction(T, alpha, beta, dtype))

    def leaf(x, g, v, h):
        dtype = compute_dtype(x.dtype, g.dtype, v.dtype, h.dtype)
        direction, v_new, h_new = adam_leaf(
            g, v, h, x if use_x else None, b1=alpha, b2=beta, eps=epsilon,
            norm_coefficient=norm_coefficient, dtype=dtype,
        )
        r_adj = rate(dtype)
        x_new = (1 - jnp.asarray(norm_coefficient_post, dtype)) * (x.astype(dtype) - r_adj * direction)
        return x_new.astype(x.dtype), v_new.astype(v.dtype), h_new.astype(h.dtype)

    return OnnxAdamOutputs(*map_leaves(leaf, 3, X, G, V, H))


def dml_adam(
    X: Any,
    M: Any,
    V: Any,
    G: Any,
    T: Any,
    *,
    learning_rate: float,
    beta1: float,
    beta2: float,
    epsilon: float,
) -> DmlAdamOutputs:
    """DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (feature level 3_0), over pytrees.

    Computes (SPEC.md section 2; the "epsilon-hat" Adam of Kingma & Ba, end of
    their section 2)::

        M     = Beta1 * M + (1 - Beta1) * G
        V     = Beta2 * V + (1 - Beta2) * G * G
        Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
        X     = X - LearningRate * Alpha * M / (sqrt(V) + Epsilon)

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
      beta1: Beta1, in [0, 1). beta2: Beta2, in [0, 1).
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
    checks.check_scalar("learning_rate", learning_rate, low=0.0)
    checks.check_scalar("beta1", beta1, low=0.0, high=1.0, high_open=True)
    checks.check_scalar("beta2", beta2, low=0.0, high=1.0, high_open=True)
    checks.check_scalar("epsilon", epsilon, low=0.0)
    T = _check_step("T", T)
    _check_tensors("X", X, M=M, V=V, G=G)
    step_size = per_dtype(
        lambda dtype: jnp.asarray(learning_rate, dtype) * adam_bias_correction(T, beta1, beta2, dtype)
    )

    def leaf(x, m, v, g):
        dtype = compute_dtype(x.dtype, m.dtype, v.dtype, g.dtype)
        direction, m_new, v_new = adam_leaf(
            g, m, v, None, b1=beta1, b2=beta2, eps=epsilon, norm_coefficient=0.0, dtype=dtype
        )
        step = step_size(dtype)
        x_new = x.astype(dtype) - step * direction
        return x_new.astype(x.dtype), m_new.astype(m.dtype), v_new.astype(v.dtype)

    return DmlAdamOutputs(*map_leaves(leaf, 3, X, M, V, G))


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
    checks.check_choice("mode", mode, ("standard", "nesterov"))
    checks.check_scalar("norm_coefficient", norm_coefficient, low=0.0)
    R = _check_rate("R", R)
    T = _check_step("T", T)
    _check_tensors("X", X, G=G, V=V)
    use_x = not is_concrete_zero(norm_coefficient)
    beta_adjusted = per_dtype(lambda dtype: jnp.where(T > 0, jnp.asarray(beta, dtype), jnp.asarray(1, dtype)))

    def leaf(x, g, v):
        dtype = compute_dtype(x.dtype, g.dtype, v.dtype)
        direction, v_new = momentum_leaf(
            g, v, x if use_x else None, alpha=alpha, beta_adj=beta_adjusted(dtype),
            nesterov=mode == "nesterov", norm_coefficient=norm_coefficient, dtype=dtype,
        )
        x_new = x.astype(dtype) - R.astype(dtype) * direction
        return x_new.astype(x.dtype), v_new.astype(v.dtype)

    return OnnxMomentumOutputs(*map_leaves(leaf, 2, X, G, V))
