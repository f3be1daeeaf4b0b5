"""``ai.onnx.preview.training``: Gradient (SPEC 6), Adagrad, Adam, Momentum (SPEC 1, 3, 4).

Gradient's builder checks the node's attributes and returns a
:class:`~optkit.onnx._ops._registry.GradientRequest`, which the converter makes
an :class:`optkit.Graph` Gradient node (``jax.vjp`` of its sub-graph). The
optimizer handlers parse ONNX's variadic form (``R, T``, then ``n`` tensors of
each kind) and call the public spec operators of :mod:`optkit.ops`, where the
arithmetic and the attributes' bounds live: a node's attributes are checked
when it is loaded by tracing its operator abstractly on one tiny tensor of
each kind, so nothing about the operators is repeated here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import optkit.ops
from optkit._src.gradient import check_gradient_names
from optkit.onnx._base.values import TRAINING_DOMAIN
from optkit.onnx._ops._registry import Family, GradientRequest, NodeContext

# optimizer -> its tensor kinds after R, T (SPEC 1, 3, 4): G is read, the others are updated (X_new, ...).
OPTIMIZER_KINDS = {"Adagrad": ("X", "G", "H"), "Adam": ("X", "G", "V", "H"), "Momentum": ("X", "G", "V")}

OPS = Family("training", domain=TRAINING_DOMAIN)


@OPS.op("Gradient", 1)
def _gradient(ctx: NodeContext) -> GradientRequest:
    """SPEC 6: inputs the values fed for ``xs + zs``; outputs ``dy/dx`` for each of ``xs`` ('' not produced)."""
    try:
        xs, zs, y = check_gradient_names(list(ctx.attrs.get("xs", ())), list(ctx.attrs.get("zs", ())),
                                         ctx.attrs.get("y"), y_required=True)
    except (TypeError, ValueError) as err:
        raise type(err)(ctx.message(str(err))) from None
    return GradientRequest(xs, zs, y)


def _count_tensors(ctx: NodeContext, kinds: Sequence[str], results: Sequence[str]) -> int:
    """``n`` for a node with inputs ``R, T, <n of each kind>`` and ``n`` outputs of each result.

    Raises:
      ValueError: the input count is not ``2 + k*n`` with ``n >= 1``, an input
        is absent, or the output count is not ``len(results) * n``.
    """
    k = len(kinds)
    count = len(ctx.inputs)
    layout = f"R, T, then n tensors each of {', '.join(kinds)}"
    if count < 2 + k or (count - 2) % k:
        raise ctx.error(f"expects 2 + {k}*n inputs ({layout}; n >= 1), got {count} inputs "
                        f"{list(ctx.inputs)}")
    n = (count - 2) // k
    absent = [i for i, name in enumerate(ctx.inputs) if not name]
    if absent:
        raise ctx.error(f"input {absent[0]} is absent (''); every input of {layout} is required")
    if len(ctx.outputs) != len(results) * n:
        raise ctx.error(f"has {n} tensors ({count} inputs: {layout}), so it must have "
                        f"{len(results)}*{n} = {len(results) * n} outputs "
                        f"({', '.join(f'{n} {r}' for r in results)}), got {len(ctx.outputs)}")
    return n


def _split(values: Sequence[Any], n: int, parts: int) -> list[list[Any]]:
    return [list(values[i * n:(i + 1) * n]) for i in range(parts)]


def _operator(ctx: NodeContext, op: Callable[..., Any], parts: int, n: int, attrs: dict[str, Any]):
    """The node's function: ``op`` on ``R, T`` and ``parts`` lists of ``n`` tensors, attributes checked now.

    Checking: ``op`` is traced once with ``jax.eval_shape`` on one float32 tensor
    of shape (1,) per kind, so its own validation names any attribute out of
    range before the model runs. At run time its trace-time errors name the
    node and its tensors.
    """
    tensor = jax.ShapeDtypeStruct((1,), jnp.float32)
    try:
        jax.eval_shape(lambda R, T, *t: op(R, T, *[[x] for x in t], **attrs),
                       jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32),
                       *[tensor] * parts)
    except (TypeError, ValueError) as err:
        raise type(err)(ctx.message(f"attribute {err}")) from None

    def run(R, T, *tensors):
        try:
            return op(R, T, *_split(tensors, n, parts), **attrs)
        except (TypeError, ValueError) as err:
            raise type(err)(ctx.message(f"{err} (inputs {list(ctx.inputs)}; X, G... leaves are "
                                        f"numbered from 0 in that order)")) from None

    return run


def _attributes(ctx: NodeContext, names: Sequence[str]) -> dict[str, Any]:
    return {name: ctx.attrs[name] for name in names}


def _outputs(run: Callable[..., Any], fields: Sequence[str]) -> Callable[..., tuple[Any, ...]]:
    """The node's outputs in ONNX's order: every tensor of the first output kind, then the next..."""

    def node(R, T, *tensors):
        out = run(R, T, *tensors)
        return tuple(tensor for field in fields for tensor in getattr(out, field))

    return node


@OPS.op("Adagrad", 1)
def _adagrad(ctx: NodeContext):
    """SPEC 1: inputs R, T, X_1..X_n, G_1..G_n, H_1..H_n; outputs X_new..., H_new..."""
    n = _count_tensors(ctx, OPTIMIZER_KINDS["Adagrad"], ("X_new", "H_new"))
    run = _operator(ctx, optkit.ops.onnx_adagrad, 3, n,
                    _attributes(ctx, ("decay_factor", "epsilon", "norm_coefficient")))
    return _outputs(run, ("X_new", "H_new"))


@OPS.op("Adam", 1)
def _adam(ctx: NodeContext):
    """SPEC 3: inputs R, T, X..., G..., V... (first moments), H... (second); outputs X_new, V_new, H_new."""
    n = _count_tensors(ctx, OPTIMIZER_KINDS["Adam"], ("X_new", "V_new", "H_new"))
    run = _operator(ctx, optkit.ops.onnx_adam, 4, n, _attributes(
        ctx, ("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post")))
    return _outputs(run, ("X_new", "V_new", "H_new"))


@OPS.op("Momentum", 1)
def _momentum(ctx: NodeContext):
    """SPEC 4: inputs R, T, X..., G..., V...; outputs X_new..., V_new...; all attributes required."""
    n = _count_tensors(ctx, OPTIMIZER_KINDS["Momentum"], ("X_new", "V_new"))
    if ctx.attrs["mode"] not in ("standard", "nesterov"):  # ONNX's text form of the op's choice
        raise ctx.error(f"attribute mode must be 'standard' or 'nesterov', got {ctx.attrs['mode']!r}")
    run = _operator(ctx, optkit.ops.onnx_momentum, 3, n,
                    _attributes(ctx, ("alpha", "beta", "mode", "norm_coefficient")))
    return _outputs(run, ("X_new", "V_new"))
