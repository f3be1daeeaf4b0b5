"""Load-time analyses of a converted ONNX graph, each one walk back over its nodes (``walk_back``):
what its Gradient nodes ask for (bounded), and which graph inputs must be known before running; and what
loading finds out once for the runners (:class:`Facts`): which graph inputs its optimizer nodes update (those
a training step may donate), which initializers its nodes read, whether it has grouped convolutions and
Gradient nodes, and the initializers trained by default.

All the walks over one model share one :class:`~optkit._src.graph.analysis.StepBudget`
(:data:`~optkit.onnx._base.limits.MAX_ANALYSIS_STEPS` steps), so loading a model from a
stranger is O(Gradient nodes x graph nodes), bounded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from optkit._src.graph.analysis import StepBudget, walk_back
from optkit.onnx._base.limits import GRADIENT_DEPTH_CEILING, Limits
from optkit.onnx._base.values import TRAINING_DOMAIN, node_name, node_where, normalize_domain
from optkit.onnx._base.walk import nodes_of, read_inside, subgraphs
from optkit.onnx._load.untie import deduplicated
from optkit.onnx._ops._registry import OpSpec
from optkit.onnx._ops.training import OPTIMIZER_KINDS

__all__ = ["Facts", "check_gradient_work", "default_trainable", "facts_of", "grouped_convolution", "looks_trainable",
           "read_inside", "static_inputs", "subgraphs", "updated_inputs"]


def _producers(nodes: Sequence[onnx.NodeProto]) -> dict[str, int]:
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer.setdefault(out, index)
    return producer


def check_gradient_work(nodes: Sequence[onnx.NodeProto], limits: Limits, budget: StepBudget, opset: int | None) -> None:
    """Bound what the graph's Gradient nodes ask for, at load time, naming the node that goes past a bound.

    A Gradient node's sub-graph is the graph from ``xs + zs`` to ``y``, cut at
    ``xs + zs``; a Gradient node inside it is differentiated again. Per node:

    - depth: 1 + the depth of the deepest Gradient node in its sub-graph, at
      most ``max_gradient_depth``;
    - reverse passes: ``1 + 2 * (the passes of each Gradient node in its
      sub-graph)`` (each inner node is traced forward and differentiated again
      there); the model's total, over every Gradient node, at most
      ``max_gradient_passes``: one level of four Gradient nodes over four
      others multiplies the work by about eight, so depth alone does not
      bound it.

    ``opset`` is the model's opset of the training domain, for messages.
    Nodes come in the graph's order (onnx.checker requires it topologically
    sorted), so every inner Gradient node is known before it is needed.

    Raises:
      ValueError: a bound passed, or the walks past ``budget``.
    """
    producer = _producers(nodes)
    depth: dict[int, int] = {}
    passes: dict[int, int] = {}
    for index, node in enumerate(nodes):
        if normalize_domain(node.domain) != TRAINING_DOMAIN or node.op_type != "Gradient":
            continue
        attrs = {a.name: a for a in node.attribute}
        if "y" not in attrs:
            continue  # parse_attributes refused it already
        where = node_where(node_name(node.name, node.op_type, index), TRAINING_DOMAIN, "Gradient", 1, opset)
        y = attrs["y"].s.decode("utf-8", "replace")
        stop = {v.decode("utf-8", "replace") for key in ("xs", "zs") if key in attrs for v in attrs[key].strings}
        budget.where = where
        # A Gradient differentiated through itself is a cycle: Graph.validate names it.
        reached, _ = walk_back([y], stop, producer, lambda p, at=index: () if p == at else nodes[p].input, budget)
        inner = sorted(p for p in reached if p in depth)
        deepest = max(inner, key=depth.__getitem__, default=None)
        depth[index] = 1 + (0 if deepest is None else depth[deepest])
        passes[index] = 1 + 2 * sum(passes[p] for p in inner)
        if depth[index] > limits.max_gradient_depth:
            inner_name = node_name(nodes[deepest].name, "Gradient", deepest)
            raise ValueError(
                f"{where}: Gradient nodes nest {depth[index]} deep here (its y {y!r} is computed through Gradient "
                f"node {inner_name!r}), more than optkit.onnx's limit of {limits.max_gradient_depth}; each level "
                f"differentiates the one below again. Pass max_gradient_depth= (at most {GRADIENT_DEPTH_CEILING}) "
                f"to allow more")
        total = sum(passes.values())
        if total > limits.max_gradient_passes:
            raise ValueError(
                f"{where}: the model's Gradient nodes need {total} reverse passes so far (this one "
                f"{passes[index]}: {len(inner)} Gradient nodes in its sub-graph, each differentiated again), more "
                f"than optkit.onnx's limit of {limits.max_gradient_passes}; pass max_gradient_passes= to allow "
                f"more (compile time grows with it)")


def static_inputs(nodes: Sequence[onnx.NodeProto], specs: Mapping[int, OpSpec], inputs: set[str],
                  budget: StepBudget) -> frozenset[str]:
    """The graph inputs that a static input slot (a Reshape shape...) depends on, through nodes that would
    fold (all inputs static); a ``Shape`` output is static whatever its input, a Gradient's never folds.

    Args:
      nodes: the graph's nodes; ``specs`` the registration each one was built from, by index.
      inputs: the names to report: graph inputs (and initializers, for the ones a static slot reads).
    """
    slots = [node.input[i] for index, node in enumerate(nodes) for i in specs[index].static_inputs
             if i < len(node.input) and node.input[i]]
    producer = {name: index for name, index in _producers(nodes).items()
                if not (specs[index].static_outputs or specs[index].op_type == "Gradient")}
    budget.where = "the graph's static inputs"
    _, leaves = walk_back(slots, (), producer, lambda p: [i for i in nodes[p].input if i] + read_inside(nodes[p]),
                          budget)
    return frozenset(leaves) & inputs


def updated_inputs(nodes: Sequence[onnx.NodeProto], inputs: Sequence[str]) -> tuple[str, ...]:
    """The graph ``inputs`` that a top-level ``Adagrad``, ``Adam`` or ``Momentum`` node (training domain) takes
    as a tensor it updates, ``X`` or its state (not ``R``, ``T`` or ``G``), in ``inputs`` order: the buffers a
    training step may donate, since the node's outputs replace them. Nodes already passed the checks of
    their registration (input count ``2 + k*n``)."""
    updated: set[str] = set()
    for node in nodes:
        kinds = OPTIMIZER_KINDS.get(node.op_type) if normalize_domain(node.domain) == TRAINING_DOMAIN else None
        if kinds is None:
            continue
        n = (len(node.input) - 2) // len(kinds)
        updated.update(name for k, kind in enumerate(kinds) if kind != "G"
                       for name in node.input[2 + k * n:2 + (k + 1) * n])
    return tuple(name for name in inputs if name in updated)


def grouped_convolution(model: onnx.ModelProto) -> tuple[bool, bool]:
    """``(grouped, gradient)``: whether ``model`` has a ``Conv`` or ``ConvTranspose`` with ``group`` > 1, and a
    ``Gradient`` node, anywhere (its graph, sub-graphs and local functions)."""
    graphs = [model.graph, *model.functions]
    grouped = gradient = False
    while graphs:
        for node in graphs.pop().node:
            gradient = gradient or (node.op_type == "Gradient" and normalize_domain(node.domain) == TRAINING_DOMAIN)
            if node.op_type in ("Conv", "ConvTranspose"):
                grouped = grouped or any(a.name == "group" and a.i > 1 for a in node.attribute)
            graphs += subgraphs(node)
    return grouped, gradient


def looks_trainable(value: np.ndarray) -> bool:
    """Whether a floating initializer holds weights rather than a mask: finite, and no magnitude whose square
    overflows its dtype (exporters write attention masks as -inf or as the dtype's lowest value, -3.4e38 in
    float32; training one makes the step's statistics overflow)."""
    value = np.asarray(value)
    flat, largest = value.reshape(-1), 0.0
    for start in range(0, flat.size, _CHUNK):  # in chunks: no temporary the size of a large weight
        part = flat[start:start + _CHUNK]
        if not np.all(np.isfinite(part)):
            return False
        largest = max(largest, float(np.max(np.abs(part))))
    return largest < float(np.finfo(value.dtype).max) ** 0.5


_CHUNK = 2**20  # elements


def default_trainable(initializers: Mapping[str, np.ndarray], read: frozenset[str],
                      static: frozenset[str]) -> tuple[str, ...]:
    """The initializers trained by default (``to_jax``, ``OnnxModule``, ``make_training_model``): floating-point,
    of rank >= 1, read by a node (sub-graphs included), not read where a value must be known before running
    (a ``Resize``'s scales) or where a table is (``static`` holds both: a rotary embedding's caches), and
    holding weights rather than masks (:func:`looks_trainable`)."""
    return tuple(name for name, value in initializers.items()
                 if np.issubdtype(np.asarray(value).dtype, np.floating) and name in read and np.ndim(value)
                 and name not in static and looks_trainable(value))


@dataclasses.dataclass(frozen=True)
class Facts:
    """What loading found out about a model, written once for both runners and ``make_training_model``.

    Attributes:
      read: the names that a node of the graph or of its sub-graphs reads.
      updated_inputs: the graph inputs an optimizer node updates (:func:`updated_inputs`), in ``graph.input``
        order.
      grouped_convolution: a ``Conv`` or ``ConvTranspose`` with ``group`` > 1 anywhere.
      gradient: a ``Gradient`` node anywhere.
      default_trainable: the initializers trained by default (:func:`default_trainable`).
      double: the model has DOUBLE or COMPLEX128 graph inputs, initializers or outputs (which run as float32
        and complex64 while JAX's 64-bit mode is off).
      shared: ``{initializer: reading nodes}`` for the initializers an exporter shared between unrelated nodes
        (:func:`optkit.onnx._load.untie.deduplicated`): trained, they tie those nodes.
    """

    read: frozenset[str]
    updated_inputs: tuple[str, ...]
    grouped_convolution: bool
    gradient: bool
    default_trainable: tuple[str, ...]
    double: bool = False
    shared: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def facts_of(model: onnx.ModelProto, inputs: Sequence[Any], initializers: Mapping[str, np.ndarray],
             static_initializers: frozenset[str], table_initializers: frozenset[str] = frozenset()) -> Facts:
    """:class:`Facts` of a checked ``model`` whose graph inputs are ``inputs`` (``InputInfo`` records) and
    decoded initializers ``initializers`` (``static_initializers``: those a static input slot reads;
    ``table_initializers``: those read as tables, not weights)."""
    read = frozenset(name for _, node in nodes_of(model.graph) for name in node.input)
    grouped, gradient = grouped_convolution(model)
    wide = {np.dtype(np.float64), np.dtype(np.complex128)}
    double = (any(info.dtype is not None and np.dtype(info.dtype) in wide for info in inputs)
              or any(np.asarray(v).dtype in wide for v in initializers.values())
              or any(o.type.tensor_type.elem_type in (onnx.TensorProto.DOUBLE, onnx.TensorProto.COMPLEX128)
                     for o in model.graph.output))
    return Facts(read, updated_inputs(model.graph.node, [info.name for info in inputs]), grouped, gradient,
                 default_trainable(initializers, read, static_initializers | table_initializers), double,
                 deduplicated(model))
