"""float16 as ONNX Runtime's CPU provider computes it: the nodes it has no float16 kernel for run in float32, and
the values passed between such nodes stay float32.

ONNX Runtime 1.32's CPU provider registers float16 kernels for few operators (data movement, ``Cast``,
``LayerNormalization``, ``Clip``/``Max``/``Min``, ``IsNaN``, some com.microsoft operators, read from
``onnxruntime.capi._pybind_state.get_all_opkernel_def()``): each operator's registration declares it
(``float16=``, :class:`optkit.onnx._ops._registry.Float16`), as it declares its channels-last role. Every other node
with a float16 input runs in float32
between inserted casts (``InsertCastTransformer``, onnxruntime/core/optimizer/insert_cast_transformer.cc): its
float16 inputs are widened (exactly) and its float16 outputs computed in float32; a node that has a float16 kernel
but sits between such nodes is moved to float32 too (``IsIsolatedFp16NodeOnCpu``); then the casts that would narrow a
float32 result to float16 and widen it again for the next float32 node are removed
(``RemoveDuplicateCastTransformer``). So a chain ``MatMul -> Add -> Pow -> Mul -> Tanh`` keeps float32 throughout,
and only the values that reach a float16 kernel, a graph output or an explicit ``Cast`` are rounded to float16.

optkit follows the same plan while a graph is traced (the runners' :func:`optkit.onnx._base.tracing.tracing` block):
every graph value keeps its ONNX dtype (float16), and the float32 value it was rounded from is kept beside it
(:func:`planned`) for the nodes that read it in float32. XLA drops whichever of the two no node reads. Values
crossing a sub-graph, a scanned layer or a compiled segment are read as their float16 values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx

from optkit.onnx._base.tracing import float16_shadows
from optkit.onnx._base.values import is_static as _is_static

__all__ = ["GraphNames", "NodePlan", "WideCarry", "keep_wide", "needs_first_block", "planned", "wide_of"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """What the plan needs to know about one node, found when its graph is converted.

    Attributes:
      native: ONNX Runtime has a float16 kernel for it (its registration's ``float16=``).
      subgraph: it has sub-graphs (``If``, ``Loop``, ``Scan``): never moved to float32.
      edges: per input, whether a node of the same graph computes it (not a graph input or initializer).
      counted: per input, whether ONNX Runtime's isolation check reads it (the first input of each formal
        parameter: one of a variadic ``Concat``'s inputs).
      outputs_counted: per output, likewise (one of a variadic ``Split``'s outputs).
      outputs_to_float32: per output, whether every node reading it lacks a float16 kernel.
      graph_output: it computes an output of its graph.
      cast_to: a ``Cast`` node's ``to`` as a NumPy dtype; None for any other node.
      read_by_cast: a ``Cast`` node whose output a ``Cast`` to a type wider than float16 reads (ONNX Runtime then
        keeps the rounding of a ``Cast`` to float16 for every reader).
      reads_unrounded: a ``Cast`` whose input only ``Cast`` nodes and nodes without a float16 kernel read, and
        that is not a graph output (a float32 node's result is then cast from its float32 value).
      inputs, outputs: the names the node's function reads and writes.
      moves_data: an operator that only moves its first input's elements (its registration's ``float16=``): its
        outputs have that input's dtype (found without tracing it again).
      typed: it has an attribute naming an output type (``dtype``, ``to``, ``output_dtype``).
    """

    native: bool
    subgraph: bool
    edges: tuple[bool, ...]
    counted: tuple[bool, ...]
    outputs_counted: tuple[bool, ...]
    outputs_to_float32: tuple[bool, ...]
    graph_output: bool
    cast_to: np.dtype | None = None
    typed: bool = False
    read_by_cast: bool = False
    reads_unrounded: bool = False
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    moves_data: bool = False


def _is_float16(value: Any) -> bool:
    return getattr(value, "dtype", None) == _FLOAT16


def _shadow(shadows: dict, value: Any, name: str) -> tuple[Any, bool] | None:
    # (the value itself and its graph name: a node may return its input unchanged, a no-op Reshape, under its
    # own name)
    entry = shadows.get((id(value), name))
    return (entry[1], entry[2]) if entry is not None and entry[0] is value else None


def _keep(shadows: dict, rounded: Any, wide: Any, moved: bool, name: str) -> None:
    shadows[(id(rounded), name)] = (rounded, wide, moved)


def wide_of(value: Any, name: str) -> tuple[Any, bool] | None:
    """The float32 value that the float16 graph value ``name`` was rounded from in the trace under way, and whether
    a node moved to float32 computed it; None when there is none (a value crossing a boundary, a float16 node's
    result)."""
    shadows = float16_shadows()
    return None if shadows is None or not _is_float16(value) else _shadow(shadows, value, name)


def keep_wide(value: Any, wide: Any, moved: bool, name: str) -> None:
    """Keep ``wide`` (float32) as the value the float16 ``value`` named ``name`` was rounded from
    (:func:`wide_of`), in the trace under way (a scanned layer's carry, read again inside the scan)."""
    shadows = float16_shadows()
    if shadows is not None:
        _keep(shadows, value, wide, moved, name)


def needs_first_block(env: Mapping[str, Any], names: Sequence[str]) -> bool:
    """Whether a scanned run of layers must run its first block unrolled: a float16 carry (``names``, read from
    ``env``) has no float32 value yet (it comes from a float16 node, an embedding's ``Gather``) while the later
    blocks' carries will (ONNX Runtime runs the first layer's nodes in float16 and the others' in float32 there:
    not one scan body)."""
    return float16_shadows() is not None and any(_is_float16(env[name]) and wide_of(env[name], name) is None
                                                  for name in names)


class WideCarry:
    """A scan's carry with each float16 value that has a float32 value beside it (:func:`wide_of`) carried as the
    pair, so that the next layer's float32 nodes read it unrounded, as unrolled."""

    def __init__(self, init: Sequence[Any], names: Sequence[str]):
        self.names = tuple(names)
        self.wide = [wide_of(value, name) for value, name in zip(init, names, strict=True)]
        self.init = tuple(v if w is None else (v, w[0]) for v, w in zip(init, self.wide, strict=True))

    def unpack(self, carry: Sequence[Any], names: Sequence[str] | None = None) -> list[Any]:
        """The carry as the layer reads it (the pairs' float16 values, their float32 values kept beside them under
        ``names``, by default the first block's names for them)."""
        out = list(carry)
        for c, (w, name) in enumerate(zip(self.wide, names or self.names, strict=True)):
            if w is not None:
                keep_wide(out[c][0], out[c][1], w[1], name)
                out[c] = out[c][0]
        return out

    def pack(self, new: Sequence[Any], names: Sequence[str], like: Callable[[Any, Any], Any]) -> tuple:
        """The layer's new carry (the values the block computed under ``names``) as the scan carries it
        (``like(new, old)``: in the old value's type)."""
        return tuple(v if w is None else (v, like(_widened(float16_shadows() or {}, v, name), old[1]))
                     for v, name, w, old in zip(new, names, self.wide, self.init, strict=True))


def _widened(shadows: dict, value: Any, name: str) -> Any:
    found = _shadow(shadows, value, name)
    if found is not None:
        return found[0]
    return value.astype(_FLOAT32)  # (NumPy for a value known before running, which stays NumPy)


def planned(fn: Callable[..., Any], plan: NodePlan) -> Callable[..., Any]:
    """``fn`` (a node's function) run under ONNX Runtime's float16 plan (the module's docstring)."""

    def node_function(*values):
        shadows = float16_shadows()
        if shadows is None:
            return fn(*values)
        if plan.cast_to is not None:
            return _cast(shadows, fn, plan, values)
        if not any(_is_float16(v) for v in values):
            return fn(*values)
        if plan.subgraph or (plan.native and not _isolated(shadows, fn, plan, values)):
            return fn(*values)
        widened = [_widened(shadows, v, n) if _is_float16(v) else v for v, n in zip(values, plan.inputs)]
        declared = _declared(fn, plan, values)
        out = fn(*widened)
        single = not isinstance(out, tuple)
        results = []
        for value, dtype, name in zip((out,) if single else out, declared, plan.outputs):
            if dtype == _FLOAT16 and getattr(value, "dtype", None) == _FLOAT32:
                rounded = value.astype(_FLOAT16)
                _keep(shadows, rounded, value, True, name)
                value = rounded
            results.append(value)
        return results[0] if single else tuple(results)

    node_function.__name__ = getattr(fn, "__name__", "node")
    return node_function


def _cast(shadows: dict, fn: Callable[..., Any], plan: NodePlan, values: Sequence[Any]) -> Any:
    """A ``Cast``: to float32 from a value a float32 node computed, its float32 value (ONNX Runtime removes the
    narrowing and widening casts between them) unless the result is a graph output; to another type, the float32
    value cast when every reader of that value is a ``Cast`` or a float32 node (ONNX Runtime then removes the
    rounding) and it is not a graph output; to float16 from float32, the
    rounded value with its float32 source beside it (the float32 nodes reading it read the source); from float16
    to float16, the value with its float32 value still beside it."""
    value = values[0]
    found = _shadow(shadows, value, plan.inputs[0]) if _is_float16(value) else None
    if plan.cast_to == _FLOAT32 and found is not None and found[1] and not plan.graph_output:
        return found[0]
    if found is not None and found[1] and plan.cast_to != _FLOAT16 and plan.reads_unrounded:
        return fn(found[0], *values[1:])  # (no reader needs the rounding: ONNX Runtime removes it)
    out = fn(*values)
    if plan.cast_to == _FLOAT16 and found is not None:
        _keep(shadows, out, found[0], found[1], plan.outputs[0])
        return out
    if plan.cast_to == _FLOAT16 and not plan.read_by_cast and getattr(value, "dtype", None) == _FLOAT32 and \
            _is_float16(out):
        _keep(shadows, out, value, False, plan.outputs[0])
    return out


def _isolated(shadows: dict, fn: Callable[..., Any], plan: NodePlan, values: Sequence[Any]) -> bool:
    """ONNX Runtime's ``IsIsolatedFp16NodeOnCpu``: a node with a float16 kernel whose float16 inputs computed by
    nodes all come from nodes moved to float32, and whose float16 outputs all go to nodes without a float16 kernel,
    runs in float32 too."""
    if plan.graph_output or not any(plan.edges):
        return False
    counted = [i for i, v in enumerate(values) if plan.counted[i] and _is_float16(v)]
    if not counted:
        return False
    for i in counted:
        if plan.edges[i] and not _is_static(values[i]):
            found = _shadow(shadows, values[i], plan.inputs[i])
            if found is None or not found[1]:
                return False
    declared = [_FLOAT16] * len(plan.outputs) if plan.moves_data and _is_float16(values[0]) else _output_dtypes(
        fn, values)
    fp16 = [i for i, dtype in enumerate(declared) if i < len(plan.outputs_counted) and plan.outputs_counted[i]
            and dtype == _FLOAT16]
    return bool(fp16) and all(plan.outputs_to_float32[i] for i in fp16)


def _declared(fn: Callable[..., Any], plan: NodePlan, values: Sequence[Any]) -> list:
    """The ONNX dtypes of a node's outputs moved to float32: found abstractly where a float32 input or an output
    type attribute could decide them; otherwise every float32 output is a float16 one (ONNX Runtime's assumption)."""
    mixed = any(getattr(v, "dtype", None) == _FLOAT32 for v in values)
    if mixed or plan.typed:
        return _output_dtypes(fn, values)
    return [_FLOAT16] * len(plan.outputs_to_float32)


def _output_dtypes(fn: Callable[..., Any], values: Sequence[Any]) -> list:
    """The dtypes of ``fn(*values)``'s outputs, found without computing them (``jax.eval_shape``)."""
    traced = [i for i, v in enumerate(values) if v is not None and not _is_static(v) and hasattr(v, "dtype")]

    def run(*args):
        given = list(values)
        for i, a in zip(traced, args):
            given[i] = a
        return fn(*given)

    shapes = jax.eval_shape(run, *(jax.ShapeDtypeStruct(np.shape(values[i]), values[i].dtype) for i in traced))
    leaves = shapes if isinstance(shapes, tuple) else (shapes,)
    return [np.dtype(s.dtype) if hasattr(s, "dtype") else None for s in leaves]


@dataclasses.dataclass(frozen=True)
class GraphNames:
    """What the plans of one graph's nodes read about the graph: the names its nodes compute, its outputs, and
    the names that only nodes without a float16 kernel read (or none)."""

    computed: frozenset[str]
    outputs: frozenset[str]
    to_float32: frozenset[str]
    cast_inputs: frozenset[str] = frozenset()
    unrounded: frozenset[str] = frozenset()

    @classmethod
    def of(cls, nodes: Sequence[onnx.NodeProto], natives: Sequence[bool], outputs: Sequence[str],
           read_inside: Callable[[onnx.NodeProto], Any]) -> GraphNames:
        """``natives``: per node, whether ONNX Runtime has a float16 kernel for it; ``read_inside``: the enclosing
        names a node's sub-graphs read."""
        readers: dict[str, list[bool]] = {}
        casts: dict[str, list[bool]] = {}
        for node, is_native in zip(nodes, natives):
            for name in {*node.input, *read_inside(node)} - {""}:
                readers.setdefault(name, []).append(is_native)
                casts.setdefault(name, []).append(node.op_type == "Cast" or not is_native)
        computed = frozenset(out for node in nodes for out in node.output if out)
        return cls(computed, frozenset(outputs),
                   frozenset(name for name in computed if not any(readers.get(name, ()))),
                   frozenset(node.input[0] for node in nodes if node.op_type == "Cast" and node.input
                             and _widening(node)),
                   frozenset(name for name in computed if all(casts.get(name, ())) and name not in outputs))

    def plan(self, node: onnx.NodeProto, role: tuple[bool, bool], schema: Any, inputs: Sequence[str],
             outputs: Sequence[str]) -> NodePlan:
        """The :class:`NodePlan` of ``node``, whose function reads ``inputs`` and writes ``outputs`` (the names as
        the converter wires them)."""
        formal_in = len(schema.inputs) if schema is not None else len(inputs)
        formal_out = len(schema.outputs) if schema is not None else len(outputs)
        attributes = {a.name: a for a in node.attribute}
        cast_to = None
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and "to" in attributes:
            try:
                cast_to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attributes["to"].i))
            except (KeyError, TypeError, ValueError):
                cast_to = None
        return NodePlan(
            native=role[0],
            subgraph=any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute),
            edges=tuple(name in self.computed for name in inputs),
            counted=tuple(i < formal_in for i in range(len(inputs))),
            outputs_counted=tuple(i < formal_out for i in range(len(outputs))),
            outputs_to_float32=tuple(name in self.to_float32 for name in outputs),
            graph_output=any(name in self.outputs for name in outputs),
            cast_to=cast_to,
            read_by_cast=any(name in self.cast_inputs for name in outputs),
            reads_unrounded=cast_to is not None and bool(inputs) and inputs[0] in self.unrounded,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            moves_data=role[1],
            typed=bool({"dtype", "to", "output_dtype", "output_datatype"} & set(attributes)),
        )


_WIDER = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16,
                    onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT16,
                    onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


def _widening(node: onnx.NodeProto) -> bool:
    """A ``Cast`` that ONNX Runtime's cast remover counts as losing a float16 value's rounding (``UnsafeCast``):
    to a wider float, to bfloat16, or to an integer of 16 bits or more."""
    return any(a.name == "to" and a.i in _WIDER for a in node.attribute)
