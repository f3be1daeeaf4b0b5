"""Arithmetic the optimizers share: the compute dtype, ``1 - b^t``, the guarded quotient, concreteness.

Arithmetic dtype: each leaf is computed in the promotion of its inputs' dtypes
with float32 (float16 and bfloat16 tensors are computed in float32, the way
fused GPU optimizers do, and stored back in their own dtype); the scalars
derived from the step count and hyperparameters are computed in that dtype
too, so a float64 run matches the float64 formula to rounding (SPEC.md,
Notation).

Concreteness: a hyperparameter is either known now (a Python number, a
concrete array) or only when the compiled program runs (a tracer, as under
``optax.inject_hyperparams`` inside ``jax.jit``). :func:`concrete_float` tells
them apart; formulas use it to drop terms that cannot change the result.

Nothing here validates: the checks live in :mod:`optkit._src.hyperparams` and
:mod:`optkit._src.trees`, which may call this module, never the other way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

__all__ = [
    "compute_dtype",
    "per_dtype",
    "one_minus_power",
    "guarded_ratio",
    "map_leaves",
    "concrete_float",
    "is_concrete_zero",
    "is_concrete_positive",
]


def compute_dtype(*dtypes: DTypeLike | None) -> np.dtype:
    """The dtype a leaf's arithmetic runs in: its inputs' promotion, at least float32 (None is skipped)."""
    dtype = jnp.dtype(jnp.float32)
    for d in dtypes:
        if d is not None:
            dtype = jnp.promote_types(dtype, d)
    return dtype


def per_dtype(fn: Callable[[np.dtype], Any]) -> Callable[[np.dtype], Any]:
    """``fn(dtype)`` computed once per dtype: a step's scalars, shared by every leaf of that dtype.

    Computing the step scalars (bias corrections, decays, ``b2_t``...) once per
    update rather than once per leaf keeps tracing a tree of thousands of
    leaves linear in the leaves' own arithmetic.
    """
    return functools.cache(fn)


def one_minus_power(b: ArrayLike, t: ArrayLike, dtype: DTypeLike) -> jax.Array:
    """``1 - b^t`` in ``dtype`` for ``b`` in [0, 1) and ``t >= 1``, accurate when ``b`` is near 1.

    ``1 - b`` is formed before ``b`` is rounded to ``dtype`` (a Python float is
    a double), and ``1 - b^t = -expm1(t * log1p(-(1 - b)))``: ``1 - b^t`` written
    out loses the digits of ``1 - b`` (float32 rounds b = 1 - 1e-8 to 1, which
    made Adam's step infinite or zero, and b = 1 - 1e-7 to 1 - 1.19e-7, a 16%
    error in Alpha); this form keeps ``dtype``'s relative accuracy for every b.
    """
    return -jnp.expm1(t * jnp.log1p(-jnp.asarray(1 - b, dtype)))


def guarded_ratio(numerator: jax.Array, root: jax.Array, eps: ArrayLike) -> jax.Array:
    """``numerator / (root + eps)``, and exactly 0 where numerator and root are both 0.

    SPEC 1, Decision (0/0), for Adagrad and Adam: with ``eps = 0`` a coordinate
    whose numerator and accumulator are both 0 would divide 0 by 0; its update
    is 0. The guard is only emitted when ``eps`` may be 0: with a concrete
    positive ``eps`` the denominator is never 0 and the guard would be a
    wasted pass.
    """
    quotient = numerator / (root + eps)
    if is_concrete_positive(eps):
        return quotient
    return jnp.where((numerator == 0) & (root == 0), jnp.zeros_like(quotient), quotient)


def map_leaves(fn: Callable[..., tuple[Any, ...]], num_outputs: int, tree: Any, *others: Any) -> tuple[Any, ...]:
    """Apply a multi-output per-leaf ``fn`` over trees shaped like ``tree``; a tuple of trees back.

    ``others`` may contain None (for example absent ``params``), which passes
    None to ``fn`` for every leaf, and a subtree (a NamedTuple) where ``tree`` has a leaf, passed whole.
    Leaves are converted with ``jnp.asarray``
    (a Python float parameter becomes a weakly typed float32 array). Several
    tensors at once (ONNX's variadic inputs) are any pytree: the formulas are
    element-wise, so applying them leaf by leaf is what ONNX's "several tensors
    behave as one concatenated tensor" means (SPEC 1).
    """
    treedef = jax.tree_util.tree_structure(tree)
    columns = [[jnp.asarray(leaf) for leaf in treedef.flatten_up_to(tree)]]
    for other in others:
        if other is None:
            columns.append([None] * treedef.num_leaves)
        else:  # a NamedTuple where ``tree`` has a leaf (an 8-bit moment's codes and absmax) is passed whole
            columns.append([leaf if isinstance(leaf, tuple) else jnp.asarray(leaf)
                            for leaf in treedef.flatten_up_to(other)])
    results = [fn(*leaves) for leaves in zip(*columns)]
    if not results:  # an empty tree gives empty trees
        return tuple(treedef.unflatten([]) for _ in range(num_outputs))
    return tuple(treedef.unflatten(list(outputs)) for outputs in zip(*results))


def concrete_float(value: Any) -> float | None:
    """``value`` as a Python float if it is a concrete real scalar, else None.

    Tracers (values only known when the compiled program runs) give None.
    Raises ``TypeError`` for non-scalar arrays so that a vector passed as a
    hyperparameter is caught early.
    """
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        if np.ndim(value) != 0:
            raise TypeError(f"expected a scalar, got an array of shape {np.shape(value)}")
        try:
            return float(value)
        except (jax.errors.ConcretizationTypeError, TypeError):
            return None
    return None


def is_concrete_zero(value: Any) -> bool:
    """True if ``value`` is known now (not traced) to be exactly 0.

    Used to drop terms that cannot change the result (a zero ``norm_coefficient``
    means no ``params`` are needed); a traced value keeps the term.
    """
    try:
        number = concrete_float(value)
    except TypeError:
        return False
    return number is not None and number == 0.0


def is_concrete_positive(value: Any) -> bool:
    """True if ``value`` is known now (not traced) to be > 0."""
    try:
        number = concrete_float(value)
    except TypeError:
        return False
    return number is not None and number > 0.0
