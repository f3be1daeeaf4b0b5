"""The ONNX Gradient operator on named tensors, as ``jax.vjp`` (SPEC section 6).

ONNX ``ai.onnx.preview.training::Gradient`` names the tensors of a graph: ``xs``
(differentiated), ``zs`` (held fixed) and ``y`` (the target). In JAX a graph is a
function, so the operator is a vector-Jacobian product of that function with
ones, which is ``jax.grad`` for a scalar ``y`` and the gradient of ``sum(y)``
otherwise. The result is an ordinary JAX function: it can be jitted and
differentiated again, which gives higher derivatives by nesting.

:func:`gradient` is the form for a Python function. :class:`optkit.Graph`
(:mod:`optkit._src.graph`) uses the same core, :func:`differentiate`, for its
Gradient nodes. The checks of the operator's attributes (``xs``, ``zs``, ``y``)
and of the values it differentiates are here too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from optkit._src.trees import check_floating

__all__ = ["gradient", "differentiate", "check_names", "check_gradient_names", "check_differentiable", "check_target"]


def check_names(
    arg: str, names: Any, *, allow_empty_list: bool = True, allow_absent: bool = False
) -> tuple[str, ...]:
    """``names`` as a tuple of non-empty, distinct tensor names; errors name ``arg``.

    A bare string is refused rather than read as a list of characters or as a
    one-name list: ``xs="W"`` is almost always a slip for ``xs=["W"]``. With
    ``allow_absent`` (a node's inputs and outputs), ``""`` stands for an absent
    tensor and repeats are left to the caller.
    """
    if isinstance(names, (str, bytes)):
        raise TypeError(f"{arg} must be a sequence of tensor names, got the string "
                        f"{names!r}; write [{names!r}]")
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"{arg} must be a sequence of tensor names, got {names!r}") from None
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{arg} must hold {'' if allow_absent else 'non-empty '}strings, got {name!r}")
        if not name and not allow_absent:
            raise ValueError(f"{arg} must hold non-empty strings, got ''")
    if allow_absent:
        return names
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{arg} names the tensor {name!r} twice")
        seen.add(name)
    if not names and not allow_empty_list:
        raise ValueError(f"{arg} must name at least one tensor")
    return names


def check_gradient_names(xs: Any, zs: Any, y: Any, *, y_required: bool) -> tuple:
    """Validate a Gradient's ``xs``, ``zs`` and ``y`` attributes; return them canonical."""
    xs = check_names("xs", xs, allow_empty_list=False)
    zs = check_names("zs", zs)
    both = [name for name in xs if name in zs]
    if both:
        raise ValueError(f"tensor {both[0]!r} is in both xs and zs; a tensor is either "
                         f"differentiated (xs) or held fixed (zs), not both")
    if y is None:
        if y_required:
            raise ValueError("y (the name of the tensor to differentiate) is required")
    elif not isinstance(y, str) or not y:
        raise TypeError(f"y must be a non-empty tensor name, got {y!r}")
    return xs, zs, y


def _check_float(what: str, value: Any, verb: str, empty_hint: str, type_hint: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``value`` holds floating-point arrays only."""
    if not jax.tree_util.tree_leaves(value):
        raise ValueError(f"{what} {verb} {value!r}, which holds no array; {empty_hint}")
    try:
        check_floating(value, what)
    except TypeError as err:
        raise ValueError(f"{err}; {type_hint}") from None


def check_differentiable(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``xs`` tensor ``name`` if ``value`` is not floating point."""
    _check_float(f"xs tensor {name!r}", value, "was fed",
                 "feed a floating-point array (or a pytree of them) to differentiate",
                 "Gradient differentiates floating-point tensors only (SPEC 6): put integer and boolean tensors in zs")


def check_target(y_name: str, value: Any) -> None:
    """Raise ``ValueError`` naming the Gradient target ``y_name`` if ``value`` is not floating point."""
    _check_float(f"y tensor {y_name!r}", value, "is", "the function must compute a floating-point y to "
                 "differentiate", "only a floating-point y can be differentiated")


def differentiate(
    target: Callable[[tuple[Any, ...]], Any],
    xs: Sequence[str],
    x_values: Sequence[Any],
    y_name: str,
) -> tuple[Any, ...]:
    """Gradient of ``sum(target(x_values))`` with respect to each of ``x_values``.

    The core of both forms of the operator. ``target`` maps the tuple of
    ``xs`` values to ``y`` (an array or a pytree of arrays); the gradient of a
    non-scalar ``y`` is the vector-Jacobian product with ones (SPEC 6,
    Decision: non-scalar y), which equals ``jax.grad`` of ``jnp.sum(y)`` but
    skips materialising the sum. Each gradient has its ``x``'s dtype and shape.

    Raises:
      ValueError: an ``xs`` value or ``y`` is not floating point; the message
        names the tensor.
    """
    for name, value in zip(xs, x_values, strict=True):
        check_differentiable(name, value)
    y, pullback = jax.vjp(target, tuple(x_values))
    check_target(y_name, y)
    # ones_like keeps y's dtype and weak type, which vjp requires of the cotangent.
    (grads,) = pullback(jax.tree_util.tree_map(jnp.ones_like, y))
    return tuple(grads)


def _parameters(fun: Callable[..., Any]) -> tuple[set[str], set[str], list[str]] | None:
    """(names ``fun`` accepts by keyword, names it requires, its positional-only names);
    None if it takes **kwargs or has no inspectable signature."""
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        return None
    accepted, required, positional_only = set(), set(), []
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.POSITIONAL_ONLY:
            positional_only.append(p.name)
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            accepted.add(p.name)
            if p.default is p.empty:
                required.add(p.name)
    return accepted, required, positional_only


def _select(out: Any, y: str | None) -> Any:
    if isinstance(out, Mapping):
        if y is None:
            raise ValueError(f"fun returned a mapping with keys {list(out)}; pass y=<name> "
                             f"to say which tensor to differentiate")
        if y not in out:
            raise ValueError(f"y {y!r} is not computed by fun: it returned the tensors "
                             f"{list(out)}")
        return out[y]
    if y is not None:
        raise ValueError(f"y={y!r} names a tensor, but fun returned y itself (an array or "
                         f"pytree), not a mapping of names to tensors; leave y=None or "
                         f"return {{{y!r}: ...}}")
    return out


def gradient(
    fun: Callable[..., Any],
    xs: Sequence[str],
    zs: Sequence[str] = (),
    y: str | None = None,
) -> Callable[..., tuple[Any, ...]]:
    """The ONNX Gradient operator for a function of named tensors.

    ``gradient(fun, xs, zs, y)(*values)`` is ONNX's
    ``Gradient(xs=xs, zs=zs, y=y)`` node fed with ``values``: the partial
    derivatives of the tensor ``y`` that ``fun`` computes, with respect to each
    tensor named in ``xs``, at the point ``values`` (given for ``xs + zs`` in
    that order). Tensors in ``zs`` are inputs that are not differentiated, of
    any dtype. For a non-scalar ``y`` the result is the gradient of ``sum(y)``.

    The returned function is built from ``jax.vjp``: it can be jitted, and
    differentiated again (``gradient`` of a function that calls ``gradient``,
    ``jax.grad``, ``jax.jvp``...), which is how ONNX expresses second and higher
    derivatives with nested Gradient nodes.

    Args:
      fun: the differentiated (sub-)graph. It is called with one keyword
        argument per name in ``xs + zs`` and returns either an array (or any
        pytree of arrays) that is ``y``, or a mapping from tensor names to
        arrays, of which ``y`` picks one.
      xs: names of the differentiable inputs (ONNX attribute ``xs``), each fed a
        floating-point array or pytree of them (float16, bfloat16, float32,
        float64).
      zs: names of the non-differentiable inputs (ONNX attribute ``zs``); any
        dtype.
      y: name of the target tensor (ONNX attribute ``y``) when ``fun`` returns
        a mapping; None when it returns ``y`` itself.

    Returns:
      A function ``grad_fn(*values)`` of ``len(xs) + len(zs)`` positional
      values (the Gradient node's inputs) that returns a tuple with one
      gradient per name in ``xs``, in ``xs`` order, each with its tensor's
      shape and dtype (the node's outputs ``dY/dX``).

    Raises:
      TypeError: ``xs``/``zs`` is not a sequence of non-empty names, or ``y``
        is not a name.
      ValueError: ``xs`` is empty; a name repeats or is in both ``xs`` and
        ``zs``; ``fun``'s signature lacks a name in ``xs``/``zs`` or needs an
        argument they do not provide. When called: the wrong number of
        values; an integer, boolean or complex ``xs`` value, or one that holds
        no array (None); a non-floating ``y`` or one that holds no array;
        ``y`` not among the tensors ``fun`` returns.

    Source: SPEC section 6 (ONNX ``ai.onnx.preview.training::Gradient``, v1).

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> def model(W, X, L):
      ...     Y = X @ W
      ...     return {"Y": Y, "O": jnp.sum((Y - L) ** 2)}
      >>> dO_dW = optkit.gradient(model, xs=["W"], zs=["X", "L"], y="O")
      >>> X, L, W = jnp.eye(2), jnp.zeros(2), jnp.array([1.0, 2.0])
      >>> dO_dW(W, X, L)[0]                       # 2 X^T (X W - L)
      Array([2., 4.], dtype=float32)
      >>> d2 = optkit.gradient(lambda W, X, L: dO_dW(W, X, L)[0], ["W"], ["X", "L"])
      >>> d2(W, X, L)[0]                          # 2 X^T X 1
      Array([2., 2.], dtype=float32)
    """
    if not callable(fun):
        raise TypeError(f"fun must be callable, got {fun!r}")
    xs, zs, y = check_gradient_names(xs, zs, y, y_required=False)
    names = xs + zs
    params = _parameters(fun)
    if params is not None:
        accepted, required, positional_only = params
        for name in names:
            if name not in accepted:
                hint = (f" (its positional-only parameters {positional_only} cannot be; wrap it, "
                        f"e.g. lambda {name}: fun({name}))" if positional_only else "")
                raise ValueError(f"tensor {name!r} (in {'xs' if name in xs else 'zs'}) is not "
                                 f"an input of fun that can be passed by keyword; those are "
                                 f"{sorted(accepted)}{hint}")
        missing = sorted(required - set(names))
        if missing:
            raise ValueError(f"fun needs the input {missing[0]!r}, which is in neither xs nor "
                             f"zs; xs and zs must together determine y (SPEC 6)")

    def grad_fn(*values: Any) -> tuple[Any, ...]:
        if len(values) != len(names):
            raise ValueError(f"expected {len(names)} values, one per tensor of xs + zs = "
                             f"{list(names)}, got {len(values)}")
        z_kwargs = dict(zip(zs, values[len(xs):], strict=True))

        def target(x_values: tuple[Any, ...]) -> Any:
            return _select(fun(**dict(zip(xs, x_values, strict=True)), **z_kwargs), y)

        return differentiate(target, xs, values[: len(xs)], "y" if y is None else y)

    grad_fn.__name__ = f"gradient_of_{getattr(fun, '__name__', 'fun')}"
    grad_fn.__doc__ = (f"Gradient(xs={list(xs)}, zs={list(zs)}, y={y!r}) of "
                       f"{getattr(fun, '__name__', 'fun')}: values for {list(names)} -> "
                       f"gradients for {list(xs)}.")
    return grad_fn
