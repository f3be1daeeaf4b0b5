"""Reading an ONNX file safely: the protobuf parsed, external data read only from the model's own directory,
``onnx.checker`` run."""

from __future__ import annotations

import os
from typing import IO, Any

import google.protobuf.message
import onnx
import onnx.external_data_helper

__all__ = ["ModelSource", "load_model", "tensors_of"]

ModelSource = onnx.ModelProto | bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]


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


def tensors_of(proto: onnx.ModelProto):
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
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for _, t in tensors_of(proto)):
        return proto
    if directory is None:
        where = next(w for w, t in tensors_of(proto) if t.data_location == onnx.TensorProto.EXTERNAL)
        raise ValueError(
            f"{where} keeps its data in an external file, but {origin} was given without a path, so "
            f"optkit reads no file for it (onnx's loaders do the same); load the model from its path "
            f"(optkit.onnx.prepare('model.onnx')) or pass base_dir= the directory of its data files")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # the caller's ModelProto is never modified
    root = os.path.realpath(directory)
    for where, tensor in tensors_of(copy):
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
