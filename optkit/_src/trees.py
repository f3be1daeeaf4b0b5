"""Checks of pytrees: leaf dtypes, structures and shapes that must match, optimizer states, paths in messages.

Every check runs at trace time and names the first pytree path where the trees
differ (``['w']``, ``[0].kernel``), so a mismatch fails before XLA sees it with
the place to look. Hyperparameter checks are in :mod:`optkit._src.hyperparams`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "key_name",
    "keystr",
    "leaf_dtype",
    "keystr",
    "check_floating",
    "check_same_paths",
    "check_same_structure",
    "check_same_shapes",
    "check_params_given",
    "check_params",
    "check_state",
    "check_update_inputs",
    "check_tensors",
    "check_shape",
]


def key_name(key: Any) -> str:
    """A pytree key as a name: a dict key, an attribute name or a sequence index, as a string."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def keystr(path: Sequence[Any], sep: str | None = None) -> str:
    """A pytree key path as text: JAX's ``['a'][0]`` (the root written ``<root>``), or with ``sep`` the
    keys' names joined by it (``"a/0"``, as T5X names parameters)."""
    if sep is not None:
        return sep.join(key_name(k) for k in path)
    text = jax.tree_util.keystr(tuple(path))
    return text if text else "<root>"


def leaf_dtype(leaf: Any, canonical: bool = False) -> np.dtype:
    """A leaf's dtype (a Python scalar's as JAX types it); ``canonical``: as JAX stores it (no 64-bit
    types with x64 off)."""
    dtype = jnp.dtype(leaf.dtype) if hasattr(leaf, "dtype") else jnp.result_type(leaf)
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype)) if canonical else dtype


def check_floating(tree: Any, name: str) -> None:
    """Raise ``TypeError`` naming the first leaf of ``tree`` that is not floating point.

    Python floats pass (they become weakly typed float arrays); ints, bools,
    complex numbers and integer arrays do not.
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        if isinstance(leaf, (bool, int, complex)) and not isinstance(leaf, float):
            raise TypeError(
                f"{name} leaf at {keystr(path)} must be a floating-point array, "
                f"got the Python {type(leaf).__name__} {leaf!r}"
            )
        if not hasattr(leaf, "dtype") and not isinstance(leaf, float):
            raise TypeError(
                f"{name} leaf at {keystr(path)} must be a floating-point array, "
                f"got {type(leaf).__name__}"
            )
        dtype = leaf_dtype(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name} leaf at {keystr(path)} must be a floating-point array, got dtype {dtype}"
            )


def _paths(tree: Any) -> list[str]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [keystr(path) for path, _ in leaves]


def check_same_paths(paths: Sequence[str], ref_paths: Sequence[str], name: str, reference_name: str) -> None:
    """Raise ``ValueError`` naming the first leaf path (as text) where two lists of paths differ."""
    for i, (p, q) in enumerate(zip(paths, ref_paths)):
        if p != q:
            raise ValueError(
                f"{name} does not match {reference_name}: leaf {i} is at {p} in {name} "
                f"but at {q} in {reference_name}"
            )
    if len(paths) != len(ref_paths):
        longer, which = (paths, name) if len(paths) > len(ref_paths) else (ref_paths, reference_name)
        extra = longer[min(len(paths), len(ref_paths))]
        raise ValueError(
            f"{name} does not match {reference_name}: {name} has {len(paths)} leaves and "
            f"{reference_name} has {len(ref_paths)}; the first extra leaf is {extra} in {which}"
        )


def check_same_structure(tree: Any, reference: Any, name: str, reference_name: str) -> None:
    """Raise ``ValueError`` if ``tree`` and ``reference`` are different pytrees.

    The message names the first path present in one tree and not the other,
    or the first node whose container type differs.
    """
    treedef = jax.tree_util.tree_structure(tree)
    ref_treedef = jax.tree_util.tree_structure(reference)
    if treedef == ref_treedef:
        return
    check_same_paths(_paths(tree), _paths(reference), name, reference_name)
    raise ValueError(
        f"{name} does not match {reference_name}: the same leaf paths but different "
        f"container types ({treedef} vs {ref_treedef})"
    )


def check_same_shapes(tree: Any, reference: Any, name: str, reference_name: str) -> None:
    """Check structure, then that every leaf of ``tree`` has its reference leaf's shape."""
    check_same_structure(tree, reference, name, reference_name)
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    ref_leaves = jax.tree_util.tree_leaves(reference)
    for (path, leaf), ref in zip(leaves, ref_leaves):
        if np.shape(leaf) != np.shape(ref):
            raise ValueError(
                f"{name} leaf at {keystr(path)} has shape {np.shape(leaf)} but {reference_name} "
                f"has shape {np.shape(ref)} there"
            )


def check_params_given(params: Any, transformation: str, reason: str) -> None:
    """Raise ``ValueError`` if ``params`` is None where the algorithm needs them."""
    if params is None:
        raise ValueError(
            f"{transformation}: params=None, but {reason} needs the parameters; "
            f"call update(grads, state, params)"
        )


def check_params(params: Any, updates: Any) -> None:
    """``params`` given to ``update`` must match ``updates`` (structure and shapes) and be floating.

    ``init`` refuses non-floating parameters; ``update`` refuses them too, so a
    tree with an integer leaf cannot slip in at the second call.
    """
    check_same_shapes(params, updates, "params", "updates")
    check_floating(params, "params")


def check_state(state: Any, state_type: type, transformation: str) -> Any:
    """``state`` as a ``state_type``, or a ``TypeError`` unless it has that NamedTuple's fields.

    Duck-typed on the NamedTuple's fields, so a state restored from a
    checkpoint (Orbax, ``flax.serialization``) into the same NamedTuple
    passes, and so does a mapping with exactly those keys (what
    ``flax.serialization.to_state_dict`` gives; it is read as the NamedTuple);
    None, a dict of other keys, or another optimizer's state fails here with a
    message instead of an ``AttributeError`` deep inside ``update``.
    """
    fields = getattr(state_type, "_fields", ())
    if isinstance(state, Mapping) and not isinstance(state, tuple) and set(state) == set(fields):
        return state_type(**{field: state[field] for field in fields})
    if all(hasattr(state, field) for field in fields):
        return state
    raise TypeError(
        f"{transformation}: state must be the {state_type.__name__} that its init returned "
        f"(fields {list(fields)}), got {type(state).__name__}; did you pass another "
        f"optimizer's state, or None?"
    )


def check_update_inputs(
    transformation: str,
    updates: Any,
    state_trees: Mapping[str, Any],
    params: Any,
    params_needed_for: str | None,
) -> None:
    """The checks every optkit ``update_fn`` makes at trace time.

    ``updates`` must be floating; each tree of ``state_trees`` (named as the
    user would write it, e.g. ``"state.mu"``) and ``params`` (when given) must
    have the same structure and shapes as ``updates``, and ``params`` must be
    floating. ``params_needed_for``, when not None, says which term needs
    ``params`` so that None is an error.
    """
    check_floating(updates, "updates")
    for name, tree in state_trees.items():
        check_same_shapes(tree, updates, name, "updates")
    if params is None:
        # An empty tree has nothing the term could scale (optax.masked and partition pass empty trees).
        if params_needed_for is not None and jax.tree_util.tree_leaves(updates):
            check_params_given(params, transformation, params_needed_for)
    else:
        check_params(params, updates)


def check_tensors(reference_name: str, reference: Any, **others: Any) -> None:
    """A spec op's tensor inputs: floating, at least one, and every other tree shaped like ``reference``."""
    check_floating(reference, reference_name)
    if not jax.tree_util.tree_leaves(reference):
        raise ValueError(f"{reference_name} must hold at least one tensor, got {reference!r}")
    for name, tree in others.items():
        check_same_shapes(tree, reference, name, reference_name)
        check_floating(tree, name)


def check_shape(name: str, shape: Any, *, allow_none: bool = False) -> tuple[int | None, ...]:
    """``shape`` as a tuple of Python ints, each non-negative (or None, if ``allow_none``).

    Raises:
      TypeError: ``shape`` is not a sequence of integers (None, a string, a float entry...).
      ValueError: an entry is negative.
    """
    what = "a sequence of non-negative integers" + (" and None (free dimensions)" if allow_none else "")
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be {what}, got {shape!r}")
    dims: list[int | None] = []
    for d in shape:
        if d is None and allow_none:
            dims.append(None)
            continue
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{name} must be {what}, got the entry {d!r} in {tuple(shape)!r}")
        if d < 0:
            raise ValueError(f"{name} must be {what}, got {d} in {tuple(shape)!r}")
        dims.append(int(d))
    return tuple(dims)
