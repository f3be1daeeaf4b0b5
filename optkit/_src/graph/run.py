"""Evaluating a :class:`optkit.Graph`: the nodes an output needs, run in order, Gradient nodes as
``jax.vjp`` of their sub-graphs (SPEC 6).

:class:`GraphRunner` works from a :class:`~optkit._src.graph.analysis.GraphAnalysis`:
it plans which nodes compute the requested tensors from the known ones (cached
per request) and runs them, re-tracing a Gradient node's sub-graph inside
:func:`optkit._src.gradient.differentiate`, so that a Gradient node inside
another's sub-graph is differentiated again (higher derivatives).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from optkit._src.gradient import check_differentiable, differentiate
from optkit._src.graph.analysis import GraphAnalysis, walk_back
from optkit._src.graph.nodes import GradientNode, Node

__all__ = ["GraphRunner"]


class GraphRunner:
    """Runs one version of a graph.

    Args:
      analysis: the graph's :class:`GraphAnalysis`.
    """

    def __init__(self, analysis: GraphAnalysis) -> None:
        self._analysis = analysis
        self._producer = analysis.tensors.producer
        self._plans: dict[tuple[tuple[str, ...], frozenset[str]], tuple[Node, ...]] = {}

    def plan(self, targets: tuple[str, ...], known: frozenset[str]) -> tuple[Node, ...]:
        """The nodes that compute ``targets`` from the ``known`` tensors, in order."""
        key = (targets, known)
        if key in self._plans:
            return self._plans[key]
        analysis = self._analysis
        needed, missing = walk_back(targets, known, self._producer, analysis.deps.__getitem__)
        if missing:
            # Undefined names were refused already; what is left is an input not fed.
            raise ValueError(f"graph input {missing[0]!r} is needed for the outputs "
                             f"{list(targets)} but was not fed")
        plan = tuple(node for node in analysis.order if node in needed)
        self._plans[key] = plan
        return plan

    def run(self, plan: Iterable[Node], env: dict[str, Any]) -> None:
        """Evaluate ``plan`` in order, adding every produced tensor to ``env``."""
        for node in plan:
            values = [env[name] if name else None for name in node.inputs]
            if isinstance(node, GradientNode):
                results = self._run_gradient(node, values, env)
            else:
                results = node(values)
            for name, value in zip(node.outputs, results, strict=True):
                if name:
                    env[name] = value

    def _run_gradient(
        self, node: GradientNode, fed: Sequence[Any], env: Mapping[str, Any]
    ) -> tuple[Any, ...]:
        sub = self._analysis.gradients[node]
        base = {leaf: env[leaf] for leaf in sub.leaves}
        base.update(zip(node.xs + node.zs, fed, strict=True))
        # Only the xs whose gradient is asked for are differentiated (differentiate
        # checks their dtypes); the rest are held fixed like zs, which gives the same
        # numbers with less work, but must still be floating point (SPEC 6).
        wanted = [i for i, out in enumerate(node.outputs) if out]
        for i, x in enumerate(node.xs):
            if i not in wanted:
                check_differentiable(x, fed[i])
        wanted_xs = tuple(node.xs[i] for i in wanted)

        def target(x_values: tuple[Any, ...]) -> Any:
            local = dict(base)
            local.update(zip(wanted_xs, x_values, strict=True))
            self.run(sub.nodes, local)
            return local[node.y]

        grads = differentiate(target, wanted_xs, tuple(fed[i] for i in wanted), node.y)
        results: list[Any] = [None] * len(node.xs)
        for i, g in zip(wanted, grads, strict=True):
            results[i] = g
        return tuple(results)
