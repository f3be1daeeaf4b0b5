"""The op table: ONNX operators mapped to JAX, keyed by ``(domain, op_type, since_version)``.

Each family module of :mod:`optkit.onnx._ops` keeps its operators in a
:class:`Family` and registers every one with one form, the decorator
``@OPS.op("Conv", 1, 11, 22)`` on its *builder*: the operator and every
``since_version`` whose semantics the builder implements (versions that only
added types included, so that a newer version can be told from an
implemented one). One builder may serve several operators: stack the
decorators and give each its ``params`` (``@OPS.op("ReduceSum", 1, 11, 13,
params=(jnp.sum,))``), which reach the builder after the context.

A builder, called once per node at load time as ``build(ctx, *params)`` with
a :class:`NodeContext` (the node's attributes decoded, the schema's defaults
filled in), validates the node and returns the JAX function of the node's
input values (None for an absent optional input) that returns the node's
output, or a tuple with one value per output; Gradient's builder returns a
:class:`GradientRequest` instead, which the converter turns into an
:class:`optkit.Graph` Gradient node. Inputs listed in ``static_inputs`` reach
that function as NumPy arrays: the converter refuses, naming the node and
the input, a value only known when the compiled program runs.

For a node of a model that imports opset ``N`` for the node's domain,
:meth:`OpTable.lookup` picks the newest registered ``since_version <= N``
and refuses it when ONNX defines a newer version of the operator at opset
``N`` that optkit does not implement, so a model never runs under outdated
semantics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs

from optkit.onnx._base.errors import UnsupportedOpError
from optkit.onnx._base.limits import MAX_LOOP_STEPS, MAX_NODE_WORK, check_size, check_work
from optkit.onnx._base.values import DEFAULT_DOMAIN, domain_text, node_where, normalize_domain

__all__ = ["Accepts", "NodeContext", "GradientRequest", "Builder", "ELEMENTWISE", "FLOAT16_KERNEL", "Float16", "Fusion",
           "Layout", "MOVES_FLOAT16", "OpSpec", "Family", "OpTable"]


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """What a builder knows about its node at load time.

    Attributes:
      op_type, domain: the operator (domain ``""`` is ``ai.onnx``).
      version: the ``since_version`` of the operator version being run.
      opset: the model's opset version for the node's domain.
      name: the node's name (or ``op_type#index`` when it has none).
      inputs, outputs: the node's tensor names; ``""`` is an absent optional one.
      attrs: the attributes, with the schema's defaults filled in; a
        sub-graph attribute (``If``'s branches...) is its ``onnx.GraphProto``.
      max_tensor_bytes: the model's bound on one tensor, which every
        intermediate a handler creates is held to (:meth:`check_size`).
      subgraph: converts a sub-graph attribute with the same converter as the
        model's graph, the enclosing graphs' names visible and the same
        bounds (see :meth:`convert_subgraph`); None where no converter runs.
      channels_last: build the node's channels-last form (:mod:`optkit.onnx._plans.layout`): its activation
        input and output hold (N, D1, ..., C) instead of ONNX's (N, C, D1, ...); only the operators
        that layout lists are built so.
      max_node_work: the elements the node may produce or iterate over (:meth:`check_work`).
      max_loop_steps: the body nodes a ``Loop`` run op by op may evaluate.
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
    subgraph: Callable[[onnx.GraphProto, str], Any] | None = dataclasses.field(default=None, repr=False)
    channels_last: bool = False
    max_node_work: int = MAX_NODE_WORK
    max_loop_steps: int = MAX_LOOP_STEPS

    @property
    def where(self) -> str:
        return node_where(self.name, self.domain, self.op_type, self.version, self.opset)

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

    def check_work(self, elements: float, what: str) -> None:
        """Raise a ``ValueError`` naming this node if ``what`` (its work, ``elements`` produced or iterated over)
        is above ``max_node_work``."""
        check_work(elements, self.message(what), self.max_node_work)

    def has_output(self, i: int) -> bool:
        """True if optional output ``i`` is asked for."""
        return i < len(self.outputs) and bool(self.outputs[i])

    def convert_subgraph(self, attribute: str) -> Any:
        """The sub-graph attribute ``attribute`` converted (a ``Converted``: its Graph, inputs, outputs and
        the enclosing graphs' names it reads, ``captures``), by the converter that converts this node.

        Raises:
          ValueError: the attribute is not a sub-graph, or no converter runs.
        """
        graph = self.attrs.get(attribute)
        if not isinstance(graph, onnx.GraphProto) or self.subgraph is None:
            raise self.error(f"attribute {attribute!r} is not a sub-graph this converter can convert")
        return self.subgraph(graph, f"{self.where}, attribute {attribute!r}")


@dataclasses.dataclass(frozen=True)
class GradientRequest:
    """What Gradient's builder returns: the node's checked attributes, for :meth:`optkit.Graph.add_gradient`."""

    xs: tuple[str, ...]
    zs: tuple[str, ...]
    y: str


Builder = Callable[..., Callable[..., Any] | GradientRequest]


@dataclasses.dataclass(frozen=True)
class Layout:
    """An operator's part in the channels-last plan (:mod:`optkit.onnx._plans.layout`), declared at its registration.

    Attributes:
      role: ``"conv"`` (a channels-last form of its own; reads ``X`` channels-last, moved there if it is not
        held), ``"reads_x"`` (a channels-last form of its own, of a held ``X``: pools, BatchNormalization),
        ``"elementwise"`` (the same formula in either layout, its other operands broadcast as ONNX does),
        ``"concat"`` (along the channels) or ``"transpose"`` (a layout boundary: into or out of the held
        layout, the value as it is).
      since: the first operator version the role holds for (an element-wise operator broadcasts as NumPy
        from Add-7, Max-8...; BatchNormalization's training form from 9).
      outputs: the most outputs a planned node may have (the first one held).
    """

    role: str
    since: int = 0
    outputs: int = 1

    def __post_init__(self) -> None:
        if self.role not in ("conv", "reads_x", "elementwise", "concat", "transpose"):
            raise ValueError(f"unknown layout role {self.role!r}")


ELEMENTWISE = Layout("elementwise")


@dataclasses.dataclass(frozen=True)
class Fusion:
    """A node that runs as one node with the nodes it reads its first input through (declared at its
    registration; the converter applies it knowing no family): a ``DequantizeLinear`` of a
    ``QuantizeLinear``'s output is one fake quantization with a straight-through gradient, and so is a
    ``Cast`` to a float type of a ``MatMulInteger`` of a ``DynamicQuantizeLinear``'s output.

    Attributes:
      producer: the operator type of the node whose output is the node's first input, or a tuple of
        operator types from the farthest to the nearest (``("DynamicQuantizeLinear", "MatMulInteger")``:
        each node's first input is the output of the one before it); all in the node's domain.
      matches: ``matches(*producers, node)``, the producers farthest first: whether this chain is fused
        (the same parameters...).
      build: ``build(ctx, *producer_attrs) -> fn``: the fused function (``ctx`` is ``node``'s, the
        producers' parsed attributes farthest first). It reads the farthest producer's first input, then
        the inputs after the first of each nearer producer and of ``node``, in that order.
    """

    producer: str | tuple[str, ...]
    matches: Callable[..., bool]
    build: Callable[..., Callable[..., Any]]

    @property
    def chain(self) -> tuple[str, ...]:
        """The producers' operator types, farthest first."""
        return (self.producer,) if isinstance(self.producer, str) else tuple(self.producer)


@dataclasses.dataclass(frozen=True)
class Float16:
    """An operator's part in ONNX Runtime's float16 plan (:mod:`optkit.onnx._plans.float16`), declared at its
    registration as ``layout=`` is.

    Attributes:
      kernel_since, kernel_until: the opset versions (inclusive; ``kernel_until`` None: every later one) at which
        ONNX Runtime 1.32's CPU provider has a float16 kernel for the operator (its kernel registry,
        ``onnxruntime.capi._pybind_state.get_all_opkernel_def()``); an operator without one runs in float32
        between casts there. None: no float16 kernel at any version.
      moves_data: the operator only moves its first input's elements (``Reshape``, ``Gather``...): its outputs
        have that input's dtype.

    Example: ``@OPS.op("Concat", 1, 4, 11, 13, float16=Float16(kernel_since=4, moves_data=True))``.
    """

    kernel_since: int | None = None
    kernel_until: int | None = None
    moves_data: bool = False

    def native_at(self, version: int) -> bool:
        """Whether ONNX Runtime runs the operator's ``version`` on float16 data itself."""
        return self.kernel_since is not None and self.kernel_since <= version and (
            self.kernel_until is None or version <= self.kernel_until)


FLOAT16_KERNEL = Float16(kernel_since=1)  # a float16 kernel at every version
MOVES_FLOAT16 = Float16(kernel_since=1, moves_data=True)  # that, and its outputs are its first input's elements


@dataclasses.dataclass(frozen=True)
class Accepts:
    """What an operator accepts beyond what ``onnx.checker`` checks, declared at its registration: the ranges or
    values of its attributes, checked once when the node is loaded, and the ranks of its inputs, checked when it is
    traced, each refused with a ``ValueError`` naming the node. For com.microsoft operators (whose schemas the
    checker does not know) and attributes whose valid range a schema leaves to prose (``Gemm``'s ``transA``).

    Attributes:
      attributes: ``{name: (low, high)}`` (inclusive; every entry of a list attribute; NaN never in range) or
        ``{name: frozenset of values}``.
      ranks: ``{input position: (lowest rank, highest rank)}``.
    """

    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    ranks: Mapping[int, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def check_attributes(self, ctx: NodeContext) -> None:
        """Raise a ``ValueError`` naming the node for an attribute outside what the operator accepts."""
        for name, allowed in self.attributes.items():
            value = ctx.attrs.get(name)
            if value is None:
                continue
            for v in np.reshape(np.asarray(value, dtype=object), -1):
                if isinstance(allowed, frozenset):
                    ok, said = v in allowed, f"one of {sorted(allowed)}"
                else:
                    ok, said = bool(allowed[0] <= float(v) <= allowed[1]), f"from {allowed[0]} to {allowed[1]}"
                if not ok:
                    raise ctx.error(f"attribute {name!r} is {v!r}; {ctx.op_type} accepts {said}")

    def check_ranks(self, ctx: NodeContext, values: Sequence[Any]) -> None:
        """Raise a ``ValueError`` naming the node for an input of a rank the operator does not take."""
        for i, (low, high) in self.ranks.items():
            if i < len(values) and values[i] is not None and not low <= np.ndim(values[i]) <= high:
                raise ctx.error(f"input {i} has shape {tuple(np.shape(values[i]))}; {ctx.op_type} takes rank "
                                f"{low}" + (f" to {high}" if high != low else ""))


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One registration: a builder and the operator versions it implements.

    Attributes:
      op_type, since_versions, domain: the operator and every ``since_version``
        whose semantics ``build`` implements.
      build: ``build(ctx, *params) -> fn`` (or a :class:`GradientRequest`).
      params: passed to ``build`` after the context (one builder, several operators).
      static_inputs: positions of inputs that must be known before running;
        they reach ``fn`` as NumPy arrays.
      static_outputs: True if the outputs are known before running whatever
        the inputs (``Shape``: shapes are static in XLA).
      table_inputs: positions of inputs that hold tables rather than weights (a rotary embedding's
        ``cos_cache`` and ``sin_cache``): an initializer read there is not trained by default.
      static_when_fed: positions of inputs that, read straight from a graph input, are taken as static when
        that input is fed a concrete value (an ``If``'s condition: the branch is chosen before running, so
        branches of different shapes run; fed a traced value, the input stays dynamic).
      layout: its part in the channels-last plan (:class:`Layout`), or None.
      fusion: how it runs fused with the node it reads (:class:`Fusion`), or None.
      float16: its part in ONNX Runtime's float16 plan (:class:`Float16`), or None (no float16 kernel).
      accepts: the attribute ranges and input ranks it accepts (:class:`Accepts`), or None.
    """

    op_type: str
    since_versions: tuple[int, ...]
    build: Builder = dataclasses.field(repr=False)
    domain: str = DEFAULT_DOMAIN
    params: tuple[Any, ...] = dataclasses.field(default=(), repr=False)
    static_inputs: tuple[int, ...] = ()
    static_outputs: bool = False
    layout: Layout | None = None
    fusion: Fusion | None = None
    table_inputs: tuple[int, ...] = ()
    static_when_fed: tuple[int, ...] = ()
    float16: Float16 | None = None
    accepts: Accepts | None = None

    def builder(self, ctx: NodeContext) -> Callable[..., Any] | GradientRequest:
        """The node's function (or Gradient request): ``build(ctx, *params)``."""
        return self.build(ctx, *self.params)

    def layout_at(self, version: int) -> Layout | None:
        """Its :class:`Layout` at operator version ``version`` (None before the role's ``since``)."""
        return self.layout if self.layout is not None and version >= self.layout.since else None

    def float16_native(self, version: int) -> bool:
        """Whether ONNX Runtime's CPU provider has a float16 kernel for operator version ``version``."""
        return self.float16 is not None and self.float16.native_at(version)


class Family:
    """One family module's operators (``OPS = Family("nn")``), each registered with :meth:`op`."""

    def __init__(self, name: str, domain: str = DEFAULT_DOMAIN) -> None:
        self.name = name
        self.domain = normalize_domain(domain)
        self.specs: list[OpSpec] = []

    def op(self, op_type: str, *since_versions: int, params: Sequence[Any] = (), static_inputs: Sequence[int] = (),
           static_outputs: bool = False, layout: Layout | None = None,
           fusion: Fusion | None = None, table_inputs: Sequence[int] = (),
           static_when_fed: Sequence[int] = (), float16: Float16 | None = None,
           accepts: Accepts | None = None) -> Callable[[Builder], Builder]:
        """Decorator: register ``build`` for ``op_type`` at each of ``since_versions``; stackable. ``layout``:
        its part in the channels-last plan (:class:`Layout`); ``fusion``: its fusion with the node it reads
        (:class:`Fusion`); ``float16``: its part in ONNX Runtime's float16 plan (:class:`Float16`); ``accepts``:
        its attribute ranges and input ranks (:class:`Accepts`); ``table_inputs``, ``static_when_fed``: see
        :class:`OpSpec`."""
        if not since_versions:
            raise ValueError(f"{self.name}.op({op_type!r}): give at least one since_version")

        def register(build: Builder) -> Builder:
            self.specs.append(OpSpec(op_type, tuple(int(v) for v in since_versions), build, self.domain,
                                     tuple(params), tuple(static_inputs), static_outputs, layout, fusion,
                                     tuple(table_inputs), tuple(static_when_fed), float16, accepts))
            return build

        return register


class OpTable:
    """The op table, built from the family modules' :class:`Family` lists (``optkit.onnx._ops.TABLE``)."""

    def __init__(self, *families: Family) -> None:
        self._rows: dict[tuple[str, str, int], OpSpec] = {}
        self._versions: dict[tuple[str, str], list[int]] = {}
        for family in families:
            for spec in family.specs:
                for version in spec.since_versions:
                    key = (spec.domain, spec.op_type, version)
                    if key in self._rows:
                        raise ValueError(f"{key} is registered twice")
                    self._rows[key] = spec
                    self._versions.setdefault((spec.domain, spec.op_type), []).append(version)
        for versions in self._versions.values():
            versions.sort()
        self._builtin = frozenset(self._rows)

    def add(self, spec: OpSpec, *, replace: bool = False) -> None:
        """Add a user's registration (:func:`optkit.onnx.register_op`) at each of its ``since_versions``.

        Raises:
          ValueError: an operator optkit itself runs (any version), or a user row already there without
            ``replace``.
        """
        keys = [(spec.domain, spec.op_type, int(v)) for v in spec.since_versions]
        if any(key[:2] == (spec.domain, spec.op_type) for key in self._builtin):
            raise ValueError(f"{domain_text(spec.domain)}::{spec.op_type} is one of optkit's own operators; "
                             f"register a custom operator under a domain of your own")
        for key in keys:
            if key in self._rows and not replace:
                raise ValueError(f"{domain_text(key[0])}::{key[1]} version {key[2]} is registered already; "
                                 f"pass replace=True to replace it")
        for key in keys:
            if key not in self._rows:
                self._versions.setdefault(key[:2], []).append(key[2])
                self._versions[key[:2]].sort()
            self._rows[key] = spec

    def users(self) -> frozenset[tuple[str, str]]:
        """The ``(domain, op_type)`` of every operator a user registered (``register_op``)."""
        return frozenset(key[:2] for key in self._rows if key not in self._builtin)

    def remove(self, domain: str, op_type: str) -> bool:
        """Remove a user's registrations of ``domain::op_type`` (every version); True if there were any.

        Raises:
          ValueError: one of optkit's own operators.
        """
        domain = normalize_domain(domain)
        keys = [key for key in self._rows if key[:2] == (domain, op_type)]
        if any(key in self._builtin for key in keys):
            raise ValueError(f"{domain_text(domain)}::{op_type} is one of optkit's own operators")
        for key in keys:
            del self._rows[key]
        self._versions.pop((domain, op_type), None)
        return bool(keys)

    def lookup(self, domain: str, op_type: str, opset: int) -> tuple[OpSpec, int, onnx.defs.OpSchema | None]:
        """The registration for ``domain::op_type`` in a model importing ``opset`` for ``domain``, the
        ``since_version`` it runs as, and ONNX's schema.

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
        return self._rows[(domain, op_type, chosen)], chosen, schema

    def rows(self) -> list[tuple[str, str, int]]:
        """Every ``(domain, op_type, since_version)``, sorted."""
        return sorted(self._rows)
