"""Handlers for ``ai.onnx.preview.training``: Adagrad, Adam, Momentum (and Gradient's row).

The optimizer handlers parse ONNX's variadic form — ``R, T``, then ``n``
tensors of each kind — and call the spec ops of :mod:`optkit.ops`, where the
arithmetic lives (SPEC sections 1, 3, 4). The Gradient operator (SPEC 6) has
no handler: the loader maps it onto :meth:`optkit.Graph.add_gradient`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from optkit._src import checks, ops
from optkit.onnx._table import TRAINING_DOMAIN, NodeContext, register, register_marker

register_marker("Gradient", 1, domain=TRAINING_DOMAIN)


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


def _check_attribute(ctx: NodeContext, name: str, **bounds: Any) -> float:
    value = ctx.attrs[name]
    try:
        checks.check_scalar(name, value, **bounds)
    except (TypeError, ValueError) as err:
        raise type(err)(ctx.message(f"attribute {err}")) from None
    return float(value)


def _split(values: Sequence[Any], n: int, parts: int) -> list[list[Any]]:
    return [list(values[i * n:(i + 1) * n]) for i in range(parts)]


def _named_errors(ctx: NodeContext, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Re-raise the spec op's trace-time errors with the node's name and tensor names."""

    def call(*values):
        try:
            return fn(*values)
        except (TypeError, ValueError) as err:
            raise type(err)(ctx.message(f"{err} (inputs {list(ctx.inputs)}; X, G... leaves are "
                                        f"numbered from 0 in that order)")) from None

    return call


@register("Adagrad", 1, domain=TRAINING_DOMAIN)
def _adagrad(ctx: NodeContext):
    """SPEC 1: inputs R, T, X_1..X_n, G_1..G_n, H_1..H_n; outputs X_new..., H_new..."""
    n = _count_tensors(ctx, ("X", "G", "H"), ("X_new", "H_new"))
    attrs = {
        "decay_factor": _check_attribute(ctx, "decay_factor", low=0.0),
        "epsilon": _check_attribute(ctx, "epsilon", low=0.0),
        "norm_coefficient": _check_attribute(ctx, "norm_coefficient", low=0.0),
    }

    def adagrad(R, T, *tensors):
        X, G, H = _split(tensors, n, 3)
        out = ops.onnx_adagrad(R, T, X, G, H, **attrs)
        return (*out.X_new, *out.H_new)

    return _named_errors(ctx, adagrad)


@register("Adam", 1, domain=TRAINING_DOMAIN)
def _adam(ctx: NodeContext):
    """SPEC 3: inputs R, T, X..., G..., V... (first moments), H... (second); outputs X_new, V_new, H_new."""
    n = _count_tensors(ctx, ("X", "G", "V", "H"), ("X_new", "V_new", "H_new"))
    attrs = {
        "alpha": _check_attribute(ctx, "alpha", low=0.0, high=1.0, high_open=True),
        "beta": _check_attribute(ctx, "beta", low=0.0, high=1.0, high_open=True),
        "epsilon": _check_attribute(ctx, "epsilon", low=0.0),
        "norm_coefficient": _check_attribute(ctx, "norm_coefficient", low=0.0),
        "norm_coefficient_post": _check_attribute(ctx, "norm_coefficient_post", low=0.0, high=1.0,
                                                  high_open=True),
    }

    def adam(R, T, *tensors):
        X, G, V, H = _split(tensors, n, 4)
        out = ops.onnx_adam(R, T, X, G, V, H, **attrs)
        return (*out.X_new, *out.V_new, *out.H_new)

    return _named_errors(ctx, adam)


@register("Momentum", 1, domain=TRAINING_DOMAIN)
def _momentum(ctx: NodeContext):
    """SPEC 4: inputs R, T, X..., G..., V...; outputs X_new..., V_new...; all attributes required."""
    n = _count_tensors(ctx, ("X", "G", "V"), ("X_new", "V_new"))
    mode = ctx.attrs["mode"]
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"attribute mode must be 'standard' or 'nesterov', got {mode!r}")
    attrs = {
        "alpha": _check_attribute(ctx, "alpha", low=0.0),
        "beta": _check_attribute(ctx, "beta", low=0.0),
        "norm_coefficient": _check_attribute(ctx, "norm_coefficient", low=0.0),
        "mode": mode,
    }

    def momentum(R, T, *tensors):
        X, G, V = _split(tensors, n, 3)
        out = ops.onnx_momentum(R, T, X, G, V, **attrs)
        return (*out.X_new, *out.V_new)

    return _named_errors(ctx, momentum)
