"""Channels-last on CPU: a graph's convolutions, pools and the element-wise nodes between them computed on
(N, D1, ..., C) values, with layout changes only where the rest of the graph reads a tensor.

ONNX writes images (N, C, D1, ...). XLA:CPU runs a convolution channels-last and, given an (N, C, H, W)
one, moves the channels around every convolution; a depthwise convolution computed from shifted slices
(:func:`~optkit.onnx._ops._depthwise.shifted`) reads its taps across the channel planes. Here the converter
holds every tensor that a run of such nodes passes along in channels-last form instead, under a name of
its own, and adds:

- a node that moves a tensor's channels last where a planned ``Conv`` reads one that is not held so
  (a graph input, an unplanned node's output);
- a node that gives every held tensor under its ONNX name, in ONNX's layout, for whatever reads that
  name: graph outputs, unplanned nodes, Gradient nodes, sub-graphs (a node nobody reads is never run);
- in a planned element-wise node, its other operands (a bias (C, 1, 1), a scalar) broadcast as ONNX
  broadcasts them and then moved like the held ones, so the node's formula is unchanged.

The choice is made when the graph is traced: off the CPU (:func:`active`), every planned node is its
ONNX form and the layout nodes pass values through, so one converted graph serves every backend and
GPU and TPU keep the layouts XLA picks there.

Which nodes are planned (:func:`plan`), from the graph's own nodes, in order:

- a ``Conv`` (1-D or higher) whose weight's rank is known (an initializer, a ``Constant``, a declared
  graph input, or its ``kernel_shape``);
- a ``MaxPool`` (without its ``Indices``), ``AveragePool``, ``GlobalAveragePool``, ``GlobalMaxPool`` or
  ``BatchNormalization`` (9 and later, inference or training) of a held tensor;
- an element-wise operator of a held tensor whose other operands are held tensors of the same rank or
  have a known rank no larger;
- a ``Concat`` of held tensors of one rank along the channels (DenseNet, Inception, U-Net);
- a ``Transpose`` from (N, D1, ..., C) to (N, C, D1, ...) of a tensor not held (its output is held, and
  is its input as it is), and one from (N, C, D1, ...) to (N, D1, ..., C) of a held tensor (its output,
  not held, is the held value as it is): the layout changes that jax2onnx writes around every ``Conv``
  of a channels-last Flax model, and ConvNeXt around its ``LayerNorm``, cost nothing.

Never: a node in another domain, a node with sub-graphs, a tensor a Gradient node names (``xs``, ``zs``,
``y``: a gradient with respect to a tensor must see the tensor itself), sub-graphs' own nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import onnx

from optkit import Graph
from optkit.onnx._base.values import TRAINING_DOMAIN, is_static, normalize_domain
from optkit.onnx._base.walk import read_inside, subgraphs
from optkit.onnx._ops._common import on_cpu
from optkit.onnx._ops._registry import Layout

__all__ = ["Plan", "active", "plan"]

def active() -> bool:
    """True where planned nodes run channels-last when traced: on XLA's CPU backend."""
    return on_cpu()


def _last(value: Any) -> Any:
    """(N, C, D1, ...) -> (N, D1, ..., C); NumPy stays NumPy (folded constants stay known)."""
    return np.moveaxis(value, 1, -1) if is_static(value) else jnp.moveaxis(value, 1, -1)


def _first(value: Any) -> Any:
    """(N, D1, ..., C) -> (N, C, D1, ...)."""
    return np.moveaxis(value, -1, 1) if is_static(value) else jnp.moveaxis(value, -1, 1)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which nodes of one graph run channels-last.

    Attributes:
      nodes: the planned nodes' indices.
      ranks: each tensor held channels-last (by its ONNX name) and its rank.
      hidden: each held tensor's own name in the :class:`optkit.Graph` (its ONNX name is its ONNX-layout copy).
      moved: the name of the channels-last copy of each tensor that is not held and that a planned ``Conv``
        reads as ``X``.
      roles: each planned node's layout role (:class:`~optkit.onnx._ops._registry.Layout`), by its first
        output.
    """

    nodes: frozenset[int]
    ranks: Mapping[str, int]
    hidden: Mapping[str, str]
    moved: Mapping[str, str]
    roles: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def _role(self, node: onnx.NodeProto) -> str:
        return self.roles[node.output[0]]

    def signature(self, node: onnx.NodeProto) -> tuple:
        """What the planned ``node``'s functions depend on besides the node itself (its role, its output's rank,
        which inputs are held, whether its ``X`` is moved): equal for the same node in two repeated layers."""
        role = self._role(node)
        return (role, self.ranks.get(node.output[0]), tuple(name in self.hidden for name in node.input),
                role == "conv" and bool(node.input) and node.input[0] not in self.hidden)

    def inputs(self, graph: Graph, node: onnx.NodeProto, where: str, added: set[str]) -> list[str]:
        """The planned ``node``'s input names in ``graph``: held tensors by their own names; a ``Conv``'s ``X``
        that is not held, moved by a node added the first time (``added``: the ONNX names moved so far)."""
        role = self._role(node)
        if role in ("conv", "reads_x"):  # X alone: W, B, scale... are read as ONNX lays them out
            names = [self.hidden.get(node.input[0], node.input[0]), *node.input[1:]]
        else:
            names = [self.hidden.get(name, name) for name in node.input]
        x = node.input[0] if node.input else ""
        if role == "conv" and x and x not in self.hidden:
            if x not in added:
                added.add(x)
                graph.add(_mover(x, self.ranks[node.output[0]], where), [x], [self.moved[x]],
                          name=f"{where}: X channels-last")
            names[0] = self.moved[x]
        return names

    def outputs(self, node: onnx.NodeProto) -> list[str]:
        """The planned ``node``'s output names in the graph."""
        return [self.hidden.get(node.output[0], node.output[0]), *node.output[1:]]

    def add_onnx_layout(self, graph: Graph, node: onnx.NodeProto, where: str) -> None:
        """After a planned ``node``: its held output under its ONNX name, in ONNX's layout."""
        out = node.output[0]
        if out not in self.hidden:
            return
        graph.add(lambda value: _first(value) if active() else value, [self.hidden[out]], [out],
                  name=f"{where}: output in ONNX's layout")

    def function(self, node: onnx.NodeProto, onnx_form: Callable[..., Any],
                 build_channels_last: Callable[[], Callable[..., Any]], where: str) -> Callable[..., Any]:
        """The planned node's function of its (renamed) inputs: its channels-last form where :func:`active`,
        its ONNX form elsewhere; ``where`` names the node in errors."""
        role = self._role(node)
        if role in ("conv", "reads_x"):
            channels_last = build_channels_last()
            return lambda *values: channels_last(*values) if active() else onnx_form(*values)
        if role == "concat":  # of held tensors along ONNX's channel axis: along their last
            def concat(*values):
                shapes = {np.shape(v)[:-1] for v in values}
                if not active() or len(shapes) != 1:  # (tensors that do not fit: the ONNX form's error)
                    return onnx_form(*(_first(v) if active() else v for v in values))
                return jnp.concatenate(values, axis=-1)

            return concat
        if role == "transpose":  # into or out of the held layout: the value as it is
            rank = len(_perm(node) or ())

            def moved(value):  # (a value of another rank: the ONNX form's error)
                return value if active() and np.ndim(value) == rank else onnx_form(value)

            return moved
        rank = self.ranks[node.output[0]]
        held = [name in self.hidden for name in node.input]

        def elementwise(*values):
            if not active():
                return onnx_form(*values)
            for name, value, h in zip(node.input, values, held):
                if not h and value is not None and np.ndim(value) > rank:  # (an initializer fed another rank)
                    raise ValueError(f"{where}: input {name!r} of shape {np.shape(value)} has more axes than the "
                                     f"rank-{rank} tensors it is combined with, which the model declares")
            return onnx_form(*(v if h or v is None else _broadcast_last(v, rank) for v, h in zip(values, held)))

        return elementwise


def _broadcast_last(value: Any, rank: int) -> Any:
    """An operand broadcast against a rank-``rank`` (N, C, D1, ...) tensor, moved as that tensor is moved."""
    shape = np.shape(value)
    if not shape:
        return value
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return _last(np.reshape(value, full) if is_static(value) else jnp.reshape(value, full))


def _mover(name: str, rank: int, where: str) -> Callable[[Any], Any]:
    def to_channels_last(value):
        if not active():
            return value
        if np.ndim(value) != rank:
            raise ValueError(f"{where}: X must be (N, C, D1, ...) of rank {rank} (as W), got shape {np.shape(value)}")
        return _last(value)

    to_channels_last.__name__ = f"{name} channels-last"
    return to_channels_last


def _fresh(name: str, taken: set[str]) -> str:
    """``name`` (primed until no tensor has it), taken."""
    while name in taken:
        name += "'"
    taken.add(name)
    return name


def _rank_of_constant(node: onnx.NodeProto) -> int | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.HasField("t"):
            return len(attr.t.dims)
        if attr.name in ("value_float", "value_int"):
            return 0
        if attr.name in ("value_floats", "value_ints"):
            return 1
    return None


def plan(nodes: Sequence[onnx.NodeProto], ranks: Mapping[str, int], layouts: Sequence[Layout | None],
         names: set[str]) -> Plan:
    """The nodes of a graph to run channels-last (see the module's text).

    Args:
      nodes: the graph's nodes, in order; ``layouts`` each one's part in the plan at its operator version, as
        its registration declares it (:meth:`~optkit.onnx._ops._registry.OpSpec.layout_at`), or None.
      ranks: the known ranks of graph inputs (declared shapes) and initializers.
      names: every tensor name of the graph and its sub-graphs (a held tensor's own name is none of them).
    """
    known = dict(ranks)
    pinned: set[str] = set()
    for node in nodes:
        if node.op_type == "Gradient" and normalize_domain(node.domain) == TRAINING_DOMAIN:
            pinned.update(v.decode("utf-8", "replace") for a in node.attribute for v in [a.s, *a.strings])
        pinned.update(read_inside(node))
    held: dict[str, int] = {}
    planned: set[int] = set()
    roles: dict[str, str] = {}
    for index, (node, layout) in enumerate(zip(nodes, layouts)):
        if normalize_domain(node.domain) != "":
            continue
        if node.op_type == "Constant" and len(node.output) == 1:
            rank = _rank_of_constant(node)
            if rank is not None:
                known[node.output[0]] = rank
            continue
        if layout is None or not 1 <= len(node.output) <= layout.outputs or not node.output[0] \
                or node.output[0] in pinned or subgraphs(node):
            continue
        if layout.role == "transpose" and _to_channels_last(node, held):  # the held tensor is what it gives
            planned.add(index)
            roles[node.output[0]] = layout.role
            known[node.output[0]] = held[node.input[0]]
            continue
        rank = _planned_rank(node, layout.role, held, known)
        if rank is not None:
            planned.add(index)
            roles[node.output[0]] = layout.role
            held[node.output[0]] = known[node.output[0]] = rank
    taken = set(names)
    hidden = {name: _fresh(f"{name}:channels_last", taken) for name in held}
    convs = [nodes[i].input[0] for i in sorted(planned) if roles[nodes[i].output[0]] == "conv"]
    moved = {x: _fresh(f"{x}:channels_last", taken) for x in dict.fromkeys(convs) if x not in held}
    return Plan(frozenset(planned), held, hidden, moved, roles)


def _perm(node: onnx.NodeProto) -> list[int] | None:
    """A transpose's ``perm`` attribute (None without one: that reverses the axes)."""
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _to_channels_last(node: onnx.NodeProto, held: Mapping[str, int]) -> bool:
    """A transpose of a held tensor to (N, D1, ..., C) (as jax2onnx writes after a Conv, ConvNeXt before
    its LayerNorm): its output, in ONNX's own layout, is the held value itself."""
    perm, rank = _perm(node), held.get(node.input[0]) if node.input else None
    return perm is not None and rank is not None and perm == [0, *range(2, rank), 1]


def _planned_rank(node: onnx.NodeProto, role: str, held: Mapping[str, int], known: Mapping[str, int]) -> int | None:
    """The rank of ``node``'s output if it runs channels-last (the output held), else None."""
    inputs = [name for name in node.input if name]
    if not inputs:
        return None
    if role == "transpose":  # (N, D1, ..., C) -> (N, C, D1, ...) of a tensor not held: held, it is its input
        perm = _perm(node)
        rank = len(perm or ())
        return rank if rank >= 3 and perm == [0, rank - 1, *range(1, rank - 1)] and inputs[0] not in held else None
    if role == "conv":
        kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape" and a.ints), None)
        rank = known.get(node.input[1]) if len(node.input) > 1 else None
        rank = rank if rank is not None else (None if kernel is None else len(kernel) + 2)
        if rank is None or rank < 3 or held.get(node.input[0], rank) != rank:
            return None
        return rank
    if role == "reads_x":
        return held.get(node.input[0])
    if role == "concat":  # of held tensors of one rank, along the channels
        ranks = {held.get(name) for name in inputs}
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        rank = ranks.pop() if len(ranks) == 1 else None
        return rank if rank is not None and axis is not None and -rank <= axis < rank and axis % rank == 1 else None
    ranks = {held[name] for name in inputs if name in held}
    if len(ranks) != 1:
        return None
    rank = ranks.pop()
    if any(name not in held and known.get(name, rank + 1) > rank for name in inputs):
        return None
    return rank
