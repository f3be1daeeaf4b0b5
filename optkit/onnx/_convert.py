"""ONNX ``ModelProto`` -> :class:`optkit.Graph`: every node mapped through the op table, everything that
can be known before running checked.

ONNX files come from strangers (see :mod:`optkit.onnx._files` for reading them
and :mod:`optkit.onnx._limits` for the bounds), so a bad model fails here,
before any computation: every operator version is in the op table (all the
missing ones named in one error) and every opset version is one ONNX defines,
every node's arity and attributes are valid (each handler validates its node
when it is built), every element type is one optkit runs, no declared shape
is negative or above the tensor-size limit, Gradient nodes nest at most
``max_gradient_depth`` deep, and the graph is closed
(:meth:`optkit.Graph.validate`). Node outputs are checked against the
tensor-size limit when the graph is traced, before XLA runs it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import onnx
import onnx.defs
import onnx.inliner

from optkit import Graph
from optkit._src.graph.names import shape_text
from optkit.onnx._errors import UnsupportedOpError
from optkit.onnx._files import ModelSource, read_model
from optkit.onnx._limits import (
    GRADIENT_DEPTH_CEILING,
    MAX_ANALYSIS_STEPS,
    MAX_EXPANDED_NODES,
    Limits,
    check_size,
)
from optkit.onnx._ops import TABLE
from optkit.onnx._ops._registry import GradientRequest, NodeContext, OpSpec, parse_attributes
from optkit.onnx._ops._values import (
    DEFAULT_DOMAIN,
    DTYPES,
    TRAINING_DOMAIN,
    domain_text,
    is_static,
    normalize_domain,
    onnx_dtype,
    tensor_value,
)

__all__ = ["InputInfo", "Converted", "convert", "check_operators", "to_graph"]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """A graph input as the model declares it.

    Attributes:
      name: the tensor name.
      dtype: its NumPy dtype.
      shape: one entry per axis: an int, a symbolic name (ONNX ``dim_param``:
        the same name must have the same size in every input), or None
        (unknown); None for the whole shape when the rank is unknown.
      has_default: True if an initializer of the same name gives a default.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None
    has_default: bool

    def shape_text(self) -> str:
        """The declared shape as text, ``(N, 3)``; ``?`` for an unknown dimension."""
        return shape_text(self.shape)


@dataclasses.dataclass(frozen=True)
class Converted:
    """What :func:`convert` returns: the Graph and what a runner needs to feed it.

    Attributes:
      graph: the :class:`optkit.Graph`.
      inputs: the graph inputs in ``graph.input`` order.
      outputs: the graph output names in ``graph.output`` order.
      static_inputs: graph inputs whose values XLA needs before running (a
        ``Reshape`` shape fed as an input...); a runner compiles once per value.
    """

    graph: Graph
    inputs: tuple[InputInfo, ...]
    outputs: tuple[str, ...]
    static_inputs: frozenset[str]


def _check_declared_shape(value_info: onnx.ValueInfoProto, what: str, limit: int) -> None:
    """A declared (graph output or value_info) tensor shape: no negative or oversized dimensions."""
    if value_info.type.WhichOneof("value") != "tensor_type":
        return
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return
    fixed = [int(d.dim_value) for d in tensor.shape.dim if d.WhichOneof("value") == "dim_value"]
    negative = [d for d in fixed if d < 0]
    if negative:
        raise ValueError(f"{what} {value_info.name!r} declares the negative dimension {negative[0]}")
    dtype = DTYPES.get(tensor.elem_type)
    check_size(tuple(fixed), dtype, f"{what} {value_info.name!r}", limit)


def _input_info(value_info: onnx.ValueInfoProto, has_default: bool, limit: int) -> InputInfo:
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedOpError(f"graph input {value_info.name!r} has type {kind or 'undefined'}; "
                                 f"optkit runs tensors only (not sequences, maps or optionals)")
    tensor = value_info.type.tensor_type
    dtype = onnx_dtype(tensor.elem_type, f"graph input {value_info.name!r}")
    shape = None
    if tensor.HasField("shape"):
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            which = dim.WhichOneof("value")
            dims.append(int(dim.dim_value) if which == "dim_value" else
                        (dim.dim_param or None) if which == "dim_param" else None)
        shape = tuple(dims)
        fixed = tuple(d for d in dims if isinstance(d, int))
        if any(d < 0 for d in fixed):
            raise ValueError(f"graph input {value_info.name!r} declares the negative dimension "
                             f"{min(fixed)}")
        check_size(fixed, dtype, f"graph input {value_info.name!r}", limit)
    return InputInfo(value_info.name, dtype, shape, has_default)


def _folding(fn, ctx: NodeContext, limit: int):
    """Run ``fn`` eagerly when every input is known before running, returning NumPy.

    Constant sub-graphs (shape arithmetic, Constant nodes, initializers
    combined) are folded this way even under ``jax.jit``, so a Reshape can
    read a shape computed from a Shape or Constant node. A handler may return
    more values than the node names (an operator's optional trailing outputs);
    those the node leaves out are dropped.
    """
    fn = _trimmed(fn, len(ctx.outputs))

    def node_function(*values):
        if all(v is None or is_static(v) for v in values):
            # Folded eagerly: find the output shapes abstractly first, so that an
            # oversized result (a broadcast or MatMul of constants) is refused
            # before it is allocated.
            _check_outputs(jax.eval_shape(lambda: fn(*values)), ctx, limit)
            with jax.ensure_compile_time_eval():
                out = fn(*values)
            if isinstance(out, tuple):
                return tuple(None if o is None else np.asarray(o) for o in out)
            return np.asarray(out)
        out = fn(*values)
        # Traced (jit, eval_shape, BackendRep's abstract pass): nothing has run yet.
        _check_outputs(out, ctx, limit)
        return out

    node_function.__name__ = ctx.op_type
    return node_function


def _trimmed(fn, count: int):
    """``fn`` returning its first ``count`` outputs (one value, not a tuple, for ``count == 1``)."""

    def trimmed(*values):
        out = fn(*values)
        if isinstance(out, tuple) and len(out) > count:
            out = out[0] if count == 1 else out[:count]
        return out

    return trimmed


def _check_outputs(out, ctx: NodeContext, limit: int) -> None:
    """Refuse node outputs above ``limit`` bytes (arrays, tracers or shape structs)."""
    values = out if isinstance(out, tuple) else (out,)
    for i, value in enumerate(values):
        if value is None or not hasattr(value, "shape"):
            continue
        name = ctx.outputs[i] if i < len(ctx.outputs) else f"#{i}"
        check_size(tuple(value.shape), getattr(value, "dtype", None),
                    f"{ctx.where}: output {name!r}", limit)


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse initializer as its dense array (its dense size was bounded when the model was read).

    Raises:
      ValueError: indices that are not ``[NNZ]`` (linear) or ``[NNZ, rank]``
        integers in range, or a count of values that does not match them.
    """
    name = sparse.values.name
    what = f"sparse initializer {name!r}"
    values = tensor_value(sparse.values, what)
    indices = tensor_value(sparse.indices, f"{what} (indices)")
    dims = tuple(int(d) for d in sparse.dims)
    if values.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"{what}: values must be 1-D and indices integers, got values of shape {values.shape} and "
                         f"indices of {indices.dtype}")
    if indices.ndim == 2 and indices.shape == (values.size, len(dims)):
        if indices.size and (np.any(indices < 0) or np.any(indices >= np.asarray(dims))):
            raise ValueError(f"{what}: an index is outside its dims {list(dims)}")
        linear = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    elif indices.ndim == 1 and indices.size == values.size:
        if indices.size and (indices.min() < 0 or indices.max() >= math.prod(dims)):
            raise ValueError(f"{what}: a linear index is outside its {math.prod(dims)} elements")
        linear = indices
    else:
        raise ValueError(f"{what}: {values.size} values need indices of shape [{values.size}] or "
                         f"[{values.size}, {len(dims)}], got {list(indices.shape)}")
    dense = np.zeros(math.prod(dims), values.dtype)
    dense[linear] = values
    dense = dense.reshape(dims)
    dense.setflags(write=False)
    return dense


def _expand_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions expanded into the graph (as ONNX Runtime does), after checks.

    - A local function whose name is a standard operator of its domain (a
      ``Relu`` of the default domain) does not replace it: standard operators
      win, as in ONNX Runtime, and such a function is dropped.
    - Every call gives at most as many inputs and outputs as the function
      declares.
    - The expansion is counted first, callees before callers: the model may
      grow to :data:`~optkit.onnx._limits.MAX_EXPANDED_NODES` nodes, or to the
      number of nodes its file holds if that is more (a function calling
      another twice, nested 30 deep, is 2**30 nodes).

    Raises:
      ValueError: a call with more inputs or outputs than its function
        declares, or an expansion beyond the bound, naming the function.
    """
    functions = {}
    for function in model.functions:
        domain = normalize_domain(function.domain)
        if onnx.defs.has(function.name, domain):
            continue  # the standard operator wins
        functions[(domain, function.name)] = function
    bodies = [("the graph", model.graph.node)] + [(f"function {f.name!r}", f.node) for f in functions.values()]
    for owner, nodes in bodies:
        for index, node in enumerate(nodes):
            function = functions.get((normalize_domain(node.domain), node.op_type))
            if function is None:
                continue
            for kind, given, declared in (("inputs", node.input, function.input),
                                          ("outputs", node.output, function.output)):
                if len(given) > len(declared):
                    raise ValueError(
                        f"node {node.name or f'{node.op_type}#{index}'!r} of {owner} calls the model-local function "
                        f"{node.op_type!r} with {len(given)} {kind}, but it declares {len(declared)}: "
                        f"{list(declared)}")
    written = len(model.graph.node) + sum(len(f.node) for f in model.functions)
    bound = max(MAX_EXPANDED_NODES, written)
    size: dict[tuple[str, str], int] = {}
    pending = list(functions)
    while pending:
        progressed = False
        for key in list(pending):
            calls = [(normalize_domain(n.domain), n.op_type) for n in functions[key].node]
            if any(c in functions and c not in size for c in calls):
                continue
            size[key] = min(sum(size.get(c, 1) for c in calls), bound + 1)
            pending.remove(key)
            progressed = True
        if not progressed:
            break  # a cycle: onnx.checker has refused it already
    total = sum(size.get((normalize_domain(n.domain), n.op_type), 1) for n in model.graph.node)
    if total > bound:
        raise ValueError(f"the model's local functions expand it to more than {bound} nodes (optkit.onnx's bound: "
                         f"{MAX_EXPANDED_NODES} nodes, or as many as the file holds); it is refused rather than "
                         f"built")
    kept = onnx.ModelProto()
    kept.CopyFrom(model)
    del kept.functions[:]
    kept.functions.extend(functions.values())
    return onnx.inliner.inline_local_functions(kept)


def _newest_opsets() -> dict[str, int]:
    """The newest opset version ONNX defines for each domain that has schemas."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = normalize_domain(schema.domain)
        newest[domain] = max(newest.get(domain, 0), int(schema.since_version))
    newest[DEFAULT_DOMAIN] = max(newest.get(DEFAULT_DOMAIN, 0), onnx.defs.onnx_opset_version())
    return newest


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The opset version the model imports for each domain; one ONNX does not define is refused."""
    opsets: dict[str, int] = {}
    newest = _newest_opsets()
    for opset in model.opset_import:
        domain = normalize_domain(opset.domain)
        opsets[domain] = int(opset.version)
        if domain in newest and not 1 <= opsets[domain] <= newest[domain]:
            raise UnsupportedOpError(
                f"the model imports opset {opsets[domain]} of domain {domain_text(domain)!r}, which ONNX does "
                f"not define (versions 1 to {newest[domain]} in the installed onnx package); optkit runs "
                f"no operator under an opset it does not know")
    return opsets


def check_operators(model: onnx.ModelProto) -> None:
    """Refuse, naming every one in one error, the operators of ``model`` optkit does not run.

    Runs before ``onnx.checker`` (whose full pass over a large model takes
    seconds): the graph's nodes and the model-local functions' nodes, except
    the calls of those functions.

    Raises:
      UnsupportedOpError: as :func:`_look_up`; an opset ONNX does not define.
    """
    bodies = [model.graph.node, *(f.node for f in model.functions)]
    for node in (n for body in bodies for n in body):
        if not all(isinstance(text, str) for text in (node.op_type, node.domain, node.name)):
            raise ValueError(f"malformed model: a node's op type, domain or name is not valid UTF-8 "
                             f"({node.op_type!r}, {node.domain!r}, {node.name!r})")
    local = {(normalize_domain(f.domain), f.name) for f in model.functions}
    nodes = [n for body in bodies for n in body if (normalize_domain(n.domain), n.op_type) not in local]
    _look_up(nodes, _opsets(model))


def convert(model: onnx.ModelProto, limits: Limits | None = None) -> Converted:
    """Map a checked ModelProto onto an :class:`optkit.Graph`; see :func:`to_graph`."""
    limits = Limits.make() if limits is None else limits
    if model.functions:
        model = _expand_functions(model)
    opsets = _opsets(model)
    g = model.graph
    initializers: dict[str, np.ndarray] = {}
    for tensor in g.initializer:
        initializers[tensor.name] = tensor_value(tensor, f"initializer {tensor.name!r}")
    for sparse in g.sparse_initializer:
        initializers[sparse.values.name] = _densify(sparse)
    infos = tuple(_input_info(vi, vi.name in initializers, limits.max_tensor_bytes) for vi in g.input)
    for vi in g.output:
        _check_declared_shape(vi, "graph output", limits.max_tensor_bytes)
    for vi in g.value_info:
        _check_declared_shape(vi, "value_info", limits.max_tensor_bytes)

    graph = Graph()
    for info in infos:
        shape = None if info.shape is None else tuple(d if isinstance(d, int) else None for d in info.shape)
        graph.add_input(info.name, shape, info.dtype)
    for name, value in initializers.items():
        graph.add_initializer(name, value)

    rows = _look_up(g.node, opsets)
    specs: dict[str, tuple[onnx.NodeProto, OpSpec]] = {}
    static_slots: list[tuple[str, str]] = []  # (tensor, reading node)
    for index, (node, (spec, schema)) in enumerate(zip(g.node, rows)):
        name = node.name or f"{node.op_type}#{index}"
        domain = normalize_domain(node.domain)
        where = f"node {name!r} ({domain_text(domain)}::{node.op_type}-{spec.since_version}, opset {opsets[domain]})"
        ctx = NodeContext(node.op_type, domain, spec.since_version, opsets[domain], name,
                          tuple(node.input), tuple(node.output), parse_attributes(node, schema, where),
                          limits.max_tensor_bytes)
        built = spec.build(ctx)
        if isinstance(built, GradientRequest):
            try:
                graph.add_gradient(xs=built.xs, zs=built.zs, y=built.y, inputs=list(ctx.inputs),
                                   outputs=list(ctx.outputs), name=ctx.name)
            except (TypeError, ValueError) as err:
                raise type(err)(ctx.message(str(err))) from None
        else:
            graph.add(_folding(built, ctx, limits.max_tensor_bytes), inputs=list(node.input),
                      outputs=list(node.output), name=name)
        for out in node.output:
            if out:
                specs[out] = (node, spec)
        static_slots += [(node.input[i], name) for i in spec.static_inputs
                         if i < len(node.input) and node.input[i]]

    outputs = tuple(vi.name for vi in g.output)
    graph.outputs = outputs
    _check_gradient_work(g.node, limits)  # before validate, which walks each level
    graph.validate()
    return Converted(graph, infos, outputs, _static_inputs(static_slots, specs, infos))


def _check_gradient_work(nodes, limits: Limits) -> None:
    """Bound what the model's Gradient nodes ask for, at load time, naming the node that goes past a bound.

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

    Each sub-graph is one walk back from ``y`` (a loop, so no input makes
    Python recurse), and the walks together take at most
    :data:`~optkit.onnx._limits.MAX_ANALYSIS_STEPS` steps: load-time analysis
    is O(Gradient nodes x graph nodes), bounded. Nodes come in the graph's
    order (onnx.checker requires it topologically sorted), so every inner
    Gradient node is known before it is needed.
    """
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer.setdefault(out, index)
    depth: dict[int, int] = {}
    passes: dict[int, int] = {}
    steps = 0
    for index, node in enumerate(nodes):
        if normalize_domain(node.domain) != TRAINING_DOMAIN or node.op_type != "Gradient":
            continue
        name = node.name or f"Gradient#{index}"
        where = f"node {name!r} ({TRAINING_DOMAIN}::Gradient)"
        attrs = {a.name: a for a in node.attribute}
        if "y" not in attrs:
            continue  # parse_attributes refused it already
        y = attrs["y"].s.decode("utf-8", "replace")
        stop = {v.decode("utf-8", "replace") for key in ("xs", "zs") if key in attrs for v in attrs[key].strings}
        inner: list[int] = []
        seen: set[str] = set()
        stack = [y]
        while stack:
            tensor = stack.pop()
            if tensor in seen or tensor in stop:
                continue
            seen.add(tensor)
            steps += 1
            if steps > MAX_ANALYSIS_STEPS:
                raise ValueError(f"{where}: the Gradient nodes' sub-graphs take more than {MAX_ANALYSIS_STEPS} steps "
                                 f"to analyse (Gradient nodes x graph nodes); optkit.onnx refuses the model "
                                 f"rather than spend longer loading it")
            p = producer.get(tensor)
            if p is None or p == index:  # a Gradient differentiated through itself: Graph.validate names it
                continue
            if p in depth:
                inner.append(p)
            stack.extend(nodes[p].input)
        inner = list(dict.fromkeys(inner))
        deepest = max(inner, key=depth.__getitem__, default=None)
        depth[index] = 1 + (0 if deepest is None else depth[deepest])
        passes[index] = 1 + 2 * sum(passes[p] for p in inner)
        if depth[index] > limits.max_gradient_depth:
            inner_name = nodes[deepest].name or f"Gradient#{deepest}"
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


def _look_up(nodes, opsets: dict[str, int]) -> list[tuple[OpSpec, Any]]:
    """Each node's op-table row and ONNX schema; every operator optkit does not run, named in one error.

    Raises:
      ValueError: a node of a domain the model does not import.
      UnsupportedOpError: one or more operators (or operator versions) that
        optkit does not run: each with its domain, the model's opset and the
        nodes that use it.
    """
    rows: list[tuple[OpSpec, Any]] = []
    missing: dict[tuple[str, str, int], tuple[str, list[str]]] = {}
    for index, node in enumerate(nodes):
        name = node.name or f"{node.op_type}#{index}"
        domain = normalize_domain(node.domain)
        if domain not in opsets:
            raise ValueError(f"node {name!r} ({domain_text(domain)}::{node.op_type}): the model does not import the "
                             f"domain {domain_text(domain)!r}")
        key = (domain, node.op_type, opsets[domain])
        if key in missing:
            missing[key][1].append(name)
            continue
        try:
            rows.append(TABLE.lookup(domain, node.op_type, opsets[domain]))
        except UnsupportedOpError as err:
            missing[key] = (str(err), [name])
    if not missing:
        return rows
    lines = []
    for (domain, op_type, opset), (why, names) in missing.items():
        shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        lines.append(f"  {domain_text(domain)}::{op_type} (opset {opset}), node{'s' * (len(names) > 1)} {shown}: {why}")
    raise UnsupportedOpError(f"the model uses {len(missing)} operator{'s' * (len(missing) > 1)} optkit.onnx does "
                             f"not run:\n" + "\n".join(lines))


def _static_inputs(
    slots: list[tuple[str, str]], specs: Mapping[str, tuple[onnx.NodeProto, OpSpec]],
    infos: tuple[InputInfo, ...],
) -> frozenset[str]:
    """The graph inputs that a static slot (a Reshape shape...) depends on, through nodes
    that would fold (all inputs static); a Shape output is static whatever its input."""
    inputs = {info.name for info in infos}
    found: set[str] = set()
    seen: set[str] = set()
    stack = [tensor for tensor, _ in slots]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in specs:
            node, spec = specs[name]
            if spec.static_outputs or spec.op_type == "Gradient":  # a Gradient's outputs are never folded
                continue
            stack.extend(i for i in node.input if i)
        elif name in inputs:
            found.add(name)
    return frozenset(found)


def to_graph(
    model: ModelSource,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    max_tensor_bytes: int | None = None,
    max_gradient_depth: int | None = None,
    max_gradient_passes: int | None = None,
) -> Graph:
    """Load an ONNX model into an :class:`optkit.Graph`.

    The model is read and checked (:func:`load_model`), each node is mapped
    through the op table (standard ``ai.onnx`` operators and
    ``ai.onnx.preview.training`` Adagrad, Adam and Momentum, SPEC 1, 3, 4);
    each Gradient node becomes a Graph Gradient node (SPEC 6). Graph inputs
    are declared with their ONNX dtype and shape, initializers are constants
    (NumPy arrays) that a feed of a graph input of the same name overrides.
    A node whose inputs are all NumPy values (initializers, constants, shapes)
    is computed once, eagerly, even under ``jax.jit`` (constant folding), and
    gives a NumPy value: that is how a ``Reshape`` reads a shape computed by
    other nodes. Feed JAX arrays to compute everything else in XLA.

    The graph is pure JAX: ``jax.jit(graph.as_function(...))`` compiles it.
    ONNX's 64-bit types (INT64 step counts and indices, DOUBLE) need JAX's
    64-bit mode: evaluate it inside ``with jax.enable_x64(True):``, as
    :class:`optkit.onnx.BackendRep` does.

    Returns:
      The :class:`optkit.Graph`; its ``outputs`` are the model's ``graph.output``.

    Source: SPEC sections 1, 3, 4, 6; the ONNX IR (graph inputs, initializers,
    nodes) and each operator version's ONNX documentation.

    Args:
      model: a ``ModelProto``, its bytes, a path or a binary file object.
      base_dir: the directory of the external data of a model given without
        a path (see :func:`load_model`); None refuses such data.
      max_tensor_bytes: the largest tensor the graph may declare or compute,
        in bytes; default :func:`default_max_tensor_bytes` (half the memory
        available now).
      max_gradient_depth: how deep Gradient nodes may nest, 1 to 16; default 8.
      max_gradient_passes: the reverse passes the Gradient nodes may need in
        all (see README "Loading ONNX files from strangers"); default 4096.

    Raises:
      ValueError: malformed bytes (text that is not UTF-8 included), a model
        ``onnx.checker`` rejects, external data outside the model's directory
        or without one (see :func:`load_model`), a node with invalid
        attributes or arity (e.g. an optimizer whose input count is not
        ``2 + k*n``, a Momentum without its required attributes), a declared
        shape with a negative dimension, Gradient nodes nested deeper than
        ``max_gradient_depth`` (naming the node).
      TensorTooLargeError: (a ``ValueError`` and a ``MemoryError``) a declared
        shape above ``max_tensor_bytes``; when the graph is traced (jit,
        ``jax.eval_shape``, :class:`BackendRep`), a node whose output would
        exceed it, before anything is computed (a node computed from
        constants alone is checked abstractly before it is folded).
      UnsupportedOpError: an operator, operator version, opset version or
        element type that optkit does not run; the message names op type,
        domain and opset.

    Example:
      >>> import jax, jax.numpy as jnp, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> node = helper.make_node("Add", ["a", "b"], ["c"])
      >>> info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
      >>> model = helper.make_model(helper.make_graph([node], "g", [info("a"), info("b")], [info("c")]))
      >>> graph = optkit.onnx.to_graph(model)
      >>> jax.jit(graph.as_function(["a", "b"], "c"))(jnp.ones(2), jnp.ones(2))
      Array([2., 2.], dtype=float32)
    """
    limits = Limits.make(max_tensor_bytes, max_gradient_depth, max_gradient_passes=max_gradient_passes)
    return convert(read_model(model, base_dir, limits, before_check=check_operators), limits).graph
