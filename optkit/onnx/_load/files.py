"""Reading an ONNX file safely, the first stage of loading (:mod:`optkit.onnx._load.pipeline`): the protobuf parsed,
every tensor it brings bounded, external data read only from the model's own directory (both by
:mod:`optkit.onnx._load.tensors`); and ``onnx.checker`` (:func:`check_model`), which the pipeline runs after the
operator check."""

from __future__ import annotations

import collections
import hashlib
import logging
import os
from collections.abc import Iterator
from typing import IO, Any

import google.protobuf.message
import onnx

from optkit.onnx._base.limits import MAX_SUBGRAPH_DEPTH, Limits
from optkit.onnx._base.values import DTYPES, node_name, storage_bits
from optkit.onnx._base.walk import nodes_of, read_inside, subgraphs, too_deep
from optkit.onnx._load.tensors import check_tensors, declared_bytes, load_external_data, tensors_of

__all__ = ["ModelSource", "load_model", "model_proto", "read_model", "check_model", "tensors_of"]

_log = logging.getLogger("optkit.onnx")
# Digests of the ModelProtos load_model checked and returned (bounded, no reference kept): given back to
# to_jax or prepare, such a proto is not checked again (onnx.checker takes seconds on a large model).
_CHECKED: collections.OrderedDict[bytes, None] = collections.OrderedDict()
_CHECKED_MAX = 64

ModelSource = onnx.ModelProto | bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]
"""What optkit.onnx loads a model from: a ``ModelProto``, its serialized bytes, a path, or a binary file object."""


def load_model(model: ModelSource, *, base_dir: str | os.PathLike[str] | None = None,
               max_tensor_bytes: int | None = None) -> onnx.ModelProto:
    """Read an ONNX model, load its external data safely, and check it with ``onnx.checker``.

    External data (tensors whose bytes live in other files) is read only
    from the model's own directory: for a path, the file's directory; for
    bytes, a ``ModelProto`` or a file object, only from ``base_dir`` when the
    caller gives one (such a model has no directory, and onnx's own loaders
    read no external file for it). Every external tensor, an initializer or
    a tensor in a node attribute (a ``Constant``'s ``value``...), goes
    through onnx's checks: a relative location inside that directory, no
    ``..``, no symlink out of it. Exactly the bytes a tensor's dims and type
    need are read, at its ``offset``, after its size was checked.

    Every tensor the model brings (initializers, sparse initializers once
    densified, attribute tensors such as a ``Constant``'s value; inline or
    external) is held to ``max_tensor_bytes`` and to the bounds on dimensions
    (:func:`optkit.onnx.default_max_tensor_bytes`), before it is read or
    converted.

    Args:
      model: a ``onnx.ModelProto``, its serialized bytes, a path to a
        ``.onnx`` file, or a binary file object.
      base_dir: for a model given without a path, the directory its external
        data files are in; None (default) refuses external data.
      max_tensor_bytes: the largest tensor in bytes; default
        :func:`optkit.onnx.default_max_tensor_bytes` (half the memory available).

    Returns:
      The checked ``ModelProto``: the object given when it has no external
      data (it is never modified), else a copy with the data loaded.

    Raises:
      ValueError: the bytes are not a ModelProto, ``onnx.checker`` rejects
        the model, a path that is a directory, external data without a
        directory to read it from, or whose location leaves that directory,
        whose file is too short or whose ``length`` disagrees with its dims,
        or that cannot be read (the message names the tensor).
      TensorTooLargeError: a tensor above ``max_tensor_bytes`` or a dimension
        above the bounds (a ``ValueError`` and a ``MemoryError``).
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
    proto, origin, directory = read_model(model, base_dir, Limits.make(max_tensor_bytes))
    check_model(proto, origin)
    proto = load_external_data(proto, directory, origin)
    digest = digest_of(proto)
    if digest is not None:
        _CHECKED[digest] = None
        while len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)
    return proto


def model_proto(model: Any, argument: str = "model") -> onnx.ModelProto:
    """The ``ModelProto`` of what a user passed as a model: a ``ModelProto`` (itself, not modified), a runner
    that holds one (``to_jax``'s ``apply_fn``, ``prepare``'s ``BackendRep``: its ``model``), or what
    :func:`load_model` reads (a path, bytes, a binary file; checked, external data from the file's directory).

    Raises:
      TypeError: naming ``argument``, for anything else; and :func:`load_model`'s errors.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    held = getattr(model, "model", None)
    if isinstance(held, onnx.ModelProto):
        return held
    if isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview)) or hasattr(model, "read"):
        return load_model(model)
    raise TypeError(f"{argument} must be an onnx.ModelProto, a path, bytes, a binary file object or to_jax's "
                    f"apply_fn, got {type(model).__name__}")


def digest_of(proto: onnx.ModelProto) -> bytes | None:
    """A digest of the serialized model (None above protobuf's 2 GiB)."""
    if sum(declared_bytes(t) for _, t, _ in tensors_of(proto)) >= 2**31:  # (ByteSize itself refuses such a model)
        return None
    try:
        return hashlib.blake2b(proto.SerializeToString(), digest_size=20).digest()
    except (ValueError, google.protobuf.message.EncodeError):
        return None


def model_identity(proto: onnx.ModelProto | None) -> tuple[str, frozenset[tuple[str, str]]] | None:
    """What keys a warm start's exported programs (``optkit.onnx._run.warm``): the digest of the model's bytes
    and the ``(domain, op_type)`` of its nodes (a user's registered operator is code the bytes do not show); None
    for a model whose tensors are in external files (not in the bytes) or above protobuf's 2 GiB."""
    if proto is None or any(t.data_location == onnx.TensorProto.EXTERNAL for _, t, _ in tensors_of(proto)):
        return None
    digest = digest_of(proto)
    operators = frozenset((n.domain, n.op_type) for g in (proto.graph, *proto.functions) for _, n in nodes_of(g))
    return None if digest is None else (digest.hex(), operators)


def check_once(proto: onnx.ModelProto, origin: str, given: Any) -> None:
    """:func:`check_model`, unless ``given`` (what the caller passed) is a ModelProto that :func:`load_model`
    checked and returned, unchanged since (by the digest of its bytes)."""
    if _CHECKED and isinstance(given, onnx.ModelProto) and proto is given:  # no digest unless one could match
        digest = digest_of(proto)
        if digest is not None and digest in _CHECKED:
            _log.debug("onnx.checker: %s was checked by load_model already", origin)
            return
    check_model(proto, origin)


def read_model(model: ModelSource, base_dir: str | os.PathLike[str] | None,
               limits: Limits) -> tuple[onnx.ModelProto, str, str | None]:
    """The model parsed as :func:`load_model` reads it, its external data not read yet: ``(proto, origin,
    directory)``, origin naming where it came from in messages, directory the one its external data may be read
    from (None: none). The pipeline checks it (``onnx.checker`` serializes what it checks, and protobuf refuses a
    message over 2 GiB) and then reads the external data
    (:func:`~optkit.onnx._load.tensors.load_external_data`)."""
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
    deep = too_deep(proto.graph, MAX_SUBGRAPH_DEPTH)
    if deep is not None:
        node, index = deep
        raise ValueError(f"{origin}: node {node_name(node.name, node.op_type, index)!r} ({node.op_type}): sub-graphs "
                         f"nest more than {MAX_SUBGRAPH_DEPTH} deep (If, Loop and Scan bodies inside one another), "
                         f"more than optkit.onnx runs")
    check_tensors(proto, limits.max_tensor_bytes)
    return _sorted(proto, origin), origin, directory


# Operators ONNX Runtime registers in the default (ai.onnx) domain that ONNX does not define, which its own tools
# write there (onnxruntime-genai's model builder: SimplifiedLayerNormalization). onnx.checker knows no schema for
# them; the model is checked with those nodes in a domain of their own (optkit.onnx._ops.contrib runs them).
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
_ORT_CHECK_DOMAIN = "optkit.ort_default_domain"


def _topological_order(graph: onnx.GraphProto) -> list[int] | None:
    """The graph's node indices in an order where each node comes after the nodes whose outputs it reads
    (Kahn's algorithm, the file's order kept among nodes that are ready together; linear in nodes and edges);
    None when the nodes are in such an order already, or when no order exists (a cycle: the checker names it)."""
    import heapq

    producer = {out: index for index, node in enumerate(graph.node) for out in node.output if out}
    reads = ([i for i in node.input if i] + read_inside(node) for node in graph.node)
    needs = [{producer[name] for name in names if producer.get(name, index) != index}
             for index, names in enumerate(reads)]
    if all(max(n, default=-1) < index for index, n in enumerate(needs)):
        return None
    readers: list[list[int]] = [[] for _ in graph.node]
    waiting = [len(n) for n in needs]
    for index, n in enumerate(needs):
        for p in n:
            readers[p].append(index)
    ready = [index for index, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    return order if len(order) == len(graph.node) else None


def _sorted(proto: onnx.ModelProto, origin: str) -> onnx.ModelProto:
    """``proto``, or a copy whose graphs (sub-graphs included) list their nodes in topological order, as ONNX
    Runtime sorts them before it runs a model (ONNX Runtime's float16 converter appends its input Casts at the
    end of the graph; ``onnx.checker`` refuses that order)."""
    def graphs(p: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
        stack = [p.graph, *p.functions]
        while stack:
            graph = stack.pop()
            yield graph
            for node in graph.node:
                stack.extend(subgraphs(node))

    orders = [_topological_order(g) for g in graphs(proto)]
    if all(order is None for order in orders):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # the caller's ModelProto is never modified
    moved = 0
    # listed before any is reordered, sub-graphs (listed after their parents) reordered first: a parent's reorder
    # copies its nodes, sub-graphs included
    for graph, order in reversed(list(zip(graphs(copy), orders))):
        if order is None:
            continue
        nodes = [graph.node[i] for i in order]
        moved += len(nodes)
        reordered = [onnx.NodeProto() for _ in nodes]
        for new, node in zip(reordered, nodes):
            new.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(reordered)
    _log.info("%s lists its nodes out of topological order; sorted them (%d nodes), as ONNX Runtime does", origin,
              moved)
    return copy


def _checkable(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy that ``onnx.checker`` can check: ONNX Runtime's default-domain extensions moved to a
    domain of their own, and each dense tensor whose data is still external replaced by a one-element stand-in of
    its type and rank (the checker would look for the data file in the working directory, and a model whose data
    is read in could exceed protobuf's 2 GiB; :func:`read_model` checks the data's location and size itself)."""
    def ours(node: onnx.NodeProto) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS

    def external(p: onnx.ModelProto) -> list[onnx.TensorProto]:
        return [t for _, t, dense in tensors_of(p) if dense is None and t.data_location == onnx.TensorProto.EXTERNAL]

    stack = [proto.graph, *proto.functions]
    found = False
    while stack and not found:
        graph = stack.pop()
        for node in graph.node:
            found = found or ours(node)
            stack.extend(subgraphs(node))
    if not found and not external(proto):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for tensor in external(copy):
        rank = len(tensor.dims)
        del tensor.external_data[:], tensor.dims[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.dims.extend([1] * rank)
        tensor.raw_data = b"\0" * max(1, -(-storage_bits(DTYPES[tensor.data_type]) // 8)
                                      if tensor.data_type in DTYPES else 1)
    if not found:
        return copy
    stack = [copy.graph, *copy.functions]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if ours(node):
                node.domain = _ORT_CHECK_DOMAIN
            stack.extend(subgraphs(node))
    copy.opset_import.add(domain=_ORT_CHECK_DOMAIN, version=1)
    return copy


def check_model(proto: onnx.ModelProto, origin: str) -> None:
    """``onnx.checker.check_model``, its errors as ValueErrors naming ``origin``; the nodes of ONNX Runtime's
    default-domain extensions (:data:`ORT_DEFAULT_DOMAIN_OPS`) checked as nodes of a domain of their own."""
    try:
        onnx.checker.check_model(_checkable(proto))
    except onnx.checker.ValidationError as err:
        raise ValueError(f"onnx.checker rejects {origin}: {err}") from None
    except UnicodeDecodeError as err:
        # The checker reads a name, op type or attribute whose bytes are not UTF-8:
        # corrupt bytes, or a model written by a tool that does not follow the IR.
        raise ValueError(f"malformed model: {origin} has a string field (a name, an op type or "
                         f"an attribute) that is not valid UTF-8 ({err})") from None


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
