"""Helpers the family modules share: axes checked against a rank, integer tests, indices made safe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._registry import NodeContext

__all__ = ["axis_index", "axis_indices", "is_integer", "lowest", "checked_indices"]


def axis_index(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """Normalize a possibly negative axis against ``rank``, naming the node on error."""
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def axis_indices(ctx: NodeContext, axes: Sequence[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    normalized = tuple(axis_index(ctx, int(a), rank, what) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"{what} {list(axes)} repeats an axis")
    return normalized


def is_integer(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.integer)


def lowest(dtype: Any) -> Any:
    """The identity of ``max``: -inf for floats, the smallest value otherwise."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min



def checked_indices(ctx: NodeContext, indices: Any, size: int, where: str) -> Any:
    """int32 or int64 indices into an axis of ``size`` with negatives counted from the end, for ``mode="fill"``.

    Indices known at load time (constants) that are out of range raise here.
    Others are tested in their own dtype, and every out-of-range one becomes
    ``size``: JAX gathers with int32 indices when the axis fits, so an int64
    index of 2**32 + 1 would otherwise wrap to row 1; ``size`` is out of range
    in any dtype, and ``mode="fill"`` then gives NaN (floats) or the fill value
    of the type, as for any out-of-range index, never a valid element.

    Raises:
      TypeError: indices of another type (ONNX's type constraint; uint64
        indices would silently give NaN, int8 ones overflow).
    """
    dtype = jnp.result_type(indices)
    if dtype not in (jnp.int32, jnp.int64):
        raise TypeError(ctx.message(f"indices must be int32 or int64 (ONNX's type constraint), got {dtype}"))
    if isinstance(indices, (np.ndarray, np.generic)):
        values = np.asarray(indices)
        bad = values[(values < -size) | (values >= size)]
        if bad.size:
            raise ctx.error(f"indices {bad.tolist()[:8]} are out of range for {where} of size {size}")
    indices = jnp.asarray(indices)
    valid = (indices >= -size) & (indices < size)
    normalized = jnp.where(indices < 0, indices + size, indices)
    return jnp.where(valid, normalized, jnp.asarray(size, indices.dtype))
