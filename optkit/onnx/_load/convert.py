"""The converter: ONNX nodes -> an :class:`optkit.Graph`, every node built from its op-table row.

The last stage of loading (:mod:`optkit.onnx._load.pipeline`). A graph's declarations
are decoded (:mod:`optkit.onnx._load.protos`), each node's attributes parsed and
its builder called (so a node with invalid attributes or arity fails here,
before any computation), its Gradient nodes' work bounded and its static
inputs found (:mod:`optkit.onnx._load.analysis`), and the graph closed
(:meth:`optkit.Graph.validate`). Node outputs are checked against the
tensor-size limit when the graph is traced, before XLA runs it.

A sub-graph (an ``If`` branch, a ``Loop`` or ``Scan`` body) is converted by
the same code, :func:`convert_graph`, when its node's builder asks for it
(:meth:`~optkit.onnx._ops._registry.NodeContext.convert_subgraph`): the names of
the enclosing graphs are visible in it (its ``captures``), and the bounds and
the analysis budget are the model's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import onnx

from optkit import Graph
from optkit._src.graph.analysis import StepBudget
from optkit.onnx._base.errors import RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._base.limits import MAX_ANALYSIS_STEPS, MAX_SUBGRAPH_DEPTH, Limits, check_size
from optkit.onnx._base.values import (
    STRING,
    TRAINING_DOMAIN,
    as_static,
    is_static,
    is_string,
    node_name,
    normalize_domain,
)
from optkit.onnx._load.analysis import Facts, check_gradient_work, static_inputs
from optkit.onnx._load.operators import Operators
from optkit.onnx._load.protos import InputInfo, decode_graph, parse_attributes
from optkit.onnx._ops._registry import GradientRequest, NodeContext, OpSpec
from optkit.onnx._plans.hook import BuiltNode, GraphPlans

__all__ = ["Converted", "Scope", "convert", "convert_graph"]


@dataclasses.dataclass(frozen=True)
class Converted:
    """A converted graph: the :class:`optkit.Graph` and what a runner needs to feed it.

    Attributes:
      graph: the :class:`optkit.Graph`.
      inputs: the graph inputs in ``graph.input`` order.
      outputs: the graph output names in ``graph.output`` order.
      static_inputs: graph inputs whose values XLA needs before running (a
        ``Reshape`` shape fed as an input...), and those an ``If`` takes as its condition (chosen before running
        when fed a concrete value); a runner compiles once per value.
      captures: for a sub-graph, the names of enclosing graphs it reads (graph
        inputs of ``graph`` that its node feeds); empty for a model's graph.
      model: the checked ``ModelProto`` as it was read (set by the pipeline; None for a sub-graph).
      static_initializers: initializers that a static input slot reads (a ``Resize``'s scales...): fed as
        traced values they would fail, so they are not trained by default.
      table_initializers: initializers that a node reads as a table rather than a weight (a rotary
        embedding's caches: its registration's ``table_inputs``), not trained by default.
      facts: what loading found out about the model for the runners (:class:`~optkit.onnx._load.analysis.Facts`;
        set by the pipeline, None for a sub-graph).
      adapters: the initializers that ``lora=`` added (``<W>.lora_A``, ``<W>.lora_B``), set by the pipeline.
      limits: the :class:`~optkit.onnx._base.limits.Limits` it was converted under, set by the pipeline.
      node_keys: each graph node's structural key (:func:`optkit.onnx._plans.layers.node_key`; nodes with sub-graphs
        have none): the repeated layers are found with them.
    """

    graph: Graph
    inputs: tuple[InputInfo, ...]
    outputs: tuple[str, ...]
    static_inputs: frozenset[str]
    captures: tuple[str, ...] = ()
    model: onnx.ModelProto | None = None
    static_initializers: frozenset[str] = frozenset()
    table_initializers: frozenset[str] = frozenset()
    facts: Facts | None = None
    adapters: tuple[str, ...] = ()
    limits: Limits | None = None
    node_keys: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Scope:
    """What every graph of one model is converted with: its operators, its bounds, one analysis budget,
    and the names the enclosing graphs define (empty for the model's graph); for the nodes of the graph being
    converted, its plans and its fused chains."""

    operators: Operators
    limits: Limits
    budget: StepBudget
    outer: frozenset[str] = frozenset()
    subgraph: bool = False
    depth: int = 0
    graph_plans: GraphPlans | None = None  # the graph being converted: its plans (optkit.onnx._plans.hook)
    fused: Mapping[int, tuple[onnx.NodeProto, ...]] = dataclasses.field(default_factory=dict)


def convert(model: onnx.ModelProto, operators: Operators, limits: Limits) -> Converted:
    """Convert a checked model whose operators were resolved (:func:`~optkit.onnx._load.operators.check_operators`)."""
    budget = StepBudget(MAX_ANALYSIS_STEPS, "the Gradient nodes' sub-graphs and the static inputs")
    return convert_graph(model.graph, Scope(operators, limits, budget))


def convert_graph(g: onnx.GraphProto, scope: Scope) -> Converted:
    """One graph (the model's or a sub-graph) as a :class:`Converted`; see :func:`optkit.onnx.to_graph`."""
    declared = decode_graph(g, scope.limits.max_tensor_bytes, subgraph=scope.subgraph)
    defined = {info.name for info in declared.inputs} | set(declared.initializers)
    defined |= {out for node in g.node for out in node.output if out}
    read = [name for node in g.node for name in node.input if name and name not in defined]
    captured = [name for name in dict.fromkeys(read) if name in scope.outer]
    rows = [scope.operators.row(node) for node in g.node]
    plans = GraphPlans.of(g, rows, declared, scope.subgraph)
    inner = dataclasses.replace(scope, outer=scope.outer | defined, subgraph=True, depth=scope.depth + 1,
                                graph_plans=plans, fused=_fused(g.node, scope.operators))

    graph = Graph()
    for info in declared.inputs:
        shape = None if info.shape is None else tuple(d if isinstance(d, int) else None for d in info.shape)
        graph.add_input(info.name, shape, None if info.container else info.dtype)
    for name, value in declared.initializers.items():
        graph.add_initializer(name, value)
    specs: dict[int, OpSpec] = {}
    for index, node in enumerate(g.node):
        specs[index], node_captures = _add_node(graph, node, index, inner)
        captured += [c for c in dict.fromkeys(node_captures) if c not in defined and c not in captured]
    for name in captured:
        graph.add_input(name)
    graph.outputs = declared.outputs
    # before validate, which walks each level
    check_gradient_work(g.node, scope.limits, scope.budget, scope.operators.opsets.get(TRAINING_DOMAIN))
    graph.validate()
    names = {info.name for info in declared.inputs}
    static = static_inputs(g.node, specs, names | set(declared.initializers), scope.budget)
    static |= frozenset(node.input[i] for index, node in enumerate(g.node) for i in specs[index].static_when_fed
                        if i < len(node.input)) & names
    static |= frozenset(info.name for info in declared.inputs if info.dtype == STRING)  # strings: on the host
    return Converted(graph, declared.inputs, declared.outputs, static & names, tuple(captured),
                     static_initializers=static & set(declared.initializers),
                     table_initializers=frozenset(node.input[i] for index, node in enumerate(g.node)
                                                  for i in specs[index].table_inputs
                                                  if i < len(node.input)) & set(declared.initializers),
                     node_keys=plans.keys)


def _fused(nodes, operators: Operators) -> dict[int, tuple[onnx.NodeProto, ...]]:
    """``{index of a node: the nodes it runs fused with, farthest first}``: the chains that the nodes'
    registrations declare (:class:`~optkit.onnx._ops._registry.Fusion`: a ``DequantizeLinear`` of a
    ``QuantizeLinear``...)."""
    producers = {node.output[0]: node for node in nodes if node.output and node.output[0]}
    chains = {}
    for index, node in enumerate(nodes):
        fusion = operators.row(node)[0].fusion
        if fusion is None:
            continue
        chain, reader = [], node
        for op_type in reversed(fusion.chain):
            producer = producers.get(reader.input[0]) if reader.input else None
            if producer is None or producer.op_type != op_type or normalize_domain(
                    producer.domain) != normalize_domain(node.domain):
                break
            chain.insert(0, producer)
            reader = producer
        else:
            if fusion.matches(*chain, node):
                chains[index] = tuple(chain)
    return chains


def _add_node(graph: Graph, node: onnx.NodeProto, index: int, scope: Scope) -> tuple[OpSpec, list[str]]:
    """Build ``node`` (at ``index`` of the graph ``scope`` converts) from its op-table row and add it to ``graph``
    through the graph's plans (:meth:`optkit.onnx._plans.hook.GraphPlans.add`); its row, and what its sub-graphs
    capture.

    A node that runs fused with the nodes it reads (``scope.fused``, farthest first, its registration's
    ``Fusion``: a ``DequantizeLinear`` of a ``QuantizeLinear``'s output) reads the farthest one's first input
    and the other inputs of the chain instead.
    """
    row = scope.operators.row(node)
    spec, version, schema = row
    domain = normalize_domain(node.domain)
    captures: list[str] = []

    def subgraph(body: onnx.GraphProto, where: str) -> Converted:
        if scope.depth > MAX_SUBGRAPH_DEPTH:
            raise ValueError(f"{where}: sub-graphs nest more than {MAX_SUBGRAPH_DEPTH} deep (If, Loop and Scan "
                             f"bodies inside one another), more than optkit.onnx runs")
        converted = convert_graph(body, scope)
        captures.extend(converted.captures)
        return converted

    ctx = NodeContext(node.op_type, domain, version, scope.operators.opsets[domain],
                      node_name(node.name, node.op_type, index), tuple(node.input), tuple(node.output), {},
                      scope.limits.max_tensor_bytes, subgraph, max_node_work=scope.limits.max_node_work,
                      max_loop_steps=scope.limits.max_loop_steps)
    ctx = dataclasses.replace(ctx, attrs=parse_attributes(node, schema, ctx.where))
    if spec.accepts is not None:
        spec.accepts.check_attributes(ctx)
    try:
        built = spec.builder(ctx)
    except _BUILDER_ERRORS as err:
        if str(err).startswith(ctx.where) or type(err) not in _BUILDER_ERRORS:
            raise  # named already (optkit's own errors), or a subclass with a meaning of its own
        # (attributes that do not fit together, found by the operator's builder as it reads them)
        raise ValueError(ctx.message(f"its attributes do not fit together: {type(err).__name__}: {err}")) from err
    if isinstance(built, GradientRequest):
        try:
            graph.add_gradient(xs=built.xs, zs=built.zs, y=built.y, inputs=list(ctx.inputs),
                               outputs=list(ctx.outputs), name=ctx.name)
        except (TypeError, ValueError) as err:
            raise type(err)(ctx.message(str(err))) from None
        return spec, captures
    inputs = list(node.input)
    fused_with = scope.fused.get(index, ())
    if fused_with:
        built = spec.fusion.build(ctx, *(parse_attributes(p, scope.operators.row(p)[2], ctx.where)
                                         for p in fused_with))
        inputs = [fused_with[0].input[0], *(i for p in fused_with[1:] for i in p.input[1:]), *inputs[1:]]
    extra = list(dict.fromkeys(captures))  # (a captured name that is also a node input comes twice)
    scope.graph_plans.add(graph, BuiltNode(
        node, index, ctx.name, ctx.where, row, built,
        lambda: spec.builder(dataclasses.replace(ctx, channels_last=True)), inputs, extra, fused_with,
        lambda fn, count: _node_function(fn, ctx, spec, schema, count, extra, scope.limits.max_tensor_bytes)))
    return spec, captures


# The plain errors an operator's builder raises reading attributes that do not fit together (a tree ensemble's
# leaf naming no node: KeyError): re-raised as a ValueError naming the node.
_BUILDER_ERRORS = (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError, OverflowError)


def _node_function(fn, ctx: NodeContext, spec: OpSpec, schema: Any, count: int, extra: list[str], limit: int):
    """The Graph node's function: static inputs made NumPy, folding, the outputs bounded, trimmed.

    - The inputs the registration declares static reach ``fn`` as NumPy
      arrays, or a ValueError names the node and the input.
    - When every input is known before running, ``fn`` runs eagerly (even
      under ``jax.jit``) and gives NumPy values: constant sub-graphs (shape
      arithmetic, Constant nodes, initializers combined) fold, so a Reshape
      can read a shape computed from a Shape or Constant node. Its output
      shapes are found abstractly first, so an oversized result is refused
      before it is allocated.
    - A handler may return more values than the node names (an operator's
      optional trailing outputs); those the node leaves out are dropped. A
      one-output node's value returned as a 1-tuple is the value.
    - A node whose sub-graphs read enclosing names gets their values as
      ``captured={name: value}``.
    """
    static = [i for i in spec.static_inputs if i < count and ctx.inputs[i]]
    wanted = len(ctx.outputs)
    tensors_only = _tensor_inputs(schema, count)

    def call(*values):
        given = list(values[:count])
        if spec.accepts is not None:
            spec.accepts.check_ranks(ctx, given)
        for i in tensors_only:
            if isinstance(given[i], list):  # (a sequence where the schema takes tensors only: a swapped operator)
                raise ctx.error(f"input {_input_name(schema, i)!r} is a sequence; {ctx.op_type} takes a tensor there")
        for i in static:
            value = as_static(given[i])
            if value is None:
                # (a Slice's ends computed in a Loop body, an EmbeddingBag's offsets: prepare runs the node on
                # concrete values between compiled segments; traced inside a caller's jax.jit it is refused)
                raise ValueDependentError(ctx.message(
                    f"input {_input_name(schema, i)!r} must be known before the graph runs (an initializer, a "
                    f"Constant node's output, a Shape output, or a tensor computed from those alone), but it is "
                    f"computed at run time from a traced value; {RUNS_IN_SEGMENTS}"))
            given[i] = value
        try:
            out = fn(*given, captured=dict(zip(extra, values[count:]))) if extra else fn(*given)
        except _NAMED_HERE as err:  # JAX's or NumPy's own error while the node runs: said with the node named
            if type(err) not in _NAMED_HERE or str(err).startswith(ctx.where):
                raise
            # a TypeError or ValueError as it is; IndexError, OverflowError, ZeroDivisionError as a ValueError
            # (the documented errors of a run: ValueError, TypeError, UnsupportedOpError), the original its cause
            kind = type(err) if type(err) in (TypeError, ValueError) else ValueError
            raise kind(ctx.message(f"{type(err).__name__}: {err}" if kind is not type(err) else str(err))) from err
        if isinstance(out, tuple) and (len(out) > wanted or len(out) == wanted == 1):  # (a Split into one part)
            out = out[0] if wanted == 1 else out[:wanted]
        return out

    # A Constant of strings: held on the host as strings fed to a node are (found once, not at every trace).
    host_constant = ctx.op_type == "Constant" and is_string(fn())

    def node_function(*values):
        strings = host_constant or any(is_string(v) for v in values)
        if strings or all(v is None or is_static(v) for v in values):
            if strings:  # computed on the host (NumPy), before running: no abstract pass (JAX has no strings)
                out = call(*values)
                _check_outputs(out, ctx, limit)
            else:
                _check_outputs(jax.eval_shape(lambda: call(*values)), ctx, limit)
                with jax.ensure_compile_time_eval():
                    out = call(*values)
                if any(isinstance(o, jax.core.Tracer) for o in (out if isinstance(out, tuple) else (out,))):
                    return out  # drawn from the run's random key (a traced value): not a constant
            return tuple(_folded(o) for o in out) if isinstance(out, tuple) else _folded(out)
        out = call(*values)
        # Traced (jit, eval_shape, BackendRep's abstract pass): nothing has run yet.
        _check_outputs(out, ctx, limit)
        return out

    node_function.__name__ = ctx.op_type
    return node_function


# The plain error types a node's computation raises from inside JAX or NumPy (shapes that do not fit, a dtype
# promotion refused, a value that overflows a conversion): re-raised with the node named. Their subclasses
# (optkit's own errors, which name the node already, JAX's tracer errors) pass as they are.
# (jax.dtypes.TypePromotionError is public from jax 0.10.2 on; before, a ValueError subclass of its own)
_NAMED_HERE = (TypeError, ValueError, OverflowError, IndexError, ZeroDivisionError,
               *((jax.dtypes.TypePromotionError,) if hasattr(jax.dtypes, "TypePromotionError") else ()))


def _folded(value: Any) -> Any:
    """A value computed before running as NumPy: an array, a sequence (a list) of arrays, or None."""
    if value is None:
        return None
    return [np.asarray(v) for v in value] if isinstance(value, list) else np.asarray(value)


def _tensor_inputs(schema: Any, count: int) -> tuple[int, ...]:
    """The input positions (of ``count``) where the schema takes tensors only, no sequence (none without one)."""
    if schema is None or not schema.inputs:
        return ()
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    out = []
    for i in range(count):
        declared = schema.inputs[min(i, len(schema.inputs) - 1)]
        if i >= len(schema.inputs) and declared.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            break
        if not any(t.startswith(("seq(", "optional(seq")) for t in allowed.get(declared.type_str, [declared.type_str])):
            out.append(i)
    return tuple(out)


def _input_name(schema: Any, i: int) -> str:
    """The schema's name of input ``i`` (``shape``, ``axes``...), or ``#i``."""
    inputs = [] if schema is None else schema.inputs
    return inputs[i].name if i < len(inputs) else f"#{i}"


def _check_outputs(out, ctx: NodeContext, limit: int) -> None:
    """Refuse node outputs above ``limit`` bytes (arrays, tracers or shape structs; a sequence's tensors
    together)."""
    values = out if isinstance(out, tuple) else (out,)
    for i, value in enumerate(values):
        name = ctx.outputs[i] if i < len(ctx.outputs) else f"#{i}"
        if isinstance(value, list):  # a sequence: its tensors together within the bound
            total = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in value if hasattr(v, "shape"))
            check_size((total,), np.dtype(np.uint8), f"{ctx.where}: output {name!r} (a sequence)", limit)
            continue
        if value is None or not hasattr(value, "shape"):
            continue
        check_size(tuple(value.shape), getattr(value, "dtype", None), f"{ctx.where}: output {name!r}", limit)
