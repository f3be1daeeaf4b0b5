"""Repeated layers run as one scanned layer: an exported model's identical blocks as ``jax.lax.scan``.

An ONNX file spells every layer of a deep model out, so XLA compiles each one separately, and compile time grows
with depth. Language models and many CNNs repeat one block with the same shapes; only the weights differ. T5X and
MaxText write such models with their layers scanned (``scan_layers``); this module finds the repeated blocks in a
converted graph and runs each run of them as one ``jax.lax.scan`` over the per-layer weights, stacked inside the
traced function (``params`` keep every initializer's own name and shape).

A *run* is a maximal stretch of the graph's nodes (in dependency order) that is periodic: node ``i`` and node
``i + L`` have the same structural key (operator, domain, opset, attributes; :func:`node_key`), cut into ``n >= 2``
blocks of ``L`` nodes whose data flow is the same in every block. Each input slot of a block node reads one of:

- a tensor of the same block (the same position in every block);
- a tensor of the block before (the *carry*: the hidden state; block 0 reads
  a tensor from before the run there);
- one tensor from before the run, the same for every block (an *invariant*:
  the attention mask, rotary tables, position ids);
- a different tensor per block from before the run (a *layer* input: the
  weights), stacked.

Outputs that nodes after the run (or the graph's outputs) read are the scan's stacked outputs (per-layer KV caches).
A stretch that fails one of these rules is not scanned; a run whose trace fails under the scan (a per-layer value an
operator needs before running, a carry whose type changes) runs unrolled, the cause logged once on the ``optkit.onnx``
logger.

Random operators draw from the same per-node streams as unrolled (the per-layer node name is scanned along, see
:func:`optkit.onnx._base.tracing.node_streams`), so outputs and gradients are the unrolled form's to rounding; so does a
float16 model's plan (:mod:`optkit.onnx._plans.float16`: a first block whose carry is float16 runs unrolled).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from optkit import Graph
from optkit._src.graph.nodes import GraphNode

__all__ = ["Layers", "Run", "find_layers", "layers_of", "node_key", "stacked_name", "stacked_names", "STACKED",
           "MIN_BLOCK", "AUTO_MIN_BLOCKS"]

_log = logging.getLogger("optkit.onnx")

MIN_BLOCK = 8  # nodes in a block: shorter repeats (three projections side by side) are left unrolled
MAX_BLOCK = 1024  # nodes in a block looked for (a LLaMA layer is 65-90 nodes, Optimum's GPT-2 layer 211)
MAX_CUTS = 64  # cuts of candidate stretches checked, in all: the search stays bounded on a file from a stranger
# Blocks in a run that scan_layers=None (the default) scans. Measured on XLA:CPU (benchmarks.onnx_depth, hidden 128,
# batch 4 x 64, fresh processes), the training step's first call (trace, compile, run) scanned / unrolled: BERT
# 2.6 / 1.9 s at 2 layers, 3.6 / 3.9 s at 12, 4.9 / 6.9 s at 24; GPT-2 4.0 / 6.4 s and LLaMA 5.3 / 4.6 s at 16;
# the steady step 1.1-1.5x the unrolled one's from 6 layers on (the weights stacked at every call).
AUTO_MIN_BLOCKS = 16


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of ``n`` identical blocks, scanned.

    Attributes:
      blocks: the nodes of each block, in order (``n`` tuples of ``L`` nodes).
      slots: for each position ``p`` and input slot ``j`` of a block, where the value comes from:
        ``("internal", q, o)`` (output ``o`` of the block's node ``q``), ``("carry", c)``,
        ``("invariant", name)``, ``("layer", x)`` (stacked input ``x``) or ``("absent",)``.
      carry: the carried outputs ``(q, o)``, in carry order.
      initial: block 0's tensor name for each carry.
      layer_names: for each stacked input, the tensor of each block.
      stacked_outputs: the outputs ``(q, o)`` read after the run, stacked over the blocks.
    """

    blocks: tuple[tuple[GraphNode, ...], ...]
    slots: tuple[tuple[tuple, ...], ...]
    carry: tuple[tuple[int, int], ...]
    initial: tuple[str, ...]
    layer_names: tuple[tuple[str, ...], ...]
    stacked_outputs: tuple[tuple[int, int], ...]

    @property
    def nodes(self) -> int:
        return sum(len(b) for b in self.blocks)

    def part(self, start: int, stop: int) -> Run:
        """Blocks ``start:stop`` of this run as a run of their own (block ``start`` reads its carry from block
        ``start - 1``'s outputs)."""
        initial = self.initial if start == 0 else tuple(self.blocks[start - 1][q].outputs[o] for q, o in self.carry)
        return dataclasses.replace(self, blocks=self.blocks[start:stop], initial=initial,
                                   layer_names=tuple(names[start:stop] for names in self.layer_names))

    def describe(self) -> str:
        return (f"{len(self.blocks)} blocks of {len(self.blocks[0])} nodes from {self.blocks[0][0].name!r} "
                f"({len(self.carry)} carried, {len(self.layer_names)} per-layer inputs)")


@dataclasses.dataclass
class Layers:
    """The runs found in a graph (:func:`find_layers`), and the ones whose scan failed (run unrolled)."""

    runs: tuple[Run, ...]
    member: dict[GraphNode, int]
    unrolled: set[int] = dataclasses.field(default_factory=set)
    remat: bool = False
    hoisted: frozenset = frozenset()  # nodes run first: computed from the graph inputs alone (:func:`hoisted`)

    def __bool__(self) -> bool:
        return bool(self.runs)


# ------------------------------------------------------------------ finding the runs

def layers_of(loaded: Any, scan_layers: bool | None, remat_layers: bool) -> Layers | None:
    """The runs a runner scans: those of a converted model (``loaded``, a
    :class:`~optkit.onnx._load.convert.Converted`) with ``scan_layers`` True, those of :data:`AUTO_MIN_BLOCKS` blocks
    or more with None, none (None returned) with False; ``remat_layers`` puts the scanned body under
    ``jax.checkpoint``.

    Raises:
      TypeError: ``scan_layers`` is not True, False or None, or ``remat_layers`` not a bool.
    """
    if scan_layers is not None and not isinstance(scan_layers, (bool, np.bool_)):
        raise TypeError(f"scan_layers must be True, False or None, got {scan_layers!r}")
    if not isinstance(remat_layers, (bool, np.bool_)):
        raise TypeError(f"remat_layers must be True or False, got {remat_layers!r}")
    if scan_layers is not None and not scan_layers:
        return None
    layers = find_layers(loaded.graph, loaded.node_keys, AUTO_MIN_BLOCKS if scan_layers is None else 2)
    if scan_layers is None:
        kept = tuple(run for run in layers.runs if len(run.blocks) >= AUTO_MIN_BLOCKS)
        layers = Layers(kept, {node: r for r, run in enumerate(kept) for block in run.blocks for node in block},
                        hoisted=layers.hoisted)
    if not layers:
        return None
    layers.remat = bool(remat_layers)
    for run in layers.runs:
        _log.debug("scans %s", run.describe())
    return layers


def find_layers(graph: Graph, keys: Mapping[Any, Hashable | None], min_blocks: int = 2) -> Layers:
    """The runs of at least ``min_blocks`` identical blocks in ``graph`` (a converted ONNX graph), given each
    node's structural key (``keys``; a node without one, or keyed None, is never part of a block). Graphs with
    Gradient nodes are left unrolled (their sub-graphs cut across layers). Bounded work: blocks of
    :data:`MIN_BLOCK` to :data:`MAX_BLOCK` nodes, :data:`MAX_CUTS` cuts checked (a graph of 65,536 nodes is
    searched in about a second)."""
    order = list(graph.order)
    if len(order) < min_blocks * MIN_BLOCK or any(not isinstance(node, GraphNode) for node in order):
        return Layers((), {})
    early = hoisted(graph, order)
    order = [node for node in order if node in early] + [node for node in order if node not in early]
    ids: dict[Hashable, int] = {}
    codes = np.empty(len(order), np.int64)
    for i, node in enumerate(order):
        key = keys.get(node)
        codes[i] = -1 - i if key is None else ids.setdefault(key, len(ids))
    candidates = []
    for length in range(MIN_BLOCK, min(len(order) // min_blocks, MAX_BLOCK) + 1):
        same = codes[:-length] == codes[length:]
        edges = np.flatnonzero(np.diff(np.concatenate([[False], same, [False]]).astype(np.int8)))
        for start, stop in zip(edges[::2], edges[1::2]):
            if stop - start >= (min_blocks - 1) * length:  # periodic over [start, stop + length)
                candidates.append((int(stop - start + length), length, int(start), int(stop + length)))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    position = {node: i for i, node in enumerate(order)}
    producer = graph.producers
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(order):
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(i)
    outputs = set(graph.outputs)
    taken = np.zeros(len(order), bool)
    runs: list[Run] = []
    budget = [MAX_CUTS]
    for _, length, start, stop in candidates:
        if budget[0] <= 0:
            break
        if taken[start:stop].any():
            continue
        run = _best_phase(_Flow(order, position, producer, readers, outputs), length, start, stop, budget)
        if run is not None and run.carry:  # (blocks side by side, not chained: left to XLA's fusion)
            first = position[run.blocks[0][0]]
            taken[first:first + run.nodes] = True
            runs.append(run)
    member = {node: r for r, run in enumerate(runs) for block in run.blocks for node in block}
    return Layers(tuple(runs), member, hoisted=early if runs else frozenset())


SMALL = 1  # elements of a float initializer that a hoisted node may read: a scalar (a mask's fill value, a scale)


def hoisted(graph: Graph, order: Sequence[Any]) -> frozenset:
    """The nodes computed from the graph inputs, integer and boolean tensors and float scalars (:data:`SMALL`)
    alone: an exporter's attention mask and rotary positions, which it may write inside the first layer
    (torch.onnx's dynamo exporter: LLaMA's mask ``Where``), where they break that layer's likeness to the others.
    Run first, in the graph's order, they leave the first layer like the rest (scanned), and are loop invariants of
    the scan. A node that reads a float weight, or a value computed from one (every layer's hidden state), stays."""
    sizes = {name: (int(np.size(value)), bool(np.issubdtype(np.asarray(value).dtype, np.floating)))
             for name, value in graph.initializers.items()}
    known = set(graph.inputs) | {name for name, (size, floating) in sizes.items() if size <= SMALL or not floating}
    chosen: list[Any] = []
    for node in order:
        if node.inputs and all(not name or name in known for name in node.inputs):
            chosen.append(node)
            known.update(name for name in node.outputs if name)
    return frozenset(chosen)


class _Flow(NamedTuple):
    """A graph's data flow as the search for runs reads it: the nodes in order, each node's position, each
    tensor's producer, each tensor's readers (positions) and the graph's outputs."""

    order: list
    position: dict
    producer: Mapping[str, Any]
    readers: dict[str, list[int]]
    outputs: set[str]


def _best_phase(flow: _Flow, length: int, start: int, stop: int, budget: list[int]) -> Run | None:
    """The valid cut of the periodic stretch ``order[start:stop]`` into blocks of ``length`` nodes with the
    most blocks, then the fewest carried tensors (the first with one carried tensor taken at once); each cut
    checked spends one of ``budget[0]``."""
    best = None
    for phase in range(start, min(start + length, stop - 2 * length + 1)):
        if budget[0] <= 0:
            break
        budget[0] -= 1
        count = (stop - phase) // length
        run = _cut(flow, length, phase, count)
        if run is not None and (best is None or (len(run.blocks), -len(run.carry)) >
                                (len(best.blocks), -len(best.carry))):
            best = run
        if best is not None and len(best.carry) == 1 and len(best.blocks) == (stop - start) // length:
            break
    return best


def _cut(flow: _Flow, length: int, first: int, count: int) -> Run | None:
    """The run of ``count`` blocks of ``length`` nodes from ``flow.order[first]``, or None if its data flow is not
    the same in every block (see the module docstring)."""
    order, position, producer, readers, outputs = flow
    end = first + length * count
    blocks = tuple(tuple(order[first + k * length:first + (k + 1) * length]) for k in range(count))

    def where(name: str, k: int) -> tuple:
        node = producer.get(name)
        i = position.get(node, -1) if node is not None else -1
        if i < first:
            return ("outside",)
        if i >= end:
            return ("after",)
        block, q = divmod(i - first, length)
        return ("in", k - block, q, node.outputs.index(name))

    slots, carry, initial, layer_names = [], {}, [], []
    layer_index: dict[tuple[str, ...], int] = {}
    for p in range(length):
        width = len(blocks[0][p].inputs)
        if any(len(b[p].inputs) != width or len(b[p].outputs) != len(blocks[0][p].outputs) for b in blocks):
            return None
        row = []
        for j in range(width):
            names = [b[p].inputs[j] for b in blocks]
            if not all(names) or not any(names):
                if any(names):
                    return None
                row.append(("absent",))
                continue
            found = [where(name, k) for k, name in enumerate(names)]
            kinds = {f[0] for f in found}
            if kinds == {"in"} and all(f[1] == 0 for f in found) and len({f[2:] for f in found}) == 1:
                row.append(("internal", *found[0][2:]))
            elif found[0][0] == "outside" and all(f[0] == "in" and f[1] == 1 for f in found[1:]) \
                    and len({f[2:] for f in found[1:]}) == 1:
                source = found[1][2:]
                if source in carry and initial[carry[source]] != names[0]:
                    return None
                if source not in carry:
                    carry[source] = len(initial)
                    initial.append(names[0])
                row.append(("carry", carry[source]))
            elif kinds == {"outside"}:
                if len(set(names)) == 1:
                    row.append(("invariant", names[0]))
                else:
                    x = layer_index.setdefault(tuple(names), len(layer_names))
                    if x == len(layer_names):
                        layer_names.append(tuple(names))
                    row.append(("layer", x))
            else:
                return None
        slots.append(tuple(row))
    # every output is read in its block, by the next block as the carry, or after the run
    stacked = []
    for p in range(length):
        for o in range(len(blocks[0][p].outputs)):
            after = False
            for k, block in enumerate(blocks):
                name = block[p].outputs[o]
                if not name:
                    continue
                last_carry = k == count - 1 and (p, o) in carry  # (the scan's final carry gives it)
                for reader in readers.get(name, ()):
                    r = reader - first
                    if reader >= end:
                        after = after or not last_carry
                    elif r // length == k + 1:
                        if (p, o) not in carry:
                            return None
                    elif r // length != k:
                        return None
                if name in outputs:
                    after = after or not last_carry
            if after:
                stacked.append((p, o))
    ordered = sorted(carry, key=carry.__getitem__)
    return Run(blocks, tuple(slots), tuple(ordered), tuple(initial), tuple(layer_names), tuple(stacked))


def node_key(node: Any, version: int, fused: Sequence[Any] = ()) -> tuple:
    """A converted ONNX node's structural key: two nodes with the same key compute the same function of their
    inputs (operator, domain, opset version, attributes; the nodes it runs fused with)."""
    return (node.domain, node.op_type, version, tuple(a.SerializeToString() for a in node.attribute),
            tuple((p.domain, p.op_type, tuple(a.SerializeToString() for a in p.attribute)) for p in fused))


STACKED = "\x00stacked\x00"  # the start of a stacked feed's name


def stacked_name(names: Sequence[str]) -> str:
    """The feed name under which a runner gives the tensors ``names`` (one per block of a run) already stacked:
    :func:`optkit.onnx._run.scanned.evaluate` reads it instead of stacking them (not a name an ONNX graph can hold:
    it starts with NUL)."""
    return STACKED + "\x00".join(names)


def stacked_names(name: str) -> list[str]:
    """The tensors of a :func:`stacked_name`, in the layers' order."""
    return name[len(STACKED):].split("\x00")
