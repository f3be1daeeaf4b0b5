"""Element-wise operators: arithmetic, activations, comparisons, logic, selection, casts.

Multidirectional (NumPy) broadcasting from version 7. ONNX requires the inputs
of most operators to share one element type, so no handler promotes dtypes;
Python scalars (attributes) are weakly typed in JAX and keep the tensor's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
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
}
for _op_type, (_fn, _versions) in _ONE_FUNCTION.items():
    OPS.op(_op_type, *_versions)(lambda ctx, fn=_fn: fn)


@OPS.op("Div", 7, 13, 14)
def _div(ctx):
    def div(a, b):
        # Integer Div truncates toward zero, as C does (test_div_int32_trunc).
        if is_integer(a):
            a, b = jnp.broadcast_arrays(a, b)
            return lax.div(a, b)
        return jnp.divide(a, b)

    return div


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


def _variadic_builder(fn):
    def build(ctx):
        def variadic(*xs):
            result = xs[0]
            for x in xs[1:]:
                result = fn(result, x)
            return result

        return variadic

    return build


OPS.op("Max", 8, 12, 13)(_variadic_builder(jnp.maximum))
OPS.op("Min", 8, 12, 13)(_variadic_builder(jnp.minimum))


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
