"""ONNX ``ModelProto`` -> :class:`optkit.Graph`: reading, checking, and mapping every node.

ONNX files come from strangers, so everything that can be known before running
is checked here, at load time, and a bad model fails before any computation:
the protobuf parses, external data is read only from the model's own directory
(onnx's own checks: relative paths inside it, no ``..``, no symlinks out) and
never for a model given without one, ``onnx.checker`` accepts it, every
operator version is in the op table and every opset version is one ONNX
defines, every node's arity and attributes are valid (each handler validates
its node when it is built), every element type is one optkit runs, no declared
shape is negative or above the tensor-size limit, Gradient nodes nest at most
``max_gradient_depth`` deep, and the graph is closed
(:meth:`optkit.Graph.validate`). Node outputs are checked against the
tensor-size limit when the graph is traced, before XLA runs it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import IO, Any

import google.protobuf.message
import jax
import numpy as np
import onnx
import onnx.defs
import onnx.external_data_helper
import onnx.inliner

from optkit import Graph
from optkit._src.checks import shape_text
from optkit._src.graph_analysis import walk_back
from optkit.onnx._ops import TABLE
from optkit.onnx._table import (
    DEFAULT_DOMAIN,
    DTYPES,
    TRAINING_DOMAIN,
    NodeContext,
    OpSpec,
    TensorTooLargeError,
    UnsupportedOpError,
    domain_text,
    is_static,
    normalize_domain,
    onnx_dtype,
    parse_attributes,
    tensor_value,
)

__all__ = [
    "ModelSource",
    "InputInfo",
    "Limits",
    "load_model",
    "to_graph",
    "convert",
    "default_max_tensor_bytes",
    "MAX_GRADIENT_DEPTH",
    "GRADIENT_DEPTH_CEILING",
]

ModelSource = onnx.ModelProto | bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]

# Gradient nodes nested deeper than this are refused at load time: each level of
# nesting differentiates the level below it again, about tripling the work (8
# levels take 1.6 s on a 2-core CPU, 12 over two minutes), and Python's recursion
# limit is reached near 64. ``max_gradient_depth`` may raise it up to the ceiling.
MAX_GRADIENT_DEPTH = 8
GRADIENT_DEPTH_CEILING = 16


def _available_bytes(device: Any) -> int | None:
    """Bytes of memory free on ``device`` now (an accelerator's free memory, else the host's)."""
    if device is not None and device.platform != "cpu":
        try:
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            stats = {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    candidates = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:  # a container's own limit (cgroup v2)
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            candidates.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return max(min(candidates), 0)


def default_max_tensor_bytes(device: Any = None) -> int:
    """The default limit on one tensor's bytes: half the memory available on ``device`` now.

    Half the free memory of an accelerator (``device.memory_stats()``), or of
    the host for CPU devices (``MemAvailable``, within a container's cgroup
    limit); 2**38 bytes (256 GiB) when neither can be read. A graph that
    declares or computes one tensor larger than this is refused with
    :class:`optkit.onnx.TensorTooLargeError` before anything is allocated
    (XLA would otherwise abort the process, or take the machine's memory).
    Pass ``max_tensor_bytes=`` to :func:`optkit.onnx.prepare` to raise it.

    Args:
      device: a ``jax.Device``, or None for the host's memory.

    Returns:
      The limit in bytes (an int >= 1).

    Raises:
      TypeError: ``device`` is neither a ``jax.Device`` nor None.

    Example:
      >>> import optkit.onnx
      >>> optkit.onnx.default_max_tensor_bytes() > 0
      True
    """
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"device must be a jax.Device or None, got {device!r}")
    available = _available_bytes(device)
    return 2**38 if available is None else max(available // 2, 1)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a loaded model may use: bytes of one tensor, depth of nested Gradient nodes.

    Attributes:
      max_tensor_bytes: the largest tensor (declared or computed) in bytes.
      max_gradient_depth: how deep Gradient nodes may nest (a Gradient whose
        ``y`` is computed through another Gradient is one level deeper).
    """

    max_tensor_bytes: int
    max_gradient_depth: int = MAX_GRADIENT_DEPTH

    @classmethod
    def make(cls, max_tensor_bytes: int | None = None, max_gradient_depth: int | None = None,
             device: Any = None) -> Limits:
        """The limits with defaults filled in, each checked (a positive int; the depth at most the ceiling)."""
        if max_tensor_bytes is None:
            max_tensor_bytes = default_max_tensor_bytes(device)
        if isinstance(max_tensor_bytes, bool) or not isinstance(max_tensor_bytes, (int, np.integer)) \
                or max_tensor_bytes < 1:
            raise ValueError(f"max_tensor_bytes must be a positive integer, got {max_tensor_bytes!r}")
        depth = MAX_GRADIENT_DEPTH if max_gradient_depth is None else max_gradient_depth
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not \
                1 <= depth <= GRADIENT_DEPTH_CEILING:
            raise ValueError(f"max_gradient_depth must be an integer from 1 to {GRADIENT_DEPTH_CEILING} "
                             f"(each level about triples the work), got {depth!r}")
        return cls(int(max_tensor_bytes), int(depth))


def _check_size(shape: tuple[int, ...], dtype: np.dtype | None, what: str, limit: int) -> None:
    """Raise :class:`TensorTooLargeError` naming ``what`` if a tensor of ``shape`` exceeds ``limit`` bytes."""
    elements = math.prod(shape)
    itemsize = 1 if dtype is None else np.dtype(dtype).itemsize
    if elements * itemsize > limit:
        kind = "" if dtype is None else f" of {np.dtype(dtype).name}"
        raise TensorTooLargeError(
            f"{what} has shape {tuple(shape)}: {elements:.4g} elements{kind}, {elements * itemsize:.4g} bytes, "
            f"more than optkit.onnx's limit of {limit} bytes ({limit / 2**30:.3g} GiB) for one tensor; it is "
            f"refused before anything is allocated (the default limit is half the memory available when "
            f"the model is loaded; pass max_tensor_bytes= to raise it)")


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
    _check_size(tuple(fixed), dtype, f"{what} {value_info.name!r}", limit)


def load_model(model: ModelSource, *, base_dir: str | os.PathLike[str] | None = None) -> onnx.ModelProto:
    """Read an ONNX model, load its external data safely, and check it with ``onnx.checker``.

    External data (tensors whose bytes live in other files) is read only
    from the model's own directory: for a path, the file's directory; for
    bytes, a ``ModelProto`` or a file object, only from ``base_dir`` when the
    caller gives one (such a model has no directory, and onnx's own loaders
    read no external file for it). Every external tensor, an initializer or
    a tensor in a node attribute (a ``Constant``'s ``value``...), goes
    through onnx's checks: a relative location inside that directory, no
    ``..``, no symlink out of it.

    Args:
      model: a ``onnx.ModelProto``, its serialized bytes, a path to a
        ``.onnx`` file, or a binary file object.
      base_dir: for a model given without a path, the directory its external
        data files are in; None (default) refuses external data.

    Returns:
      The checked ``ModelProto``: the object given when it has no external
      data (it is never modified), else a copy with the data loaded.

    Raises:
      ValueError: the bytes are not a ModelProto, ``onnx.checker`` rejects
        the model, a path that is a directory, external data without a
        directory to read it from, or whose location leaves that directory
        or cannot be read (the message names the tensor).
      TypeError: ``model`` is none of the accepted kinds, or ``base_dir``
        given with a path.
      FileNotFoundError: no file at the path.

    Example:
      >>> import optkit.onnx
      >>> optkit.onnx.load_model(b"not a model")
      Traceback (most recent call last):
      ...
      ValueError: malformed ONNX model bytes: ...
    """
    directory: str | None = None
    if isinstance(model, onnx.ModelProto):
        proto, origin = model, "the ModelProto"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, origin = _parse(bytes(model), "ONNX model bytes"), "the model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if base_dir is not None:
            raise TypeError("base_dir is for a model given without a path; the external data of a model "
                            f"file is read from the file's own directory ({path!r})")
        if os.path.isdir(path):
            raise ValueError(f"{path!r} is a directory, not an ONNX model file")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no ONNX model file at {path!r}")
        with open(path, "rb") as f:
            proto = _parse(f.read(), f"ONNX model file {path!r}")
        directory, origin = os.path.dirname(os.path.abspath(path)), repr(path)
    elif hasattr(model, "read"):
        data = model.read()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"the file object must be opened in binary mode; read() returned "
                            f"{type(data).__name__}")
        proto, origin = _parse(bytes(data), "ONNX model bytes read from the file object"), "the file"
    else:
        raise TypeError(f"model must be an onnx.ModelProto, bytes, a path or a binary file object, "
                        f"got {type(model).__name__}")
    if directory is None and base_dir is not None:
        directory = os.fspath(base_dir)
        if not os.path.isdir(directory):
            raise ValueError(f"base_dir {directory!r} is not a directory")
    proto = _load_external_data(proto, directory, origin)
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


def _tensors(proto: onnx.ModelProto):
    """Every TensorProto of the model with a description: initializers, attribute tensors
    (sub-graphs and model-local functions included). Iterative: no recursion on nesting."""
    stack: list[tuple[Any, str]] = [(proto.graph, "")]
    stack += [(function, f"function {function.name!r}: ") for function in proto.functions]
    while stack:
        graph, prefix = stack.pop()
        for tensor in getattr(graph, "initializer", ()):
            yield f"{prefix}initializer {tensor.name!r}", tensor
        for sparse in getattr(graph, "sparse_initializer", ()):
            yield f"{prefix}sparse initializer {sparse.values.name!r}", sparse.values
            yield f"{prefix}sparse initializer {sparse.values.name!r} (indices)", sparse.indices
        for index, node in enumerate(graph.node):
            where = f"{prefix}attribute {{}} of node {node.name or f'{node.op_type}#{index}'!r}"
            for attr in node.attribute:
                what = where.format(repr(attr.name))
                if attr.HasField("t"):
                    yield what, attr.t
                for tensor in attr.tensors:
                    yield what, tensor
                for sparse in [attr.sparse_tensor] * attr.HasField("sparse_tensor") + list(attr.sparse_tensors):
                    yield what, sparse.values
                    yield what, sparse.indices
                if attr.HasField("g"):
                    stack.append((attr.g, f"{what}, sub-graph: "))
                stack += [(g, f"{what}, sub-graph: ") for g in attr.graphs]


def _load_external_data(proto: onnx.ModelProto, directory: str | None, origin: str) -> onnx.ModelProto:
    """``proto`` with the data of its external tensors read from ``directory`` (a copy when there are any)."""
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for _, t in _tensors(proto)):
        return proto
    if directory is None:
        where = next(w for w, t in _tensors(proto) if t.data_location == onnx.TensorProto.EXTERNAL)
        raise ValueError(
            f"{where} keeps its data in an external file, but {origin} was given without a path, so "
            f"optkit reads no file for it (onnx's loaders do the same); load the model from its path "
            f"(optkit.onnx.prepare('model.onnx')) or pass base_dir= the directory of its data files")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # the caller's ModelProto is never modified
    root = os.path.realpath(directory)
    for where, tensor in _tensors(copy):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = onnx.external_data_helper.ExternalDataInfo(tensor).location
        parts = location.replace("\\", "/").split("/")
        target = os.path.realpath(os.path.join(root, location)) if location else root
        if not location or os.path.isabs(location) or ".." in parts or os.path.splitdrive(location)[0] \
                or os.path.commonpath([root, target]) != root:
            raise ValueError(f"{where}: its external data location {location!r} is not a file inside the "
                             f"model's directory {directory!r}; optkit reads external data from that "
                             f"directory only")
        try:
            onnx.external_data_helper.load_external_data_for_tensor(tensor, root)
        except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as err:
            raise ValueError(f"{where}: cannot read its external data {location!r} in {directory!r}: "
                             f"{err}") from None
    return copy


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
        _check_size(fixed, dtype, f"graph input {value_info.name!r}", limit)
    return InputInfo(value_info.name, dtype, shape, has_default)


def _folding(fn, ctx: NodeContext, limit: int):
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


def _check_outputs(out, ctx: NodeContext, limit: int) -> None:
    """Refuse node outputs above ``limit`` bytes (arrays, tracers or shape structs)."""
    values = out if isinstance(out, tuple) else (out,)
    for i, value in enumerate(values):
        if value is None or not hasattr(value, "shape"):
            continue
        name = ctx.outputs[i] if i < len(ctx.outputs) else f"#{i}"
        _check_size(tuple(value.shape), getattr(value, "dtype", None),
                    f"{ctx.where}: output {name!r}", limit)


# The most nodes a model may have once its model-local functions are expanded.
MAX_EXPANDED_NODES = 1_000_000


def _check_function_expansion(model: onnx.ModelProto) -> None:
    """Refuse a model whose functions, expanded, would exceed ``MAX_EXPANDED_NODES`` nodes.

    onnx.checker refuses recursive functions; this bounds the expansion of
    the rest, iteratively (functions in an order where callees come first).
    """
    functions = {(normalize_domain(f.domain), f.name): f for f in model.functions}
    size: dict[tuple[str, str], int] = {}
    pending = list(functions)
    while pending:
        progressed = False
        for key in list(pending):
            calls = [(normalize_domain(n.domain), n.op_type) for n in functions[key].node]
            if any(c in functions and c not in size for c in calls):
                continue
            size[key] = min(sum(size.get(c, 1) for c in calls), MAX_EXPANDED_NODES + 1)
            pending.remove(key)
            progressed = True
        if not progressed:
            return  # a cycle: onnx.checker has refused it already
    total = sum(size.get((normalize_domain(n.domain), n.op_type), 1) for n in model.graph.node)
    if total > MAX_EXPANDED_NODES:
        raise ValueError(f"the model's local functions expand to more than {MAX_EXPANDED_NODES} nodes; "
                         f"optkit.onnx refuses it rather than build such a graph")


def _newest_opsets() -> dict[str, int]:
    """The newest opset version ONNX defines for each domain that has schemas."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = normalize_domain(schema.domain)
        newest[domain] = max(newest.get(domain, 0), int(schema.since_version))
    newest[DEFAULT_DOMAIN] = max(newest.get(DEFAULT_DOMAIN, 0), onnx.defs.onnx_opset_version())
    return newest


def convert(model: onnx.ModelProto, limits: Limits | None = None) -> Converted:
    """Map a checked ModelProto onto an :class:`optkit.Graph`; see :func:`to_graph`."""
    limits = Limits.make() if limits is None else limits
    if model.functions:
        # Model-local functions are expanded into the graph, as ONNX Runtime does; first count
        # what that makes (a function calling another twice, nested 30 deep, is 2**30 nodes).
        _check_function_expansion(model)
        model = onnx.inliner.inline_local_functions(model)
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
    g = model.graph
    if g.sparse_initializer:
        raise UnsupportedOpError(f"sparse initializers ({g.sparse_initializer[0].name!r}...) are "
                                 f"not supported")

    initializers: dict[str, np.ndarray] = {}
    for tensor in g.initializer:
        initializers[tensor.name] = tensor_value(tensor, f"initializer {tensor.name!r}")
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

    specs: dict[str, tuple[onnx.NodeProto, OpSpec]] = {}
    static_slots: list[tuple[str, str]] = []  # (tensor, reading node)
    for index, node in enumerate(g.node):
        name = node.name or f"{node.op_type}#{index}"
        domain = normalize_domain(node.domain)
        where = f"node {name!r} ({domain_text(domain)}::{node.op_type})"
        if domain not in opsets:
            raise ValueError(f"{where}: the model does not import the domain {domain_text(domain)!r}")
        opset = opsets[domain]
        spec = TABLE.lookup(domain, node.op_type, opset, where=where)
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
            graph.add(_folding(fn, ctx, limits.max_tensor_bytes), inputs=list(node.input),
                      outputs=list(node.output), name=name)
        for out in node.output:
            if out:
                specs[out] = (node, spec)
        static_slots += [(node.input[i], name) for i in spec.static_inputs
                         if i < len(node.input) and node.input[i]]

    outputs = tuple(vi.name for vi in g.output)
    graph.outputs = outputs
    _check_gradient_depth(g.node, limits.max_gradient_depth)  # before validate, which recurses per level
    graph.validate()
    return Converted(graph, infos, outputs, _static_inputs(static_slots, specs, infos))


def _check_gradient_depth(nodes, limit: int) -> None:
    """Refuse Gradient nodes nested more than ``limit`` deep, naming the first such node.

    A Gradient node's depth is 1 + the depth of the deepest Gradient node in
    its sub-graph (the graph from ``xs + zs`` to ``y``, cut at ``xs + zs``).
    Nodes come in the graph's order (onnx.checker requires it topologically
    sorted), so every inner Gradient node's depth is known before it is
    needed; each walk is :func:`optkit._src.graph_analysis.walk_back`, the
    graph's own cut (a loop, so no input makes Python recurse).
    """
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer.setdefault(out, index)
    depth: dict[int, int] = {}
    for index, node in enumerate(nodes):
        if normalize_domain(node.domain) != TRAINING_DOMAIN or node.op_type != "Gradient":
            continue
        attrs = {a.name: a for a in node.attribute}
        if "y" not in attrs:
            continue  # parse_attributes refused it already
        y = attrs["y"].s.decode("utf-8", "replace")
        stop = {v.decode("utf-8", "replace") for key in ("xs", "zs") if key in attrs for v in attrs[key].strings}
        # The sub-graph, by node index; a Gradient differentiated through itself
        # is not walked into again (Graph.validate names that cycle).
        reached, _ = walk_back([y], stop, producer, lambda p, index=index: () if p == index else nodes[p].input)
        inner = max((p for p in reached if p in depth), key=lambda p: depth[p], default=None)
        deepest = 0 if inner is None else depth[inner]
        depth[index] = deepest + 1
        if depth[index] > limit:
            name = node.name or f"Gradient#{index}"
            inner_name = nodes[inner].name or f"Gradient#{inner}"
            raise ValueError(
                f"node {name!r} ({TRAINING_DOMAIN}::Gradient): Gradient nodes nest {depth[index]} deep here "
                f"(its y {y!r} is computed through Gradient node {inner_name!r}), more than optkit.onnx's "
                f"limit of {limit}; each level differentiates the one below again and about triples the "
                f"work. Pass max_gradient_depth= (at most {GRADIENT_DEPTH_CEILING}) to allow more")


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


def to_graph(
    model: ModelSource,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    max_tensor_bytes: int | None = None,
    max_gradient_depth: int | None = None,
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
    limits = Limits.make(max_tensor_bytes, max_gradient_depth)
    return convert(load_model(model, base_dir=base_dir), limits).graph
