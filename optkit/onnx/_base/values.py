"""ONNX values in JAX: domains, element types, tensors read from protobufs, values known before running."""

from __future__ import annotations

import contextlib
import contextvars
import mmap
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optkit.onnx._base.errors import UnsupportedOpError

__all__ = [
    "DEFAULT_DOMAIN",
    "TRAINING_DOMAIN",
    "DTYPES",
    "LOW_BIT_TYPES",
    "storage_bits",
    "normalize_domain",
    "domain_text",
    "dtype_name",
    "onnx_dtype",
    "tensor_value",
    "STRING",
    "is_string",
    "string_array",
    "is_static",
    "as_static",
    "node_name",
    "node_where",
]

DEFAULT_DOMAIN = ""
TRAINING_DOMAIN = "ai.onnx.preview.training"


def normalize_domain(domain: str) -> str:
    """``"ai.onnx"`` and ``""`` are the same (default) domain; the table uses ``""``."""
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def domain_text(domain: str) -> str:
    """The domain as people write it: ``ai.onnx`` for the default domain."""
    return "ai.onnx" if normalize_domain(domain) == DEFAULT_DOMAIN else domain


# ---------------------------------------------------------------------------
# Element types

# The element types a handler may see. Strings and complex numbers are
# refused at load time. The 8-, 4- and 2-bit formats are ml_dtypes' types,
# which JAX and XLA compute with (Cast and the quantization operators apply
# ONNX's saturation and rounding rules to them).
DTYPES: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.BFLOAT16: np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
}
LOW_BIT_TYPES = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1",
                 "INT4", "UINT4", "INT2", "UINT2")
DTYPES.update({getattr(TensorProto, name): np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, name)))
               for name in LOW_BIT_TYPES})


def storage_bits(dtype: np.dtype) -> int:
    """Bits one element takes in an ONNX tensor's data: 4 and 2 for the packed types, else 8 x itemsize."""
    name = np.dtype(dtype).name
    if name.startswith(("int4", "uint4", "float4")):
        return 4
    if name.startswith(("int2", "uint2")):
        return 2
    return 8 * np.dtype(dtype).itemsize


def dtype_name(elem_type: int) -> str:
    """The ONNX name of an element type (``FLOAT``, ``INT64``...)."""
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"<unknown element type {elem_type}>"


def onnx_dtype(elem_type: int, what: str) -> np.dtype:
    """The NumPy dtype of ONNX element type ``elem_type``; ``what`` names its use in errors.

    Raises:
      UnsupportedOpError: a type optkit does not run (strings, complex numbers).
    """
    if elem_type not in DTYPES:
        supported = ", ".join(dtype_name(t) for t in DTYPES)
        raise UnsupportedOpError(f"{what} has element type {dtype_name(elem_type)}, which optkit does "
                                 f"not run; supported: {supported}")
    return DTYPES[elem_type]


def _strings_of(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """A STRING TensorProto as a read-only object array of ``str`` (its bytes decoded as UTF-8)."""
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    if len(tensor.string_data) != count:
        raise ValueError(f"{what}: {len(tensor.string_data)} strings for dims {list(tensor.dims)}")
    try:
        items = [b.decode("utf-8") for b in tensor.string_data]
    except UnicodeDecodeError:
        raise ValueError(f"{what} holds a string that is not UTF-8") from None
    value = string_array(items, tuple(tensor.dims))
    value.setflags(write=False)
    return value


# The external tensors mapped from their files while a model loads (optkit.onnx._load.tensors.load_external_data):
# {external_key(tensor): read-only array}, set by mapped_tensors for the stages that decode tensors.
_MAPPED: contextvars.ContextVar[Mapping[tuple, np.ndarray] | None] = contextvars.ContextVar("optkit_onnx_mapped",
                                                                                            default=None)


def external_key(tensor: onnx.TensorProto) -> tuple:
    """What names an external tensor's bytes: its ``external_data`` entries (location, offset, length...), the
    same in every copy of the tensor (a copy made by untying shared weights reads the same bytes)."""
    return tuple(sorted((entry.key, entry.value) for entry in tensor.external_data))


def is_mapped(value: Any) -> bool:
    """True for a NumPy array that views a file mapped into memory (external data, :func:`mapped_tensors`)."""
    while isinstance(value, np.ndarray):
        if isinstance(value, np.memmap):
            return True
        value = value.base
    return False


def release_pages(value: Any) -> None:
    """Give back the resident pages of an array mapped from external data (``madvise(MADV_DONTNEED)`` on the
    whole pages it covers: they are read from the file again if it is read), once a copy of it is what runs.
    Anything else, or a system without ``madvise``, is left as it is."""
    root = value
    while isinstance(root, np.ndarray) and isinstance(root.base, np.ndarray):
        root = root.base
    handle = getattr(root, "base", None)  # the memmap that made the map holds the mmap itself
    if not (isinstance(root, np.memmap) and isinstance(handle, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")):
        return
    page = mmap.PAGESIZE  # (the map starts at the memmap's offset rounded down to the allocation granularity)
    start = value.ctypes.data - root.ctypes.data + root.offset % mmap.ALLOCATIONGRANULARITY
    begin, end = -(-start // page) * page, (start + value.nbytes) // page * page
    if end > begin:
        handle.madvise(mmap.MADV_DONTNEED, begin, end - begin)


@contextlib.contextmanager
def mapped_tensors(mapped: Mapping[tuple, np.ndarray]) -> Iterator[None]:
    """Inside: :func:`tensor_value` of an external tensor whose :func:`external_key` is in ``mapped`` returns
    that array (a view of its file)."""
    token = _MAPPED.set(mapped)
    try:
        yield
    finally:
        _MAPPED.reset(token)


def tensor_value(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """A TensorProto's value as a read-only NumPy array; ``what`` names it in errors.

    Never reads a file: ``numpy_helper.to_array`` would read a tensor whose
    data is external from the current directory, so a tensor still marked
    external here (its data was not loaded from the model's directory by
    :func:`optkit.onnx.load_model`) is refused.

    Raises:
      ValueError: external data not loaded, or data that does not fit the
        declared dims and type.
      UnsupportedOpError: an element type optkit does not run.
    """
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        value = (_MAPPED.get() or {}).get(external_key(tensor))
        if value is not None:  # mapped from the model's directory by load_external_data (checked there)
            return value
        raise ValueError(f"{what} keeps its data in an external file that was not loaded; load the "
                         f"model with optkit.onnx.load_model (from its path, or with base_dir=)")
    if tensor.data_type == TensorProto.STRING:  # (an attribute or initializer of strings: an object array of str)
        return _strings_of(tensor, what)
    onnx_dtype(tensor.data_type, what)
    try:
        value = numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what}: its data does not fit its dims {list(tensor.dims)} and type "
                         f"{dtype_name(tensor.data_type)} ({err})") from None
    value.setflags(write=False)
    return value


# ---------------------------------------------------------------------------
# Values known before running


# ONNX's STRING tensors: NumPy object arrays of ``str``, values known before running (a graph input of this type
# is static: compiled once per value), computed on the host; a string output leaves the compiled program as it was
# computed while tracing (optkit.onnx._run.program.graph_function).
STRING = np.dtype(object)


def is_string(value: Any) -> bool:
    """True for a NumPy array of ONNX strings (object dtype)."""
    return isinstance(value, np.ndarray) and value.dtype == STRING


def string_array(items: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ONNX strings (object dtype) of ``shape`` holding ``items`` (``str``) in C order."""
    out = np.empty(shape, dtype=STRING)
    out.ravel()[:] = list(items)
    return out


def is_static(value: Any) -> bool:
    """True for a value known before running: a NumPy array or scalar (not a JAX value), or a sequence (a
    list) of them."""
    if isinstance(value, list):
        return all(isinstance(v, (np.ndarray, np.generic)) for v in value)
    return isinstance(value, (np.ndarray, np.generic))


def as_static(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array when it is known before running; None when it is traced.

    Known before running: a NumPy value (an initializer, a ``Constant``'s
    output, a ``Shape`` output, or a tensor folded from those alone) or a
    concrete ``jax.Array`` (a graph run op by op).
    """
    if is_static(value):
        return np.asarray(value)
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return np.asarray(value)
    return None


# ---------------------------------------------------------------------------
# Nodes in messages


def node_name(name: str, op_type: str, index: int) -> str:
    """A node's name in messages: its own, or ``op_type#index`` (its place in its graph) when it has none."""
    return name or f"{op_type}#{index}"


def node_where(name: str, domain: str, op_type: str, version: int | None = None, opset: int | None = None) -> str:
    """Where an error is, in one format: ``node 'n' (ai.onnx::Relu-14, opset 17)``; the parts not known yet left out."""
    operator = f"{domain_text(domain)}::{op_type}" + ("" if version is None else f"-{version}")
    return f"node {name!r} ({operator}" + ("" if opset is None else f", opset {opset}") + ")"
