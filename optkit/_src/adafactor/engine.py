"""The Adafactor engine: one transformation's init and update, for every public form (SPEC 5, 5b).

:class:`Adafactor` reads the state (:mod:`~optkit._src.adafactor.reading`), computes the step's scalars
``b2_t`` and ``rho_t`` once per dtype, and runs :func:`optkit._src.adafactor.fast.leaf_step` (the paper's
algorithm, :mod:`~optkit._src.adafactor.paper`) on each leaf, factored as a planner says. The planners and the
public transformations are in :mod:`~optkit._src.adafactor.transform` (the paper's) and
:mod:`~optkit._src.adafactor.t5x` (T5X's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from optkit._src import flat, hyperparams, sharding, trees
from optkit._src.adafactor import fast
from optkit._src.adafactor.factoring import concrete_min_dim_size, factored_axes
from optkit._src.adafactor.reading import read_second_moments
from optkit._src.adafactor.rules import Plan, Rules, heuristic_plan, metadata_names, plan_of
from optkit._src.adafactor.state import (
    FactoredSecondMoment,
    FullSecondMoment,
    ScaleByAdafactorState,
    init_second_moments,
)
from optkit._src.numerics import compute_dtype, is_concrete_positive, per_dtype

__all__ = ["Adafactor", "heuristic", "step_scalars"]


def heuristic(shape: tuple[int, ...], factored: bool, factored_dims: str, min_dim: int | None) -> Plan:
    """The factoring heuristic's plan (:func:`optkit.factored_axes`); ``min_dim`` None: at update, where the
    statistics' shapes say whether ``init`` factored it."""
    if min_dim is None:
        return heuristic_plan(shape, factored_axes(shape, factored=True, factored_dims=factored_dims))
    return heuristic_plan(shape, factored_axes(shape, factored=factored, factored_dims=factored_dims,
                                               min_dim_size_to_factor=min_dim))


def _b2(count, decay_rate, dtype):
    """``b2_t = 1 - t^(-decay_rate)`` with ``t = count + 1``, in ``dtype`` (so ``b2_1 = 0``)."""
    t = count.astype(dtype) + 1  # in dtype: count + 1 in int32 wraps to -2^31 at the last count
    return 1 - t ** (-jnp.asarray(decay_rate, dtype))


def step_scalars(count, learning_rate, decay_rate, b2_count=None):
    """The step's ``(b2_t, lr_t)`` per dtype, for the update with ``t = count + 1``: computed once per step.

    ``lr_t`` is ``rho_t = min(1e-2, 1/sqrt(t))`` when ``learning_rate`` is None
    (SPEC 5), ``schedule(count)`` for an Optax schedule (called once, with the
    number of updates already made, as ``optax.scale_by_learning_rate`` calls
    it), or the number itself; ``b2_t`` counts from ``b2_count(count)`` if given
    (a restart of the statistics). Returns ``dtype -> (b2_t, lr_t)``, memoized.
    """
    value = learning_rate(count) if callable(learning_rate) else learning_rate

    def scalars(dtype):
        b2 = _b2(count if b2_count is None else b2_count(count), decay_rate, dtype)
        if value is None:
            t = count.astype(dtype) + 1
            return b2, jnp.minimum(jnp.asarray(1e-2, dtype), 1 / jnp.sqrt(t))
        return b2, jnp.asarray(value).astype(dtype)

    return per_dtype(scalars)


class Adafactor:
    """One Adafactor transformation's options, and its init and update: the engine every public form runs.

    Args:
      name: the public name, for errors.
      planner: ``planner(path, shape, names, min_dim) -> Plan``: how the parameter at ``path`` (its axes'
        logical ``names`` or None) is factored; ``min_dim`` is the concrete ``min_dim_size_to_factor`` at
        ``init`` and None at update (then the statistics' shapes say whether ``init`` factored it). The
        paper's planner is :func:`~optkit._src.adafactor.transform.paper_planner`, T5X's
        :func:`~optkit._src.adafactor.t5x.t5x_planner`.
      rules: the factor rules (for the per-path ``multiply_by_parameter_scale``).
      learning_rate, decay_rate: as :func:`~optkit.scale_by_adafactor`'s.
      options: the step's options (:class:`~optkit._src.adafactor.fast.Options`).
      min_dim_size_to_factor, mu_dtype, nu_dtype: as :func:`~optkit.scale_by_adafactor`'s.
      params_reason: why ``params`` are needed at update, or None.
      decay_by_alpha: weight decay scaled by the step size ``alpha_t`` (Hugging Face) or not.
      b2_count: ``count -> count`` that ``b2_t`` counts from (a restart of the statistics), or None.
    """

    def __init__(self, name, *, planner, rules: Rules, learning_rate, decay_rate, options: fast.Options,
                 min_dim_size_to_factor, mu_dtype, nu_dtype, params_reason, decay_by_alpha: bool = True,
                 b2_count=None):
        self.name = name
        self.planner = planner
        self.rules = rules
        self.learning_rate = learning_rate
        self.decay_rate = decay_rate
        self.options = options
        self.min_dim = min_dim_size_to_factor
        self.mu_dtype, self.nu_dtype = mu_dtype, nu_dtype
        self.params_reason = params_reason
        self.guard = not is_concrete_positive(options.eps1)
        self.decay_by_alpha, self.b2_count = decay_by_alpha, b2_count

    def init_nu(self, params):
        flat.refuse_flat(params, self.name)
        trees.check_floating(params, "params")
        min_dim = concrete_min_dim_size(self.min_dim)
        return init_second_moments(
            params, lambda path, shape, box: self.planner(path, shape, metadata_names(box), min_dim), self.nu_dtype)

    def _plan_at_update(self, path: str, shape: tuple[int, ...], node) -> Plan:
        roles = type(node).roles
        if roles is not None:
            plan = plan_of(roles, shape, f"{self.name}: {path!r}")
        else:
            plan = self.planner(path, shape, None, None)
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
        scalars = step_scalars(count, self.learning_rate, self.decay_rate, self.b2_count)
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
