"""Every validation of optkit: hyperparameters, trees, dtypes, step counts, names, feeds, concreteness.

Every check runs in Python at construction or trace time, so a bad input fails
before XLA sees it, with a message that names the argument or the pytree path.
Values that are JAX tracers (for example hyperparameters under
``optax.inject_hyperparams`` inside ``jax.jit``) cannot be inspected at trace
time; range checks skip them, as the public docstrings say, and the
concreteness tests here (:func:`is_concrete_zero`, :func:`params_needed_for`)
decide which terms a formula may drop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "concrete_float",
    "check_scalar",
    "check_choice",
    "check_dtype",
    "check_floating",
    "check_same_structure",
    "check_same_shapes",
    "check_params_given",
    "keystr",
    "check_same_paths",
    "check_update_inputs",
    "check_params",
    "check_state",
    "check_step_count",
    "check_count",
    "check_decay",
    "check_tensors",
    "is_concrete_zero",
    "is_concrete_positive",
    "params_needed_for",
    "check_factoring",
    "concrete_min_dim_size",
    "check_names",
    "check_gradient_names",
    "check_gradient_node",
    "check_differentiable",
    "check_target",
    "check_feed",
    "shape_text",
    "check_rate_scalar",
    "check_shape",
]


def keystr(path: Sequence[Any]) -> str:
    """A pytree key path as text; the root is written ``<root>``."""
    text = jax.tree_util.keystr(tuple(path))
    return text if text else "<root>"


def concrete_float(value: Any) -> float | None:
    """``value`` as a Python float if it is a concrete real scalar, else None.

    Tracers (values only known when the compiled program runs) give None.
    Raises ``TypeError`` for non-scalar arrays so that a vector passed as a
    hyperparameter is caught early.
    """
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
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


def check_scalar(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_schedule: bool = False,
    allow_none: bool = False,
) -> None:
    """Check a numeric hyperparameter against a range, naming it on failure.

    Args:
      name: the argument's name as the user wrote it (used in messages).
      value: a Python number, a 0-d array, a tracer (skipped), a callable if
        ``allow_schedule`` (skipped: an Optax schedule), or None if ``allow_none``.
      low, high: bounds; ``low_open``/``high_open`` exclude the bound itself.

    Raises:
      TypeError: ``value`` is not a real scalar (or schedule, where allowed).
      ValueError: ``value`` is NaN, infinite, or outside the range.
    """
    if value is None:
        if allow_none:
            return
        raise TypeError(f"{name} must be a number, got None")
    if callable(value) and not isinstance(value, (jax.Array, np.ndarray, np.generic)):
        if allow_schedule:
            return
        raise TypeError(f"{name} must be a number, got the callable {value!r}")
    if isinstance(value, (str, bytes)) or (
        hasattr(value, "dtype") and not jnp.issubdtype(value.dtype, np.number)
        and not jnp.issubdtype(value.dtype, np.bool_)
    ):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if hasattr(value, "dtype") and jnp.issubdtype(value.dtype, np.complexfloating):
        raise TypeError(f"{name} must be a real number, got a complex value")
    try:
        number = concrete_float(value)
    except TypeError as err:
        raise TypeError(f"{name} must be a scalar: {err}") from None
    if number is None:
        if not isinstance(value, jax.core.Tracer) and not hasattr(value, "dtype"):
            raise TypeError(f"{name} must be a real number, got {value!r}")
        return
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{name} must be finite, got {number}")
    if low is not None and (number < low or (low_open and number == low)):
        raise ValueError(f"{name} must be {_range_text(low, high, low_open, high_open)}, got {number}")
    if high is not None and (number > high or (high_open and number == high)):
        raise ValueError(f"{name} must be {_range_text(low, high, low_open, high_open)}, got {number}")


def _range_text(low, high, low_open, high_open) -> str:
    if high is None:
        return f"> {low:g}" if low_open else f">= {low:g}"
    if low is None:
        return f"< {high:g}" if high_open else f"<= {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


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


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming ``name`` if ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)!r}, got {value!r}")


def check_dtype(name: str, dtype: Any) -> Any:
    """Canonicalize an optional state dtype; it must be a floating dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{name} must be a floating dtype or None, got an array; under optax.inject_hyperparams a dtype "
            f"such as jnp.float32 is callable and is taken for a schedule: pass static_args=({name!r},)"
        )
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype or None, got {dtype!r}") from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating dtype or None, got {dtype}")
    return jax.dtypes.canonicalize_dtype(dtype)


def _leaf_dtype(leaf: Any):
    if hasattr(leaf, "dtype"):
        return jnp.dtype(leaf.dtype)
    return jnp.result_type(leaf)


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
        dtype = _leaf_dtype(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name} leaf at {keystr(path)} must be a floating-point array, got dtype {dtype}"
            )


def _paths(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[str]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
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


def check_same_structure(
    tree: Any, reference: Any, name: str, reference_name: str
) -> None:
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
    state_trees: dict[str, Any],
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


def _scalar_dtype(name: str, value: Any, what: str) -> Any:
    """The dtype ``value`` has as a JAX array, or a ``TypeError`` naming ``name``.

    ``jnp.result_type`` reads a string as a dtype name ("0.1" gives "data type
    '.1' not understood") and None as float32; both are refused here.
    """
    if value is None or isinstance(value, (str, bytes)) or (callable(value) and not hasattr(value, "dtype")):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        return jnp.result_type(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be {what}, got {value!r}") from None


def check_step_count(name: str, value: Any) -> jax.Array:
    """A spec op's step input ``T``: an integer scalar >= 0 (checked when concrete), as an array.

    Raises:
      TypeError: ``value`` is not an integer (bool, float, None, a string...).
      ValueError: ``value`` is not a scalar, is negative, or is a Python int
        too large for the integer dtype JAX uses (int32 without
        ``jax_enable_x64``).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        # A Python int becomes JAX's default integer (int32 without jax_enable_x64).
        limit = np.iinfo(jax.dtypes.canonicalize_dtype(np.int64)).max
        if value < 0:
            raise ValueError(f"{name} (the step count) must be >= 0, got {value}")
        if value > limit:
            raise ValueError(
                f"{name} = {value} does not fit JAX's default integer type (largest {limit}); "
                f"enable 64-bit integers with jax.enable_x64(True) or pass a smaller step count"
            )
    dtype = _scalar_dtype(name, value, "an integer scalar (the step count)")
    shape = jnp.shape(value)
    if shape != ():
        raise ValueError(f"{name} must be a scalar (shape ()), got shape {shape}")
    if not jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        raise TypeError(f"{name} (the step count) must be an integer scalar, got dtype {dtype}")
    concrete = concrete_float(value)
    if concrete is not None and concrete < 0:
        raise ValueError(f"{name} (the step count) must be >= 0, got {int(concrete)}")
    return jnp.asarray(value)


def check_rate_scalar(name: str, value: Any) -> jax.Array:
    """A spec op's learning-rate input ``R``: a finite floating scalar >= 0, as an array.

    Raises:
      TypeError: ``value`` is not floating point (an int, None, a string...).
      ValueError: ``value`` is not a scalar, negative, NaN or infinite
        (tracers are not range-checked).
    """
    dtype = _scalar_dtype(name, value, "a floating-point scalar")
    shape = jnp.shape(value)
    if shape != ():
        raise ValueError(f"{name} must be a scalar (shape ()), got shape {shape}")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point scalar, got dtype {dtype}")
    check_scalar(name, value, low=0.0)
    return jnp.asarray(value)


def check_count(count: Any, transformation: str) -> None:
    """An optimizer state's ``count``: an integer scalar, >= 0 when its value is known.

    A state restored from a corrupt or hand-edited checkpoint can hold a
    negative, float or array ``count``; the step it means (``T``, ``t``) would
    then be wrong without anything non-finite to show it (Adagrad with
    ``count = -5`` flips the sign of its update).

    Raises:
      TypeError: ``count`` is not of an integer dtype (a float, a bool).
      ValueError: ``count`` is not a scalar, or is concretely negative.
    """
    where = f"{transformation}: state.count (the number of updates made so far)"
    dtype = _leaf_dtype(count) if hasattr(count, "dtype") or isinstance(count, (int, float)) else None
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        kind = "an array" if hasattr(count, "dtype") else f"the {type(count).__name__} {count!r}"
        raise TypeError(f"{where} must be an integer scalar, got {kind}"
                        + ("" if dtype is None else f" of dtype {dtype}")
                        + "; was the state restored from another optimizer's checkpoint or edited?")
    if np.shape(count) != ():
        raise ValueError(f"{where} must be a scalar, got shape {np.shape(count)}")
    value = concrete_float(count)
    if value is not None and value < 0:
        raise ValueError(f"{where} must be >= 0, got {int(value)}; was the state restored from a corrupt "
                         f"checkpoint?")


def check_decay(name: str, value: Any, *, allow_none: bool = False) -> None:
    """A decay rate in [0, 1) such as Adam's ``b1`` and ``b2``, never in a 16-bit float dtype.

    ``optax.inject_hyperparams`` casts hyperparameters to the parameters'
    dtype; in bfloat16 ``b2 = 0.999`` becomes 1.0 and ``0.9`` becomes
    0.8984375, and under ``jax.jit`` the value cannot be checked. A 16-bit
    float value is refused, eagerly and jitted alike, with the remedy.

    Raises:
      TypeError: ``value`` is a float16 or bfloat16 array (or as :func:`check_scalar`).
      ValueError: as :func:`check_scalar` with the range [0, 1).
    """
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        number = None
        try:
            number = concrete_float(value)
        except TypeError:
            pass
        shown = "" if number is None else f" ({number!r} here{', outside [0, 1)' if number >= 1 else ''})"
        raise TypeError(
            f"{name} is a {jnp.dtype(dtype).name} value{shown}: optax.inject_hyperparams casts hyperparameters "
            f"to the parameters' dtype, and {jnp.dtype(dtype).name} rounds a decay rate near 1 to an invalid "
            f"value (0.999 becomes 1.0 in bfloat16) or loses the digits of 1 - {name}; pass "
            f"hyperparam_dtype=jnp.float32 to optax.inject_hyperparams (or {name} as a float32 value)"
        )
    check_scalar(name, value, low=0.0, high=1.0, high_open=True, allow_none=allow_none)


def check_tensors(reference_name: str, reference: Any, **others: Any) -> None:
    """A spec op's tensor inputs: floating, at least one, and every other tree shaped like ``reference``."""
    check_floating(reference, reference_name)
    if not jax.tree_util.tree_leaves(reference):
        raise ValueError(f"{reference_name} must hold at least one tensor, got {reference!r}")
    for name, tree in others.items():
        check_same_shapes(tree, reference, name, reference_name)
        check_floating(tree, name)


# ---------------------------------------------------------------------------
# Concreteness: which terms a formula may drop


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


def params_needed_for(name: str, value: Any) -> str | None:
    """Why ``params`` are needed for the term scaled by hyperparameter ``name``, or None.

    None when the term is off: ``value`` is None (the default of the
    transformations' coefficients) or a Python or NumPy 0. A JAX array is
    what ``optax.inject_hyperparams`` passes for every numeric hyperparameter
    it was given; under ``jax.jit`` its value is unknown, so whatever it is
    now (0.0 included) the term is kept and needs ``params``, eagerly and
    jitted alike, and the reason says so. A coefficient that was never given
    stays None and is not injected.
    """
    if value is None:
        return None
    if isinstance(value, jax.Array):
        if not isinstance(value, jax.core.Tracer) and value.ndim == 0 and float(value) != 0.0:
            return f"{name} != 0"
        return (
            f"{name} (a JAX array, as optax.inject_hyperparams passes each hyperparameter it is given, "
            f"so possibly nonzero under jax.jit; leave {name} unset for no term, or pass it in "
            f"static_args)"
        )
    if is_concrete_zero(value):
        return None
    return f"{name} != 0"


# ---------------------------------------------------------------------------
# Adafactor's factoring options


def check_factoring(factored: Any, factored_dims: Any, min_dim_size_to_factor: Any, choices: Sequence[str]) -> None:
    """Adafactor's ``factored`` (a bool), ``factored_dims`` (one of ``choices``) and
    ``min_dim_size_to_factor`` (an integer >= 1, or a tracer of one)."""
    if not isinstance(factored, (bool, np.bool_)):
        raise TypeError(f"factored must be a bool, got {factored!r}")
    if not isinstance(factored_dims, str) or factored_dims not in choices:
        raise ValueError(
            f"factored_dims must be one of {list(choices)!r} (the last two axes, or the "
            f"two largest as Optax does), got {factored_dims!r}"
        )
    if isinstance(min_dim_size_to_factor, (bool, np.bool_)) or (
        hasattr(min_dim_size_to_factor, "dtype")
        and not jnp.issubdtype(min_dim_size_to_factor.dtype, jnp.integer)
    ) or isinstance(min_dim_size_to_factor, float):
        raise TypeError(f"min_dim_size_to_factor must be an integer, got {min_dim_size_to_factor!r}")
    check_scalar("min_dim_size_to_factor", min_dim_size_to_factor, low=1)


def concrete_min_dim_size(min_dim_size_to_factor: Any) -> int:
    """``min_dim_size_to_factor`` as an int at init, where it decides the state's structure."""
    value = concrete_float(min_dim_size_to_factor)
    if value is None:
        raise ValueError(
            "min_dim_size_to_factor is a traced value here (optax.inject_hyperparams with init "
            "under jax.jit or jax.eval_shape?), but it decides which leaves are factored, that is "
            "the state's structure; pass it as static: "
            "optax.inject_hyperparams(optkit.adafactor, static_args=('min_dim_size_to_factor',))"
        )
    return int(value)


# ---------------------------------------------------------------------------
# Tensor names (the Gradient operator and graphs)


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


def check_differentiable(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``xs`` tensor ``name`` if ``value`` is not floating point."""
    if not jax.tree_util.tree_leaves(value):
        raise ValueError(f"xs tensor {name!r} was fed {value!r}, which holds no array; feed a "
                         f"floating-point array (or a pytree of them) to differentiate")
    try:
        check_floating(value, f"xs tensor {name!r}")
    except TypeError as err:
        raise ValueError(f"{err}; Gradient differentiates floating-point tensors only "
                         f"(SPEC 6): put integer and boolean tensors in zs") from None


def check_target(y_name: str, value: Any) -> None:
    """Raise ``ValueError`` naming the Gradient target ``y_name`` if ``value`` is not floating point."""
    if not jax.tree_util.tree_leaves(value):
        raise ValueError(f"y tensor {y_name!r} is {value!r}, which holds no array; the function "
                         f"must compute a floating-point y to differentiate")
    try:
        check_floating(value, f"y tensor {y_name!r}")
    except TypeError as err:
        raise ValueError(f"{err}; only a floating-point y can be differentiated") from None


# ---------------------------------------------------------------------------
# Feeds of graph inputs (optkit.Graph and optkit.onnx's BackendRep)


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
      TypeError (``exact``, ONNX's rule: no implicit conversion) or ValueError:
        a dtype other than the declared one.
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
