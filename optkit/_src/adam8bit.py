"""8-bit blockwise Adam exactly as bitsandbytes' ``Adam8bit`` computes it (SPEC.md section 10; the quantization is
:mod:`optkit._src.blockwise`).

SPEC 10, at step ``t`` (1 at the first update), every parameter of ``min_8bit_size`` elements or more::

    m, v   = dequantize(state)                 code[index] * absmax of the index's block of 256
    m      = b1 * m + (1 - b1) * g
    v      = b2 * v + (1 - b2) * g^2
    X_new  = X * (1 - lr * weight_decay) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    state  = quantize(m, signed dynamic map), quantize(v, unsigned dynamic map)

A smaller parameter keeps float32 moments and bitsandbytes' 32-bit update,
``X_new = X * (1 - lr * weight_decay) - lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t))``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optkit._src import hyperparams, sharding, trees
from optkit._src.blockwise import (
    BLOCK_SIZE,
    ROUNDING,
    QuantizedMoment,
    dequantize_blockwise,
    quantize_blockwise,
)
from optkit._src.numerics import map_leaves

__all__ = ["ScaleByAdam8bitState", "adam8bit"]

MIN_8BIT_SIZE = 4096  # bitsandbytes' default: smaller parameters keep float32 moments


class ScaleByAdam8bitState(NamedTuple):
    """State of :func:`adam8bit`.

    Attributes:
      count: int32 scalar, the updates made so far (bitsandbytes' ``step`` is ``count + 1`` in the update).
      mu: the first moments: a :class:`QuantizedMoment` (signed map) per parameter of ``min_8bit_size``
        elements or more, a float32 array of the parameter's shape per smaller one.
      nu: the second moments, the same way (unsigned map).
    """

    count: jax.Array
    mu: Any
    nu: Any


def _quantized_zeros(p: Any, block_size: int) -> QuantizedMoment:
    blocks = -(-math.prod(np.shape(p)) // block_size)
    return QuantizedMoment(jnp.zeros((blocks, block_size), jnp.uint8), jnp.zeros((blocks,), jnp.float32))


def _is_moment(x: Any) -> bool:
    return isinstance(x, QuantizedMoment)


def adam8bit(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    block_size: int | None = None,
    min_8bit_size: int | None = None,
    rounding: str = "nearest",
) -> optax.GradientTransformation:
    """8-bit blockwise Adam as bitsandbytes' ``Adam8bit`` computes it (Dettmers et al., 2022; SPEC.md section 10).

    Each moment of a parameter with ``min_8bit_size`` elements or more is held as uint8 codes of Dettmers'
    dynamic map (signed for the first moment, unsigned for the second) with one float32 ``absmax`` per block of
    ``block_size``: about 2.03 bytes of state per parameter against Adam's 8. It is dequantized, updated and
    quantized again in every step, with ``jnp`` inside the update (no host round trip). Weight decay is
    decoupled (``X * (1 - lr * weight_decay)``), as bitsandbytes applies it. Smaller parameters keep float32
    moments and bitsandbytes' 32-bit update.

    Args:
      learning_rate: bitsandbytes' ``lr``, >= 0: a float or an Optax schedule (called with ``state.count``).
      b1, b2: the moments' decays, in [0, 1).
      eps: added to the bias-corrected root of the second moment, >= 0.
      weight_decay: decoupled weight decay, >= 0.
      block_size: elements per quantization block; None for bitsandbytes' 256.
      min_8bit_size: parameters with fewer elements keep float32 moments; None for bitsandbytes' 4096.
      rounding: ``"nearest"`` (the paper's and bitsandbytes' CUDA kernels' nearest code) or ``"table"``
        (bitsandbytes 0.50's CPU backend, through a 65,536-entry table: a moment of 0 among larger ones is held as
        1.56e-5 of its block's absmax, never 0); :func:`quantize_blockwise` says how each rounds. A second moment
        stored as 0 under a first moment that is not makes the step ``m / eps``: where many gradients are 0
        beside large ones, ``"table"`` trains where ``"nearest"`` diverges (docs page "Muon, schedule-free AdamW
        and 8-bit Adam").

    Returns:
      An ``optax.GradientTransformation`` whose state is ``(ScaleByAdam8bitState,)``. Every float argument works
      under ``optax.inject_hyperparams``; ``block_size`` and ``min_8bit_size`` decide the state's layout, so their
      defaults are None (which ``inject_hyperparams`` leaves static) and a value given to it goes in
      ``static_args``. ``optkit.state_sharding`` splits a :class:`QuantizedMoment`'s codes and absmax over the
      same blocks.

    Raises:
      ValueError: a hyperparameter out of range, an unknown ``rounding``; ``params=None`` with weight decay.
      TypeError: non-floating leaves.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optkit.adam8bit(1e-3)
      >>> params = {"w": jnp.zeros((64, 64)), "b": jnp.zeros(64)}
      >>> state = tx.init(params)
      >>> state[0].mu["w"].codes.shape, state[0].mu["b"].dtype
      ((16, 256), dtype('float32'))
    """
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    hyperparams.check_scalar("b1", b1, low=0.0, high=1.0, high_open=True)
    hyperparams.check_scalar("b2", b2, low=0.0, high=1.0, high_open=True)
    hyperparams.check_scalar("eps", eps, low=0.0)
    hyperparams.check_scalar("weight_decay", weight_decay, low=0.0)
    hyperparams.check_choice("rounding", rounding, ROUNDING)
    block_size = BLOCK_SIZE if block_size is None else block_size
    min_8bit_size = MIN_8BIT_SIZE if min_8bit_size is None else min_8bit_size
    for name, value in (("block_size", block_size), ("min_8bit_size", min_8bit_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (name == "block_size"):
            raise ValueError(f"{name} must be an int >= {int(name == 'block_size')}, got {value!r} (pass it in "
                             f"static_args under optax.inject_hyperparams)")
    reason = hyperparams.params_needed_for("weight_decay", weight_decay)

    def eight_bit(p: Any) -> bool:
        return math.prod(np.shape(p)) >= min_8bit_size

    def init_fn(params):
        trees.check_floating(params, "params")

        def moment(p):
            return _quantized_zeros(p, block_size) if eight_bit(p) else sharding.full_like(p, 0, jnp.float32)

        # Flax boxes (nnx.Param) are left out: a box around a QuantizedMoment would not survive nnx.Optimizer.
        def moments():  # each moment its own buffers (a jitted step may donate the state)
            return jax.tree.map(lambda p: moment(sharding.unbox(p)), params, is_leaf=sharding.is_box)

        return ScaleByAdam8bitState(jnp.zeros([], jnp.int32), moments(), moments())

    def update_fn(updates, state, params=None):
        state = trees.check_state(state, ScaleByAdam8bitState, "adam8bit")
        hyperparams.check_count(state.count, "adam8bit")
        trees.check_update_inputs("adam8bit", updates, {}, params, reason)
        _check_moments(updates, state, block_size, eight_bit)
        t = (state.count + 1).astype(jnp.float32)
        rate = learning_rate(state.count) if callable(learning_rate) else learning_rate
        lr = jnp.asarray(rate, jnp.float32)
        beta1, beta2 = jnp.asarray(b1, jnp.float32), jnp.asarray(b2, jnp.float32)
        one_minus_b1 = jnp.asarray(1 - b1, jnp.float32)
        one_minus_b2 = jnp.asarray(1 - b2, jnp.float32)
        correction1 = 1 - beta1 ** t
        correction2 = jnp.sqrt(1 - beta2 ** t)
        decay = jnp.asarray(weight_decay, jnp.float32)

        def per_leaf(g, m, v, x):
            g32 = g.astype(jnp.float32)
            quantized = _is_moment(m)
            m32 = dequantize_blockwise(m, g.shape, signed=True, like=g) if quantized else m
            v32 = dequantize_blockwise(v, g.shape, signed=False, like=g) if quantized else v
            m32 = m32 * beta1 + one_minus_b1 * g32
            v32 = v32 * beta2 + one_minus_b2 * g32 * g32
            if quantized:
                step = (-lr / correction1) * (m32 / (jnp.sqrt(v32) / correction2 + eps))
            else:
                step = (-lr * correction2 / correction1) * (m32 / (jnp.sqrt(v32) + eps * correction2))
            if x is not None and reason is not None:
                step = step - lr * decay * x.astype(jnp.float32)
            if quantized:
                m32 = quantize_blockwise(m32, signed=True, block_size=block_size, rounding=rounding)
                v32 = quantize_blockwise(v32, signed=False, block_size=block_size, rounding=rounding)
            return step.astype(g.dtype), m32, v32

        new_updates, mu, nu = map_leaves(per_leaf, 3, updates, state.mu, state.nu,
                                         params if reason is not None else None)
        return new_updates, ScaleByAdam8bitState(optax.safe_increment(state.count), mu, nu)

    return optax.chain(optax.GradientTransformation(init_fn, update_fn))


def _check_moments(updates: Any, state: ScaleByAdam8bitState, block_size: int, eight_bit: Any) -> None:
    """The state's moments match ``updates``: a QuantizedMoment of the right blocks or a float32 array of the
    gradient's shape per leaf, named by path."""
    grads = sharding.leaves_with_paths(updates)
    for name, tree in (("state.mu", state.mu), ("state.nu", state.nu)):
        moments = jax.tree.leaves(tree, is_leaf=_is_moment)
        if len(moments) != len(grads):
            raise ValueError(f"adam8bit: {name} holds {len(moments)} moments for {len(grads)} gradients; was the "
                             f"state made by init of other parameters?")
        for (path, g), m in zip(grads, moments):
            where = f"adam8bit: {name}{trees.keystr(path)}"
            blocks = -(-math.prod(np.shape(g)) // block_size)
            if eight_bit(g) != _is_moment(m):
                raise ValueError(f"{where} is {'not ' if eight_bit(g) else ''}quantized, but a gradient of shape "
                                 f"{np.shape(g)} needs {'codes' if eight_bit(g) else 'a float32 moment'}")
            if _is_moment(m) and (np.shape(m.codes) != (blocks, block_size) or np.shape(m.absmax) != (blocks,)):
                raise ValueError(f"{where} has codes {np.shape(m.codes)} and absmax {np.shape(m.absmax)}; a gradient "
                                 f"of shape {np.shape(g)} needs ({blocks}, {block_size}) and ({blocks},)")
            if not _is_moment(m) and np.shape(m) != np.shape(g):
                raise ValueError(f"{where} has shape {np.shape(m)} but the gradient has shape {np.shape(g)}")
