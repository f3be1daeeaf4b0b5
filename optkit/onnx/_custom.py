"""A user's own operators: :func:`register_op` and :func:`unregister_op`.

A registration is a row of the one op table (:data:`optkit.onnx._ops.TABLE`), built by the same
:class:`~optkit.onnx._ops._registry.OpSpec` as optkit's own operators; every runner (``to_jax``,
``prepare``, ``OnnxModule``, the command line's ``check``) then runs it like any other node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from optkit.onnx._base.values import normalize_domain
from optkit.onnx._ops import TABLE
from optkit.onnx._ops._registry import NodeContext, OpSpec

__all__ = ["register_op", "unregister_op"]


def _builder(fn: Callable[..., Any]) -> Callable[[NodeContext], Callable[..., Any]]:
    def build(ctx: NodeContext) -> Callable[..., Any]:
        attrs = dict(ctx.attrs)

        def node(*inputs: Any) -> Any:
            try:
                out = fn(*inputs, **attrs)
            except Exception as err:  # the user's function: its own error, with the node named in a note
                err.add_note(ctx.message(f"raised by the function registered for it, {_name(fn)}"))
                raise
            if isinstance(out, list):
                out = tuple(out)
            if isinstance(out, tuple) and len(out) < len(ctx.outputs):
                raise ctx.error(f"the registered function {_name(fn)} returned {len(out)} values for the node's "
                                f"{len(ctx.outputs)} outputs")
            return out

        return node

    return build


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def register_op(
    domain: str,
    op_type: str,
    fn: Callable[..., Any] | None = None,
    *,
    since_version: int = 1,
    static_inputs: Sequence[int] = (),
    replace: bool = False,
) -> Any:
    """Run the nodes ``domain::op_type`` of any model with ``fn``: a user's or a vendor's operator.

    ``fn(*inputs, **attributes)`` receives the node's inputs as JAX arrays (``None`` for an absent optional
    input; NumPy arrays for the positions in ``static_inputs``, and for every input when all of them are
    known before running, as constants are folded) and its attributes as Python values (ints, floats,
    ``str``, lists, NumPy arrays for tensors). It returns one array, or a tuple with one array per output
    (extra trailing values are dropped when the node names fewer outputs). It is traced like optkit's own
    operators: output shapes and dtypes follow from JAX's tracing, the gradient is JAX's (``jax.grad`` of
    ``fn``; write a ``jax.custom_vjp`` for another one), and it compiles under ``jax.jit``.

    The model must import ``domain`` (``opset_import``) at a version ``>= since_version``; a node of an
    operator optkit does not run raises :class:`optkit.onnx.UnsupportedOpError`, whose message points here.
    Registrations are process-wide (as ONNX Runtime's custom-op libraries are per session options, these are
    per process); a model already converted keeps the functions it was converted with.

    Args:
      domain: the operator's domain (``"com.example"``; ``""`` or ``"ai.onnx"`` for the default domain, for an
        operator ONNX defines that optkit does not run).
      op_type: the node's ``op_type``.
      fn: the function; leave it out to use ``register_op`` as a decorator.
      since_version: the first opset version of ``domain`` this ``fn`` implements (an integer >= 1).
      static_inputs: positions of inputs that must be known before running (initializers, constants,
        shapes): they reach ``fn`` as NumPy arrays, as a ``Reshape``'s shape does.
      replace: replace an earlier registration of the same operator and version.

    Returns:
      ``fn`` (so the decorator form leaves it usable), or the decorator.

    Raises:
      ValueError: ``op_type`` or ``domain`` empty or not a string, ``since_version`` < 1, an operator optkit
        itself runs at any version (``Relu`` in the default domain: register under your own domain), or a version
        registered already without ``replace=True``.
      TypeError: ``fn`` not callable.

    Source: the ONNX IR's operator sets (``opset_import``, ``since_version``); ONNX Runtime's custom operators
    and onnx2torch's ``add_converter`` are the same idea.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> @optkit.onnx.register_op("com.example", "ScaledTanh")
      ... def scaled_tanh(x, *, alpha=1.0):
      ...     return alpha * jnp.tanh(x)
      >>> info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
      >>> node = helper.make_node("ScaledTanh", ["x"], ["y"], domain="com.example", alpha=2.0)
      >>> model = helper.make_model(helper.make_graph([node], "g", [info("x")], [info("y")]),
      ...     opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
      >>> apply_fn, params = optkit.onnx.to_jax(model)
      >>> jax.grad(lambda x: apply_fn(params, x).sum())(jnp.zeros(2, jnp.float32))
      Array([2., 2.], dtype=float32)
      >>> optkit.onnx.unregister_op("com.example", "ScaledTanh")
      True
    """
    if not isinstance(domain, str) or not isinstance(op_type, str) or not op_type:
        raise ValueError(f"register_op: domain must be a string and op_type a non-empty string, got "
                         f"domain={domain!r}, op_type={op_type!r}")
    if isinstance(since_version, bool) or not isinstance(since_version, int) or since_version < 1:
        raise ValueError(f"register_op: since_version must be an integer >= 1, got {since_version!r}")
    statics = tuple(static_inputs)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in statics):
        raise ValueError(f"register_op: static_inputs must be input positions (integers >= 0), got {statics!r}")

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise TypeError(f"register_op({domain!r}, {op_type!r}): fn must be callable, got "
                            f"{type(function).__name__}")
        spec = OpSpec(op_type, (since_version,), _builder(function), normalize_domain(domain),
                      static_inputs=statics)
        TABLE.add(spec, replace=replace)
        return function

    return register if fn is None else register(fn)


def unregister_op(domain: str, op_type: str) -> bool:
    """Remove every registration of ``domain::op_type`` made by :func:`register_op`.

    Returns:
      True if there was one.

    Raises:
      ValueError: one of optkit's own operators.

    Example:
      >>> import optkit.onnx
      >>> optkit.onnx.unregister_op("com.example", "NotRegistered")
      False
    """
    return TABLE.remove(domain, op_type)
