"""One walker for nested ONNX graphs: the graphs a node holds, every node at every depth, the names sub-graphs read.

The ground floor of :mod:`optkit.onnx`: every wing that walks a model's sub-graphs (If branches, Loop and Scan
bodies) walks them with these, iteratively (no recursion on nesting, so a file's depth cannot exhaust the stack).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

__all__ = ["subgraphs", "nodes_of", "read_inside", "too_deep"]


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (an If's branches, a Loop's or Scan's body)."""
    return [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def nodes_of(graph: onnx.GraphProto) -> Iterator[tuple[int, onnx.NodeProto]]:
    """``(index in its graph, node)`` for every node of ``graph`` and of its sub-graphs (If, Loop, Scan bodies).

    Iterative: no recursion on nesting.
    """
    stack = [graph]
    while stack:
        g = stack.pop()
        for index, node in enumerate(g.node):
            yield index, node
            for attr in node.attribute:
                if attr.HasField("g"):
                    stack.append(attr.g)
                stack.extend(attr.graphs)


def read_inside(node: onnx.NodeProto) -> list[str]:
    """The names a node's sub-graphs (If branches, Loop and Scan bodies, nested) read: an If's output is
    static when what its branch reads is."""
    graphs = subgraphs(node)
    names: list[str] = []
    while graphs:
        g = graphs.pop()
        for inner in g.node:
            names += [i for i in inner.input if i]
            graphs += subgraphs(inner)
    return names


def too_deep(graph: onnx.GraphProto, limit: int) -> tuple[onnx.NodeProto, int] | None:
    """The first node whose sub-graphs (If, Loop and Scan bodies) nest more than ``limit`` deep below ``graph``,
    with its index in its graph; None if none does. Iterative, and it stops at the first: a ModelProto built in
    memory can nest thousands deep (protobuf refuses to serialize such a message, and onnx.checker serializes)."""
    stack = [(graph, 0)]
    while stack:
        g, depth = stack.pop()
        for index, node in enumerate(g.node):
            inner = subgraphs(node)
            if inner and depth + 1 > limit:
                return node, index
            stack.extend((sub, depth + 1) for sub in inner)
    return None
