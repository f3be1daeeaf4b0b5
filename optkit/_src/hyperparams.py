"""Checks of hyperparameters and step inputs: numbers in range, decay rates, dtypes, flags, step counts.

Every check runs in Python at construction or trace time, so a bad value fails
before XLA sees it, with a message that names the argument. A value that is a
JAX tracer (a hyperparameter under ``optax.inject_hyperparams`` inside
``jax.jit``) cannot be inspected at trace time: range checks skip it, and the
formulas turn an invalid decay rate into NaN updates at run time
(:func:`nan_unless_decays`), never into silently wrong ones.

Checks of pytrees (structures, shapes, leaf dtypes, states) are in
:mod:`optkit._src.trees`; an algorithm's own options are checked in its module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from optkit._src.numerics import concrete_float, is_concrete_zero

__all__ = [
    "check_scalar",
    "check_decay",
    "nan_unless_decays",
    "check_choice",
    "check_flag",
    "check_dtype",
    "params_needed_for",
    "check_rate_scalar",
    "check_step_count",
    "check_count",
]


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


def check_decay(name: str, value: Any, *, allow_none: bool = False) -> None:
    """A decay rate in [0, 1): Adam's ``b1``/``b2`` (ONNX's ``alpha``/``beta``), Adafactor's ``b1``.

    The value is checked as it is: a 16-bit float value that the user (or
    ``optax.inject_hyperparams(..., hyperparam_dtype=jnp.bfloat16)``) made is
    honoured when it is in range (0.9 is 0.8984375 in bfloat16; the formulas
    compute in float32 from it). One that rounded out of range (0.999 is 1.0
    in bfloat16) is refused, naming its dtype and the remedy. A traced value
    cannot be checked here; :func:`nan_unless_decays` makes its updates NaN
    when it is out of range.

    Raises:
      TypeError: not a real scalar (as :func:`check_scalar`).
      ValueError: NaN, infinite or outside [0, 1); for a 16-bit float, with the
        dtype that rounded it there.
    """
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        try:
            number = concrete_float(value)
        except TypeError:
            number = None
        if number is not None and not 0.0 <= number < 1.0:
            raise ValueError(
                f"{name} is the {jnp.dtype(dtype).name} value {number!r}, outside [0, 1): a decay rate near 1 "
                f"rounds to 1.0 in {jnp.dtype(dtype).name} (0.999 does in bfloat16). Pass {name} as a float32 "
                f"value, or hyperparam_dtype=jnp.float32 to optax.inject_hyperparams"
            )
    check_scalar(name, value, low=0.0, high=1.0, high_open=True, allow_none=allow_none)


def nan_unless_decays(scalar: jax.Array, *decays: Any) -> jax.Array:
    """``scalar``, or NaN where a traced decay rate is outside [0, 1) when the program runs.

    Concrete decay rates were checked when the transformation was made
    (:func:`check_decay`); only traced ones (``optax.inject_hyperparams``
    under ``jax.jit``) are tested here, so that ``b2 = 1`` gives NaN updates,
    which ``optax.apply_if_finite`` and a loss curve show, instead of updates
    of 0 (``sqrt(1 - b2^t) = 0``).
    """
    traced = [d for d in decays if isinstance(d, jax.core.Tracer)]
    if not traced:
        return scalar
    valid = jnp.all(jnp.stack([(jnp.asarray(d) >= 0) & (jnp.asarray(d) < 1) for d in traced]))
    return jnp.where(valid, scalar, jnp.asarray(jnp.nan, scalar.dtype))


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming ``name`` if ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)!r}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """Raise ``TypeError`` naming ``name`` if ``value`` is not a bool (a switch that decides the program)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_dtype(name: str, dtype: DTypeLike | None) -> np.dtype | None:
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
# The spec operators' step inputs, and an optimizer state's count


def _scalar_dtype(name: str, value: Any, what: str) -> np.dtype:
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


def check_step_count(name: str, value: ArrayLike) -> jax.Array:
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


def check_rate_scalar(name: str, value: ArrayLike) -> jax.Array:
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
    dtype = None
    if hasattr(count, "dtype"):
        dtype = jnp.dtype(count.dtype)
    elif isinstance(count, (int, float)):
        dtype = jnp.result_type(count)
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
