"""Element-wise operators: arithmetic, activations, comparisons, logic, selection, casts.

Multidirectional (NumPy) broadcasting from version 7; version 6 of Add, Sub,
Mul and Div broadcasts B onto A only, as its ``broadcast`` and ``axis``
attributes say. ONNX requires the inputs
of most operators to share one element type, so no handler promotes dtypes;
Python scalars (attributes) are weakly typed in JAX and keep the tensor's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

from optkit.onnx._base.values import is_static, is_string, onnx_dtype, storage_bits
from optkit.onnx._ops._cast import cast_to
from optkit.onnx._ops._common import is_integer
from optkit.onnx._ops._registry import ELEMENTWISE, Family, Float16, Fusion, Layout
from optkit.onnx._ops.quantize import dynamic_matmul, dynamic_matmul_matches

OPS = Family("elementwise")


# Operators that are one jax.numpy function (arithmetic, comparisons, logic, Where), with every
# since_version whose semantics that function implements.
@OPS.op("Add", 7, 13, 14, params=(jnp.add,), layout=ELEMENTWISE)
@OPS.op("Sub", 7, 13, 14, params=(jnp.subtract,), layout=ELEMENTWISE)
@OPS.op("Mul", 7, 13, 14, params=(jnp.multiply,), layout=ELEMENTWISE)
@OPS.op("Neg", 6, 13, params=(jnp.negative,), layout=ELEMENTWISE)
@OPS.op("Abs", 6, 13, params=(jnp.abs,), layout=ELEMENTWISE)
@OPS.op("Sqrt", 6, 13, params=(jnp.sqrt,), layout=ELEMENTWISE)
@OPS.op("Exp", 6, 13, params=(jnp.exp,), layout=ELEMENTWISE)
@OPS.op("Log", 6, 13, params=(jnp.log,), layout=ELEMENTWISE)
@OPS.op("Sigmoid", 6, 13, params=(jax.nn.sigmoid,), layout=ELEMENTWISE)
@OPS.op("Tanh", 6, 13, params=(jnp.tanh,), layout=ELEMENTWISE)
@OPS.op("Less", 7, 9, 13, params=(jnp.less,))
@OPS.op("Greater", 7, 9, 13, params=(jnp.greater,))
@OPS.op("GreaterOrEqual", 12, 16, params=(jnp.greater_equal,))
@OPS.op("LessOrEqual", 12, 16, params=(jnp.less_equal,))
@OPS.op("And", 7, params=(jnp.logical_and,))
@OPS.op("Or", 7, params=(jnp.logical_or,))
@OPS.op("Not", 1, params=(jnp.logical_not,))
@OPS.op("Where", 9, 16, params=(jnp.where,), layout=ELEMENTWISE)
@OPS.op("Xor", 7, params=(jnp.logical_xor,))
@OPS.op("Reciprocal", 6, 13, params=(jnp.reciprocal,), layout=ELEMENTWISE)
@OPS.op("Floor", 6, 13, params=(jnp.floor,))
@OPS.op("Ceil", 6, 13, params=(jnp.ceil,))
@OPS.op("Round", 11, 22, params=(jnp.round,), float16=Float16(kernel_since=11))  # halves to even, as ONNX specifies
@OPS.op("Sign", 9, 13, params=(jnp.sign,), float16=Float16(kernel_since=9))
@OPS.op("Erf", 9, 13, params=(jax.scipy.special.erf,), layout=ELEMENTWISE)
@OPS.op("Sin", 7, 22, params=(jnp.sin,))
@OPS.op("Cos", 7, 22, params=(jnp.cos,))
@OPS.op("Tan", 7, 22, params=(jnp.tan,))
@OPS.op("Asin", 7, 22, params=(jnp.arcsin,))
@OPS.op("Acos", 7, 22, params=(jnp.arccos,))
@OPS.op("Atan", 7, 22, params=(jnp.arctan,))
@OPS.op("Sinh", 9, 22, params=(jnp.sinh,))
@OPS.op("Cosh", 9, 22, params=(jnp.cosh,))
@OPS.op("Asinh", 9, 22, params=(jnp.arcsinh,))
@OPS.op("Acosh", 9, 22, params=(jnp.arccosh,))
@OPS.op("Atanh", 9, 22, params=(jnp.arctanh,))
@OPS.op("IsNaN", 9, 13, 20, params=(jnp.isnan,), float16=Float16(kernel_since=9))
@OPS.op("Softsign", 1, 22, params=(lambda x: x / (1 + jnp.abs(x)),))
# log(exp(x) + 1) without overflow
@OPS.op("Softplus", 1, 22, params=(lambda x: jnp.logaddexp(x, jnp.zeros((), jnp.result_type(x))),), layout=ELEMENTWISE)
@OPS.op("Mish", 18, 22, params=(lambda x: x * jnp.tanh(jnp.logaddexp(x, jnp.zeros((), jnp.result_type(x)))),),
        layout=ELEMENTWISE)
def _one_function(ctx, fn):
    host = _ON_HOST.get(fn)
    if host is None:
        return fn

    def either(*values):
        # Folded before running (every input a NumPy value: a causal mask built from shapes): the same computation
        # in NumPy, bit for bit, instead of an XLA program compiled for each new shape.
        cast = _on_host(values, selects=fn is jnp.where)
        if cast is None:
            return fn(*values)
        with np.errstate(all="ignore"):  # (integers wrap on overflow, as in XLA)
            return host(*cast)

    return either


def _on_host(values, selects: bool) -> list | None:
    """NumPy values cast to the dtypes jax.numpy computes in (int64 to int32 with x64 off, wrapping as JAX does)
    where NumPy's function then gives JAX's values and dtype: integers or booleans of one dtype, or for Where a
    boolean condition, then two values of one dtype (floats included: selection is exact); None otherwise."""
    if not all(is_static(v) for v in values):
        return None
    try:  # (computed before its size is checked: large results, and shapes that do not fit, as before)
        if math.prod(np.broadcast_shapes(*(np.shape(v) for v in values))) > _HOST_ELEMENTS:
            return None
    except ValueError:
        return None
    cast = [np.asarray(v).astype(jax.dtypes.canonicalize_dtype(v.dtype), copy=False) for v in values]
    if selects and cast[0].dtype != np.bool_:
        return None
    kinds = {v.dtype for v in (cast[1:] if selects else cast)}
    return cast if len(kinds) == 1 and (selects or next(iter(kinds)).kind in "biu") else None


# The largest result computed on the host: an attention mask of 1024 x 1024 (a larger one is compiled, as before).
_HOST_ELEMENTS = 1 << 20


# The operators whose NumPy function computes the same values as the jax.numpy one, exactly on the values
# _on_host admits: run with NumPy when folded.
_ON_HOST = {jnp.logical_and: np.logical_and, jnp.logical_or: np.logical_or, jnp.logical_xor: np.logical_xor,
            jnp.logical_not: np.logical_not, jnp.where: np.where, jnp.less: np.less, jnp.greater: np.greater,
            jnp.less_equal: np.less_equal, jnp.greater_equal: np.greater_equal, jnp.equal: np.equal,
            jnp.add: np.add, jnp.subtract: np.subtract, jnp.multiply: np.multiply, jnp.negative: np.negative,
            jnp.abs: np.abs}


@OPS.op("Equal", 7, 11, 13, 19)
def _equal(ctx):
    def equal(a, b):
        if is_string(a) or is_string(b):  # ONNX STRING tensors (version 19): compared on the host
            return np.equal(a, b).astype(bool)
        cast = _on_host((a, b), selects=False)
        return jnp.equal(a, b) if cast is None else np.equal(*cast)

    return equal


def _divide(a, b):
    # Integer Div truncates toward zero, as C does (test_div_int32_trunc).
    if is_integer(a):
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)
    return jnp.divide(a, b)


@OPS.op("Div", 7, 13, 14, layout=ELEMENTWISE)
def _div(ctx):
    return _divide


@OPS.op("Add", 6, params=(jnp.add,))
@OPS.op("Sub", 6, params=(jnp.subtract,))
@OPS.op("Mul", 6, params=(jnp.multiply,))
@OPS.op("Div", 6, params=(_divide,))
@OPS.op("Pow", 1, params=(jnp.power,))
def _legacy_broadcast(ctx, fn):
    """Version 6 of Add/Sub/Mul/Div, version 1 of Pow: B broadcast onto A (``broadcast=1``) with its
    dimensions matched to A's from ``axis`` (default: A's trailing dimensions), or A and B of one shape
    (``broadcast=0``)."""
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


@OPS.op("Pow", 7, 12, 13, 15, layout=ELEMENTWISE)
def _pow(ctx):
    def power(x, y):
        x_dtype = jnp.result_type(x)
        y_dtype = jnp.result_type(y)
        # The result has the base's type (Pow-12 allows a different exponent type).
        exponent = float(np.ravel(y)[0]) if is_static(y) and np.size(y) == 1 else None
        if jnp.issubdtype(x_dtype, jnp.floating) and exponent in (2.0, 3.0):
            # ONNX Runtime's kernel: x * x and x * x * x for one exponent of 2 or 3, not pow (also fewer operations
            # for XLA to compile and differentiate)
            out = x * x if exponent == 2.0 else x * x * x
            shape = jnp.broadcast_shapes(jnp.shape(x), np.shape(y))
            return out if jnp.shape(out) == shape else jnp.broadcast_to(out, shape)
        if jnp.issubdtype(x_dtype, jnp.integer) and jnp.issubdtype(y_dtype, jnp.floating):
            return jnp.power(jnp.asarray(x).astype(y_dtype), y).astype(x_dtype)
        return jnp.power(x, jnp.asarray(y).astype(x_dtype))

    return power


@OPS.op("Relu", 6, 13, 14, layout=ELEMENTWISE)
def _relu(ctx):
    return lambda x: jnp.maximum(x, jnp.zeros((), jnp.result_type(x)))


@OPS.op("LeakyRelu", 6, 16, layout=ELEMENTWISE)
def _leaky_relu(ctx):
    alpha = ctx.attrs["alpha"]
    return lambda x: jnp.where(x >= 0, x, alpha * x)


@OPS.op("HardSigmoid", 6, 22, layout=ELEMENTWISE)
def _hard_sigmoid(ctx):
    alpha, beta = ctx.attrs.get("alpha", 0.2), ctx.attrs.get("beta", 0.5)
    return lambda x: jnp.clip(alpha * x + beta, 0, 1).astype(jnp.result_type(x))


@OPS.op("HardSwish", 14, 22, layout=ELEMENTWISE)
def _hard_swish(ctx):
    return lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1).astype(jnp.result_type(x))


@OPS.op("Elu", 6, 22, layout=ELEMENTWISE)
def _elu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@OPS.op("Celu", 12, 28, layout=ELEMENTWISE, float16=Float16(kernel_since=28))
def _celu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@OPS.op("Selu", 6, 22, layout=ELEMENTWISE)
def _selu(ctx):
    alpha = ctx.attrs.get("alpha", 1.67326319217681884765625)
    gamma = ctx.attrs.get("gamma", 1.05070102214813232421875)
    return lambda x: gamma * jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@OPS.op("ThresholdedRelu", 10, 22)
def _thresholded_relu(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    return lambda x: jnp.where(x > alpha, x, jnp.zeros((), jnp.result_type(x)))


@OPS.op("Gelu", 20, layout=ELEMENTWISE)
def _gelu(ctx):
    approximate = ctx.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    return lambda x: 0.5 * x * (1 + jax.scipy.special.erf(x / np.sqrt(2).astype(jnp.result_type(x))))


@OPS.op("PRelu", 6, 7, 9, 16, layout=Layout("elementwise", since=7))
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


@OPS.op("Clip", 6, 11, 12, 13, layout=ELEMENTWISE, float16=Float16(kernel_since=12))
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


@OPS.op("IsInf", 10, 20, float16=Float16(kernel_since=20))
def _is_inf(ctx):
    negative = bool(ctx.attrs.get("detect_negative", 1))
    positive = bool(ctx.attrs.get("detect_positive", 1))

    def is_inf(x):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            return jnp.zeros(jnp.shape(x), bool)
        return ((x == jnp.inf) & positive) | ((x == -jnp.inf) & negative)

    return is_inf


@OPS.op("Mod", 10, 13, 28, float16=Float16(kernel_since=10))
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


@OPS.op("Max", 6, 8, 12, 13, params=(jnp.maximum,), layout=Layout("elementwise", since=8),
        float16=Float16(kernel_since=12))
@OPS.op("Min", 6, 8, 12, 13, params=(jnp.minimum,), layout=Layout("elementwise", since=8),
        float16=Float16(kernel_since=12))
@OPS.op("Sum", 6, 8, 13, params=(jnp.add,), layout=Layout("elementwise", since=8))
@OPS.op("Mean", 6, 8, 13, params=(jnp.add, True), layout=Layout("elementwise", since=8))
def _variadic(ctx, fn, mean=False):
    def variadic(*xs):
        if ctx.version < 8 and len({jnp.shape(x) for x in xs}) > 1:
            raise ctx.error(f"the inputs must have one shape before version 8, got "
                            f"{[jnp.shape(x) for x in xs]}")
        result = xs[0]
        for x in xs[1:]:
            result = fn(result, x)
        return result / len(xs) if mean else result

    return variadic


def _cast_rules(ctx):
    saturate = bool(ctx.attrs.get("saturate", 1))
    round_mode = ctx.attrs.get("round_mode", "up")
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.error(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    return saturate, round_mode


def _dynamic_matmul(ctx, quantize_attrs, matmul_attrs):
    return dynamic_matmul(_cast(ctx))


@OPS.op("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28, layout=ELEMENTWISE,
        fusion=Fusion(("DynamicQuantizeLinear", "MatMulInteger"), dynamic_matmul_matches, _dynamic_matmul),
        float16=Float16(kernel_since=6))
def _cast(ctx):
    dtype = onnx_dtype(ctx.attrs["to"], ctx.message("attribute 'to'"))
    saturate, round_mode = _cast_rules(ctx)

    def cast(x):
        return cast_to(x, dtype, saturate, round_mode)

    return cast


@OPS.op("CastLike", 15, 19, 21, 23, 24, 25)
def _cast_like(ctx):
    saturate, round_mode = _cast_rules(ctx)

    def cast_like(x, target):
        return cast_to(x, jnp.result_type(target), saturate, round_mode)

    return cast_like


@OPS.op("BitCast", 26, float16=Float16(kernel_since=26))
def _bit_cast(ctx):
    """The bits of each element read as type ``to`` of the same width (bool as one byte, 0 or 1)."""
    dtype = onnx_dtype(ctx.attrs["to"], ctx.message("attribute 'to'"))

    def bit_cast(x):
        x = jnp.asarray(x)
        source = np.dtype(x.dtype)
        if source.itemsize != dtype.itemsize or storage_bits(source) != storage_bits(dtype):
            raise ctx.error(f"{source} and {dtype} differ in width: BitCast keeps every bit")
        if source == np.bool_:
            x = x.astype(jnp.uint8)
        if dtype == np.bool_:
            return lax.bitcast_convert_type(x, jnp.uint8) != 0
        return lax.bitcast_convert_type(x, dtype)

    return bit_cast


@OPS.op("BitShift", 11, 28)
def _bit_shift(ctx):
    """Version 11: unsigned integers. Version 28 adds signed ones: a right shift is arithmetic, a shift by a
    negative amount or by the bit width or more gives 0 (-1 for a negative value shifted right)."""
    direction = ctx.attrs.get("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")

    def bit_shift(x, y):
        dtype = jnp.result_type(x)
        if not jnp.issubdtype(dtype, jnp.integer) or (ctx.version < 28 and jnp.issubdtype(dtype, jnp.signedinteger)):
            raise TypeError(ctx.message(f"BitShift-{ctx.version} does not shift {dtype}"))
        x, y = jnp.broadcast_arrays(x, y)
        bits = jnp.iinfo(dtype).bits
        out_of_range = (y < 0) | (y >= bits)
        amount = jnp.where(out_of_range, 0, y).astype(dtype)
        if direction == "LEFT":
            shifted = lax.shift_left(x, amount)  # wraps in two's complement, as the unsigned view does
            return jnp.where(out_of_range, jnp.zeros_like(x), shifted)
        if jnp.issubdtype(dtype, jnp.signedinteger):
            fill = jnp.where(x < 0, -jnp.ones_like(x), jnp.zeros_like(x))
            return jnp.where(out_of_range, fill, lax.shift_right_arithmetic(x, amount))
        return jnp.where(out_of_range, jnp.zeros_like(x), lax.shift_right_logical(x, amount))

    return bit_shift


@OPS.op("BitwiseAnd", 18, params=(jnp.bitwise_and,))
@OPS.op("BitwiseOr", 18, params=(jnp.bitwise_or,))
@OPS.op("BitwiseXor", 18, params=(jnp.bitwise_xor,))
@OPS.op("BitwiseNot", 18, params=(jnp.bitwise_not,))
def _bitwise(ctx, fn):
    def bitwise(*values):
        if not all(jnp.issubdtype(jnp.result_type(v), jnp.integer) for v in values):
            types = [str(jnp.result_type(v)) for v in values]
            raise TypeError(ctx.message(f"{ctx.op_type} takes integers, got {types}"))
        return fn(*values)

    return bitwise


@OPS.op("Swish", 24)
def _swish(ctx):
    alpha = float(ctx.attrs.get("alpha", 1.0))
    return lambda x: x * jax.nn.sigmoid(jnp.asarray(alpha, jnp.result_type(x)) * x)


@OPS.op("Shrink", 9, float16=Float16(kernel_since=9))
def _shrink(ctx):
    bias, lambd = float(ctx.attrs.get("bias", 0.0)), float(ctx.attrs.get("lambd", 0.5))

    def shrink(x):
        dtype = jnp.result_type(x)
        b, t = jnp.asarray(bias, dtype), jnp.asarray(lambd, dtype)
        return jnp.where(x < -t, x + b, jnp.where(x > t, x - b, jnp.zeros_like(x))).astype(dtype)

    return shrink


@OPS.op("SwiGLU", 28)
def _swiglu(ctx):
    alpha = float(ctx.attrs.get("alpha", 1.0))
    return lambda a, b: a * jax.nn.sigmoid(jnp.asarray(alpha, jnp.result_type(a)) * a) * b
