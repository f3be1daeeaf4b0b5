"""The names of an :class:`optkit.Graph`: its inputs, initializers, nodes and the node that produces each
tensor (:class:`Tensors`), and the check of a value fed for a graph input."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from optkit._src.gradient import check_names
from optkit._src.graph.nodes import Node, name_of
from optkit._src.trees import check_shape

__all__ = ["InputSpec", "Tensors", "check_feed", "shape_text"]


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


def shape_text(shape: Sequence[Any] | None) -> str:
    """A declared shape as text, ``(N, 3)``: an int, a symbolic name, ``?`` for an unknown dimension."""
    if shape is None:
        return "(any shape)"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def check_feed(name: str, value: Any, shape: Sequence[Any] | None, dtype: Any, *, exact: bool = False) -> None:
    """A value fed for graph input ``name`` against its declared ``shape`` and ``dtype``.

    ``shape`` entries are ints (checked), or None or a symbolic name (free);
    None for the whole shape or ``dtype`` leaves that unchecked. Values without
    ``.shape``/``.dtype`` (pytrees fed to an :class:`optkit.Graph`) pass.

    Raises:
      TypeError: a dtype other than the declared one, with ``exact`` (ONNX's
        rule: no implicit conversion); a ValueError without it.
      ValueError: another rank, or another size on a fixed dimension.
    """
    if dtype is not None and hasattr(value, "dtype") and jnp.dtype(value.dtype) != jnp.dtype(dtype):
        if exact:
            raise TypeError(f"graph input {name!r} is declared {jnp.dtype(dtype)}, fed {jnp.dtype(value.dtype)}; "
                            f"ONNX does not convert types implicitly: cast the value first")
        raise ValueError(f"graph input {name!r} is declared {jnp.dtype(dtype)}, fed {jnp.dtype(value.dtype)}")
    if shape is not None and hasattr(value, "shape"):
        got = tuple(value.shape)
        if len(got) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(shape, got)):
            raise ValueError(f"graph input {name!r} is declared with shape {shape_text(shape)}, fed shape {got}")
