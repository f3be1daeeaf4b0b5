"""ONNX ``ModelProto`` -> :class:`optkit.Graph`: reading, checking, and mapping every node.

Everything that can be known before running is checked here, at load time,
so that a bad model fails before any computation: the protobuf parses,
``onnx.checker`` accepts it, every operator version is in the op table, every
node's arity and attributes are valid (each handler validates its node when
it is built), every element type is one optkit runs, no declared shape is
negative or above ``MAX_TENSOR_BYTES``, and the graph is closed
(:meth:`optkit.Graph.validate`). Node outputs are checked against
``MAX_TENSOR_BYTES`` when the graph is traced, before XLA runs it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import IO

import google.protobuf.message
import jax
import numpy as np
import onnx
import onnx.defs
import onnx.inliner
from onnx import numpy_helper

from optkit._src.graph import Graph
from optkit.onnx import _standard, _training  # noqa: F401  (they fill the op table)
from optkit.onnx._table import (
    _DTYPES,
    TRAINING_DOMAIN,
    NodeContext,
    OpSpec,
    UnsupportedOpError,
    domain_text,
    is_static,
    lookup,
    normalize_domain,
    onnx_dtype,
    parse_attributes,
)

__all__ = ["ModelSource", "InputInfo", "load_model", "to_graph", "convert", "MAX_TENSOR_BYTES"]

ModelSource = onnx.ModelProto | bytes | bytearray | memoryview | str | os.PathLike | IO[bytes]

# The largest tensor a model may declare or a node may compute: 256 GiB, more
# than any single accelerator holds today, so a larger one can only be a corrupt
# or hostile model. Checked before anything is allocated: declared shapes at
# load, node outputs when the graph is traced (before XLA runs it).
MAX_TENSOR_BYTES = 2**38


def _check_size(shape: tuple[int, ...], dtype: np.dtype | None, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` if a tensor of ``shape`` exceeds ``MAX_TENSOR_BYTES``."""
    elements = math.prod(shape)
    itemsize = 1 if dtype is None else np.dtype(dtype).itemsize
    if elements * itemsize > MAX_TENSOR_BYTES:
        kind = "" if dtype is None else f" of {np.dtype(dtype).name}"
        raise ValueError(f"{what} has shape {tuple(shape)}: {elements:.4g} elements{kind}, "
                         f"{elements * itemsize:.4g} bytes, more than optkit.onnx's limit of "
                         f"{MAX_TENSOR_BYTES} bytes ({MAX_TENSOR_BYTES / 2**30:g} GiB) for one tensor; it is "
                         f"refused before anything is allocated")


def _check_declared_shape(value_info: onnx.ValueInfoProto, what: str) -> None:
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
    dtype = _DTYPES.get(tensor.elem_type)
    _check_size(tuple(fixed), dtype, f"{what} {value_info.name!r}")


def load_model(model: ModelSource) -> onnx.ModelProto:
    """Read an ONNX model and check it with ``onnx.checker``.

    Args:
      model: a ``onnx.ModelProto``, its serialized bytes, a path to a
        ``.onnx`` file (external data next to it is loaded), or a binary file
        object.

    Returns:
      The checked ``ModelProto`` (the object itself when one is given; it is
      not modified).

    Raises:
      ValueError: the bytes are not a ModelProto, or ``onnx.checker`` rejects
        the model (the message says why).
      TypeError: ``model`` is none of the accepted kinds.
      FileNotFoundError: no file at the path.

    Example:
      >>> import optkit.onnx
      >>> optkit.onnx.load_model(b"not a model")
      Traceback (most recent call last):
      ...
      ValueError: malformed ONNX model bytes: ...
    """
    if isinstance(model, onnx.ModelProto):
        proto, origin = model, "the ModelProto"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, origin = _parse(bytes(model), "ONNX model bytes"), "the model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no ONNX model file at {path!r}")
        with open(path, "rb") as f:
            proto = _parse(f.read(), f"ONNX model file {path!r}")
        if any(_uses_external_data(t) for t in proto.graph.initializer):
            onnx.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        origin = repr(path)
    elif hasattr(model, "read"):
        data = model.read()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"the file object must be opened in binary mode; read() returned "
                            f"{type(data).__name__}")
        proto, origin = _parse(bytes(data), "ONNX model bytes read from the file object"), "the file"
    else:
        raise TypeError(f"model must be an onnx.ModelProto, bytes, a path or a binary file object, "
                        f"got {type(model).__name__}")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise ValueError(f"onnx.checker rejects {origin}: {err}") from None
    except UnicodeDecodeError as err:
        # The checker reads a name, op type or attribute whose bytes are not UTF-8:
        # corrupt bytes, or a model written by a tool that does not follow the IR.
        raise ValueError(f"malformed model: {origin} has a string field (a name, an op type or "
                         f"an attribute) that is not valid UTF-8 ({err})") from None
    return proto


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (google.protobuf.message.DecodeError, RuntimeError, ValueError) as err:
        raise ValueError(f"malformed {what}: not a serialized onnx.ModelProto ({err})") from None
    if not proto.HasField("graph"):
        raise ValueError(f"malformed {what}: it parses as a ModelProto without a graph "
                         f"({len(data)} bytes)")
    return proto


def _uses_external_data(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


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
        if self.shape is None:
            return "(any shape)"
        return "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"


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


def _input_info(value_info: onnx.ValueInfoProto, has_default: bool) -> InputInfo:
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
        _check_size(fixed, dtype, f"graph input {value_info.name!r}")
    return InputInfo(value_info.name, dtype, shape, has_default)


def _folding(fn, ctx: NodeContext):
    """Run ``fn`` eagerly when every input is known before running, returning NumPy.

    Constant sub-graphs (shape arithmetic, Constant nodes, initializers
    combined) are folded this way even under ``jax.jit``, so a Reshape can
    read a shape computed from a Shape or Constant node.
    """

    def node_function(*values):
        if all(v is None or is_static(v) for v in values):
            # Folded eagerly: find the output shapes abstractly first, so that an
            # oversized result (a broadcast or MatMul of constants) is refused
            # before it is allocated.
            _check_outputs(jax.eval_shape(lambda: fn(*values)), ctx)
            with jax.ensure_compile_time_eval():
                out = fn(*values)
            if isinstance(out, tuple):
                return tuple(None if o is None else np.asarray(o) for o in out)
            return np.asarray(out)
        out = fn(*values)
        # Traced (jit, eval_shape, BackendRep's abstract pass): nothing has run yet.
        _check_outputs(out, ctx)
        return out

    node_function.__name__ = ctx.op_type
    return node_function


def _check_outputs(out, ctx: NodeContext) -> None:
    """Refuse node outputs above ``MAX_TENSOR_BYTES`` (arrays, tracers or shape structs)."""
    values = out if isinstance(out, tuple) else (out,)
    for i, value in enumerate(values):
        if value is None or not hasattr(value, "shape"):
            continue
        name = ctx.outputs[i] if i < len(ctx.outputs) else f"#{i}"
        _check_size(tuple(value.shape), getattr(value, "dtype", None),
                    f"{ctx.where}: output {name!r}")


def convert(model: onnx.ModelProto) -> Converted:
    """Map a checked ModelProto onto an :class:`optkit.Graph`; see :func:`to_graph`."""
    if model.functions:
        # Model-local functions are expanded into the graph, as ONNX Runtime does.
        model = onnx.inliner.inline_local_functions(model)
    opsets: dict[str, int] = {}
    for opset in model.opset_import:
        opsets[normalize_domain(opset.domain)] = int(opset.version)
    g = model.graph
    if g.sparse_initializer:
        raise UnsupportedOpError(f"sparse initializers ({g.sparse_initializer[0].name!r}...) are "
                                 f"not supported")

    initializers: dict[str, np.ndarray] = {}
    for tensor in g.initializer:
        onnx_dtype(tensor.data_type, f"initializer {tensor.name!r}")
        value = numpy_helper.to_array(tensor)
        value.setflags(write=False)
        initializers[tensor.name] = value
    infos = tuple(_input_info(vi, vi.name in initializers) for vi in g.input)
    for vi in g.output:
        _check_declared_shape(vi, "graph output")
    for vi in g.value_info:
        _check_declared_shape(vi, "value_info")

    graph = Graph()
    for info in infos:
        shape = None if info.shape is None else tuple(d if isinstance(d, int) else None for d in info.shape)
        graph.add_input(info.name, shape, info.dtype)
    for name, value in initializers.items():
        graph.add_initializer(name, value)

    specs: dict[str, tuple[onnx.NodeProto, OpSpec]] = {}
    static_slots: list[tuple[str, str]] = []  # (tensor, reading node)
    for index, node in enumerate(g.node):
        name = node.name or f"{node.op_type}#{index}"
        domain = normalize_domain(node.domain)
        where = f"node {name!r} ({domain_text(domain)}::{node.op_type})"
        if domain not in opsets:
            raise ValueError(f"{where}: the model does not import the domain {domain_text(domain)!r}")
        opset = opsets[domain]
        spec = lookup(domain, node.op_type, opset, where=where)
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, domain)
        except onnx.defs.SchemaError:
            schema = None
        where = f"node {name!r} ({domain_text(domain)}::{node.op_type}-{spec.since_version}, opset {opset})"
        attrs = parse_attributes(node, schema, where)
        ctx = NodeContext(node.op_type, domain, spec.since_version, opset, name,
                          tuple(node.input), tuple(node.output), attrs)
        if spec.build is None:
            _add_gradient(graph, ctx)
        else:
            fn = spec.build(ctx)
            graph.add(_folding(fn, ctx), inputs=list(node.input), outputs=list(node.output), name=name)
        for out in node.output:
            if out:
                specs[out] = (node, spec)
        static_slots += [(node.input[i], name) for i in spec.static_inputs
                         if i < len(node.input) and node.input[i]]

    outputs = tuple(vi.name for vi in g.output)
    graph.outputs = outputs
    graph.validate()
    return Converted(graph, infos, outputs, _static_inputs(static_slots, specs, infos))


def _add_gradient(graph: Graph, ctx: NodeContext) -> None:
    """ONNX Gradient (SPEC 6) -> :meth:`optkit.Graph.add_gradient`."""
    if ctx.domain != TRAINING_DOMAIN:  # pragma: no cover - the table only marks the training domain
        raise ctx.unsupported("unexpected marker row")
    xs = ctx.attrs.get("xs")
    y = ctx.attrs.get("y")
    zs = ctx.attrs.get("zs", [])
    try:
        graph.add_gradient(xs=list(xs), zs=list(zs), y=y, inputs=list(ctx.inputs),
                           outputs=list(ctx.outputs), name=ctx.name)
    except (TypeError, ValueError) as err:
        raise type(err)(ctx.message(str(err))) from None


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
            if spec.static_outputs or spec.build is None:
                continue
            stack.extend(i for i in node.input if i)
        elif name in inputs:
            found.add(name)
    return frozenset(found)


def to_graph(model: ModelSource) -> Graph:
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

    Args:
      model: a ``ModelProto``, its bytes, a path or a binary file object.

    Returns:
      The :class:`optkit.Graph`; its ``outputs`` are the model's ``graph.output``.

    Source: SPEC sections 1, 3, 4, 6; the ONNX IR (graph inputs, initializers,
    nodes) and each operator version's ONNX documentation.

    Raises:
      ValueError: malformed bytes (text that is not UTF-8 included), a model
        ``onnx.checker`` rejects, a node with invalid attributes or arity
        (e.g. an optimizer whose input count is not ``2 + k*n``, a Momentum
        without its required attributes), a declared shape with a negative
        dimension or above ``MAX_TENSOR_BYTES`` (2**38 bytes, 256 GiB). When
        the graph is traced (jit, ``jax.eval_shape``, :class:`BackendRep`), a
        node whose output would exceed ``MAX_TENSOR_BYTES`` raises
        ``ValueError`` before anything is computed; a node computed from
        constants alone is checked abstractly before it is folded.
      UnsupportedOpError: an operator, operator version or element type that
        optkit does not run; the message names op type, domain and opset.

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
    return convert(load_model(model)).graph
