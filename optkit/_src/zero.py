"""Optimizer state split over the data axis of a mesh (ZeRO stage 1), or parameters too (FSDP).

With plain data parallelism the parameters are replicated, and so is the state every optkit optimizer makes
like its parameters (:mod:`optkit._src.sharding`): Adam's two moments are twice the model on every device.
:func:`state_sharding` gives each state leaf a sharding split over one more mesh axis (``"data"``), along its
largest dimension that the axis divides and that the leaf's own sharding leaves whole; :func:`shard_state`
places a state so. A jitted step that takes the state so placed and returns it so
(``out_shardings=``) computes each update on the device that holds its part, and XLA gathers the
parameters where they are replicated.

Adafactor's factored statistics: a row statistic (``v_row``) and a column statistic (``v_col``) split over
one mesh axis could not form their outer product (the axis would have to split two dimensions of one array,
which a ``PartitionSpec`` cannot say and an explicit mesh refuses). The row statistic is split and the column
statistic is left as it is: it is the smaller one whenever the factored leaf has more rows than columns (the
usual ``(d_in, d_out)`` kernel with ``factored_dims="last"``), and it is the one the whole update reads.

8-bit moments (:class:`~optkit._src.blockwise.QuantizedMoment`): the codes ``(blocks, block_size)`` and the
absmax ``(blocks,)`` are split over the same blocks (axis 0 of both) when the axis divides the block count, so that
each device holds the absmax of the codes it holds; otherwise both keep their sharding.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from optkit._src.adafactor.state import FactoredSecondMoment
from optkit._src.blockwise import QuantizedMoment

__all__ = ["state_sharding", "shard_state", "fsdp_rule"]


def _check(mesh: Any, axis: str) -> int:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (jax.make_mesh(...)), got {type(mesh).__name__}")
    if axis not in mesh.shape:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh; its axes are {list(mesh.shape)}")
    return int(mesh.shape[axis])


def _spec(leaf: Any, mesh: Mesh) -> list[Any]:
    """The leaf's own PartitionSpec on ``mesh``, one entry per dimension (replicated if it has none there)."""
    sharding = getattr(leaf, "sharding", None)
    spec: list[Any] = []
    if isinstance(sharding, NamedSharding) and tuple(sharding.mesh.axis_names) == tuple(mesh.axis_names):
        spec = list(sharding.spec)
    return spec + [None] * (np.ndim(leaf) - len(spec))


def _split(leaf: Any, mesh: Mesh, axis: str, size: int) -> NamedSharding:
    spec = _spec(leaf, mesh)
    used = {name for entry in spec if entry is not None
            for name in (entry if isinstance(entry, tuple) else (entry,))}
    shape = np.shape(leaf)
    if axis not in used:
        free = [d for d in range(len(shape)) if spec[d] is None and shape[d] >= size and shape[d] % size == 0]
        if free:
            spec[max(free, key=lambda d: (shape[d], -d))] = axis
    return NamedSharding(mesh, PartitionSpec(*spec))


def state_sharding(state: Any, mesh: Mesh, axis: str = "data") -> Any:
    """Shardings that split an optimizer state (or parameters) over ``axis`` of ``mesh``: ZeRO stage 1.

    Each leaf keeps its own sharding (a parameter's ``model`` axis...) and is split over ``axis`` along its
    largest dimension that ``axis``'s size divides and that no mesh axis splits yet (the first such on a tie).
    A leaf with no such dimension (a scalar step count, a bias shorter than the axis) keeps its sharding.
    Adafactor's column statistics (``FactoredSecondMoment.v_col``) keep theirs, and the row statistics are
    split: both split over one axis could not form their outer product (module docstring). 8-bit moments
    (``QuantizedMoment``) split their codes and absmax over the same blocks, or neither. Works on any
    pytree: an optkit or Optax state, ``optax.chain`` and ``optax.inject_hyperparams`` states included, and
    ``to_jax``'s ``params`` (parameters split too: FSDP).

    Args:
      state: a pytree of arrays (or ``jax.ShapeDtypeStruct``s), e.g. ``tx.init(params)``.
      mesh: the ``jax.sharding.Mesh`` (``jax.make_mesh``).
      axis: the mesh axis to split over (default ``"data"``).

    Returns:
      A pytree of ``NamedSharding``s of ``state``'s structure, for ``jax.device_put`` or ``jax.jit``'s
      ``in_shardings``/``out_shardings``.

    Raises:
      TypeError: ``mesh`` is not a ``jax.sharding.Mesh``.
      ValueError: ``axis`` is not an axis of ``mesh``.

    Source: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC 2020),
    stage 1 (optimizer state partitioning); MaxText's ``shard_optimizer_over_data``.

    Example:
      >>> import jax, jax.numpy as jnp, optkit
      >>> mesh = jax.make_mesh((1,), ("data",))
      >>> state = optkit.adam(1e-3).init({"w": jnp.zeros((8, 4))})
      >>> jax.tree.leaves(optkit.state_sharding(state, mesh))[1].spec
      P('data', None)
    """
    size = _check(mesh, axis)

    def one(leaf: Any) -> Any:
        if isinstance(leaf, FactoredSecondMoment):
            return FactoredSecondMoment(_split(leaf.v_row, mesh, axis, size),
                                        NamedSharding(mesh, PartitionSpec(*_spec(leaf.v_col, mesh))))
        if isinstance(leaf, QuantizedMoment):
            return QuantizedMoment(*_same_blocks(leaf, mesh, axis, size))
        return _split(leaf, mesh, axis, size)

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, (FactoredSecondMoment, QuantizedMoment)))


def _same_blocks(moment: QuantizedMoment, mesh: Mesh, axis: str, size: int) -> tuple[NamedSharding, NamedSharding]:
    """Codes and absmax split over ``axis`` along their block axis (0) together, or both left as they are."""
    codes, absmax = _spec(moment.codes, mesh), _spec(moment.absmax, mesh)
    used = {name for entry in codes + absmax if entry is not None
            for name in (entry if isinstance(entry, tuple) else (entry,))}
    blocks = np.shape(moment.absmax)[0] if np.ndim(moment.absmax) else 0
    if axis not in used and codes[0] is None and absmax[0] is None and blocks >= size and blocks % size == 0:
        codes[0] = absmax[0] = axis
    return NamedSharding(mesh, PartitionSpec(*codes)), NamedSharding(mesh, PartitionSpec(*absmax))


def shard_state(state: Any, mesh: Mesh, axis: str = "data") -> Any:
    """``state`` placed as :func:`state_sharding` says (``jax.device_put``; ``state`` itself is not changed).

    Args, Raises: as :func:`state_sharding`.

    Returns:
      The state, each leaf a ``jax.Array`` split over ``axis`` where it can be.

    Example:
      >>> import jax, jax.numpy as jnp, optkit
      >>> mesh = jax.make_mesh((1,), ("data",))
      >>> state = optkit.shard_state(optkit.adam(1e-3).init({"w": jnp.zeros((8, 4))}), mesh)
      >>> jax.tree.leaves(state)[1].sharding.spec
      P('data', None)
    """
    return jax.device_put(state, state_sharding(state, mesh, axis))


def fsdp_rule(mesh: Mesh, axis: str = "data") -> Any:
    """A sharding rule that splits each parameter over ``axis`` (FSDP), for :class:`optkit.onnx.OnnxModule`'s
    ``sharding=`` (any ``(name, shape) -> mesh axis names per dimension or None`` rule).

    Each parameter is split along its largest dimension that ``axis``'s size divides (the first such on a tie),
    the choice :func:`state_sharding` makes for a replicated leaf; a parameter with no such dimension (a short
    bias) stays replicated. optkit's optimizers shard their state like the parameters, so both are split over
    ``axis`` (ZeRO stage 3). On an explicit mesh an ``OnnxModule`` gathers such a parameter over the axes its
    inputs are split by where it uses it; on an ``Auto`` mesh XLA does.

    Args:
      mesh: the ``jax.sharding.Mesh`` (``jax.make_mesh``); only ``axis``'s size is read.
      axis: the mesh axis to split over (default ``"data"``).

    Returns:
      ``rule(name, shape) -> tuple of axis names (None where a dimension is whole), or None``.

    Raises:
      TypeError: ``mesh`` is not a ``jax.sharding.Mesh``.
      ValueError: ``axis`` is not an axis of ``mesh``.

    Source: Rajbhandari et al. (SC 2020), stage 3; PyTorch's FullyShardedDataParallel; MaxText's ``fsdp`` axis.

    Example:
      >>> import jax, optkit
      >>> rule = optkit.fsdp_rule(jax.make_mesh((1,), ("data",)))
      >>> rule("net.0.weight", (32, 64))
      (None, 'data')
    """
    size = _check(mesh, axis)

    def rule(name: str, shape: tuple[int, ...]) -> tuple[str | None, ...] | None:
        free = [d for d in range(len(shape)) if shape[d] >= size and shape[d] % size == 0]
        if not free:
            return None
        names: list[str | None] = [None] * len(shape)
        names[max(free, key=lambda d: (shape[d], -d))] = axis
        return tuple(names)

    return rule
