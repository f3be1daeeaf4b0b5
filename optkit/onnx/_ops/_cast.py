"""ONNX's casts as values: the float 8 types ``saturate`` applies to, float8e8m0's rounding modes, 4- and 2-bit
integers wrapped as ONNX's reference wraps them. Shared by the families that cast (Cast in ``elementwise``,
QuantizeLinear in ``quantize``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._base.values import storage_bits

__all__ = ["FLOAT8", "cast_to"]


# The float 8 types that ONNX's ``saturate`` applies to (Cast, QuantizeLinear).
FLOAT8 = tuple(np.dtype(getattr(jnp, name)) for name in
               ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"))


def _to_e8m0(x, saturate: bool, round_mode: str):
    """float8e8m0 (a power of two: the exponent byte of a float32), rounded as ONNX's reference does
    (``onnx.numpy_helper.to_float8e8m0``): "up" when any fraction bit is set, "nearest" from the guard,
    round and sticky bits, "down" truncating; NaN and infinity give NaN (0xFF); ``saturate`` keeps the
    largest exponent (0xFE) from rounding up into NaN."""
    bits = lax.bitcast_convert_type(jnp.asarray(x).astype(jnp.float32), jnp.uint32)
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        guard, rnd, sticky = (bits & 0x400000) > 0, (bits & 0x200000) > 0, (bits & 0x1FFFFF) > 0
        round_up = guard & (rnd | sticky | (exponent > 0))
    else:
        round_up = jnp.zeros_like(special)
    if saturate:
        round_up = round_up & (exponent != 0xFE)
    exponent = jnp.where(special, 0xFF, exponent + round_up.astype(jnp.uint32)) & 0xFF
    return lax.bitcast_convert_type(exponent.astype(jnp.uint8), jnp.float8_e8m0fnu)


def cast_to(x, dtype, saturate: bool = True, round_mode: str = "up"):
    """``x`` as ``dtype`` by ONNX's Cast rules (version 19 on): a float cast to a float 8 type with
    ``saturate`` is clipped to the type's finite range first (NaN stays NaN; without ``saturate`` an
    overflow is NaN or infinity, as the type has); float8e8m0 rounds by ``round_mode`` (see
    :func:`_to_e8m0`); a cast to a 4- or 2-bit integer truncates a float and wraps around modulo
    2^bits, as ONNX's reference implementation does; every other cast is XLA's conversion."""
    x, dtype = jnp.asarray(x), np.dtype(dtype)
    if dtype == np.dtype(jnp.float8_e8m0fnu):
        return _to_e8m0(x, saturate, round_mode)
    if dtype in FLOAT8 and saturate and jnp.issubdtype(x.dtype, jnp.floating):
        high = float(jnp.finfo(dtype).max)
        x = jnp.clip(x, -high, high)
    packed = jnp.issubdtype(dtype, jnp.integer) and storage_bits(dtype) < 8
    if packed and x.dtype != dtype:  # wrap around, as ONNX's reference (ml_dtypes) does
        low, span = int(jnp.iinfo(dtype).min), 1 << storage_bits(dtype)
        x = (x.astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32) - low) % span + low
    return x.astype(dtype)
