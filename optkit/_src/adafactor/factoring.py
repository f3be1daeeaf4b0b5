"""Which axes of a parameter Adafactor factors over (SPEC 5, Decision (rank > 2)), and the options' checks."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from optkit._src import hyperparams, trees
from optkit._src.numerics import concrete_float

__all__ = ["FACTORED_DIMS", "factored_axes", "check_factoring", "concrete_min_dim_size", "without"]

FACTORED_DIMS = ("last", "largest")


def check_factoring(factored: Any, factored_dims: Any, min_dim_size_to_factor: Any) -> None:
    """Adafactor's ``factored`` (a bool), ``factored_dims`` (``"last"`` or ``"largest"``) and
    ``min_dim_size_to_factor`` (an integer >= 1, or a tracer of one)."""
    hyperparams.check_flag("factored", factored)
    if not isinstance(factored_dims, str) or factored_dims not in FACTORED_DIMS:
        raise ValueError(
            f"factored_dims must be one of {list(FACTORED_DIMS)!r} (the last two axes, or the "
            f"two largest as Optax does), got {factored_dims!r}"
        )
    if isinstance(min_dim_size_to_factor, (bool, np.bool_)) or (
        hasattr(min_dim_size_to_factor, "dtype")
        and not jnp.issubdtype(min_dim_size_to_factor.dtype, jnp.integer)
    ) or isinstance(min_dim_size_to_factor, float):
        raise TypeError(f"min_dim_size_to_factor must be an integer, got {min_dim_size_to_factor!r}")
    hyperparams.check_scalar("min_dim_size_to_factor", min_dim_size_to_factor, low=1)


def concrete_min_dim_size(min_dim_size_to_factor: Any) -> int:
    """``min_dim_size_to_factor`` as an int at init, where it decides the state's structure."""
    value = concrete_float(min_dim_size_to_factor)
    if value is None:
        raise ValueError(
            "min_dim_size_to_factor is a traced value here (optax.inject_hyperparams with init "
            "under jax.jit or jax.eval_shape?), but it decides which leaves are factored, that is "
            "the state's structure; pass it as static: "
            "optax.inject_hyperparams(optkit.adafactor, static_args=('min_dim_size_to_factor',))"
        )
    return int(value)


def without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """``shape`` with ``axis`` removed: the shape of a statistic averaged over that axis."""
    return shape[:axis] + shape[axis + 1:]


def factored_axes(
    shape: tuple[int, ...],
    *,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
) -> tuple[int, int] | None:
    """Which two axes of a tensor of ``shape`` Adafactor factors over, or None (SPEC 5).

    ``"last"`` takes the last two axes (SPEC 5, Decision (rank > 2): the
    paper's matrix case for every leading index); ``"largest"`` the two
    largest, the second largest as the row axis, ties broken as
    ``optax.scale_by_factored_rms`` breaks them (``numpy.argsort``).

    Args:
      shape: the parameter's shape.
      factored: False: never factor.
      factored_dims: ``"last"`` or ``"largest"``.
      min_dim_size_to_factor: both chosen axes must be at least this long.

    Returns:
      ``(row_axis, col_axis)``, non-negative: the row statistics average over
      ``col_axis`` and the column statistics over ``row_axis``. None (a full
      second moment) for rank < 2, ``factored=False``, or a chosen axis
      shorter than ``min_dim_size_to_factor`` or empty.

    Raises:
      TypeError: ``shape`` is not a sequence of integers, a non-bool
        ``factored``, a non-integer ``min_dim_size_to_factor``.
      ValueError: a negative entry in ``shape``, an unknown
        ``factored_dims``, ``min_dim_size_to_factor < 1``.

    Example:
      >>> import optkit
      >>> optkit.factored_axes((3, 512, 256), factored_dims="largest")
      (2, 1)
      >>> optkit.factored_axes((3, 512, 256)), optkit.factored_axes((3, 512, 256), min_dim_size_to_factor=300)
      ((1, 2), None)
    """
    shape = trees.check_shape("shape", shape)
    check_factoring(factored, factored_dims, min_dim_size_to_factor)
    if not factored or len(shape) < 2:
        return None
    if factored_dims == "last":
        row, col = len(shape) - 2, len(shape) - 1
    else:
        order = np.argsort(shape)
        row, col = int(order[-2]), int(order[-1])
    if min(shape[row], shape[col]) < max(1, min_dim_size_to_factor):
        return None
    return row, col
