"""Optimizer state placed like the parameters under ``jax.sharding``, with no communication code.

JAX's SPMD partitioner does the distributed work; optkit only has to build
its state so that every full-size leaf has its parameter's sharding, and a
leaf with one axis of the parameter removed (Adafactor's row and column
statistics) the parameter's sharding with that axis removed. How a new
array gets its sharding depends on what is known when it is made:

- a concrete ``jax.Array`` (``tx.init(params)`` outside ``jax.jit``): its
  ``.sharding`` is known, and the state is made with the matching sharding;
- a tracer on a mesh of several devices (``jax.jit(tx.init)(params)``,
  ``jax.eval_shape(tx.init, params)``): with ``Explicit`` mesh axes the
  sharding is part of the type, with ``Auto`` axes (the default of
  ``jax.sharding.Mesh``) XLA decides it when it compiles. ``jnp.zeros_like(p)``
  does not depend on ``p``, so XLA would replicate it (or, ``p`` being unused,
  put it on one device). Here the state is computed *from* ``p`` (exact
  zeros, see :func:`_zeros_from`), so XLA's sharding propagation and the
  types give full-size leaves ``p``'s sharding and a sum over an axis ``p``'s
  sharding without that axis.

Nothing here names a mesh axis: every sharding is derived from the
parameter's own. On one device nothing changes.

Not used, on purpose: ``jax.experimental.shard_alike`` says "shard these two
alike" without computing anything, but in jax 0.10.2 its lowering is cached
per abstract value, so all same-shaped (state, parameter) pairs of a program
land in one sharding group; and even with distinct groups, two zero
constants tied to differently sharded parameters came out sharded alike.
Different parameters of one shape would be forced into one sharding.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

__all__ = [
    "full_like",
    "zeros_without_axis",
    "tree_zeros_like",
    "may_be_split",
    "is_box",
    "unbox",
    "rebox",
    "leaves_with_paths",
]

_AUTO = getattr(getattr(jax.sharding, "AxisType", None), "Auto", None)
_MANUAL = getattr(getattr(jax.sharding, "AxisType", None), "Manual", None)


def _type_sharding(x) -> Any:
    """The sharding in ``x``'s type (a NamedSharding on an AbstractMesh), or None (older JAX)."""
    typeof = getattr(jax, "typeof", None)
    try:
        aval = typeof(x) if typeof is not None else jax.core.get_aval(x)
    except TypeError:
        return None
    return getattr(aval, "sharding", None)


def _mesh_axes(x) -> list[tuple[str, int, Any]]:
    """``(name, size, axis type)`` of the mesh in ``x``'s type; empty when none (one device)."""
    sharding = _type_sharding(x)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True):
        return []
    types = getattr(mesh, "axis_types", None) or (None,) * len(mesh.axis_names)
    return list(zip(mesh.axis_names, mesh.axis_sizes, types))


def _on_mesh(x) -> bool:
    """True for a tracer typed on a mesh of several devices (outside ``jax.shard_map``'s manual axes)."""
    if not isinstance(x, jax.core.Tracer):
        return False
    axes = _mesh_axes(x)
    return any(size > 1 for _, size, _ in axes) and not any(kind == _MANUAL for _, _, kind in axes)


def _spec_entries(spec: PartitionSpec, ndim: int) -> list:
    """The ``PartitionSpec``'s entry for every axis (a short spec leaves the last axes unsharded)."""
    entries = list(spec)
    return entries + [None] * (ndim - len(entries))


def _named_axes(entry) -> tuple:
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def may_be_split(x) -> bool:
    """Whether ``x`` is, or may be, divided among several devices (its sharding is not known to be whole).

    A concrete array: its sharding is not fully replicated. A tracer: its type
    names a mesh axis of size > 1 in its ``PartitionSpec`` (``Explicit``
    axes), or its mesh has an ``Auto`` axis of size > 1 (XLA may split it
    along that axis: the answer is yes to be safe). ``Manual`` axes (inside
    ``jax.shard_map``) hold per-device blocks, which are whole arrays locally.
    """
    if not isinstance(x, jax.core.Tracer):
        sharding = getattr(x, "sharding", None)
        return sharding is not None and not sharding.is_fully_replicated
    axes = _mesh_axes(x)
    if any(size > 1 and kind == _AUTO for _, size, kind in axes):
        return True
    sizes = {name: size for name, size, kind in axes if kind != _MANUAL}
    spec = getattr(_type_sharding(x), "spec", None) or PartitionSpec()
    return any(sizes.get(name, 1) > 1 for entry in spec for name in _named_axes(entry))


def _zeros_from(p, dtype) -> jax.Array:
    """Exact zeros of ``p``'s shape computed *from* ``p``, so that XLA shards them as it shards ``p``.

    ``jnp.zeros_like(p)`` is a constant: under ``jax.jit`` with ``Auto`` mesh
    axes XLA replicates it, and ``p``, unused, is not even an input of the
    program (the output then lives on one device). ``0 * |p|`` where ``p`` is
    finite (else 0) is +0 everywhere and depends on ``p``'s values, so XLA
    propagates ``p``'s sharding to it (it does not simplify it away first;
    tests/sharding/test_sharding.py would notice). It costs one read of ``p``, once,
    at init.
    """
    return jnp.where(jnp.isfinite(p), jnp.abs(p) * 0, 0).astype(dtype)


def _is_abstract(p) -> bool:
    """A ``jax.ShapeDtypeStruct`` (``init`` on abstract parameters, as in building restore targets)."""
    return isinstance(p, jax.ShapeDtypeStruct)


def full_like(p, fill_value, dtype=None) -> jax.Array:
    """An array of ``p``'s shape filled with ``fill_value``, sharded as ``p`` is (see the module docstring).

    ``p`` may be a ``jax.ShapeDtypeStruct``: the result is a concrete array of
    its shape, placed with its sharding when it has one (as ``optax`` does).
    """
    if _is_abstract(p):
        return jnp.full(p.shape, fill_value, dtype or p.dtype, device=p.sharding)
    p = jnp.asarray(p)
    if not _on_mesh(p):
        return jnp.full_like(p, fill_value, dtype=dtype)  # a concrete p: its sharding; one device: as before
    dtype = p.dtype if dtype is None else dtype
    return _zeros_from(p, dtype) + jnp.asarray(fill_value).astype(dtype)


def _axes(axis: int | tuple[int, ...]) -> tuple[int, ...]:
    """One axis or several, as a tuple from the last to the first (so deleting them in order is safe)."""
    return tuple(sorted({axis} if isinstance(axis, (int, np.integer)) else set(axis), reverse=True))


def _delete(entries: list, axis: int | tuple[int, ...]) -> list:
    for a in _axes(axis):
        del entries[a]
    return entries


def _without_axis(sharding, axis: int | tuple[int, ...], ndim: int) -> NamedSharding | None:
    """A ``NamedSharding`` of an ``ndim`` array, for the array with ``axis`` (one or several) removed.

    None for other shardings (one device, or kinds without a ``PartitionSpec``):
    the new array then gets the default placement.
    """
    if not isinstance(sharding, NamedSharding):
        return None
    entries = _delete(_spec_entries(sharding.spec, ndim), axis)
    return NamedSharding(sharding.mesh, PartitionSpec(*entries), memory_kind=sharding.memory_kind)


def zeros_without_axis(p, axis: int | tuple[int, ...], dtype=None) -> jax.Array:
    """Zeros of ``p``'s shape with ``axis`` removed, sharded as ``p`` is with that axis removed.

    For ``p`` sharded ``P(a, b)`` this is ``P(b)`` for ``axis=0`` and ``P(a)``
    for ``axis=1``: what XLA gives a reduction of ``p`` over ``axis``, so the
    statistics that Adafactor's step computes by reductions keep it. A
    ``jax.ShapeDtypeStruct`` ``p`` gives concrete zeros with its sharding reduced so.
    """
    shape = tuple(_delete(list(p.shape), axis))
    if _is_abstract(p):
        return jnp.zeros(shape, dtype or p.dtype, device=_without_axis(p.sharding, axis, len(p.shape)))
    p = jnp.asarray(p)
    dtype = p.dtype if dtype is None else dtype
    if not isinstance(p, jax.core.Tracer):
        return jnp.zeros(shape, dtype, device=_without_axis(getattr(p, "sharding", None), axis, p.ndim))
    if _on_mesh(p):
        # A reduction of p over the axis: XLA (Auto axes) and the types (Explicit axes) drop the axis from
        # p's sharding. The sum of zeros over a sharded axis costs one vector all-reduce, once.
        return jnp.sum(_zeros_from(p, dtype), axis=_axes(axis), dtype=dtype)
    return jnp.zeros(shape, dtype)


def tree_zeros_like(tree, dtype=None):
    """``optax.tree.zeros_like``, with every leaf sharded as its counterpart in ``tree`` (:func:`full_like`)."""
    return jax.tree.map(lambda p: full_like(p, 0, dtype), tree)



# ---------------------------------------------------------------------------
# Boxed parameters: Flax's nnx.Variable and linen's AxisMetadata (nn.Partitioned)
#
# Flax hands optimizers parameters wrapped in boxes that carry sharding names:
# ``nnx.Optimizer`` calls ``tx.init(nnx.state(model, wrt))`` on nnx.Param
# variables, and linen's ``TrainState.create`` on ``nn.Partitioned`` boxes.
# Both are pytree nodes with one child (the array), so ``jax.tree.map`` keeps
# the box, with its metadata, around each state leaf it makes. That is right
# for a state leaf of the parameter's shape; a leaf with one axis fewer
# (Adafactor's row and column statistics) needs the metadata with that axis
# dropped too, or Flax applies a rank-2 sharding to a vector. Flax is an
# optional dependency: the box types are looked up only among modules the
# program has already imported.


def _box_types() -> tuple[type, ...]:
    types: list[type] = []
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and hasattr(nnx, "Variable"):
        types.append(nnx.Variable)
    meta = sys.modules.get("flax.core.meta")
    if meta is not None and hasattr(meta, "AxisMetadata"):
        types.append(meta.AxisMetadata)
    return tuple(types)


def is_box(x: Any) -> bool:
    """True for a Flax box around a parameter: an ``nnx.Variable`` or a linen ``AxisMetadata``."""
    types = _box_types()
    return bool(types) and isinstance(x, types)


def _one_level(x: Any):
    """``x``'s children with their keys, and the treedef that rebuilds ``x`` from them."""
    return jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)


def unbox(x: Any) -> Any:
    """The value inside a box (its one pytree child); ``x`` itself when it is not a box."""
    if not is_box(x):
        return x
    children, _ = _one_level(x)
    if len(children) != 1:
        raise TypeError(f"expected a Flax box with one value, got {type(x).__name__} with {len(children)}")
    return children[0][1]


_PER_AXIS_METADATA = ("out_sharding", "optimizer_sharding", "sharding_names", "sharding")


def _drop_entry(spec: Any, axis: int | tuple[int, ...], ndim: int) -> Any:
    """A per-axis sharding annotation of an ``ndim`` array, for the array with ``axis`` removed.

    Tuples, lists and ``PartitionSpec``s lose their entry ``axis`` (a short
    one is padded with None first); a ``NamedSharding`` its spec's entry. Any
    other kind gives None (no annotation), never a wrong one.
    """
    if isinstance(spec, NamedSharding):
        entries = _delete(_spec_entries(spec.spec, ndim), axis)
        return NamedSharding(spec.mesh, PartitionSpec(*entries), memory_kind=spec.memory_kind)
    if isinstance(spec, (PartitionSpec, tuple, list)):
        entries = _delete(list(spec) + [None] * (ndim - len(spec)), axis)
        return PartitionSpec(*entries) if isinstance(spec, PartitionSpec) else type(spec)(entries)
    return None


def rebox(box: Any, value: Any, *, drop_axis: int | tuple[int, ...] | None = None) -> Any:
    """``value`` in a box like ``box`` (same type and metadata); with ``drop_axis``, the metadata
    of an array with that axis of ``box``'s value removed.

    nnx.Variable: the sharding annotations (``out_sharding``, ``optimizer_sharding``)
    lose the entry, as the array lost the axis. linen ``AxisMetadata``: its own
    ``remove_axis`` (``nn.Partitioned`` drops the axis's name). ``box`` is not modified.
    """
    if not is_box(box):
        return value
    _, treedef = _one_level(box)
    if drop_axis is None:
        return treedef.unflatten([value])
    ndim = np.ndim(unbox(box))
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(box, nnx.Variable):
        metadata = box.get_metadata()
        dropped = {k: _drop_entry(metadata[k], drop_axis, ndim)
                   for k in _PER_AXIS_METADATA if metadata.get(k) is not None}
        return box.replace(value, **dropped)
    names = getattr(box, "names", None)
    if names is None or max(_axes(drop_axis)) >= len(names):
        return treedef.unflatten([value])
    partition_name = getattr(sys.modules.get("flax.core.meta"), "PARTITION_NAME", "partition_name")
    reduced = box
    for a in _axes(drop_axis):
        reduced = reduced.remove_axis(a, {partition_name: names[a]})
    return reduced.replace_boxed(value)


def leaves_with_paths(tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """``jax.tree_util.tree_flatten_with_path(tree)[0]`` with Flax boxes transparent.

    The same leaves, in the same order, as ``jax.tree.leaves(tree)``; each
    path leaves out the keys of the boxes (``nnx.Variable``, ``nn.Partitioned``)
    the leaf sits in, so that a boxed tree and its unboxed twin have the same
    paths. Compare paths by :func:`~optkit._src.trees.key_name` of each key to match a NamedTuple
    field, a dict key and an ``nnx.State`` key of the same name, whatever
    containers Flax, Orbax or ``flax.serialization`` hand back.
    """
    out: list[tuple[tuple[Any, ...], Any]] = []

    def walk(x, path):
        if x is None:
            return
        children, treedef = _one_level(x)
        if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # an array (an empty node has no leaves)
            out.append((path, x))
            return
        box = is_box(x)
        for (key,), child in children:
            walk(child, path if box else (*path, key))

    walk(tree, ())
    return out
