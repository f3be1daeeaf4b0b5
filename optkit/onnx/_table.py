"""The op table: ONNX operators mapped to JAX, keyed by ``(domain, op_type, since_version)``.

A *handler* is registered for each operator version it implements (ONNX bumps
an operator's ``since_version`` when its semantics or its type list change).
For a node of a model that imports opset ``N`` for the node's domain,
:func:`lookup` picks the handler with the newest ``since_version <= N``, and
refuses it when ONNX defines a newer version of the operator at opset ``N``
that optkit does not implement (the operator changed after the handler was
written), so a model never runs under outdated semantics.

A handler is a *builder*: called once per node at load time with a
:class:`NodeContext` (the node's parsed attributes, with the schema's
defaults filled in), it validates the node and returns a JAX function of the
node's input values (None for an absent optional input) that returns the
node's output value, or a tuple with one value per output.

Values known before running (initializers, ``Constant`` outputs, ``Shape``
outputs, and whatever is computed from those alone) flow through the graph as
NumPy arrays; inputs that ONNX passes as tensors but XLA needs as static
values (``Reshape``'s ``shape``, ``Unsqueeze``'s ``axes``...) are read with
:func:`static_value`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "DEFAULT_DOMAIN",
    "TRAINING_DOMAIN",
    "DTYPES",
    "UnsupportedOpError",
    "TensorTooLargeError",
    "tensor_value",
    "OpSpec",
    "OpTable",
    "Handler",
    "handler",
    "NodeContext",
    "parse_attributes",
    "onnx_dtype",
    "dtype_name",
    "static_value",
    "is_static",
    "normalize_domain",
    "domain_text",
]

DEFAULT_DOMAIN = ""
TRAINING_DOMAIN = "ai.onnx.preview.training"


class UnsupportedOpError(NotImplementedError):
    """An ONNX operator, operator version, attribute value or type that optkit does not run.

    The message names the operator type, its domain and the model's opset
    version for that domain (and the node, where there is one).
    """


class TensorTooLargeError(ValueError, MemoryError):
    """A tensor larger than ``max_tensor_bytes``, refused before it is allocated.

    Raised for a declared shape when the model is loaded and for a node's
    output when the graph is traced, before XLA runs it; the message names the
    tensor (and node), its shape and bytes, and the limit. It is both a
    ``ValueError`` (a model optkit does not run) and a ``MemoryError`` (what
    ``onnx.reference`` raises for such a graph).
    """


def normalize_domain(domain: str) -> str:
    """``"ai.onnx"`` and ``""`` are the same (default) domain; the table uses ``""``."""
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def domain_text(domain: str) -> str:
    """The domain as people write it: ``ai.onnx`` for the default domain."""
    return "ai.onnx" if normalize_domain(domain) == DEFAULT_DOMAIN else domain


# ---------------------------------------------------------------------------
# dtypes

# The element types a handler may see. Strings, complex numbers and the
# 2-, 4-, 6- and 8-bit floating/integer formats are refused at load time:
# their ONNX cast/saturation rules are not implemented.
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


def dtype_name(elem_type: int) -> str:
    """The ONNX name of an element type (``FLOAT``, ``INT64``...)."""
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"<unknown element type {elem_type}>"


def onnx_dtype(elem_type: int, what: str) -> np.dtype:
    """The NumPy dtype of ONNX element type ``elem_type``; ``what`` names its use in errors.

    Raises:
      UnsupportedOpError: a type optkit does not run (strings, complex, float8...).
    """
    if elem_type not in DTYPES:
        supported = ", ".join(dtype_name(t) for t in DTYPES)
        raise UnsupportedOpError(f"{what} has element type {dtype_name(elem_type)}, which optkit does "
                                 f"not run; supported: {supported}")
    return DTYPES[elem_type]


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
        raise ValueError(f"{what} keeps its data in an external file that was not loaded; load the "
                         f"model with optkit.onnx.load_model (from its path, or with base_dir=)")
    onnx_dtype(tensor.data_type, what)
    try:
        value = numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what}: its data does not fit its dims {list(tensor.dims)} and type "
                         f"{dtype_name(tensor.data_type)} ({err})") from None
    value.setflags(write=False)
    return value


# ---------------------------------------------------------------------------
# static values


def is_static(value: Any) -> bool:
    """True for a value known before running: a NumPy array or scalar (not a JAX value)."""
    return isinstance(value, (np.ndarray, np.generic))


def static_value(value: Any, ctx: NodeContext, what: str) -> np.ndarray | None:
    """``value`` as a NumPy array, for an input that XLA needs before running.

    A shape, a list of axes... must be a compile-time constant under
    ``jax.jit``: an initializer, a ``Constant`` node's output, a ``Shape``
    output, or a tensor computed from those alone.

    Raises:
      ValueError: ``value`` is only known when the compiled program runs.
    """
    if value is None:
        return None
    if is_static(value):
        return np.asarray(value)
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return np.asarray(value)
    raise ValueError(ctx.message(
        f"input {what!r} must be known before the graph runs (an initializer, a Constant node's "
        f"output, a Shape output, or a tensor computed from those alone), but it is computed "
        f"at run time from a traced value"))


# ---------------------------------------------------------------------------
# attributes


def _decode(value: bytes, name: str, where: str) -> str:
    """A STRING attribute as text; ONNX strings are UTF-8."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: attribute {name!r} is not valid UTF-8 text ({err}); the "
                         f"model is corrupt or was not written as ONNX specifies") from None


def _attribute_value(attr: onnx.AttributeProto, where: str) -> Any:
    kind = attr.type
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(f"{where}: attribute {attr.name!r} is a sub-graph; optkit does "
                                 f"not run control flow (If, Loop, Scan)")
    if kind in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
        raise UnsupportedOpError(f"{where}: attribute {attr.name!r} is a sparse tensor, which "
                                 f"optkit does not run")
    if kind in (onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS):
        raise UnsupportedOpError(f"{where}: attribute {attr.name!r} is a type proto, which optkit "
                                 f"does not run")
    value = helper.get_attribute_value(attr)
    if kind == onnx.AttributeProto.STRING:
        return _decode(value, attr.name, where)
    if kind == onnx.AttributeProto.STRINGS:
        return [_decode(v, attr.name, where) for v in value]
    if kind == onnx.AttributeProto.TENSOR:
        return tensor_value(value, f"{where}: attribute {attr.name!r}")
    if kind == onnx.AttributeProto.TENSORS:
        return [tensor_value(v, f"{where}: attribute {attr.name!r}") for v in value]
    if kind == onnx.AttributeProto.INTS:
        return [int(v) for v in value]
    if kind == onnx.AttributeProto.FLOATS:
        return [float(v) for v in value]
    return value


def parse_attributes(
    node: onnx.NodeProto, schema: onnx.defs.OpSchema | None, where: str
) -> dict[str, Any]:
    """The node's attributes as Python values, with the schema's defaults for absent ones.

    STRING(S) become ``str``, TENSOR a NumPy array, INTS/FLOATS lists. An
    attribute the schema requires and the node lacks is an error here, so a
    model that skipped ``onnx.checker`` still fails before running.

    Raises:
      ValueError: a required attribute is missing or one is given twice; a string
        attribute that is not UTF-8.
      UnsupportedOpError: a sub-graph, sparse-tensor or type attribute.
    """
    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.name in attrs:
            raise ValueError(f"{where}: attribute {attr.name!r} is given twice")
        if attr.ref_attr_name:
            raise UnsupportedOpError(f"{where}: attribute {attr.name!r} refers to a function "
                                     f"attribute; optkit runs graphs, not function bodies")
        attrs[attr.name] = _attribute_value(attr, where)
    if schema is not None:
        for name, spec in schema.attributes.items():
            if name in attrs:
                continue
            if spec.required:
                raise ValueError(f"{where}: the required attribute {name!r} is missing "
                                 f"(ONNX schema {schema.domain or 'ai.onnx'}::{schema.name}-"
                                 f"{schema.since_version})")
            if spec.default_value.type != onnx.AttributeProto.UNDEFINED:
                attrs[name] = _attribute_value(spec.default_value, where)
    return attrs


# ---------------------------------------------------------------------------
# nodes and the table


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """What a handler knows about its node at load time.

    Attributes:
      op_type, domain: the operator (domain ``""`` is ``ai.onnx``).
      version: the ``since_version`` of the operator version being run.
      opset: the model's opset version for the node's domain.
      name: the node's name (or ``op_type#index`` when it has none).
      inputs, outputs: the node's tensor names; ``""`` is an absent optional one.
      attrs: the attributes, with the schema's defaults filled in.
    """

    op_type: str
    domain: str
    version: int
    opset: int
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]

    @property
    def where(self) -> str:
        return (f"node {self.name!r} ({domain_text(self.domain)}::{self.op_type}-{self.version}, "
                f"opset {self.opset})")

    def message(self, text: str) -> str:
        return f"{self.where}: {text}"

    def error(self, text: str) -> ValueError:
        """A ValueError that names this node; raise it."""
        return ValueError(self.message(text))

    def unsupported(self, text: str) -> UnsupportedOpError:
        """An UnsupportedOpError that names this node; raise it."""
        return UnsupportedOpError(self.message(text))

    def has_output(self, i: int) -> bool:
        """True if optional output ``i`` is asked for."""
        return i < len(self.outputs) and bool(self.outputs[i])


Builder = Callable[[NodeContext], Callable[..., Any]]


@dataclasses.dataclass(frozen=True)
class Handler:
    """A handler and the operator versions it implements (a module's list of these is its part of the table).

    Attributes:
      op_type, since_versions, domain: the operator and every ``since_version``
        whose semantics ``build`` implements (versions that only added types
        included, so that a newer version can be told from an implemented one).
      build: ``build(ctx) -> fn``; None for Gradient, which the loader maps
        onto :meth:`optkit.Graph.add_gradient` itself.
      static_inputs: positions of inputs that must be known before running.
      static_outputs: True if the outputs are known before running whatever
        the inputs (``Shape``: shapes are static in XLA).
    """

    op_type: str
    since_versions: tuple[int, ...]
    build: Builder | None = dataclasses.field(repr=False)
    domain: str = DEFAULT_DOMAIN
    static_inputs: tuple[int, ...] = ()
    static_outputs: bool = False


def handler(
    handlers: list[Handler],
    op_type: str,
    *since_versions: int,
    domain: str = DEFAULT_DOMAIN,
    static_inputs: Sequence[int] = (),
    static_outputs: bool = False,
) -> Callable[[Builder], Builder]:
    """Decorator: append to ``handlers`` (a module's own list) a :class:`Handler` for ``build``."""
    if not since_versions:
        raise ValueError(f"handler({op_type!r}): give at least one since_version")

    def decorate(build: Builder) -> Builder:
        handlers.append(Handler(op_type, tuple(int(v) for v in since_versions), build, normalize_domain(domain),
                                tuple(static_inputs), static_outputs))
        return build

    return decorate


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One row of the table: one version of one operator.

    Attributes:
      domain, op_type, since_version: the key.
      build, static_inputs, static_outputs: as :class:`Handler`.
    """

    domain: str
    op_type: str
    since_version: int
    build: Builder | None = dataclasses.field(repr=False)
    static_inputs: tuple[int, ...] = ()
    static_outputs: bool = False


class OpTable:
    """The op table, built from lists of :class:`Handler` (``optkit.onnx._ops.TABLE``)."""

    def __init__(self, *handler_lists: Sequence[Handler]) -> None:
        self._rows: dict[tuple[str, str, int], OpSpec] = {}
        self._versions: dict[tuple[str, str], list[int]] = {}
        for handlers in handler_lists:
            for h in handlers:
                for version in h.since_versions:
                    key = (h.domain, h.op_type, version)
                    if key in self._rows:
                        raise ValueError(f"{key} is registered twice")
                    self._rows[key] = OpSpec(h.domain, h.op_type, version, h.build, h.static_inputs,
                                             h.static_outputs)
                    self._versions.setdefault((h.domain, h.op_type), []).append(version)
        for versions in self._versions.values():
            versions.sort()

    def lookup(self, domain: str, op_type: str, opset: int, *, where: str | None = None) -> OpSpec:
        """The handler for ``domain::op_type`` in a model importing ``opset`` for ``domain``.

        Picks the registered ``since_version`` that is the newest one ``<= opset``.

        Raises:
          UnsupportedOpError: no handler for the operator, none old enough, or
            ONNX defines a newer version of the operator at this opset than the
            newest one optkit implements. The message names the operator type,
            the domain and the opset version.
        """
        domain = normalize_domain(domain)
        prefix = f"{where}: " if where else ""
        op_text = f"{op_type} (domain {domain_text(domain)!r}, opset {opset})"
        versions = self._versions.get((domain, op_type))
        if not versions:
            known = sorted(op for d, op in self._versions if d == domain)
            hint = (f"; optkit runs these {domain_text(domain)} operators: {', '.join(known)}" if known
                    else f"; optkit runs no operator of domain {domain_text(domain)!r}")
            raise UnsupportedOpError(f"{prefix}unsupported operator {op_text}{hint}")
        usable = [v for v in versions if v <= opset]
        if not usable:
            raise UnsupportedOpError(f"{prefix}unsupported operator version: {op_text}; optkit "
                                     f"implements {op_type} versions {versions}")
        chosen = usable[-1]
        try:
            schema = onnx.defs.get_schema(op_type, opset, domain)
        except onnx.defs.SchemaError:
            schema = None
        if schema is not None and schema.since_version > chosen:
            raise UnsupportedOpError(
                f"{prefix}unsupported operator version: {op_text} means {op_type}-{schema.since_version}; "
                f"optkit implements {op_type} versions {versions}")
        return self._rows[(domain, op_type, chosen)]

    def rows(self) -> list[tuple[str, str, int]]:
        """Every ``(domain, op_type, since_version)``, sorted."""
        return sorted(self._rows)
