"""T5X's Adafactor as an Optax transformation (SPEC 5b): :func:`t5x_adafactor`.

The algorithm is SPEC 5's; T5X (google-research/t5x, ``t5x/adafactor.py``)
differs in its defaults and options: a learning rate is required, the two
largest axes of a matrix are factored when the smaller is at least 128, a
parameter of rank > 2 needs a factor rule, weight decay is not scaled by the
step size, and it adds ``step_offset``, ``max_parameter_scale``,
``weight_decay_rate_lr_exponent``, ``global_norm_clip_threshold`` and
``skip_nan_updates``. This module maps those arguments onto the engine
(:class:`~optkit._src.adafactor.engine.Adafactor`) with T5X's factoring planner, :func:`t5x_planner`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike

from optkit._src import hyperparams, trees
from optkit._src.adafactor import fast
from optkit._src.adafactor.engine import Adafactor, heuristic
from optkit._src.adafactor.factoring import check_factoring
from optkit._src.adafactor.rules import HEURISTIC, Plan, Rules, heuristic_plan, plan_of
from optkit._src.adafactor.state import ScaleByAdafactorState
from optkit._src.numerics import concrete_float

__all__ = ["t5x_adafactor"]


def t5x_planner(name: str, rules: Rules, factored: bool, factored_dims: str):
    """T5X's reading of the factoring options: ``factored=False`` factors nothing (rules ignored); the
    heuristic (:func:`optkit.factored_axes`) only for rank <= 2, where a rule without a batch axis also falls
    back to it (T5X logs a warning); a parameter of rank > 2 without a rule is an error. Returns the engine's
    ``planner(path, shape, names, min_dim) -> Plan``."""

    def planner(path: str, shape: tuple[int, ...], names, min_dim: int | None) -> Plan:
        if not factored:
            return heuristic_plan(shape, None)
        rule = rules.roles(path, len(shape), names) if rules.any else HEURISTIC
        if rule is None:
            return heuristic_plan(shape, None)
        if rule == HEURISTIC or (len(shape) <= 2 and "batch" not in rule):
            if len(shape) > 2:
                raise ValueError(f"{name}: the parameter {path!r} of shape {shape} has rank > 2 and needs a "
                                 f"factor rule (factor_map, or logical_factor_rules with its axes' names)")
            return heuristic(shape, factored, factored_dims, min_dim)
        return plan_of(rule, shape, f"{name}: {path!r}")

    return planner


def _off_when_zero(value: Any) -> Any:
    """T5X tests these options for truth: a concrete 0 (or None) means off."""
    return None if value is None or concrete_float(value) == 0.0 else value


def _clip_by_global_norm(updates: Any, threshold: Any) -> Any:
    """T5X's gradient clipping, before the statistics: ``g * d * min(1/d, 1/||g||)`` over every leaf."""
    leaves = [jnp.asarray(g) for g in jax.tree.leaves(updates)]
    norm = jnp.sqrt(jnp.sum(jnp.array([jnp.sum(jnp.square(g)) for g in leaves])))
    d = jnp.asarray(threshold, jnp.result_type(norm, jnp.float32))
    scale = d * jnp.minimum(1 / d, 1 / norm)
    return jax.tree.map(lambda g: (jnp.asarray(g) * scale).astype(jnp.asarray(g).dtype), updates)


def _skip_nan(updates: Any, new: ScaleByAdafactorState, old: ScaleByAdafactorState):
    """T5X's ``skip_nan_updates``: an update element that is NaN becomes 0, and a statistic or first-moment
    element that would become NaN keeps its previous value."""
    keep = lambda a, b: jnp.where(jnp.isnan(a), b, a)  # noqa: E731
    updates = jax.tree.map(lambda u: jnp.where(jnp.isnan(u), jnp.zeros_like(u), u), updates)
    mu = None if new.mu is None else jax.tree.map(keep, new.mu, old.mu)
    return updates, new._replace(nu=jax.tree.map(keep, new.nu, old.nu), mu=mu)


def t5x_adafactor(
    learning_rate: optax.ScalarOrSchedule,
    factored: bool = True,
    multiply_by_parameter_scale: bool | Any = True,
    beta1: float | None = None,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    clipping_threshold: float | None = 1.0,
    weight_decay_rate: float | None = None,
    min_dim_size_to_factor: int = 128,
    epsilon1: float = 1e-30,
    epsilon2: float = 1e-3,
    dtype_momentum: DTypeLike = jnp.float32,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    weight_decay_rate_lr_exponent: float | None = None,
    global_norm_clip_threshold: float | None = None,
    max_parameter_scale: float | None = None,
    skip_nan_updates: bool = False,
    *,
    param_logical_axes: Any = None,
) -> optax.GradientTransformation:
    """T5X's Adafactor (``t5x.adafactor.Adafactor``) as an Optax ``GradientTransformation``.

    The arguments are T5X's, with its names, order, defaults and meanings;
    ``optax.apply_updates(params, updates)`` gives the parameters T5X's
    ``apply_gradient`` gives. Per parameter ``X`` with gradient ``G`` (in
    float32), ``t = count - step_offset + 1`` and ``lr = learning_rate``
    (or ``learning_rate(count)``)::

        G       = G * d * min(1/d, 1/||G_all||)              # global_norm_clip_threshold d, over all leaves
        b2      = 1 - t^(-decay_rate)
        R, C    = b2 R + (1 - b2) mean_cols(G^2 + epsilon1), b2 C + (1 - b2) mean_rows(G^2 + epsilon1)
        U       = G / sqrt(R C / mean(R))                       # or G / sqrt(V) unfactored
        U       = U / max(1, RMS(U) / clipping_threshold)
        scale   = lr * min(max(epsilon2, RMS(X)), max_parameter_scale)   # lr alone without the parameter scale
        M       = beta1 M + (1 - beta1) scale U                  # with beta1; then the step is M
        X_new   = (1 - w) X - scale U,   w = weight_decay_rate (* lr^weight_decay_rate_lr_exponent)

    ``RMS`` and the means are per slice of the batch axes (SPEC 5b). With
    ``skip_nan_updates`` an element of ``X``, of a statistic or of ``M`` that
    would become NaN keeps its previous value.

    Factoring: without rules, a matrix's two largest axes (the second largest
    as the rows) when the smaller is at least ``min_dim_size_to_factor``;
    vectors and scalars are not factored, and a parameter of rank > 2 is a
    ``ValueError``. ``factor_map`` is a sequence of ``(regex, rule)`` pairs,
    ``re.search``-ed against the parameter's path joined by ``/``, first match
    wins; a rule is a tuple of per-axis roles (``"row"``, ``"column"`` or
    ``"col"``, ``"batch"``, ``"none"`` or None; T5X's ``FactorDim`` values are
    accepted too), ``"heuristic"`` (T5X's ``HEURISTIC_RULE``) or None (not
    factored). ``logical_factor_rules`` (e.g.
    :func:`t5x_standard_logical_factor_rules`) maps logical axis names to
    roles, for names from ``param_logical_axes`` or, where that is not given,
    from each parameter's Flax metadata (``nnx.with_partitioning``,
    ``nnx.vmap`` or ``nnx.scan`` with ``transform_metadata={nnx.PARTITION_NAME:
    "layers"}``, linen ``nn.Partitioned``); it supersedes ``factor_map``, as
    T5X's ``set_param_axes`` does. As in T5X, a parameter whose names give
    rows but no columns (or the reverse) is not factored (its batch axes
    stay), and a rule for a parameter of rank <= 2 without a batch axis falls
    back to the heuristic. Unlike T5X, the state has no ``(1,)`` placeholders:
    the row and column statistics, or ``v``, in float32, and ``m`` (in
    ``dtype_momentum``) only with ``beta1``.

    Args:
      learning_rate: a float or an Optax schedule (called with the 0-based
        step count, as T5X's trainer feeds it each step), >= 0.
      factored: False keeps a full second moment for every parameter (and
        ignores factor rules, as T5X does).
      multiply_by_parameter_scale: a bool, or ``(regex, bool)`` pairs by path.
      beta1: the first-moment decay in [0, 1), or None (no first moment).
      decay_rate: the exponent of ``b2 = 1 - t^(-decay_rate)``, > 0.
      step_offset: the step at which the second moments restart (fine-tuning),
        an integer.
      clipping_threshold: ``d`` of the update clipping, > 0, or None.
      weight_decay_rate: ``w`` in ``X_new = (1 - w) X - ...``, >= 0, or None.
      min_dim_size_to_factor: the heuristic factors a matrix whose smaller
        of the two largest axes is at least this long, >= 1.
      epsilon1, epsilon2: added to ``G^2``; the floor of the parameter scale, >= 0.
      dtype_momentum: the first moment's dtype.
      factor_map: ``(regex, rule)`` pairs, or None.
      logical_factor_rules: a mapping from logical axis name to role, or None.
      weight_decay_rate_lr_exponent: ``w = (weight_decay_rate or 1) * lr^e``
        when set (PaLM's ``lr^2`` decay); 0 or None: off.
      global_norm_clip_threshold: clip the gradients by their global norm
        first, > 0; 0 or None: off.
      max_parameter_scale: the ceiling of ``max(epsilon2, RMS(X))``, > 0, or None.
      skip_nan_updates: keep previous values where the new ones are NaN.
      param_logical_axes: a tree like the parameters whose leaves are tuples
        of logical axis names or ``PartitionSpec`` objects (T5X's ``set_param_axes``),
        or None.

    Returns:
      ``optax.chain`` of the step and ``optax.scale(-1)``; its state is
      ``(ScaleByAdafactorState, EmptyState())``.

    Raises:
      ValueError: a hyperparameter out of range, ``learning_rate`` None,
        ``factored=False`` with a ``factor_map`` (at construction); at ``init``
        or ``update``, naming the parameter's path: a parameter of rank > 2
        without a rule, no ``factor_map`` pattern matching, a rule of the
        wrong length, an unknown role or logical name, rows and columns with
        a ``"none"`` axis from logical names, rows without columns in a rule,
        and ``optkit.FlatParams``.
      TypeError: non-bool flags, a ``factor_map`` that is not pairs, a
        non-integer ``step_offset`` or ``min_dim_size_to_factor``.

    Source: google-research/t5x ``t5x/adafactor.py`` (SPEC 5b).

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> params = {"layers": {"mlp": jnp.ones((4, 8, 16))}, "scale": jnp.ones(8)}
      >>> tx = optkit.t5x_adafactor(1e-2, logical_factor_rules=optkit.t5x_standard_logical_factor_rules(),
      ...                           param_logical_axes={"layers": {"mlp": ("layers", "embed", "mlp")},
      ...                                               "scale": ("embed",)})
      >>> state = tx.init(params)
      >>> state[0].nu["layers"]["mlp"].v_row.shape, state[0].nu["layers"]["mlp"].v_col.shape
      ((4, 8), (4, 16))
      >>> updates, state = tx.update({"layers": {"mlp": jnp.ones((4, 8, 16))}, "scale": jnp.ones(8)}, state, params)
    """
    if learning_rate is None:
        raise ValueError("t5x_adafactor: learning_rate is required (T5X asserts one is provided)")
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    hyperparams.check_flag("factored", factored)
    hyperparams.check_flag("skip_nan_updates", skip_nan_updates)
    hyperparams.check_decay("beta1", beta1, allow_none=True)
    hyperparams.check_scalar("decay_rate", decay_rate, low=0.0, low_open=True)
    if isinstance(step_offset, (bool, float)) or not isinstance(step_offset, int) and not (
            hasattr(step_offset, "dtype") and jnp.issubdtype(step_offset.dtype, jnp.integer)):
        raise TypeError(f"step_offset must be an integer, got {step_offset!r}")
    hyperparams.check_scalar("clipping_threshold", clipping_threshold, low=0.0, low_open=True, allow_none=True)
    hyperparams.check_scalar("weight_decay_rate", weight_decay_rate, low=0.0, allow_none=True)
    check_factoring(True, "largest", min_dim_size_to_factor)
    hyperparams.check_scalar("epsilon1", epsilon1, low=0.0)
    hyperparams.check_scalar("epsilon2", epsilon2, low=0.0)
    if isinstance(dtype_momentum, (jax.Array, np.ndarray)) and jnp.issubdtype(dtype_momentum.dtype, jnp.floating):
        # optax.inject_hyperparams takes the default jnp.float32 (a callable) for a schedule and passes
        # jnp.float32(count): an array of that dtype.
        dtype_momentum = dtype_momentum.dtype
    dtype_momentum = hyperparams.check_dtype("dtype_momentum", dtype_momentum)
    hyperparams.check_scalar("weight_decay_rate_lr_exponent", weight_decay_rate_lr_exponent, allow_none=True)
    hyperparams.check_scalar("global_norm_clip_threshold", global_norm_clip_threshold, low=0.0,
                             allow_none=True)
    hyperparams.check_scalar("max_parameter_scale", max_parameter_scale, low=0.0, low_open=True, allow_none=True)
    if not factored and factor_map is not None:
        raise ValueError("t5x_adafactor: factored is False but factor_map is given (T5X refuses this too)")
    if not isinstance(multiply_by_parameter_scale, (bool, type(None))) and isinstance(
            multiply_by_parameter_scale, (int, float)):
        raise TypeError(f"multiply_by_parameter_scale must be a bool or (regex, bool) pairs, got "
                        f"{multiply_by_parameter_scale!r}")
    rules = Rules(factor_map=factor_map, logical_factor_rules=logical_factor_rules,
                  param_logical_axes=param_logical_axes, multiply_by_parameter_scale=multiply_by_parameter_scale)
    exponent = _off_when_zero(weight_decay_rate_lr_exponent)
    decays = weight_decay_rate is not None or exponent is not None
    if rules.may_scale:
        params_reason = "multiply_by_parameter_scale (the step size lr * max(epsilon2, RMS(X)))"
    else:
        params_reason = "weight decay" if decays else None
    options = fast.Options(epsilon1, epsilon2, clipping_threshold, beta1, weight_decay_rate if decays else None,
                           max_parameter_scale)
    offset = None if isinstance(step_offset, int) and step_offset == 0 else step_offset
    af = Adafactor("t5x_adafactor", planner=t5x_planner("t5x_adafactor", rules, factored, "largest"), rules=rules,
                   learning_rate=learning_rate, decay_rate=decay_rate, options=options,
                   min_dim_size_to_factor=min_dim_size_to_factor, mu_dtype=dtype_momentum, nu_dtype=jnp.float32,
                   params_reason=params_reason, decay_by_alpha=False,
                   b2_count=None if offset is None else lambda count: count - offset)
    clip_norm = _off_when_zero(global_norm_clip_threshold)

    def update_fn(updates, state, params=None):
        step_options = None
        if exponent is not None:  # PaLM's decay: (weight_decay_rate or 1) * lr^exponent, this step's lr
            count = trees.check_state(state, ScaleByAdafactorState, af.name).count
            lr = learning_rate(count) if callable(learning_rate) else learning_rate
            rate = 1.0 if weight_decay_rate is None else weight_decay_rate
            step_options = options._replace(weight_decay_rate=rate * jnp.asarray(lr, jnp.float32) ** exponent)
        if clip_norm is not None:
            updates = _clip_by_global_norm(updates, clip_norm)
        new_updates, new_state = af.update_state(updates, state, params, step_options)
        if skip_nan_updates:
            old = trees.check_state(state, ScaleByAdafactorState, af.name)
            new_updates, new_state = _skip_nan(new_updates, new_state, old)
        return new_updates, new_state

    init_fn = lambda params: af.init_state(params, with_mu=beta1 is not None)  # noqa: E731
    return optax.chain(optax.GradientTransformation(init_fn, update_fn), optax.scale(-1.0))
