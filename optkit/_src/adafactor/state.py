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

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from optkit._src import sharding

__all__ = [
    "FactoredSecondMoment",
    "FullSecondMoment",
    "ScaleByFactoredRmsState",
    "ScaleByAdafactorState",
    "init_second_moments",
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
    maps onto them by dropping one axis.
    """

    v_row: jax.Array
    v_col: jax.Array


class FullSecondMoment(NamedTuple):
    """The second moment of one unfactored tensor (vectors, scalars, or ``factored=False``).

    Attributes:
      v: the exponential average of ``G^2 + eps1``, the leaf's shape.
    """

    v: jax.Array


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


def init_second_moments(params: Any, axes_of: Callable[[tuple[int, ...]], tuple[int, int] | None],
                        nu_dtype: Any) -> Any:
    """Zero statistics for every leaf of ``params``: factored over ``axes_of(shape)``, or full when None."""

    def leaf(p):
        box = p if sharding.is_box(p) else None
        p = sharding.unbox(p)
        p = p if isinstance(p, jax.ShapeDtypeStruct) else jnp.asarray(p)
        dtype = nu_dtype or p.dtype
        axes = axes_of(p.shape)
        if axes is None:
            return FullSecondMoment(sharding.rebox(box, sharding.full_like(p, 0, dtype)))
        row, col = axes
        return FactoredSecondMoment(
            v_row=sharding.rebox(box, sharding.zeros_without_axis(p, col, dtype), drop_axis=col),
            v_col=sharding.rebox(box, sharding.zeros_without_axis(p, row, dtype), drop_axis=row),
        )

    return jax.tree.map(leaf, params, is_leaf=sharding.is_box)
