"""The one hook through which the converter applies the per-node plans of a graph.

The converter (:mod:`optkit.onnx._load.convert`) builds each node from its op-table row and hands it to
:meth:`GraphPlans.add`, which applies, in this order, every plan the graph has and adds the node to the
:class:`optkit.Graph`:

1. the channels-last plan (:mod:`optkit.onnx._plans.layout`; the model's graph only, on the CPU): a planned node is
   built in both layouts and reads and writes the held tensors;
2. ONNX Runtime's float16 plan (:mod:`optkit.onnx._plans.float16`): the node's function keeps the float32 values
   ONNX Runtime keeps;
3. the layers' keys (:mod:`optkit.onnx._plans.layers`): each node added gets the structural key by which the
   repeated layers are found.

Each plan reads only what the operators' registrations declare (``layout=``, ``float16=``, ``fusion=``), never
operator names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from optkit import Graph
from optkit.onnx._base.walk import read_inside
from optkit.onnx._plans import layout as _layout
from optkit.onnx._plans.float16 import GraphNames, planned
from optkit.onnx._plans.layers import node_key

__all__ = ["BuiltNode", "GraphPlans"]


@dataclasses.dataclass(frozen=True)
class BuiltNode:
    """One node as the converter built it, before the plans.

    Attributes:
      node: the ONNX node; index: its position in its graph; name: the Graph node's name; where: its text for
        errors.
      row: its op-table row ``(OpSpec, version, schema)``.
      built: the builder's function of the node's inputs.
      rebuild_channels_last: builds it again reading channels-last tensors (the layout plan calls it).
      inputs: the names its function reads (the fused chain's, when it runs fused); extra: the enclosing
        names its sub-graphs read, given after the inputs.
      fused: the nodes it runs fused with (farthest first).
      function: ``function(built, count)``: the converter's Graph node function of ``built`` reading ``count``
        inputs (static inputs made NumPy, folding, outputs bounded).
    """

    node: onnx.NodeProto
    index: int
    name: str
    where: str
    row: tuple[Any, int, Any]
    built: Callable[..., Any]
    rebuild_channels_last: Callable[[], Callable[..., Any]]
    inputs: list[str]
    extra: list[str]
    fused: tuple[onnx.NodeProto, ...]
    function: Callable[[Callable[..., Any], int], Callable[..., Any]]


class GraphPlans:
    """The per-node plans of one graph (see the module docstring), made once per graph by :meth:`of`.

    Attributes:
      layout: the channels-last plan, or None (sub-graphs; nothing planned).
      names: the graph's names as the float16 plan reads them.
      keys: ``{Graph node: structural key}`` of the nodes added so far (nodes with sub-graphs have none).
    """

    def __init__(self, layout: _layout.Plan | None, names: GraphNames) -> None:
        self.layout = layout
        self.names = names
        self.keys: dict[Any, Any] = {}
        self._moved: set[str] = set()  # the tensors not held whose channels-last copies were made so far

    @classmethod
    def of(cls, g: onnx.GraphProto, rows: Sequence[tuple[Any, int, Any]], declared: Any, subgraph: bool) -> GraphPlans:
        """The plans of graph ``g``: ``rows`` its nodes' op-table rows, ``declared`` its decoded declarations
        (:func:`optkit.onnx._load.protos.decode_graph`); ``subgraph``: an If, Loop or Scan body (no layout plan)."""
        natives = [spec.float16_native(version) for spec, version, _ in rows]
        names = GraphNames.of(g.node, natives, declared.outputs, read_inside)
        return cls(None if subgraph else _plan_layout(g, rows, declared), names)

    def add(self, graph: Graph, step: BuiltNode) -> None:
        """Apply the plans to ``step`` and add it to ``graph`` (see the module docstring)."""
        node, (spec, version, schema) = step.node, step.row
        layout = self.layout if self.layout is not None and step.index in self.layout.nodes else None
        start = graph.node_count
        built, inputs, outputs = step.built, step.inputs, list(node.output)
        if layout is not None:
            built = layout.function(node, built, step.rebuild_channels_last, step.where)
            inputs, outputs = layout.inputs(graph, node, step.where, self._moved), layout.outputs(node)
        fn = step.function(built, len(inputs))
        role = (spec.float16_native(version), spec.float16 is not None and spec.float16.moves_data)
        fn = planned(fn, self.names.plan(node, role, schema, inputs + step.extra, outputs))
        graph.add(fn, inputs=inputs + step.extra, outputs=outputs, name=step.name)
        if layout is not None:
            layout.add_onnx_layout(graph, node, step.where)
        if not step.extra:  # (the nodes of a planned node: the channels-last move, the node, its ONNX copy)
            key = node_key(node, version, step.fused)
            if layout is not None:
                key += (layout.signature(node),)
            for part, added in enumerate(graph.nodes_from(start)):
                self.keys[added] = (*key, part)


def _plan_layout(g: onnx.GraphProto, rows: Sequence[tuple[Any, int, Any]], declared: Any) -> _layout.Plan:
    """The model graph's channels-last plan (:mod:`optkit.onnx._plans.layout`)."""
    ranks: dict[str, int] = {info.name: len(info.shape) for info in declared.inputs if info.shape is not None}
    ranks.update((name, np.ndim(value)) for name, value in declared.initializers.items())
    names = {info.name for info in declared.inputs} | set(declared.initializers)
    names |= {name for node in g.node for name in [*node.input, *node.output, *read_inside(node)]}
    layouts = [spec.layout_at(version) for spec, version, _ in rows]
    return _layout.plan(g.node, ranks, layouts, names)


