"""Running a graph's repeated layers as ``jax.lax.scan`` (the runs :mod:`optkit.onnx._plans.layers` found).

Per call: :func:`evaluate` is :meth:`optkit.Graph.evaluate` over the graph's plan, each run of identical blocks
that the outputs need traced as one scan over the per-layer inputs (stacked inside the traced function, or read
stacked under :func:`~optkit.onnx._plans.layers.stacked_name` when a runner stacked them once). A run whose scanned
trace fails runs unrolled (``Layers.unrolled``), the cause logged once on the ``optkit.onnx`` logger.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optkit import Graph
from optkit.onnx._base.tracing import node_streams, random_key_active
from optkit.onnx._ops._common import sharded_like
from optkit.onnx._plans.float16 import WideCarry, needs_first_block
from optkit.onnx._plans.layers import STACKED, Layers, Run, stacked_name, stacked_names

__all__ = ["evaluate"]

_log = logging.getLogger("optkit.onnx")


def evaluate(graph: Graph, layers: Layers, feeds: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """:meth:`optkit.Graph.evaluate` with each run of ``layers`` that the outputs need as one ``jax.lax.scan``
    (its body under ``jax.checkpoint`` if ``layers.remat``)."""
    env = _Env(graph.initializers, feeds)
    names, plan = graph.plan(list(outputs), env.known())
    if layers.hoisted:  # (computed from the graph inputs alone: first, as find_layers ordered them)
        plan = [node for node in plan if node in layers.hoisted] + [node for node in plan if node not in layers.hoisted]
    wanted = set(plan)
    done: set[int] = set()
    pending: list = []
    for node in plan:
        r = layers.member.get(node)
        if r is None or r in layers.unrolled:
            pending.append(node)
            continue
        if r in done:
            continue
        graph.run_plan(pending, env)
        pending = []
        done.add(r)
        run = layers.runs[r]
        for start, stop in _same_shapes(run, env):  # (a stage's blocks of other widths: scanned apart)
            if stop - start >= 2 and needs_first_block(env, run.part(start, stop).initial):
                graph.run_plan([n for n in run.blocks[start] if n in wanted], env)  # (optkit.onnx._plans.float16)
                start += 1
            part = run.part(start, stop)
            try:
                if stop - start < 2:
                    raise _Unrolled
                env.update(_scanned(part, env, layers.remat))
            except Exception as err:  # noqa: BLE001 - any failure of the scanned trace: unrolled, as before
                if not isinstance(err, _Unrolled):
                    layers.unrolled.add(r)
                    _log.info("runs unrolled: %s, because %s: %s", part.describe(), type(err).__name__,
                              str(err).splitlines()[0] if str(err) else "")
                graph.run_plan([n for block in part.blocks for n in block if n in wanted], env)
    graph.run_plan(pending, env)
    return {name: env[name] for name in names}


class _Unrolled(Exception):
    """A single block: run as it is."""


class _Env(dict):
    """The evaluation's tensors by name. A stacked feed's layers (read by blocks that run unrolled) are sliced
    from it when a node first reads them, not at every call: a scanned run reads the stacked feed itself."""

    def __init__(self, initializers: Mapping[str, Any], feeds: Mapping[str, Any]):
        super().__init__(initializers)
        self.update(feeds)
        self.layers = {layer: (name, k) for name in feeds if name.startswith(STACKED)
                       for k, layer in enumerate(stacked_names(name))}
        for layer in self.layers:  # (the stacked feed's value, not an initializer's or a feed's of that name)
            self.pop(layer, None)

    def known(self) -> list[str]:
        """Every name a node can read: the values held and the stacked feeds' layers."""
        return [*self, *self.layers]

    def __missing__(self, name: str) -> Any:
        if name not in self.layers:
            raise KeyError(name)
        stacked, k = self.layers[name]
        value = self[name] = jax.lax.index_in_dim(self[stacked], k, keepdims=False)
        return value

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.layers

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def aval(self, name: str) -> tuple[tuple[int, ...], Any]:
        """The shape and dtype of ``name``'s value, a stacked feed's layer's without slicing it."""
        if not dict.__contains__(self, name) and name in self.layers:
            stacked = self[self.layers[name][0]]
            return np.shape(stacked)[1:], jnp.result_type(stacked)
        return np.shape(self[name]), jnp.result_type(self[name])


def _same_shapes(run: Run, env: _Env) -> list[tuple[int, int]]:
    """The run's blocks cut where the per-layer inputs change shape or dtype (ResNet's stages), as
    ``(start, stop)`` ranges."""
    def signature(k):
        return tuple(env.aval(names[k]) if names[k] in env else None for names in run.layer_names)

    cuts, start = [], 0
    for k in range(1, len(run.blocks) + 1):
        if k == len(run.blocks) or signature(k) != signature(start):
            cuts.append((start, k))
            start = k
    return cuts


def _equal_constants(values: list) -> bool:
    first = values[0]
    return all(isinstance(v, np.ndarray) for v in values) and all(
        v.dtype == first.dtype and v.shape == first.shape and np.array_equal(v, first) for v in values[1:])


def _scanned(run: Run, env: Mapping[str, Any], remat: bool) -> dict[str, Any]:
    """The run's outputs (every tensor read after it), computed by one ``jax.lax.scan``."""
    blocks, count = run.blocks, len(run.blocks)
    carried = WideCarry([env[name] for name in run.initial], run.initial)  # (optkit.onnx._plans.float16)
    invariant: dict[int, Any] = {}  # a per-layer input whose values are equal NumPy constants stays static
    stacked: list[Any] = []
    stacked_index: dict[int, int] = {}
    for x, names in enumerate(run.layer_names):
        ready = env.get(stacked_name(names))
        if ready is not None:  # stacked once by the runner (a frozen base: to_jax(..., lora=))
            stacked_index[x] = len(stacked)
            stacked.append(ready)
            continue
        values = [env[name] for name in names]
        if _equal_constants(values):
            invariant[x] = values[0]
        else:
            stacked_index[x] = len(stacked)
            stacked.append(np.stack(values) if all(isinstance(v, np.ndarray) for v in values)
                           else jnp.stack([jnp.asarray(v) for v in values]))
    key = random_key_active()
    salts = None
    if key is not None:  # the per-layer name of every node, for the random operators' streams
        salts = np.array([[zlib.crc32(node.name.encode()) & 0x7FFFFFFF for node in block] for block in blocks],
                         np.uint32)
    first = blocks[0]
    slot_values = {name: env[name] for row in run.slots for slot in row if slot[0] == "invariant"
                   for name in slot[1:]}

    def body(carry, xs):
        layer, salt = xs
        carry = carried.unpack(carry)
        produced: list[tuple] = []
        streams = None if salt is None else {node.name: salt[p] for p, node in enumerate(first)}
        with node_streams(streams):
            for p, node in enumerate(first):
                values = []
                for slot in run.slots[p]:
                    kind = slot[0]
                    if kind == "internal":
                        values.append(produced[slot[1]][slot[2]])
                    elif kind == "carry":
                        values.append(carry[slot[1]])
                    elif kind == "invariant":
                        values.append(slot_values[slot[1]])
                    elif kind == "layer":
                        x = slot[1]
                        values.append(invariant[x] if x in invariant else layer[stacked_index[x]])
                    else:
                        values.append(None)
                produced.append(tuple(node(values)))
        new = tuple(_like(produced[q][o], old) for (q, o), old in zip(run.carry, carry, strict=True))
        new = carried.pack(new, [first[q].outputs[o] for q, o in run.carry], _like)
        return new, tuple(produced[q][o] for q, o in run.stacked_outputs)

    if remat:
        body = jax.checkpoint(body)
    final, ys = jax.lax.scan(body, carried.init, (tuple(stacked), salts), length=count)
    final = carried.unpack(final, [blocks[-1][q].outputs[o] for q, o in run.carry])
    out: dict[str, Any] = {}
    for (q, o), values in zip(run.stacked_outputs, ys, strict=True):
        for k, block in enumerate(blocks):
            if block[q].outputs[o]:
                out[block[q].outputs[o]] = values[k]
    for (q, o), value in zip(run.carry, final, strict=True):
        out[blocks[-1][q].outputs[o]] = value
    return out


def _like(new: Any, old: Any) -> Any:
    """The carry's new value in the old one's type (its explicit mesh axes included); a changed shape or dtype
    raises (the run is then unrolled)."""
    if np.shape(new) != np.shape(old) or jnp.result_type(new) != jnp.result_type(old):
        raise TypeError(f"the carried value changes from {jnp.result_type(old)}{list(np.shape(old))} to "
                        f"{jnp.result_type(new)}{list(np.shape(new))} across a block")
    return sharded_like(new, old)
