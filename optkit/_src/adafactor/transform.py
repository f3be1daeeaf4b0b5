"""Adafactor as Optax transformations: :func:`scale_by_factored_rms`, :func:`scale_by_adafactor`, :func:`adafactor`.

Each ``update`` reads the state (:mod:`~optkit._src.adafactor.reading`),
computes the step's scalars ``b2_t`` and ``rho_t`` once per dtype, and runs
:func:`optkit._src.adafactor.fast.leaf_step` (the paper's algorithm,
:mod:`~optkit._src.adafactor.paper`) on each leaf.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from optkit._src import flat, hyperparams, sharding, trees
from optkit._src.adafactor import fast
from optkit._src.adafactor.factoring import check_factoring, concrete_min_dim_size, factored_axes
from optkit._src.adafactor.reading import read_second_moments
from optkit._src.adafactor.rules import HEURISTIC, Plan, Rules, heuristic_plan, metadata_names, plan_of
from optkit._src.adafactor.state import (
    FactoredSecondMoment,
    FullSecondMoment,
    ScaleByAdafactorState,
    ScaleByFactoredRmsState,
    init_second_moments,
)
from optkit._src.numerics import compute_dtype, is_concrete_positive, per_dtype

__all__ = ["scale_by_factored_rms", "scale_by_adafactor", "adafactor"]


def _b2(count, decay_rate, dtype):
    """``b2_t = 1 - t^(-decay_rate)`` with ``t = count + 1``, in ``dtype`` (so ``b2_1 = 0``)."""
    t = count.astype(dtype) + 1  # in dtype: count + 1 in int32 wraps to -2^31 at the last count
    return 1 - t ** (-jnp.asarray(decay_rate, dtype))


def _step_scalars(count, learning_rate, decay_rate, step_offset=0):
    """The step's ``(b2_t, lr_t)`` per dtype, for the update with ``t = count + 1``: computed once per step.

    ``lr_t`` is ``rho_t = min(1e-2, 1/sqrt(t))`` when ``learning_rate`` is None
    (SPEC 5), ``schedule(count)`` for an Optax schedule (called once, with the
    number of updates already made, as ``optax.scale_by_learning_rate`` calls
    it), or the number itself. Returns ``dtype -> (b2_t, lr_t)``, memoized.
    """
    value = learning_rate(count) if callable(learning_rate) else learning_rate

    def scalars(dtype):
        b2 = _b2(count if isinstance(step_offset, int) and step_offset == 0 else count - step_offset,
                 decay_rate, dtype)
        if value is None:
            t = count.astype(dtype) + 1
            return b2, jnp.minimum(jnp.asarray(1e-2, dtype), 1 / jnp.sqrt(t))
        return b2, jnp.asarray(value).astype(dtype)

    return per_dtype(scalars)


class _Adafactor:
    """One Adafactor transformation's options, and its init and update (shared by every public form).

    ``t5x_factoring`` is T5X's reading of the factoring options
    (:func:`~optkit._src.adafactor.t5x.t5x_adafactor`): the heuristic only for
    rank <= 2, a rule of rank <= 2 without a batch axis falls back to it,
    ``factored=False`` ignores the rules. What else only T5X does is its
    own: the step's options (``fast.Options``' parameter-scale ceiling,
    ``decay_by_alpha=False``: weight decay not scaled by the step size) and the transformations around
    this step in ``t5x.py`` (global-norm clipping, skipping NaN elements).
    """

    def __init__(self, name, *, learning_rate, decay_rate, options: fast.Options, rules: Rules, factored,
                 factored_dims, min_dim_size_to_factor, mu_dtype, nu_dtype, params_reason,
                 t5x_factoring: bool = False, decay_by_alpha: bool = True, step_offset=0):
        self.name = name
        self.learning_rate = learning_rate
        self.decay_rate = decay_rate
        self.options = options
        self.rules = rules
        self.factored, self.factored_dims, self.min_dim = factored, factored_dims, min_dim_size_to_factor
        self.mu_dtype, self.nu_dtype = mu_dtype, nu_dtype
        self.params_reason = params_reason
        self.guard = not is_concrete_positive(options.eps1)
        self.t5x_factoring, self.decay_by_alpha, self.step_offset = t5x_factoring, decay_by_alpha, step_offset

    def _heuristic(self, path: str, shape: tuple[int, ...], min_dim: int | None) -> Plan:
        if self.t5x_factoring and len(shape) > 2:
            raise ValueError(f"{self.name}: the parameter {path!r} of shape {shape} has rank > 2 and needs a "
                             f"factor rule (factor_map, or logical_factor_rules with its axes' names)")
        if min_dim is None:  # at update: the statistics' shapes say whether init factored it
            return heuristic_plan(shape, factored_axes(shape, factored=True, factored_dims=self.factored_dims))
        return heuristic_plan(shape, factored_axes(shape, factored=self.factored, factored_dims=self.factored_dims,
                                                   min_dim_size_to_factor=min_dim))

    def plan(self, path: str, shape: tuple[int, ...], names=None, min_dim: int | None = None) -> Plan:
        """How the parameter at ``path`` is factored (``min_dim`` None: at update, before the statistics say)."""
        if self.t5x_factoring and not self.factored:
            return heuristic_plan(shape, None)
        rule = self.rules.roles(path, len(shape), names) if self.rules.any else HEURISTIC
        if rule is None:
            return heuristic_plan(shape, None)
        if rule == HEURISTIC or (self.t5x_factoring and len(shape) <= 2 and "batch" not in rule):
            return self._heuristic(path, shape, min_dim)  # (T5X falls back to it for rank <= 2 and logs a warning)
        if not self.factored:
            rule = tuple("none" if r in ("row", "column") else r for r in rule)
        return plan_of(rule, shape, f"{self.name}: {path!r}")

    def init_nu(self, params):
        flat.refuse_flat(params, self.name)
        trees.check_floating(params, "params")
        min_dim = concrete_min_dim_size(self.min_dim)
        return init_second_moments(
            params, lambda path, shape, box: self.plan(path, shape, metadata_names(box), min_dim), self.nu_dtype)

    def _plan_at_update(self, path: str, shape: tuple[int, ...], node) -> Plan:
        roles = type(node).roles
        plan = plan_of(roles, shape, f"{self.name}: {path!r}") if roles is not None else self.plan(path, shape)
        return plan if plan.factored == isinstance(node, FactoredSecondMoment) else plan.unfactored()

    def _expected(self, path: str, shape: tuple[int, ...], node):
        plan = self._plan_at_update(path, shape, node)
        return (plan.stat_shape("column"), plan.stat_shape("row")) if plan.factored else None

    def init_state(self, params, *, with_mu: bool) -> ScaleByAdafactorState:
        """A fresh :class:`ScaleByAdafactorState`: count 0, zero statistics, a zero first moment if ``with_mu``."""
        mu = sharding.tree_zeros_like(params, self.mu_dtype) if with_mu else None
        return ScaleByAdafactorState(count=jnp.zeros([], jnp.int32), nu=self.init_nu(params), mu=mu)

    def update_state(self, updates, state, params, options=None):
        """``(updates, new state)`` from a :class:`ScaleByAdafactorState` (checked)."""
        state = trees.check_state(state, ScaleByAdafactorState, self.name)
        hyperparams.check_count(state.count, self.name)
        new_updates, nu, mu = self.step(updates, state.count, state.nu, state.mu, params, options)
        return new_updates, ScaleByAdafactorState(optax.safe_increment(state.count), nu, mu)

    def step(self, updates, count, nu, mu, params, options=None):
        """``(updates, new nu, new mu)`` for the update with ``t = count + 1`` (``options``: this step's, if
        they differ from the transformation's)."""
        flat.refuse_flat(updates, self.name)
        trees.check_floating(updates, "updates")
        nodes, write_nu = read_second_moments(nu, updates, self._expected, self.name)
        if self.options.b1 is not None:
            if mu is None:
                raise ValueError("state.mu is None but b1 is set: the state was made with b1=None")
            trees.check_same_shapes(mu, updates, "state.mu", "updates")
        if params is None:
            if self.params_reason is not None and nodes:  # an empty tree has nothing to scale
                trees.check_params_given(params, "adafactor", self.params_reason)
        else:
            trees.check_params(params, updates)
        treedef = jax.tree.structure(updates)
        grads = treedef.flatten_up_to(updates)
        paths = [trees.keystr(path, "/") for path, _ in sharding.leaves_with_paths(updates)]
        xs = [None] * len(grads) if params is None else treedef.flatten_up_to(params)
        mus = [None] * len(grads) if mu is None else treedef.flatten_up_to(mu)
        scalars = _step_scalars(count, self.learning_rate, self.decay_rate, self.step_offset)
        options = self.options if options is None else options
        if options.b1 is not None:  # a traced b1 outside [0, 1) gives NaN updates, never silent ones
            options = options._replace(b1=hyperparams.nan_unless_decays(jnp.asarray(options.b1), options.b1))
        new_updates, new_nu, new_mu = [], [], []
        for path, g, node, x, m in zip(paths, grads, nodes, xs, mus):
            g = jnp.asarray(g)
            x = None if x is None else jnp.asarray(x)
            # A leaf runs in the promotion of its gradient's, statistics', parameter's and first moment's dtypes
            # with float32; every result is stored back in its own dtype.
            dtype = compute_dtype(g.dtype, *(leaf.dtype for leaf in node), None if x is None else x.dtype,
                                  None if m is None else m.dtype)
            plan = self._plan_at_update(path, g.shape, node)
            g_, x_, m_, node_ = (None if a is None else _to_step(a, plan) for a in (g, x, m, node))
            split = plan.factored and any(sharding.may_be_split(a) for a in (g, *node))
            b2, lr = scalars(dtype)
            update, nu_leaf, m_new = fast.leaf_step(
                g_, x_, node_, m_, axes=plan.axes, b2=b2, lr=lr, options=options,
                multiply_by_parameter_scale=self.rules.multiply_by_parameter_scale(path), guard=self.guard,
                dtype=dtype, split=split, batch_ndim=plan.batch_ndim,
                decay_by_alpha=self.decay_by_alpha)
            update, m_new, nu_leaf = (None if a is None else _from_step(a, plan) for a in (update, m_new, nu_leaf))
            nu_leaf = type(node)(*(a.astype(b.dtype) for a, b in zip(nu_leaf, node)))
            new_updates.append(update.astype(g.dtype if x is None else x.dtype))
            new_nu.append(nu_leaf)
            if m_new is not None:
                new_mu.append(m_new.astype(m.dtype))
        mu = None if self.options.b1 is None else treedef.unflatten(new_mu)
        return treedef.unflatten(new_updates), write_nu(new_nu), mu


def _to_step(a, plan: Plan):
    """A parameter-shaped array, or a statistics node, in the step's layout (batch, whole, rows, columns)."""
    if plan.in_place:
        return a
    if isinstance(a, FactoredSecondMoment):
        return FactoredSecondMoment(
            jnp.transpose(a.v_row, plan.stat_perm("column")).reshape(plan.stat_step_shape("column")),
            jnp.transpose(a.v_col, plan.stat_perm("row")).reshape(plan.stat_step_shape("row")))
    if isinstance(a, FullSecondMoment):
        return FullSecondMoment(_to_step(a.v, plan))
    return jnp.transpose(a, plan.perm).reshape(plan.shape)


def _from_step(a, plan: Plan):
    """The inverse of :func:`_to_step`."""
    if plan.in_place:
        return a

    def back(x, dropped):
        kept = [axis for axis in plan.perm if plan.roles[axis] != dropped]
        x = x.reshape(tuple(plan.param_shape[axis] for axis in kept))
        order = sorted(range(len(kept)), key=lambda i: kept[i])  # the stored order: the parameter's
        return jnp.transpose(x, order)

    if isinstance(a, FactoredSecondMoment):
        return FactoredSecondMoment(back(a.v_row, "column"), back(a.v_col, "row"))
    if isinstance(a, FullSecondMoment):
        return FullSecondMoment(_from_step(a.v, plan))
    return back(a, None)


def _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype):
    hyperparams.check_scalar("decay_rate", decay_rate, low=0.0, low_open=True)
    hyperparams.check_scalar("eps1", eps1, low=0.0)
    check_factoring(factored, factored_dims, min_dim_size_to_factor)
    return hyperparams.check_dtype("nu_dtype", nu_dtype)


def scale_by_factored_rms(
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    *,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
) -> optax.GradientTransformation:
    """Adafactor's normalised gradient ``U_t = G_t / sqrt(V_t)``, before clipping and step size.

    With ``t = count + 1`` and ``b2_t = 1 - t^(-decay_rate)`` (so ``b2_1 = 0``:
    no bias correction is needed), for a factored leaf ``G`` (n x m over its
    factored axes, see :func:`optkit.factored_axes`; any other axes index independent
    matrices)::

        R_t = b2_t * R_{t-1} + (1 - b2_t) * mean_j(G_t^2 + eps1)     # row statistics
        C_t = b2_t * C_{t-1} + (1 - b2_t) * mean_i(G_t^2 + eps1)     # column statistics
        V_t = R_t C_t / mean_i(R_t)
        U_t = G_t / sqrt(V_t)

    and for any other leaf ``V_t = b2_t * V_{t-1} + (1 - b2_t) * (G_t^2 + eps1)``
    (SPEC.md section 5; Shazeer & Stern 2018, Algorithms 4 and 5). The paper's
    sums become means (the same ``V_t``). This is the building block that
    ``optax.scale_by_factored_rms`` also provides, with the paper's defaults and
    a state without placeholder arrays. :func:`scale_by_adafactor` is the whole
    algorithm.

    Args:
      decay_rate: the exponent in ``b2_t = 1 - t^(-decay_rate)`` (the paper's
        0.8), > 0.
      eps1: the paper's ``epsilon_1``, added to ``G^2`` (default 1e-30), >= 0.
        With 0, a coordinate whose ``V_t`` is 0 (its gradient has always been
        0) gets ``U = 0`` instead of 0/0.
      factored: False keeps a full second moment for every leaf.
      factored_dims: ``"last"`` (factor over the last two axes, as the paper,
        tensor2tensor and Hugging Face) or ``"largest"`` (the two largest
        axes, as Optax).
      min_dim_size_to_factor: a leaf whose chosen axes are not both at least
        this long keeps a full second moment; default 1 factors every leaf of
        rank >= 2. It decides the state's structure, so under
        ``optax.inject_hyperparams`` with a traced ``init`` it must be static.
      nu_dtype: dtype of the statistics; None keeps each parameter's dtype.
        float32 for bfloat16 parameters costs little (the factored statistics
        are vectors) and keeps the averages precise.
      factor_map, logical_factor_rules, param_logical_axes: factor rules
        (SPEC 5b), as :func:`adafactor` takes them.

    Returns:
      An ``optax.GradientTransformation`` with state
      :class:`ScaleByFactoredRmsState`; updates have the gradients' dtypes
      (arithmetic in float32 or wider).

    Raises:
      ValueError: ``decay_rate <= 0``, ``eps1 < 0``, an unknown
        ``factored_dims``, ``min_dim_size_to_factor < 1`` (at construction);
        gradients that do not match the state (at update, naming the path).
      TypeError: non-floating leaves, a non-bool ``factored``, a non-integer
        ``min_dim_size_to_factor``, a non-floating ``nu_dtype``.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_factored_rms(), optax.clip_by_block_rms(1.0),
      ...                  optax.scale_by_learning_rate(1e-2))
      >>> state = tx.init({"w": jnp.ones((3, 4))})
      >>> state[0].nu["w"].v_row.shape, state[0].nu["w"].v_col.shape
      ((3,), (4,))
    """
    nu_dtype = _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
    rules = Rules(factor_map=factor_map, logical_factor_rules=logical_factor_rules,
                  param_logical_axes=param_logical_axes, multiply_by_parameter_scale=False)
    # U_t alone: the Adafactor step with a unit step size, no parameter scale, no clipping.
    af = _Adafactor("scale_by_factored_rms", learning_rate=1, decay_rate=decay_rate,
                    options=fast.Options(eps1, None, None, None, None), rules=rules, factored=factored,
                    factored_dims=factored_dims, min_dim_size_to_factor=min_dim_size_to_factor,
                    mu_dtype=None, nu_dtype=nu_dtype, params_reason=None)

    def init_fn(params):
        return ScaleByFactoredRmsState(count=jnp.zeros([], jnp.int32), nu=af.init_nu(params))

    def update_fn(updates, state, params=None):
        del params
        state = trees.check_state(state, ScaleByFactoredRmsState, af.name)
        hyperparams.check_count(state.count, af.name)
        new_updates, nu, _ = af.step(updates, state.count, state.nu, None, None)
        return new_updates, ScaleByFactoredRmsState(optax.safe_increment(state.count), nu)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_adafactor(
    learning_rate: optax.ScalarOrSchedule | None = None,
    *,
    b1: float | None = None,
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    eps2: float = 1e-3,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    weight_decay_rate: float | None = None,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
) -> optax.GradientTransformation:
    """The whole Adafactor step, as a positive quantity: ``X_t = X_{t-1} - update``.

    :func:`adafactor` is this followed by a sign flip. Per leaf, with
    ``t = count + 1`` and ``U_t`` from :func:`scale_by_factored_rms`::

        U_t     = U_t / max(1, RMS(U_t) / d)                    # d = clipping_threshold
        alpha_t = max(eps2, RMS(X_{t-1})) * rho_t               # rho_t: see learning_rate
        M_t     = b1 * M_{t-1} + (1 - b1) * alpha_t * U_t        # only with b1
        update  = M_t (or alpha_t * U_t) + weight_decay_rate * alpha_t * X_{t-1}

    ``RMS(A) = sqrt(mean(A^2))`` over the whole leaf. All of it is one
    transformation because ``rho_t``, ``b2_t``, the first moment and the decay
    share one step count and the first moment averages the *scaled* update.

    Args:
      learning_rate: None for the paper's relative step ``rho_t = min(1e-2,
        1/sqrt(t))``; a float or an Optax schedule (called with ``count``, the
        number of updates already made) replaces ``rho_t`` (SPEC 5, Decision
        (learning rate)), >= 0.
      b1: the first-moment decay (the paper's ``beta_1``), in [0, 1), or None
        (default: no first moment, and no state for it).
      decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype: as
        :func:`scale_by_factored_rms`.
      eps2: the paper's ``epsilon_2``, the floor of the parameter scale
        (default 1e-3), >= 0.
      clipping_threshold: the paper's ``d`` (default 1), > 0, or None for no
        update clipping.
      multiply_by_parameter_scale: False drops the ``max(eps2, RMS(X_{t-1}))``
        factor (then ``params`` are only needed for weight decay).
      weight_decay_rate: decoupled weight decay ``w`` scaled by the step size,
        as Hugging Face's Adafactor (SPEC 5, Decision (weight decay)), >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      factor_map, logical_factor_rules, param_logical_axes: factor rules
        (SPEC 5b), as :func:`adafactor` takes them.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByAdafactorState`.
      Updates have the parameters' dtypes (the gradients' without params);
      arithmetic runs in float32 or wider, and the scalars (``t``, ``b2_t``,
      ``rho_t``, ``alpha_t``) in that dtype.

    Raises:
      ValueError: a hyperparameter out of range or an unknown ``factored_dims``
        (at construction); mismatched trees or ``params=None`` where the
        parameter scale or weight decay needs them (at update).
      TypeError: non-floating leaves, non-bool flags, a non-integer
        ``min_dim_size_to_factor``, non-floating state dtypes.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_adafactor(), optax.scale(-1.0))  # = optkit.adafactor()
      >>> state = tx.init({"w": jnp.ones((3, 4)), "b": jnp.zeros(4)})
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True, allow_none=True)
    hyperparams.check_decay("b1", b1, allow_none=True)
    nu_dtype = _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
    hyperparams.check_scalar("eps2", eps2, low=0.0)
    hyperparams.check_scalar("clipping_threshold", clipping_threshold, low=0.0, low_open=True, allow_none=True)
    hyperparams.check_flag("multiply_by_parameter_scale", multiply_by_parameter_scale)
    hyperparams.check_scalar("weight_decay_rate", weight_decay_rate, low=0.0, allow_none=True)
    mu_dtype = hyperparams.check_dtype("mu_dtype", mu_dtype)
    decay_reason = hyperparams.params_needed_for("weight_decay_rate", weight_decay_rate)
    if multiply_by_parameter_scale:
        params_reason = "multiply_by_parameter_scale=True (the step size max(eps2, RMS(X)) * rho_t)"
    else:
        params_reason = decay_reason
    options = fast.Options(eps1, eps2, clipping_threshold, b1, None if decay_reason is None else weight_decay_rate)
    rules = Rules(factor_map=factor_map, logical_factor_rules=logical_factor_rules,
                  param_logical_axes=param_logical_axes,
                  multiply_by_parameter_scale=bool(multiply_by_parameter_scale))
    af = _Adafactor("scale_by_adafactor", learning_rate=learning_rate, decay_rate=decay_rate, options=options,
                    rules=rules, factored=factored, factored_dims=factored_dims,
                    min_dim_size_to_factor=min_dim_size_to_factor, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                    params_reason=params_reason)

    return optax.GradientTransformation(lambda params: af.init_state(params, with_mu=b1 is not None),
                                        lambda updates, state, params=None: af.update_state(updates, state, params))


def adafactor(
    learning_rate: optax.ScalarOrSchedule | None = None,
    *,
    b1: float | None = None,
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    eps2: float = 1e-3,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    weight_decay_rate: float | None = None,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
) -> optax.GradientTransformation:
    """Adafactor exactly as Shazeer & Stern (ICML 2018) define it, with sublinear memory.

    ``optax.apply_updates(X, updates)`` gives, for each parameter tensor
    (SPEC.md section 5), with ``t = count + 1``::

        alpha_t = max(eps2, RMS(X_{t-1})) * rho_t,   rho_t = min(1e-2, 1/sqrt(t))
        b2_t    = 1 - t^(-decay_rate)                                 # b2_1 = 0
        R_t     = b2_t * R_{t-1} + (1 - b2_t) * mean_j(G_t^2 + eps1)   # factored leaves:
        C_t     = b2_t * C_{t-1} + (1 - b2_t) * mean_i(G_t^2 + eps1)   #   rows and columns
        V_t     = R_t C_t / mean_i(R_t)       # other leaves: b2_t V_{t-1} + (1 - b2_t)(G_t^2 + eps1)
        U_t     = G_t / sqrt(V_t)
        U_t     = U_t / max(1, RMS(U_t) / d)
        X_t     = X_{t-1} - alpha_t * U_t

    with the options: a first moment ``M_t = b1 M_{t-1} + (1 - b1) alpha_t U_t``
    replacing ``alpha_t U_t`` (tensor2tensor), and decoupled weight decay
    ``- weight_decay_rate * alpha_t * X_{t-1}`` (Hugging Face). With the
    defaults it is also Hugging Face ``transformers.optimization.Adafactor``
    with its defaults.

    Memory: a factored leaf of shape (..., n, m) keeps ``(..., n)`` row and
    ``(..., m)`` column statistics; other leaves one array of their shape; a
    first moment only with ``b1``; one int32 step count.

    Sharding (``jax.sharding``): ``tx.init`` and ``jax.jit(tx.init)`` on
    sharded parameters (and ``jax.eval_shape(tx.init, ...)`` with ``Explicit``
    mesh axes) give the first moment and unfactored statistics each
    parameter's ``NamedSharding``, the row statistics the parameter's
    ``PartitionSpec`` without the column axis and the column statistics
    without the row axis; the count is replicated.
    Reductions across shards (row and column means, ``RMS(X)``, ``RMS(U)``)
    are XLA's all-reduces of vectors and scalars.

    How it differs from ``optax.adafactor``: there, ``learning_rate=None``
    means no step size at all (``rho_t`` is absent) and the default
    ``min_dim_size_to_factor`` is 128 over the two largest axes; and Optax's
    weight decay is not scaled by the step size. ``optax.adafactor(
    learning_rate=lambda c: jnp.minimum(1e-2, 1 / jnp.sqrt(c + 1)))`` equals
    ``optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128)``.

    Args:
      learning_rate: None (default) for the paper's relative step size
        ``rho_t``; a float or an Optax schedule replaces ``rho_t``, >= 0.
      b1: the first-moment decay ``beta_1`` in [0, 1), or None (the paper's
        default: no first moment).
      decay_rate: the exponent of ``b2_t = 1 - t^(-decay_rate)``, > 0 (paper: 0.8).
      eps1: ``epsilon_1``, added to ``G^2`` (paper: 1e-30), >= 0.
      eps2: ``epsilon_2``, the floor of the parameter scale (paper: 1e-3), >= 0.
      clipping_threshold: ``d`` (paper: 1), > 0, or None for no update clipping.
      multiply_by_parameter_scale: False uses ``alpha_t = rho_t``.
      factored: False keeps a full second moment for every leaf.
      factored_dims: ``"last"`` or ``"largest"``; see :func:`optkit.factored_axes`.
      min_dim_size_to_factor: leaves whose chosen axes are shorter keep a full
        second moment (default 1: every leaf of rank >= 2 is factored).
      weight_decay_rate: ``w`` in ``- w * alpha_t * X_{t-1}``, >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      nu_dtype: dtype of the second-moment statistics; None keeps each
        parameter's dtype. For bfloat16 parameters, ``nu_dtype=jnp.float32``
        keeps float32 statistics (the mixed-precision setting); float16
        statistics overflow when the mean of ``G^2`` over a row or column
        reaches 65520 (an RMS gradient of 256), and the tensor's updates are
        NaN from then on (docs/usage.md).
      factor_map: factor rules by path (SPEC 5b): ``(regex, rule)`` pairs,
        ``re.search``-ed against the parameter's path joined by ``/`` (dict
        keys, attribute names, indices), first match wins, no match is a
        ``ValueError``. A rule is a tuple of per-axis roles, ``"row"``,
        ``"column"`` (or ``"col"``), ``"batch"``, ``"none"`` (or None), one
        per axis; ``"heuristic"`` (this optimizer's own factoring, as
        without rules); or None (not factored). Several row (or column) axes
        act as one; a ``"batch"`` axis is never averaged over: statistics,
        ``RMS(X)``, ``RMS(U)`` and the clipping are per slice, so layers
        stacked into one parameter train exactly as separate ones. Unlike
        :func:`t5x_adafactor`, a rule is applied as given at every rank
        (T5X falls back to its heuristic for rank <= 2 without a batch axis).
      logical_factor_rules: a mapping from logical axis name to role (e.g.
        :func:`t5x_standard_logical_factor_rules`), applied to each
        parameter's axis names from ``param_logical_axes`` or, where not
        given there, from its Flax metadata (``nnx.with_partitioning``,
        ``nnx.vmap`` or ``nnx.scan`` with ``transform_metadata``, linen
        ``nn.Partitioned``); it supersedes ``factor_map``. Names giving rows
        but no columns (or the reverse) mean not factored, batch axes kept;
        rows and columns with a ``"none"`` axis are a ``ValueError``.
      param_logical_axes: a tree like the parameters of tuples of logical
        names or ``PartitionSpec`` objects, or None.

    A NaN or infinite gradient element makes its whole tensor's update NaN
    (the statistics and RMS are shared over rows, columns and the tensor),
    and the tensor stays NaN; wrap the optimizer in ``optax.apply_if_finite``
    to skip such steps (docs/usage.md).

    Returns:
      An ``optax.GradientTransformation``: ``optax.chain`` of
      :func:`scale_by_adafactor` and ``optax.scale(-1)``; its state is
      ``(ScaleByAdafactorState, EmptyState())``. Updates have the parameters'
      dtypes. Every numeric argument works under ``optax.inject_hyperparams``
      (``min_dim_size_to_factor`` must be static if ``init`` is traced).

    Raises:
      ValueError: ``decay_rate <= 0``, ``eps1 < 0``, ``eps2 < 0``,
        ``clipping_threshold <= 0``, ``b1`` outside [0, 1), a negative learning
        or weight-decay rate, an unknown ``factored_dims``,
        ``min_dim_size_to_factor < 1``, an unknown role (at construction);
        mismatched trees, ``params=None`` with the parameter scale or weight
        decay (at update); a rule of the wrong length, no ``factor_map``
        match, an unknown logical name, rows without columns (at ``init``,
        naming the parameter's path).
      TypeError: non-floating leaves or state dtypes, non-bool flags.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
      >>> tx = optkit.adafactor()
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: jnp.sum((jnp.ones(4) @ p["w"] + p["b"]) ** 2))(params)
      >>> updates, state = tx.update(grads, state, params)
      >>> params = optax.apply_updates(params, updates)
    """
    return optax.chain(
        scale_by_adafactor(
            learning_rate,
            b1=b1,
            decay_rate=decay_rate,
            eps1=eps1,
            eps2=eps2,
            clipping_threshold=clipping_threshold,
            multiply_by_parameter_scale=multiply_by_parameter_scale,
            factored=factored,
            factored_dims=factored_dims,
            min_dim_size_to_factor=min_dim_size_to_factor,
            weight_decay_rate=weight_decay_rate,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            factor_map=factor_map,
            logical_factor_rules=logical_factor_rules,
            param_logical_axes=param_logical_axes,
        ),
        optax.scale(-1.0),
    )
