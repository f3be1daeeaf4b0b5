"""The errors optkit.onnx raises besides ``ValueError`` and ``TypeError``."""

from __future__ import annotations

__all__ = ["UnsupportedOpError", "TensorTooLargeError", "ValueDependentError", "RUNS_IN_SEGMENTS", "PAST_CAP"]

# What every ValueDependentError message ends with: what runs such a node.
RUNS_IN_SEGMENTS = ("optkit.onnx.prepare(model).run(...) runs it on concrete values, compiling the rest of the "
                    "graph in segments around the node; inside jax.jit (a to_jax function traced) it cannot run")

# What the error of a compiled Loop stopped at its bound of iterations starts with, inside JAX's runtime error
# (raised by a host callback): :meth:`optkit.onnx.BackendRep.run` re-raises the rest as a ValueError.
PAST_CAP = "optkit.onnx stopped a Loop at its bound: "


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


class ValueDependentError(ValueError):
    """A node whose output shapes depend on input values (``NonZero``, ``Unique``, a ``Loop``'s scan outputs
    when its condition is computed), traced. :class:`~optkit.onnx.BackendRep` catches it and runs the graph as
    compiled segments around such nodes (``optkit.onnx._run.segments``); inside a caller's ``jax.jit`` it reaches
    the caller, naming the node. Not exported: a ``ValueError`` to callers."""
