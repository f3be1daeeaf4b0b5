"""The op table: ONNX operators mapped to JAX, keyed by ``(domain, op_type, since_version)``.

Each family module of :mod:`optkit.onnx._ops` (``elementwise``, ``nn``,
``shape``, ``reduce``, ``loss``, ``training``) keeps its operators in a
:class:`Family` and registers each with one form, ``@OPS.op("Conv", 1, 11,
22)``: the operator and every ``since_version`` whose semantics the builder
implements (versions that only added types included, so that a newer
version can be told from an implemented one).

A *builder*, called once per node at load time with a :class:`NodeContext`
(the node's attributes parsed, the schema's defaults filled in), validates
the node and returns the JAX function of the node's input values (None for
an absent optional input) that returns the node's output, or a tuple with
one value per output; Gradient's builder returns a :class:`GradientRequest`
instead, which the converter turns into an :class:`optkit.Graph` Gradient node.

For a node of a model that imports opset ``N`` for the node's domain,
:meth:`OpTable.lookup` picks the handler with the newest ``since_version <= N``
and refuses it when ONNX defines a newer version of the operator at opset
``N`` that optkit does not implement, so a model never runs under outdated
semantics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import onnx.defs
from onnx import helper

from optkit.onnx._errors import UnsupportedOpError
from optkit.onnx._limits import check_size
from optkit.onnx._ops._values import DEFAULT_DOMAIN, domain_text, normalize_domain, tensor_value

__all__ = ["NodeContext", "GradientRequest", "Builder", "Handler", "Family", "OpSpec", "OpTable",
           "parse_attributes"]


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
      max_tensor_bytes: the model's bound on one tensor, which every
        intermediate a handler creates is held to (:meth:`check_size`).
    """

    op_type: str
    domain: str
    version: int
    opset: int
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    max_tensor_bytes: int = 2**62

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

    def check_size(self, shape: Sequence[int], dtype: Any, what: str) -> None:
        """Raise :class:`~optkit.onnx.TensorTooLargeError` if an intermediate of ``shape`` would exceed the bounds."""
        check_size(tuple(shape), dtype, self.message(what), self.max_tensor_bytes)

    def has_output(self, i: int) -> bool:
        """True if optional output ``i`` is asked for."""
        return i < len(self.outputs) and bool(self.outputs[i])


@dataclasses.dataclass(frozen=True)
class GradientRequest:
    """What Gradient's builder returns: the node's checked attributes, for :meth:`optkit.Graph.add_gradient`."""

    xs: tuple[str, ...]
    zs: tuple[str, ...]
    y: str


Builder = Callable[[NodeContext], Callable[..., Any] | GradientRequest]


@dataclasses.dataclass(frozen=True)
class Handler:
    """A builder and the operator versions it implements.

    Attributes:
      op_type, since_versions, domain: the operator and every ``since_version``
        whose semantics ``build`` implements.
      build: ``build(ctx) -> fn`` (or a :class:`GradientRequest`).
      static_inputs: positions of inputs that must be known before running.
      static_outputs: True if the outputs are known before running whatever
        the inputs (``Shape``: shapes are static in XLA).
    """

    op_type: str
    since_versions: tuple[int, ...]
    build: Builder = dataclasses.field(repr=False)
    domain: str = DEFAULT_DOMAIN
    static_inputs: tuple[int, ...] = ()
    static_outputs: bool = False


class Family:
    """One family module's operators (``OPS = Family("nn")``), each registered with :meth:`op`."""

    def __init__(self, name: str, domain: str = DEFAULT_DOMAIN) -> None:
        self.name = name
        self.domain = normalize_domain(domain)
        self.handlers: list[Handler] = []

    def op(self, op_type: str, *since_versions: int, static_inputs: Sequence[int] = (),
           static_outputs: bool = False) -> Callable[[Builder], Builder]:
        """Decorator: register ``build`` for ``op_type`` at each of ``since_versions``."""
        if not since_versions:
            raise ValueError(f"{self.name}.op({op_type!r}): give at least one since_version")

        def register(build: Builder) -> Builder:
            self.handlers.append(Handler(op_type, tuple(int(v) for v in since_versions), build, self.domain,
                                         tuple(static_inputs), static_outputs))
            return build

        return register


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One row of the table: one version of one operator.

    Attributes:
      domain, op_type, since_version: the key.
      build, static_inputs, static_outputs: as :class:`Handler`.
      family: the family module that registered it.
    """

    domain: str
    op_type: str
    since_version: int
    build: Builder = dataclasses.field(repr=False)
    static_inputs: tuple[int, ...] = ()
    static_outputs: bool = False
    family: str = ""


class OpTable:
    """The op table, built from the family modules' :class:`Family` lists (``optkit.onnx._ops.TABLE``)."""

    def __init__(self, *families: Family) -> None:
        self._rows: dict[tuple[str, str, int], OpSpec] = {}
        self._versions: dict[tuple[str, str], list[int]] = {}
        for family in families:
            for h in family.handlers:
                for version in h.since_versions:
                    key = (h.domain, h.op_type, version)
                    if key in self._rows:
                        raise ValueError(f"{key} is registered twice")
                    self._rows[key] = OpSpec(h.domain, h.op_type, version, h.build, h.static_inputs,
                                             h.static_outputs, family.name)
                    self._versions.setdefault((h.domain, h.op_type), []).append(version)
        for versions in self._versions.values():
            versions.sort()

    def lookup(self, domain: str, op_type: str, opset: int) -> tuple[OpSpec, onnx.defs.OpSchema | None]:
        """The handler for ``domain::op_type`` in a model importing ``opset`` for ``domain``, and ONNX's schema.

        Picks the registered ``since_version`` that is the newest one ``<= opset``.

        Raises:
          UnsupportedOpError: no handler for the operator, none old enough, or
            ONNX defines a newer version of the operator at this opset than the
            newest one optkit implements. The message names the operator type,
            the domain and the opset version.
        """
        domain = normalize_domain(domain)
        op_text = f"{op_type} (domain {domain_text(domain)!r}, opset {opset})"
        versions = self._versions.get((domain, op_type))
        if not versions:
            known = sorted(op for d, op in self._versions if d == domain)
            hint = (f"; optkit runs these {domain_text(domain)} operators: {', '.join(known)}" if known
                    else f"; optkit runs no operator of domain {domain_text(domain)!r}")
            raise UnsupportedOpError(f"unsupported operator {op_text}{hint}")
        usable = [v for v in versions if v <= opset]
        if not usable:
            raise UnsupportedOpError(f"unsupported operator version: {op_text}; optkit "
                                     f"implements {op_type} versions {versions}")
        chosen = usable[-1]
        try:
            schema = onnx.defs.get_schema(op_type, opset, domain)
        except onnx.defs.SchemaError:
            schema = None
        if schema is not None and schema.since_version > chosen:
            raise UnsupportedOpError(
                f"unsupported operator version: {op_text} means {op_type}-{schema.since_version}; "
                f"optkit implements {op_type} versions {versions}")
        return self._rows[(domain, op_type, chosen)], schema

    def rows(self) -> list[tuple[str, str, int]]:
        """Every ``(domain, op_type, since_version)``, sorted."""
        return sorted(self._rows)

    def family_of(self, domain: str, op_type: str) -> str | None:
        """The family module that implements ``domain::op_type`` (``"nn"``...), or None."""
        versions = self._versions.get((normalize_domain(domain), op_type))
        return None if not versions else self._rows[(normalize_domain(domain), op_type, versions[0])].family


# ---------------------------------------------------------------------------
# Attributes


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
