"""Reading Adafactor's statistics back from whatever container Flax, Orbax or ``flax.serialization`` hands over.

``init`` gives :class:`~optkit._src.adafactor.state.FactoredSecondMoment` and
``FullSecondMoment`` nodes in the parameters' containers, but ``nnx.Optimizer``
hands them back inside ``nnx.State`` and its variables, linen inside
``nn.Partitioned`` boxes, and ``flax.serialization.to_state_dict`` as plain
dicts. The statistics are therefore matched to the gradients by path (the
names of the keys, whatever their container type), and new statistics are
written back into the form they came in, so that the state keeps its
structure from step to step (``jax.jit``, ``lax.scan``, ``nnx.update``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from optkit._src import sharding, trees
from optkit._src.adafactor.state import FactoredSecondMoment, FullSecondMoment

__all__ = ["read_second_moments"]

Node = FactoredSecondMoment | FullSecondMoment
_NODE_FIELDS = {frozenset(FactoredSecondMoment._fields): FactoredSecondMoment,
                frozenset(FullSecondMoment._fields): FullSecondMoment}


def read_second_moments(
    nu: Any, updates: Any, expected: Callable[[str, tuple[int, ...], Node], Any], transformation: str,
) -> tuple[list[Node], Callable[[list[Node]], Any]]:
    """The statistics of every leaf of ``updates``, and a function that writes new ones back.

    Args:
      nu: the state's statistics, in any container.
      updates: the gradients.
      expected: ``(path, shape, node) -> (v_row shape, v_col shape)``, or
        None for a full second moment: what the leaf at ``path`` (joined by
        ``/``) needs, to check the statistics' shapes. ``node`` carries the
        factor rule recorded at ``init``, when its type has one.
      transformation: the optimizer's name, in messages.

    Returns:
      ``(nodes, write)``: one :class:`FactoredSecondMoment` or
      :class:`FullSecondMoment` of plain arrays per leaf of ``updates`` (in
      leaf order), and ``write(new_nodes)``, the new ``nu`` in ``nu``'s structure.

    Raises:
      ValueError: the statistics are for other leaf paths, or a leaf's are
        neither ``v`` nor ``v_row`` and ``v_col``, or do not fit its shape; the
        message names the optimizer and the path.
    """
    name = "state.nu"
    grads = sharding.leaves_with_paths(updates)
    index = {tuple(map(trees.key_name, path)): i for i, (path, _) in enumerate(grads)}
    stats = sharding.leaves_with_paths(nu)
    node_types = _node_types(nu)
    fields: list[dict[str, Any]] = [{} for _ in grads]
    slots = []
    for path, leaf in stats:
        field = trees.key_name(path[-1]) if path else None
        i = index.get(tuple(map(trees.key_name, path[:-1]))) if path else None
        if i is None or field not in ("v", "v_row", "v_col"):
            # Name the first difference between the leaf paths of the statistics and of the updates.
            owners = list(dict.fromkeys(trees.keystr(p[:-1]) for p, _ in stats))
            trees.check_same_paths(owners, [trees.keystr(p) for p, _ in grads], f"{transformation}: {name}",
                                   "updates")
            raise ValueError(f"{transformation}: {name} holds {jax.tree_util.keystr(path)}, which is "
                             f"not the statistics v, v_row or v_col of a leaf of updates")
        fields[i][field] = leaf
        slots.append((i, field))
    nodes = [_node(found, node_types.get(tuple(map(trees.key_name, path))), np.shape(g), path,
                   f"{transformation}: {name} at {trees.keystr(path)}", expected)
             for (path, g), found in zip(grads, fields)]
    treedef = jax.tree.structure(nu)

    def write(new_nodes: list[Node]) -> Any:
        return treedef.unflatten([getattr(new_nodes[i], field) for i, field in slots])

    return nodes, write


def _node_types(nu: Any) -> dict[tuple[str, ...], type]:
    """The statistics nodes' types that record a factor rule, by the path of their leaf."""
    is_node = lambda x: isinstance(x, (FactoredSecondMoment, FullSecondMoment))  # noqa: E731
    flat, _ = jax.tree_util.tree_flatten_with_path(nu, is_leaf=is_node)
    return {tuple(map(trees.key_name, path)): type(x) for path, x in flat
            if is_node(x) and type(x).roles is not None}


def _node(found: dict[str, Any], recorded: type | None, shape: tuple[int, ...], path: tuple[Any, ...], where: str,
          expected: Callable[[str, tuple[int, ...], Node], Any]) -> Node:
    """One leaf's statistics as a node (of the type ``init`` recorded, if any), checked against ``shape``."""
    node_type = _NODE_FIELDS.get(frozenset(found))
    if node_type is not None and recorded is not None and issubclass(recorded, node_type):
        node_type = recorded
    if node_type is None:
        raise ValueError(
            f"{where} does not match updates: expected the statistics v (unfactored) or v_row and "
            f"v_col (factored) of the update there, found {sorted(found) or 'nothing'}; was the "
            f"state made for other parameters?"
        )
    node = node_type(**found)
    if issubclass(node_type, FullSecondMoment):
        if np.shape(node.v) != shape:
            raise ValueError(f"{where}: v has shape {np.shape(node.v)} but the update has shape {shape}")
        return node
    want = expected(trees.keystr(path, "/"), shape, node)
    got = (np.shape(node.v_row), np.shape(node.v_col))
    if want != got:
        raise ValueError(f"{where}: factored statistics of shapes {got} do not fit an update of shape {shape} "
                         f"(expected {want})")
    return node

