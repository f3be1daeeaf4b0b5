"""What a :class:`optkit.Graph` means: every name defined, the dependencies, the Gradient nodes' cut
sub-graphs (SPEC 6), an evaluation order, and the checks that need the whole graph.

:class:`GraphAnalysis` is built from a graph's parts and raises, naming the tensor
and the node, on anything the graph cannot evaluate: a name no input,
initializer or node defines, a cycle (also through a Gradient node
differentiated through its own output), ``xs + zs`` that do not determine ``y``
or are not independent. :func:`walk_back` is the cut itself: the nodes that
compute some tensors when the graph is cut at others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from optkit._src.graph.names import Tensors
from optkit._src.graph.nodes import GradientNode, Node, name_of

__all__ = ["GradientPlan", "GraphAnalysis", "StepBudget", "walk_back"]


@dataclasses.dataclass(frozen=True)
class GradientPlan:
    """A Gradient node's sub-graph: its nodes in evaluation order, and the initializers it reads
    besides ``xs + zs``."""

    nodes: tuple[Node, ...]
    leaves: tuple[str, ...]


_N = TypeVar("_N", bound=Hashable)  # a graph's node: optkit's Node, or an ONNX node's index


class StepBudget:
    """The steps that several walks may take in all (``walk_back(..., budget=)``), so that analysing a
    graph from a stranger is bounded: past ``steps``, :meth:`spend` raises a ValueError that starts
    with ``where`` (set it before each walk) and says ``what`` was being analysed."""

    def __init__(self, steps: int, what: str) -> None:
        self.steps, self.left, self.what, self.where = steps, steps, what, "the graph"

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise ValueError(f"{self.where}: {self.what} take more than {self.steps} steps to analyse; the graph "
                             f"is refused rather than spend longer loading it")


def walk_back(
    targets: Iterable[str],
    stop: Collection[str],
    producer: Mapping[str, _N],
    deps: Callable[[_N], Iterable[str]],
    budget: StepBudget | None = None,
) -> tuple[set[_N], tuple[str, ...]]:
    """The nodes that compute ``targets`` when the graph is cut at ``stop``, and the
    tensors outside ``stop`` that no node produces (graph inputs, initializers). A loop:
    graphs loaded from ONNX can be deeper than Python's recursion limit. Each tensor
    visited spends one step of ``budget``."""
    nodes: set[_N] = set()
    leaves: set[str] = set()
    seen: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        if budget is not None:
            budget.spend()
        node = producer.get(name)
        if node is None:
            leaves.add(name)
        elif node not in nodes:
            nodes.add(node)
            stack.extend(deps(node))
    return nodes, tuple(sorted(leaves))


_Cut = tuple[frozenset[Node], tuple[str, ...]]  # a Gradient node's sub-graph nodes, and its other leaves


class GraphAnalysis:
    """The analysis of one version of a graph (a graph rebuilds it when it changes).

    Args:
      tensors: the graph's names (its nodes in the order they were added, and
        the node that produces each tensor).
      outputs: the declared graph outputs, or None.

    Attributes:
      order: every node, in dependency order (ties by insertion order).
      deps: each node's inputs, a Gradient node's including the tensors its
        sub-graph reads besides ``xs + zs``.
      gradients: each Gradient node's :class:`GradientPlan`.

    Raises:
      ValueError: as :meth:`optkit.Graph.validate`.
    """

    def __init__(self, tensors: Tensors, outputs: Sequence[str] | None) -> None:
        self.tensors = tensors
        self._nodes = tuple(tensors.nodes)
        self._producer = tensors.producer
        self._check_names(outputs)
        self.deps, cuts = self._dependencies()
        self.order = self._topological_order()
        position = {node: i for i, node in enumerate(self.order)}
        self.gradients = {
            grad: GradientPlan(tuple(sorted(nodes, key=position.__getitem__)), leaves)
            for grad, (nodes, leaves) in cuts.items()
        }
        for grad in self.gradients:
            self._check_independent(grad)

    def _check_names(self, outputs: Sequence[str] | None) -> None:
        """Every name a node reads, a Gradient node names, or the graph outputs is defined."""
        defined = self.tensors.defined
        for node in self._nodes:
            if isinstance(node, GradientNode):
                if not defined(node.y):
                    raise ValueError(f"{name_of(node)}: y {node.y!r} is never computed by the "
                                     f"graph (not a graph input, initializer or node output)")
                for attr, names in (("xs", node.xs), ("zs", node.zs)):
                    for name in names:
                        if not defined(name):
                            raise ValueError(
                                f"{name_of(node)}: {name!r} in {attr} is not a graph input, "
                                f"an initializer or an intermediate tensor of the graph")
            for name in node.inputs:
                if name and not defined(name):
                    raise ValueError(f"{name_of(node)} reads the tensor {name!r}, which is not "
                                     f"a graph input, an initializer or any node's output")
        for name in outputs or ():
            if not defined(name):
                raise ValueError(f"graph output {name!r} is not a graph input, an initializer "
                                 f"or any node's output")

    def _dependencies(self) -> tuple[dict[Node, tuple[str, ...]], dict[GradientNode, _Cut]]:
        """Each node's dependencies and each Gradient node's cut: the gradient planning.

        A Gradient node depends on its inputs and on what its sub-graph reads
        besides ``xs + zs``, and that sub-graph may hold other Gradient nodes,
        so the two are computed together; a Gradient node met again while its
        own cut is being computed is a cycle.
        """
        deps: dict[Node, tuple[str, ...]] = {}
        cuts: dict[GradientNode, _Cut] = {}
        in_progress: list[GradientNode] = []

        def node_deps(node: Node) -> tuple[str, ...]:
            if node not in deps:
                names = tuple(n for n in node.inputs if n)
                if isinstance(node, GradientNode):
                    names += cut(node)[1]
                deps[node] = names
            return deps[node]

        def cut(grad: GradientNode) -> _Cut:
            if grad in cuts:
                return cuts[grad]
            if grad in in_progress:
                chain = " -> ".join(repr(g.name) for g in in_progress[in_progress.index(grad):])
                raise ValueError(f"cycle: {name_of(grad)} differentiates through its own "
                                 f"output (Gradient nodes {chain} -> {grad.name!r})")
            in_progress.append(grad)
            nodes, leaves = walk_back([grad.y], set(grad.xs) | set(grad.zs), self._producer, node_deps)
            for name in leaves:
                if name not in self.tensors.initializers:
                    raise ValueError(
                        f"{name_of(grad)}: y {grad.y!r} depends on the graph input {name!r}, "
                        f"which is in neither xs {list(grad.xs)} nor zs {list(grad.zs)}; xs "
                        f"and zs must determine y (SPEC 6): add {name!r} to zs")
            in_progress.pop()
            cuts[grad] = (frozenset(nodes), leaves)
            return cuts[grad]

        for node in self._nodes:
            node_deps(node)
        return deps, cuts

    def _topological_order(self) -> tuple[Node, ...]:
        """Nodes in dependency order, ties broken by insertion order; iterative DFS,
        since graphs loaded from ONNX can be deeper than Python's recursion limit."""
        order: list[Node] = []
        state: dict[Node, int] = {}  # 1: on the DFS path, 2: done
        for root in self._nodes:
            if state.get(root) == 2:
                continue
            path: list[tuple[Node, Iterable[str]]] = [(root, iter(self.deps[root]))]
            state[root] = 1
            while path:
                node, pending = path[-1]
                for name in pending:
                    producer = self._producer.get(name)
                    if producer is None or state.get(producer) == 2:
                        continue
                    if state.get(producer) == 1:
                        on_path = [n for n, _ in path]
                        cycle = on_path[on_path.index(producer):] + [producer]
                        text = " -> ".join(repr(n.name) for n in reversed(cycle))
                        raise ValueError(f"the graph has a cycle through tensor {name!r}: "
                                         f"nodes {text}, each feeding the next")
                    state[producer] = 1
                    path.append((producer, iter(self.deps[producer])))
                    break
                else:
                    path.pop()
                    state[node] = 2
                    order.append(node)
        return tuple(order)

    def _check_independent(self, grad: GradientNode) -> None:
        """No tensor of ``xs + zs`` is computed from another: one walk back from all of them together,
        each tensor visited once (linear in the graph, however many names ``xs`` and ``zs`` hold)."""
        listed = {name: "xs" for name in grad.xs} | {name: "zs" for name in grad.zs}
        origin: dict[str, str] = {}  # a visited tensor -> the listed name whose inputs led to it
        stack = [(dep, name) for name in listed if name in self._producer
                 for dep in self.deps[self._producer[name]]]
        while stack:
            tensor, source = stack.pop()
            if tensor in origin:
                continue
            origin[tensor] = source
            if tensor in listed:
                raise ValueError(
                    f"{name_of(grad)}: xs and zs must be independent (SPEC 6), but "
                    f"{source!r} (in {listed[source]}) is computed from {tensor!r} (in "
                    f"{listed[tensor]}); drop one of them")
            producer = self._producer.get(tensor)
            if producer is not None:
                stack.extend((dep, source) for dep in self.deps[producer])
