"""Element-wise operators: arithmetic, activations, comparisons, logic, selection, casts.

Multidirectional (NumPy) broadcasting from version 7; version 6 of Add, Sub,
Mul and Div broadcasts B onto A only, as its ``broadcast`` and ``axis``
attributes say. ONNX requires the inputs
of most operators to share one element type, so no handler promotes dtypes;
Python scalars (attributes) are weakly typed in JAX and keep the tensor's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

from optkit.onnx._ops._common import is_integer
from optkit.onnx._ops._registry import Family
from optkit.onnx._ops._values import onnx_dtype

OPS = Family("elementwise")


# Operators that are one jax.numpy function (arithmetic, comparisons, logic, Where), with every
# since_version whose semantics that function implements.
_ONE_FUNCTION = {
    "Add": (jnp.add, (7, 13, 14)),
    "Sub": (jnp.subtract, (7, 13, 14)),
    "Mul": (jnp.multiply, (7, 13, 14)),
    "Neg": (jnp.negative, (6, 13)),
    "Abs": (jnp.abs, (6, 13)),
    "Sqrt": (jnp.sqrt, (6, 13)),
    "Exp": (jnp.exp, (6, 13)),
    "Log": (jnp.log, (6, 13)),
    "Sigmoid": (jax.nn.sigmoid, (6, 13)),
    "Tanh": (jnp.tanh, (6, 13)),
    "Equal": (jnp.equal, (7, 11, 13, 19)),
    "Less": (jnp.less, (7, 9, 13)),
    "Greater": (jnp.greater, (7, 9, 13)),
    "GreaterOrEqual": (jnp.greater_equal, (12, 16)),
    "LessOrEqual": (jnp.less_equal, (12, 16)),
    "And": (jnp.logical_and, (7,)),
    "Or": (jnp.logical_or, (7,)),
    "Not": (jnp.logical_not, (1,)),
    "Where": (jnp.where, (9, 16)),
    "Xor": (jnp.logical_xor, (7,)),
    "Reciprocal": (jnp.reciprocal, (6, 13)),
    "Floor": (jnp.floor, (6, 13)),
    "Ceil": (jnp.ceil, (6, 13)),
    "Round": (jnp.round, (11, 22)),  # halves to even, as ONNX specifies
    "Sign": (jnp.sign, (9, 13)),
    "Erf": (jax.scipy.special.erf, (9, 13)),
    "Sin": (jnp.sin, (7, 22)),
    "Cos": (jnp.cos, (7, 22)),
    "Tan": (jnp.tan, (7, 22)),
    "Asin": (jnp.arcsin, (7, 22)),
    "Acos": (jnp.arccos, (7, 22)),
    "Atan": (jnp.arctan, (7, 22)),
    "Sinh": (jnp.sinh, (9, 22)),
    "Cosh": (jnp.cosh, (9, 22)),
    "Asinh": (jnp.arcsinh, (9, 22)),
    "Acosh": (jnp.arccosh, (9, 22)),
    "Atanh": (jnp.arctanh, (9, 22)),
    "IsNaN": (jnp.isnan, (9, 13, 20)),
    "Softsign": (lambda x: x / (1 + jnp.abs(x)), (1, 22)),
    # log(exp(x) + 1) without overflow
    "Softplus": (lambda x: jnp.logaddexp(x, jnp.zeros((), jnp.result_type(x))), (1, 22)),
    "Mish": (lambda x: x * jnp.tanh(jnp.logaddexp(x, jnp.zeros((), jnp.result_type(x)))), (18, 22)),
}
for _op_type, (_fn, _versions) in _ONE_FUNCTION.items():
    OPS.op(_op_type, *_versions)(lambda ctx, fn=_fn: fn)


def _divide(a, b):
    # Integer Div truncates toward zero, as C does (test_div_int32_trunc).
    if is_integer(a):
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)
    return jnp.divide(a, b)


OPS.op("Div", 7, 13, 14)(lambda ctx: _divide)


def _legacy_broadcast_builder(fn):
    """Version 6 of Add/Sub/Mul/Div: B broadcast onto A (``broadcast=1``) with its dimensions matched to
    A's from ``axis`` (default: A's trailing dimensions), or A and B of one shape (``broadcast=0``)."""

    def build(ctx):
        broadcast = bool(ctx.attrs.get("broadcast", 0))
        axis = ctx.attrs.get("axis")

        def legacy(a, b):
            sa, sb = jnp.shape(a), jnp.shape(b)
            if not broadcast:
                if sa != sb:
                    raise ctx.error(f"A {sa} and B {sb} must have one shape when broadcast=0")
                return fn(a, b)
            start = len(sa) - len(sb) if axis is None else (axis + len(sa) if axis < 0 else axis)
            if len(sb) > len(sa) or not 0 <= start <= len(sa) - len(sb) or any(
                    db not in (1, da) for db, da in zip(sb, sa[start:])):
                raise ctx.error(f"B {sb} cannot be broadcast onto A {sa} from axis {start}")
            return fn(a, jnp.reshape(b, sb + (1,) * (len(sa) - start - len(sb))))

        return legacy

    return build


for _op_type, _fn in {"Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": _divide}.items():
    OPS.op(_op_type, 6)(_legacy_broadcast_builder(_fn))


@OPS.op("Pow", 7, 12, 13, 15)
def _pow(ctx):
    def power(x, y):
        x_dtype = jnp.result_type(x)
        y_dtype = jnp.result_type(y)
        # The result has the base's type (Pow-12 allows a different exponent type).
        if jnp.issubdtype(x_dtype, jnp.integer) and jnp.issubdtype(y_dtype, jnp.floating):
            return jnp.power(jnp.asarray(x).astype(y_dtype), y).astype(x_dtype)
        return jnp.power(x, jnp.asarray(y).astype(x_dtype))

    return power


@OPS.op("Relu", 6, 13, 14)
def _relu(ctx):
    return lambda x: jnp.maximum(x, jnp.zeros((), jnp.result_type(x)))


@OPS.op("LeakyRelu", 6, 16)
def _leaky_relu(ctx):
    alpha = ctx.attrs["alpha"]
    return lambda x: jnp.where(x >= 0, x, alpha * x)


@OPS.op("HardSigmoid", 6, 22)
def _hard_sigmoid(ctx):
    alpha, beta = ctx.attrs.get("alpha", 0.2), ctx.attrs.get("beta", 0.5)
    return lambda x: jnp.clip(alpha * x + beta, 0, 1).astype(jnp.result_type(x))


@OPS.op("HardSwish", 14, 22)
def _hard_swish(ctx):
    return lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1).astype(jnp.result_type(x))


@OPS.op("Elu", 6, 22)
def _elu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@OPS.op("Celu", 12, 28)
def _celu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@OPS.op("Selu", 6, 22)
def _selu(ctx):
    alpha = ctx.attrs.get("alpha", 1.67326319217681884765625)
    gamma = ctx.attrs.get("gamma", 1.05070102214813232421875)
    return lambda x: gamma * jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@OPS.op("ThresholdedRelu", 10, 22)
def _thresholded_relu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.where(x > alpha, x, jnp.zeros((), jnp.result_type(x)))


@OPS.op("Gelu", 20)
def _gelu(ctx):
    approximate = ctx.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    return lambda x: 0.5 * x * (1 + jax.scipy.special.erf(x / np.sqrt(2).astype(jnp.result_type(x))))


@OPS.op("PRelu", 6, 7, 9, 16)
def _prelu(ctx):
    def prelu(x, slope):
        if ctx.version < 7 and jnp.ndim(x) > 2 and jnp.shape(slope) == (jnp.shape(x)[1],):
            # PRelu-6: one slope per channel of (N, C, D1, ...)
            slope = jnp.reshape(slope, (-1,) + (1,) * (jnp.ndim(x) - 2))
        try:  # slope is broadcast onto X (unidirectional)
            shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(slope))
        except ValueError:
            shape = None
        if shape != jnp.shape(x):
            raise ctx.error(f"slope {jnp.shape(slope)} cannot be broadcast onto X {jnp.shape(x)}")
        return jnp.where(x < 0, slope * x, x)

    return prelu


@OPS.op("Clip", 6, 11, 12, 13)
def _clip(ctx):
    if ctx.version < 11:
        low, high = ctx.attrs.get("min", -3.4028234663852886e38), ctx.attrs.get("max", 3.4028234663852886e38)
        return lambda x: jnp.minimum(jnp.maximum(x, low), high).astype(jnp.result_type(x))

    def clip(x, low=None, high=None):
        for bound, what in ((low, "min"), (high, "max")):
            if bound is not None and jnp.size(bound) != 1:
                raise ctx.error(f"{what} must be a scalar, got shape {jnp.shape(bound)}")
        if low is not None:
            x = jnp.maximum(x, jnp.reshape(low, ()))
        if high is not None:
            x = jnp.minimum(x, jnp.reshape(high, ()))  # min > max: every value is max, as in NumPy
        return x

    return clip


@OPS.op("IsInf", 10, 20)
def _is_inf(ctx):
    negative = bool(ctx.attrs.get("detect_negative", 1))
    positive = bool(ctx.attrs.get("detect_positive", 1))

    def is_inf(x):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            return jnp.zeros(jnp.shape(x), bool)
        return ((x == jnp.inf) & positive) | ((x == -jnp.inf) & negative)

    return is_inf


@OPS.op("Mod", 10, 13, 28)
def _mod(ctx):
    fmod = int(ctx.attrs.get("fmod", 0))
    if fmod not in (0, 1):
        raise ctx.error(f"fmod must be 0 or 1, got {fmod}")

    def mod(a, b):
        if not fmod and not is_integer(a) and ctx.version < 28:
            raise ctx.error("fmod must be 1 for floating-point inputs before Mod-28 (ONNX's rule)")
        # fmod=1: the sign of the dividend (C's fmod); fmod=0: the sign of the divisor (Python's %)
        return jnp.fmod(a, b) if fmod else jnp.remainder(a, b)

    return mod


def _variadic_builder(fn, mean=False):
    def build(ctx):
        def variadic(*xs):
            if ctx.version < 8 and len({jnp.shape(x) for x in xs}) > 1:
                raise ctx.error(f"the inputs must have one shape before version 8, got "
                                f"{[jnp.shape(x) for x in xs]}")
            result = xs[0]
            for x in xs[1:]:
                result = fn(result, x)
            return result / len(xs) if mean else result

        return variadic

    return build


OPS.op("Max", 6, 8, 12, 13)(_variadic_builder(jnp.maximum))
OPS.op("Min", 6, 8, 12, 13)(_variadic_builder(jnp.minimum))
OPS.op("Sum", 6, 8, 13)(_variadic_builder(jnp.add))
OPS.op("Mean", 6, 8, 13)(_variadic_builder(jnp.add, mean=True))


@OPS.op("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def _cast(ctx):
    dtype = onnx_dtype(ctx.attrs["to"], ctx.message("attribute 'to'"))

    def cast(x):
        return jnp.asarray(x).astype(dtype)

    return cast


@OPS.op("CastLike", 15, 19, 21, 23, 24, 25)
def _cast_like(ctx):
    def cast_like(x, target):
        return jnp.asarray(x).astype(jnp.result_type(target))

    return cast_like
