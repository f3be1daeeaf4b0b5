"""Adafactor's state: the second-moment statistics of each leaf, and how they are made at ``init``.

A factored leaf keeps its row and column statistics
(:class:`FactoredSecondMoment`), any other leaf one full second-moment array
(:class:`FullSecondMoment`); nothing else, no placeholder arrays. Each
statistic is placed like its parameter (:mod:`optkit._src.sharding`), and a
Flax box around a parameter (``nnx.Param``, ``nn.Partitioned``) is put around
its statistics with the box's metadata, sharding names reduced as the array
is. Reading a state back from the containers Flax and Orbax hand over is
:mod:`optkit._src.adafactor.reading`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from optkit._src import sharding, trees
from optkit._src.adafactor.rules import Plan

__all__ = [
    "FactoredSecondMoment",
    "FullSecondMoment",
    "ScaleByFactoredRmsState",
    "ScaleByAdafactorState",
    "init_second_moments",
    "with_roles",
]


class FactoredSecondMoment(NamedTuple):
    """The second-moment statistics of one factored tensor (the paper's ``R_t`` and ``C_t``).

    For a leaf factored over (row axis ``a``, column axis ``b``), see
    :func:`optkit.factored_axes`:

    Attributes:
      v_row: ``R_t / m``, the exponential average of the mean of ``G^2 + eps1``
        over axis ``b``: the leaf's shape with axis ``b`` removed.
      v_col: ``C_t / n``, the same over axis ``a``: the leaf's shape with axis
        ``a`` removed.

    Both keep the leaf's other axes in their order, so a sharding of the leaf
    maps onto them by dropping one axis. Under a factor rule (SPEC 5b) the
    row statistics drop every column axis and the column statistics every row
    axis, and the node's type records the rule.
    """

    v_row: jax.Array
    v_col: jax.Array
    roles = None  # a factor rule's per-axis roles, on the types with_roles makes


class FullSecondMoment(NamedTuple):
    """The second moment of one unfactored tensor (vectors, scalars, or ``factored=False``).

    Attributes:
      v: the exponential average of ``G^2 + eps1``, the leaf's shape.
    """

    v: jax.Array
    roles = None


class ScaleByFactoredRmsState(NamedTuple):
    """State of :func:`optkit.scale_by_factored_rms`.

    Attributes:
      count: int32 scalar, the number of updates made so far; the update being
        made is the paper's step ``t = count + 1``.
      nu: a tree with the parameters' structure whose leaves are
        :class:`FactoredSecondMoment` or :class:`FullSecondMoment` nodes, in
        ``nu_dtype`` or each parameter's dtype.
    """

    count: jax.Array
    nu: Any


class ScaleByAdafactorState(NamedTuple):
    """State of :func:`optkit.scale_by_adafactor` (and of :func:`optkit.adafactor`'s first link).

    Attributes:
      count: int32 scalar, the number of updates made so far (``t = count + 1``).
      nu: the second-moment statistics, as in :class:`ScaleByFactoredRmsState`.
      mu: the first moment (an exponential average of the final scaled update
        ``alpha_t * U_t``) with the parameters' structure, in ``mu_dtype`` or
        each parameter's dtype; None when ``b1`` is None.
    """

    count: jax.Array
    nu: Any
    mu: Any


@functools.cache
def with_roles(node_type: type, roles: tuple[str, ...]) -> type:
    """A subtype of ``node_type`` (a statistics node) that records a factor rule's per-axis ``roles``.

    The rule is part of the node's type, so it is part of the state's pytree
    structure: it survives ``jax.jit``, ``nnx.Optimizer`` (which hands the
    state back as plain arrays, without the parameters' Flax metadata the
    rule may have come from) and restoring into a target made by ``init``.
    """
    return type(node_type.__name__, (node_type,), {"__slots__": (), "roles": tuple(roles),
                                                   "__module__": node_type.__module__,
                                                   "__doc__": node_type.__doc__})


def init_second_moments(params: Any, plan_of_leaf: Callable[[str, tuple[int, ...], Any], Plan],
                        nu_dtype: Any) -> Any:
    """Zero statistics for every leaf of ``params``.

    ``plan_of_leaf(path, shape, box)`` says how the leaf is factored (a
    :class:`~optkit._src.adafactor.rules.Plan`); ``box`` is the parameter's Flax
    box (for its metadata) or None. A recorded plan's roles go into the nodes' types.
    """

    def leaf(path, p):
        box = p if sharding.is_box(p) else None
        p = sharding.unbox(p)
        p = p if isinstance(p, jax.ShapeDtypeStruct) else jnp.asarray(p)
        dtype = nu_dtype or p.dtype
        plan = plan_of_leaf(trees.keystr(path, "/"), tuple(p.shape), box)
        full, factored = ((with_roles(FullSecondMoment, plan.roles), with_roles(FactoredSecondMoment, plan.roles))
                          if plan.recorded else (FullSecondMoment, FactoredSecondMoment))
        if not plan.factored:
            return full(sharding.rebox(box, sharding.full_like(p, 0, dtype)))
        rows, cols = plan.axes_of("row"), plan.axes_of("column")
        return factored(
            v_row=sharding.rebox(box, sharding.zeros_without_axis(p, cols, dtype), drop_axis=cols),
            v_col=sharding.rebox(box, sharding.zeros_without_axis(p, rows, dtype), drop_axis=rows),
        )

    return jax.tree_util.tree_map_with_path(leaf, params, is_leaf=sharding.is_box)
