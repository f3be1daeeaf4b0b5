"""The nodes of an :class:`optkit.Graph`: a JAX callable over named tensors, and ONNX's Gradient node (SPEC 6)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optkit._src.gradient import check_gradient_names, check_names

__all__ = ["GraphNode", "GradientNode", "Node", "name_of", "check_gradient_node"]


@dataclasses.dataclass(frozen=True, eq=False)
class GraphNode:
    """A node ``outputs <- fn(inputs)`` of a :class:`Graph`; made by :meth:`~optkit.Graph.add`.

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
    """An ONNX Gradient node of a :class:`Graph`; made by :meth:`~optkit.Graph.add_gradient`.

    Attributes:
      xs: ONNX attribute ``xs``: the differentiated inputs of the sub-graph (SPEC 6).
      zs: ONNX attribute ``zs``: its fixed inputs.
      y: ONNX attribute ``y``: its target tensor.
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


def check_gradient_node(xs: Any, zs: Any, y: Any, inputs: Any, outputs: Any) -> tuple:
    """A Gradient node's attributes, inputs (default ``xs + zs``) and outputs (default ``d{y}/d{x}``).

    Returns ``(xs, zs, y, inputs, outputs)`` as tuples of names. The same tensor
    may be fed for two names, so repeated inputs are allowed; ``""`` marks an
    output not produced.

    Raises:
      TypeError, ValueError: as :func:`check_gradient_names`; an absent input, or
        a count of inputs or outputs that does not fit ``xs + zs`` and ``xs``.
    """
    xs, zs, y = check_gradient_names(xs, zs, y, y_required=True)
    fed = xs + zs if inputs is None else check_names("inputs", inputs, allow_absent=True)
    if "" in fed:
        raise ValueError(f"a Gradient node needs a value for every tensor of xs + zs; "
                         f"inputs {list(fed)} has an absent ('') entry")
    if len(fed) != len(xs) + len(zs):
        raise ValueError(f"a Gradient node is fed one value per tensor of xs + zs = "
                         f"{list(xs + zs)}, so it needs {len(xs) + len(zs)} inputs, "
                         f"got {len(fed)}: {list(fed)}")
    if outputs is None:
        outputs = tuple(f"d{y}/d{x}" for x in xs)
    outputs = check_names("outputs", outputs, allow_absent=True)
    if len(outputs) != len(xs):
        raise ValueError(f"a Gradient node has one output per tensor of xs = {list(xs)}, "
                         f"got {len(outputs)}: {list(outputs)} (use '' to skip one)")
    return xs, zs, y, fed, outputs
