"""The tensors an ONNX file brings, read by :mod:`optkit.onnx._load.files` before anything else: every TensorProto
found (initializers, sparse ones, attribute tensors, in sub-graphs and functions), each bounded before it is read,
and external data read only from inside the model's own directory, exactly the bytes each tensor needs."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx

from optkit.onnx._base.errors import TensorTooLargeError, UnsupportedOpError
from optkit.onnx._base.limits import check_size
from optkit.onnx._base.values import DTYPES, dtype_name, external_key, node_name, storage_bits

__all__ = ["tensors_of", "check_tensors", "load_external_data", "declared_bytes", "PROGRESS_BYTES"]

_log = logging.getLogger("optkit.onnx")
# External data above this many bytes is read with a progress bar (tqdm, where installed and on a terminal).
PROGRESS_BYTES = 100 * 2**20


def tensors_of(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto, tuple[int, ...] | None]]:
    """Every TensorProto of the model: ``(description, tensor, dense dims)``.

    Initializers, sparse initializers' values and indices, attribute tensors
    (sub-graphs and model-local functions included). ``dense dims`` is the
    shape a sparse tensor has once densified (what its values are bounded
    by), None for a dense tensor. Iterative: no recursion on nesting.
    """
    stack: list[tuple[Any, str]] = [(proto.graph, "")]
    stack += [(function, f"function {function.name!r}: ") for function in proto.functions]
    while stack:
        graph, prefix = stack.pop()
        for tensor in getattr(graph, "initializer", ()):
            yield f"{prefix}initializer {tensor.name!r}", tensor, None
        for sparse in getattr(graph, "sparse_initializer", ()):
            yield f"{prefix}sparse initializer {sparse.values.name!r}", sparse.values, tuple(sparse.dims)
            yield f"{prefix}sparse initializer {sparse.values.name!r} (indices)", sparse.indices, None
        for index, node in enumerate(graph.node):
            named = node_name(node.name, node.op_type, index)
            for attr in node.attribute:  # (no str.format of a file's names: a name may hold braces)
                what = f"{prefix}attribute {attr.name!r} of node {named!r}"
                if attr.HasField("t"):
                    yield what, attr.t, None
                for tensor in attr.tensors:
                    yield what, tensor, None
                for sparse in [attr.sparse_tensor] * attr.HasField("sparse_tensor") + list(attr.sparse_tensors):
                    yield what, sparse.values, tuple(sparse.dims)
                    yield f"{what} (indices)", sparse.indices, None
                if attr.HasField("g"):
                    stack.append((attr.g, f"{what}, sub-graph: "))
                stack += [(g, f"{what}, sub-graph: ") for g in attr.graphs]


def check_tensors(proto: onnx.ModelProto, limit: int) -> None:
    """Every tensor the model brings, inline or external, against the bounds, before any is read or converted
    (a STRING tensor by the bytes of its strings, plus 8 per string).

    A tensor of an element type optkit does not run is left to the
    converter, which refuses it naming the type.
    """
    for where, tensor, dense in tensors_of(proto):
        if tensor.data_type == onnx.TensorProto.STRING:  # its bytes as held: each string, and a pointer to it
            check_size(dense if dense is not None else tuple(tensor.dims), None, where, limit)
            held = sum(map(len, tensor.string_data)) + 8 * len(tensor.string_data)
            if held > limit:
                raise TensorTooLargeError(f"{where} holds {held} bytes of strings (their bytes and 8 per string), "
                                          f"more than optkit.onnx's limit of {limit} bytes (max_tensor_bytes); it "
                                          f"is refused before it is decoded")
            continue
        dtype = DTYPES.get(tensor.data_type)
        if dtype is None:
            continue
        check_size(dense if dense is not None else tuple(tensor.dims), dtype, where, limit)


def _external_location(tensor: onnx.TensorProto, where: str) -> tuple[str, int, int | None]:
    """``(location, offset, length)`` of an external tensor, each checked; a ValueError names the tensor."""
    fields: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key in fields:
            raise ValueError(f"{where}: its external data gives {entry.key!r} twice")
        fields[entry.key] = entry.value
    numbers = {}
    for key in ("offset", "length"):
        if key in fields:
            try:
                numbers[key] = int(fields[key])
            except ValueError:
                raise ValueError(f"{where}: its external data {key} {fields[key]!r} is not an integer") from None
            if numbers[key] < 0:
                raise ValueError(f"{where}: its external data {key} is negative ({numbers[key]})")
    return fields.get("location", ""), numbers.get("offset", 0), numbers.get("length")


def _external_file(tensor: onnx.TensorProto, root: str, directory: str, where: str) -> tuple[str, int, int]:
    """``(path, offset, size)`` of ``tensor``'s bytes, checked: exactly the bytes its dims and type need.

    The size was bounded by :func:`check_tensors` before; the file must be
    inside ``root`` (no absolute path, no ``..``, no link out of it), hold
    ``offset + size`` bytes, and a ``length`` it declares must be that size.
    """
    location, offset, length = _external_location(tensor, where)
    parts = location.replace("\\", "/").split("/")
    target = os.path.realpath(os.path.join(root, location)) if location else root
    if not location or os.path.isabs(location) or ".." in parts or os.path.splitdrive(location)[0] \
            or os.path.commonpath([root, target]) != root:
        raise ValueError(f"{where}: its external data location {location!r} is not a file inside the "
                         f"model's directory {directory!r}; optkit reads external data from that "
                         f"directory only")
    dtype = DTYPES.get(tensor.data_type)
    if dtype is None:
        raise UnsupportedOpError(f"{where} has element type {dtype_name(tensor.data_type)}, which optkit does not "
                                 f"run (its external data is not read)")
    size = -(-math.prod(tensor.dims) * storage_bits(dtype) // 8)  # 4- and 2-bit values are packed
    if length is not None and length != size:
        raise ValueError(f"{where}: its external data declares length {length} bytes, but dims "
                         f"{list(tensor.dims)} of {dtype.name} need {size}")
    try:
        if not os.path.isfile(target):
            raise ValueError(f"{where}: its external data file {location!r} does not exist in {directory!r} "
                             f"(or is not a file)")
        available = os.path.getsize(target)
    except OSError as err:
        raise ValueError(f"{where}: cannot read its external data {location!r} in {directory!r}: {err}") from None
    if offset + size > available:
        raise ValueError(f"{where}: its external data file {location!r} holds {available} bytes, but dims "
                         f"{list(tensor.dims)} of {dtype.name} at offset {offset} need {offset + size}")
    return target, offset, size


def _read_external(tensor: onnx.TensorProto, root: str, directory: str, where: str) -> None:
    """Read exactly the bytes ``tensor``'s dims and type need from its file in ``root`` (checked by
    :func:`_external_file`), into the tensor. Nothing else of the file is read."""
    target, offset, size = _external_file(tensor, root, directory, where)
    location = _external_location(tensor, where)[0]
    try:
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read(size)
    except OSError as err:
        raise ValueError(f"{where}: cannot read its external data {location!r} in {directory!r}: {err}") from None
    if len(data) != size:  # the file shrank while it was read
        raise ValueError(f"{where}: its external data file {location!r} ended after {len(data)} of {size} bytes")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = data


# The element types whose external bytes are the array itself (little-endian, one or more bytes per value), as
# numpy_helper.to_array decodes them: such a tensor is mapped from its file instead of read (map_external_data).
_MAPPABLE = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                       onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
                       onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64,
                       onnx.TensorProto.UINT64})


def _mapped(tensor: onnx.TensorProto, root: str, directory: str, where: str,
            files: dict[str, np.memmap]) -> np.ndarray | None:
    """``tensor``'s value as a read-only view of its file mapped into memory (one map per file, in ``files``),
    checked as :func:`_read_external` checks it; None for a type that is not stored as its array
    (:data:`_MAPPABLE`) or on a machine that is not little-endian."""
    if tensor.data_type not in _MAPPABLE or sys.byteorder != "little":
        return None
    target, offset, size = _external_file(tensor, root, directory, where)
    if target not in files:
        try:
            files[target] = np.memmap(target, np.uint8, mode="r")
        except (OSError, ValueError) as err:
            location = _external_location(tensor, where)[0]
            raise ValueError(f"{where}: cannot map its external data {location!r} in {directory!r}: {err}") from None
    value = files[target][offset:offset + size].view(DTYPES[tensor.data_type]).reshape(tuple(tensor.dims))
    value.setflags(write=False)
    return value


def load_external_data(proto: onnx.ModelProto, directory: str | None, origin: str,
                       mapped: dict[tuple, np.ndarray] | None = None) -> onnx.ModelProto:
    """``proto`` with the data of its external tensors read from ``directory`` (a copy when there are any).

    With ``mapped`` (a dict filled here), each tensor whose type is stored as its array (:data:`_MAPPABLE`) is
    mapped from its file instead (a read-only view, no copy: the pages are read as they are used) and stays
    external in the copy; ``mapped[external_key(tensor)]`` is its value, which
    :func:`~optkit.onnx._base.values.tensor_value` returns inside :func:`~optkit.onnx._base.values.mapped_tensors`.
    """
    external = [(w, t) for w, t, _ in tensors_of(proto) if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return proto
    if directory is None:
        raise ValueError(
            f"{external[0][0]} keeps its data in an external file, but {origin} was given without a path, so "
            f"optkit reads no file for it (onnx's loaders do the same); load the model from its path "
            f"(optkit.onnx.prepare('model.onnx')) or pass base_dir= the directory of its data files")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # the caller's ModelProto is never modified
    root = os.path.realpath(directory)
    tensors = [(where, tensor) for where, tensor, _ in tensors_of(copy)
               if tensor.data_location == onnx.TensorProto.EXTERNAL]
    total = sum(declared_bytes(tensor) for _, tensor in tensors)
    bar = _progress(total, f"reading the external data of {origin}")
    files: dict[str, np.memmap] = {}
    count = 0
    for where, tensor in tensors:
        value = None if mapped is None else _mapped(tensor, root, directory, where, files)
        if value is None:
            _read_external(tensor, root, directory, where)
            count += 1
        else:
            mapped[external_key(tensor)] = value
        if bar is not None:
            bar.update(declared_bytes(tensor))
    if bar is not None:
        bar.close()
    _log.info("read %d and mapped %d external tensors (%d bytes) of %s", count, len(tensors) - count, total, origin)
    return copy


def declared_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes ``tensor``'s dims and element type declare (4- and 2-bit values packed; 1 byte per value for a
    type optkit does not run), what its data will take once read."""
    bits = storage_bits(DTYPES[tensor.data_type]) if tensor.data_type in DTYPES else 8
    return math.prod(int(d) for d in tensor.dims) * bits // 8


def _progress(total: int, what: str) -> Any:
    """A tqdm bar over ``total`` bytes when that is above :data:`PROGRESS_BYTES` and tqdm is installed (shown
    on a terminal only: ``disable=None``); else None."""
    if total <= PROGRESS_BYTES:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=what, disable=None, leave=False)
