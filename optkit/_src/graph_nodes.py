"""The parts of an :class:`optkit.Graph`: its nodes (a JAX callable over named tensors, ONNX's Gradient
node) and its names (:class:`Tensors`: inputs, initializers, nodes, producers, feeds checked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from optkit._src.checks import check_feed, check_names, check_shape

__all__ = ["GraphNode", "GradientNode", "Node", "name_of", "InputSpec", "Tensors"]


@dataclasses.dataclass(frozen=True, eq=False)
class GraphNode:
    """A node ``outputs <- fn(inputs)`` of a :class:`Graph`; made by :meth:`Graph.add`.

    Attributes:
      fn: a JAX-traceable callable. With ``keywords=None`` it is called with
        the input tensors positionally, else as ``fn(**dict(zip(keywords, values)))``.
        An absent optional input (name ``""``) is passed as None.
      inputs: names of the tensors read, in call order; ``""`` is an absent input.
      outputs: names of the tensors produced; ``""`` is an output not produced.
      name: the node's name, used in error messages.
      keywords: the keyword for each input, or None for positional calls.
    """

    fn: Callable[..., Any] = dataclasses.field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str
    keywords: tuple[str, ...] | None = dataclasses.field(default=None, repr=False)

    def __call__(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """Run ``fn`` on the input values; return one value per output name."""
        if self.keywords is None:
            out = self.fn(*values)
        else:
            out = self.fn(**dict(zip(self.keywords, values, strict=True)))
        if len(self.outputs) == 1:
            return (out,)
        if isinstance(out, Mapping):
            missing = [o for o in self.outputs if o and o not in out]
            if missing:
                raise ValueError(f"node {self.name!r} returned the tensors {list(out)}, "
                                 f"without its output {missing[0]!r}")
            return tuple(out[o] if o else None for o in self.outputs)
        if not isinstance(out, (tuple, list)) or len(out) != len(self.outputs):
            got = (f"{len(out)} values" if isinstance(out, (tuple, list))
                   else f"one {type(out).__name__}")
            raise ValueError(f"node {self.name!r} has {len(self.outputs)} outputs "
                             f"{list(self.outputs)} but its function returned {got}; return "
                             f"a tuple with one value per output or a mapping from output names")
        return tuple(out)


@dataclasses.dataclass(frozen=True, eq=False)
class GradientNode:
    """An ONNX Gradient node of a :class:`Graph`; made by :meth:`Graph.add_gradient`.

    Attributes:
      xs, zs, y: the ONNX attributes: the differentiated inputs, the fixed
        inputs, and the target tensor of the sub-graph (SPEC 6).
      inputs: names of the tensors fed for ``xs + zs`` (in that order); the
        gradient is taken at their values.
      outputs: one name per ``xs``: output i is ``dy/d(xs[i])``; ``""`` is not produced.
      name: the node's name, used in error messages.
    """

    xs: tuple[str, ...]
    zs: tuple[str, ...]
    y: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str


Node = GraphNode | GradientNode



def name_of(node: Node) -> str:
    """The node as error messages name it: ``node 'n'`` or ``Gradient node 'g'``."""
    kind = "Gradient node" if isinstance(node, GradientNode) else "node"
    return f"{kind} {node.name!r}"


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A graph input's declared shape (None entries free) and dtype; None leaves either unchecked."""

    shape: tuple[int | None, ...] | None
    dtype: Any


class Tensors:
    """The names of a graph: its inputs, initializers, nodes, and the node that produces each tensor.

    Every definition is claimed here, so a name is defined once (a graph input
    may also be an initializer: its default, ONNX IR semantics).
    """

    def __init__(self) -> None:
        self.inputs: dict[str, InputSpec] = {}
        self.initializers: dict[str, Any] = {}
        self.nodes: list[Node] = []
        self.producer: dict[str, Node] = {}

    def claim(self, name: str, what: str, *, input_and_initializer: bool = False) -> None:
        """Refuse a second definition of ``name``, naming the first. A graph input may
        also be an initializer (its default) when ``input_and_initializer``."""
        if not isinstance(name, str):
            raise TypeError(f"{what} name must be a non-empty string, got {name!r}")
        if not name:
            raise ValueError(f"{what} name must be a non-empty string, got ''")
        if name in self.producer:
            raise ValueError(f"tensor {name!r} ({what}) is already the output of "
                             f"{name_of(self.producer[name])}")
        if name in self.inputs and not (input_and_initializer and what == "initializer"):
            raise ValueError(f"tensor {name!r} ({what}) is already a graph input")
        if name in self.initializers and not (input_and_initializer and what == "graph input"):
            raise ValueError(f"tensor {name!r} ({what}) is already an initializer")

    def add_input(self, name: str, shape: Any = None, dtype: Any = None) -> None:
        """Declare a graph input (see :meth:`optkit.Graph.add_input`)."""
        self.claim(name, "graph input", input_and_initializer=True)
        if shape is not None:
            shape = check_shape(f"graph input {name!r}: shape", shape, allow_none=True)
        if dtype is not None:
            try:
                dtype = jnp.dtype(dtype)
            except TypeError:
                raise TypeError(f"graph input {name!r}: dtype must be a NumPy/JAX dtype, "
                                f"got {dtype!r}") from None
        self.inputs[name] = InputSpec(shape, dtype)

    def add_inputs(self, inputs: Sequence[str] | Mapping[str, Any]) -> None:
        """Declare graph inputs: names, or a mapping from names to None, ``(shape, dtype)`` or a struct."""
        if isinstance(inputs, Mapping):
            for name, spec in inputs.items():
                if spec is None:
                    self.add_input(name)
                elif hasattr(spec, "shape") and hasattr(spec, "dtype"):
                    self.add_input(name, spec.shape, spec.dtype)
                elif isinstance(spec, (tuple, list)) and len(spec) == 2:
                    shape, dtype = spec
                    self.add_input(name, shape, dtype)
                else:
                    raise TypeError(f"graph input {name!r}: expected None, a (shape, dtype) pair or "
                                    f"an object with .shape and .dtype (jax.ShapeDtypeStruct), "
                                    f"got {spec!r}")
        else:
            for name in check_names("inputs", inputs):
                self.add_input(name)

    def add_initializers(self, initializers: Mapping[str, Any] | None) -> None:
        """Add constant tensors from a mapping of names to values (or nothing for None)."""
        if initializers is not None and not isinstance(initializers, Mapping):
            raise TypeError(f"initializers must be a mapping from tensor names to constant "
                            f"tensors, got {type(initializers).__name__}")
        for name, value in (initializers or {}).items():
            self.add_initializer(name, value)

    def add_initializer(self, name: str, value: Any) -> None:
        """Add a constant tensor (see :meth:`optkit.Graph.add_initializer`)."""
        self.claim(name, "initializer", input_and_initializer=True)
        self.initializers[name] = value

    def append(self, node: Node) -> Node:
        """Add ``node``, claiming each of its outputs."""
        named = [out for out in node.outputs if out]
        for out in named:
            if named.count(out) > 1:
                raise ValueError(f"{name_of(node)} names the output {out!r} twice")
            self.claim(out, f"output of {name_of(node)}")
        self.nodes.append(node)
        self.producer.update((out, node) for out in named)
        return node

    def defined(self, name: str) -> bool:
        """True if a graph input, an initializer or a node defines the tensor ``name``."""
        return name in self.producer or name in self.inputs or name in self.initializers

    def check_feed(self, name: str, value: Any) -> None:
        """A value fed for ``name``: a graph input (checked against its spec) or an initializer."""
        spec = self.inputs.get(name)
        if spec is None:
            if name in self.initializers:
                return
            if name in self.producer:
                raise ValueError(f"feed {name!r} is the output of {name_of(self.producer[name])}"
                                 f"; only graph inputs and initializers can be fed")
            raise ValueError(f"feed {name!r} is not a graph input (inputs: {list(self.inputs)})")
        check_feed(name, value, spec.shape, spec.dtype)
