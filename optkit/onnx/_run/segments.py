"""Compiled segments around the nodes whose output sizes depend on values (``prepare``'s default compile).

``NonZero``, ``Unique``, ``Compress``, ``NonMaxSuppression``, a ``Range`` or ``OneHot`` fed computed values, an
``If`` whose branches differ in shape, a ``Loop`` whose scan outputs grow with a computed condition: XLA needs
every shape before running, and these nodes' output shapes are known only from values. When tracing the whole
graph raises :class:`~optkit.onnx.ValueDependentError`, :class:`SegmentedRun` runs the graph as

    compiled segment -> the node, with concrete values -> compiled segment -> ...

The split is found at the first run of an input signature (a node is split off only when tracing it raised),
and kept: later runs go straight through the compiled segments, each cached by the shapes of what it is fed
(the shapes after a value-dependent node change with the values, and a new shape compiles that segment once).
What a segment computes from constants and shapes alone (``Shape``, folded constants) stays a constant for the
segments after it, as in one compiled graph.

Inside a caller's ``jax.jit`` nothing is concrete, and the error is raised as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from optkit import Graph
from optkit.onnx._base.errors import ValueDependentError
from optkit.onnx._base.tracing import tracing
from optkit.onnx._base.values import is_string

_log = logging.getLogger("optkit.onnx")

__all__ = ["SegmentedRun"]


class _Split(Exception):
    """Tracing a segment stopped at its ``index``-th node, whose output size depends on values."""

    def __init__(self, index: int, error: ValueDependentError) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


def _signature(values: Sequence[Any]) -> tuple:
    """What a segment's compile depends on in each value: shape, dtype, weak type; per tensor for a sequence (a
    list), None for an empty optional."""
    return tuple(_signature(v) if isinstance(v, list) else None if v is None else
                 (np.shape(v), np.dtype(v.dtype).str, bool(getattr(v, "weak_type", False))) for v in values)


def _holds(value: Any, kind: type) -> bool:
    """``value`` is a ``kind`` (a JAX array, a tracer), or a sequence (a list) holding one."""
    return isinstance(value, kind) or isinstance(value, list) and any(isinstance(v, kind) for v in value)


class _Segment:
    """Nodes compiled together: reads ``inputs`` from the run's values, adds ``wanted`` (what later nodes and the
    outputs need) back. Compiled per (which inputs are constants, the signature of the others)."""

    def __init__(self, graph: Graph, nodes: tuple, inputs: tuple[str, ...], wanted: tuple[str, ...],
                 options: dict[str, Any] | None, checks: bool) -> None:
        self._graph, self.nodes, self.inputs, self.wanted = graph, nodes, inputs, wanted
        self._options, self._checks = options, checks
        self._compiled: dict[Any, tuple[Any, tuple[str, ...], dict[str, np.ndarray]]] = {}

    def _build(self, static: dict[str, Any], dynamic: tuple[str, ...], values: list[Any]):
        constants: dict[str, np.ndarray] = {}
        traced: list[str] = []

        def run(*args):
            env = dict(static)
            env.update(zip(dynamic, args))
            with tracing(checks=self._checks):
                for i, node in enumerate(self.nodes):
                    try:
                        self._graph.run_plan((node,), env)
                    except ValueDependentError as err:
                        raise _Split(i, err) from None
            for name in self.wanted:
                value = env[name]
                if _holds(value, jax.core.Tracer):
                    traced.append(name)
                else:  # known from constants and shapes alone: a constant for the segments after this one
                    constants[name] = ([np.asarray(v) for v in value] if isinstance(value, list) else
                                       None if value is None else np.asarray(value))
            return tuple(env[name] for name in traced)

        fn = checkify.checkify(run, errors=checkify.user_checks) if self._checks else run
        start = time.perf_counter()
        compiled = jax.jit(fn, compiler_options=self._options).trace(*values).lower().compile()
        _log.info("compiled a segment of %d nodes in %.2f s", len(self.nodes), time.perf_counter() - start)
        return compiled, tuple(traced), constants

    def __call__(self, env: dict[str, Any]) -> None:
        static = {n: env[n] for n in self.inputs if not _holds(env[n], jax.Array)}
        dynamic = tuple(n for n in self.inputs if n not in static)
        values = [env[n] for n in dynamic]
        # Constants are objects this run's plan keeps (initializers, fed static values, earlier segments'
        # constants), so their identity stands for their value.
        key = (dynamic, tuple((n, id(v)) for n, v in static.items()), _signature(values))
        entry = self._compiled.get(key)
        if entry is None:
            entry = self._compiled[key] = (*self._build(static, dynamic, values), tuple(static.values()))
        compiled, traced, constants, _ = entry
        out = compiled(*values)
        if self._checks:
            err, out = out
            err.throw()
        env.update(zip(traced, out))
        env.update(constants)


class SegmentedRun:
    """``graph``'s ``outputs`` computed as compiled segments around the nodes whose output sizes depend on values.

    Made by :class:`~optkit.onnx.BackendRep` for one set of fed names and static values, after the whole graph's
    trace raised :class:`~optkit.onnx.ValueDependentError`; :meth:`run` takes the feeds by name (concrete).
    """

    def __init__(self, graph: Graph, outputs: Sequence[str], static: Mapping[str, np.ndarray],
                 *, options: dict[str, Any] | None = None, checks: bool = False) -> None:
        self._graph = graph
        self._outputs = tuple(outputs)
        self._constants = dict(graph.initializers)
        self._constants.update(static)
        self._static = frozenset(static)
        self._options, self._checks = options, checks
        self._steps: list[Any] | None = None  # _Segment or a node run with concrete values

    def _needs_after(self, nodes: tuple) -> list[set[str]]:
        """For each position, the names that the nodes from there on and the outputs read."""
        deps = self._graph.dependencies
        needs = [set(self._outputs)]
        for node in reversed(nodes):
            needs.append(needs[-1] | set(deps(node)))
        return needs[::-1]

    def _segment(self, nodes: tuple, known: set[str], after: set[str]) -> _Segment:
        deps = self._graph.dependencies
        produced = {out for node in nodes for out in node.outputs if out}
        inputs = tuple(dict.fromkeys(n for node in nodes for n in deps(node) if n not in produced and n in known))
        wanted = tuple(sorted(produced & after))
        return _Segment(self._graph, nodes, inputs, wanted, self._options, self._checks)

    def _eager(self, node: Any, env: dict[str, Any]) -> None:
        with tracing():  # ONNX's 64-bit types narrowed unwarned per node, as in the segments
            self._graph.run_plan((node,), env)
        for name in node.outputs:  # concrete results: fed to the next segment as values, not constants
            value = env.get(name)
            if name and isinstance(value, np.ndarray | np.generic | list) and not is_string(value):
                env[name] = jax.tree.map(jnp.asarray, value)  # (strings stay NumPy: computed on the host)

    def _plan(self, env: dict[str, Any]) -> list[Any]:
        """Find the split while running: trace what is left, and where it stops, compile the part before the
        node and run the node with concrete values."""
        _, nodes = self._graph.plan(self._outputs, env)
        needs = self._needs_after(nodes)
        steps: list[Any] = []
        start = 0
        while start < len(nodes):
            segment = self._segment(nodes[start:], set(env), needs[len(nodes)])
            try:
                segment(env)
            except _Split as split:
                stop = start + split.index
                if stop > start:
                    head = self._segment(nodes[start:stop], set(env), needs[stop])
                    head(env)
                    steps.append(head)
                node = nodes[stop]
                try:
                    self._eager(node, env)
                except ValueDependentError:
                    raise split.error from None  # not even its concrete values run it
                _log.info("node %r runs between compiled segments (its output size depends on values)",
                          getattr(node, "name", node))
                steps.append(node)
                start = stop + 1
                continue
            steps.append(segment)
            break
        return steps

    def run(self, feeds: Mapping[str, Any]) -> tuple[Any, ...]:
        """The outputs for the (checked, concrete) ``feeds``, in ``outputs`` order."""
        env = dict(self._constants)
        for name, value in feeds.items():
            if name not in self._static:
                env[name] = jax.tree.map(jnp.asarray, value)
        if self._steps is None:
            self._steps = self._plan(env)
        else:
            for step in self._steps:
                if isinstance(step, _Segment):
                    step(env)
                else:
                    self._eager(step, env)
        return tuple(env[name] for name in self._outputs)
