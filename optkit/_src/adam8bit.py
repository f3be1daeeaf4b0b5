"""8-bit blockwise Adam exactly as bitsandbytes' ``Adam8bit`` computes it (SPEC.md section 10).

SPEC 10, at step ``t`` (1 at the first update), every parameter of ``min_8bit_size`` elements or more::

    m, v   = dequantize(state)                 code[index] * absmax of the index's block of 256
    m      = b1 * m + (1 - b1) * g
    v      = b2 * v + (1 - b2) * g^2
    X_new  = X * (1 - lr * weight_decay) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    state  = quantize(m, signed dynamic map), quantize(v, unsigned dynamic map)

``quantize``: per block of ``block_size`` consecutive elements (row-major), ``absmax = max |x|``; each element's
code is the map entry nearest ``x * (1 / absmax)`` (``rounding="nearest"``, the paper's and bitsandbytes'
CUDA kernels'), or the one bitsandbytes 0.50's CPU backend finds through its 65,536-entry table
(``rounding="table"``). A smaller parameter keeps float32 moments and bitsandbytes' 32-bit update,
``X_new = X * (1 - lr * weight_decay) - lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t))``.

The dynamic maps are Dettmers' (``bitsandbytes.functional.create_dynamic_map``), computed here in float32 as
bitsandbytes computes them (its ``torch.linspace`` rounds once per value).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optkit._src import hyperparams, sharding, trees

__all__ = ["QuantizedMoment", "ScaleByAdam8bitState", "adam8bit", "dynamic_map", "quantize_blockwise",
           "dequantize_blockwise"]

ROUNDING = ("nearest", "table")
BLOCK_SIZE = 256  # bitsandbytes' blockwise size
MIN_8BIT_SIZE = 4096  # bitsandbytes' default: smaller parameters keep float32 moments
_TABLE_SIZE = 65536


def _linspace(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32 on the CPU: each value rounded once (a fused multiply-add)
    from the float32 step, the first half counted from ``start``, the second from ``end``."""
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps)
    exact = np.where(index < steps // 2, np.float64(start32) + step * index,
                     np.float64(end32) - step * (steps - index - 1))
    return exact.astype(np.float32)


def dynamic_map(signed: bool = True) -> np.ndarray:
    """Dettmers' 8-bit dynamic quantization map: 256 sorted float32 values in [-1, 1] (signed) or [0, 1].

    bitsandbytes' ``create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)``: for each exponent
    ``e = -6, ..., 0`` the midpoints of ``2^(e+6) + 1`` (signed) or ``2^(e+7) + 1`` points evenly spaced in
    [0.1, 1], times ``10^e`` (and their negatives, signed), then 0 and 1, zeros to 256 entries, sorted.

    Args:
      signed: the first moment's map (True) or the second moment's (False).

    Returns:
      A read-only ``(256,)`` float32 NumPy array.

    Raises:
      TypeError: ``signed`` is not a bool.

    Example:
      >>> import optkit
      >>> m = optkit.dynamic_map(signed=False)
      >>> m.shape, float(m[0]), float(m[-1])
      ((256,), 0.0, 1.0)
    """
    hyperparams.check_flag("signed", signed)
    return _dynamic_map(bool(signed))


@functools.lru_cache(maxsize=2)
def _dynamic_map(signed: bool) -> np.ndarray:
    values: list[np.ndarray] = []
    for i in range(7):
        points = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        bounds = _linspace(0.1, 1.0, points)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        scale = 10.0 ** (i - 6)
        values.append(np.float32(scale) * means)
        if signed:
            values.append(np.float32(-scale) * means)
    out = np.concatenate([*values, np.float32([0.0, 1.0])])
    out = np.sort(np.concatenate([out, np.zeros(256 - out.size, np.float32)]))
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=2)
def _table(signed: bool) -> np.ndarray:
    """bitsandbytes 0.50's CPU table: for each of 65,536 points evenly spaced in [-1, 1], the index of its
    nearest map entry by the float32 midpoints between entries (``build_quantize_lut``)."""
    code = _dynamic_map(signed)
    midpoints = np.float32(0.5) * (code[:-1] + code[1:])
    points = np.float32(-1.0) + (np.float32(2.0) * np.arange(_TABLE_SIZE, dtype=np.float32)) / np.float32(
        _TABLE_SIZE - 1)
    return np.searchsorted(midpoints, points, side="left").astype(np.uint8)


class QuantizedMoment(NamedTuple):
    """A moment held in 8 bits: ``codes`` (uint8, ``(blocks, block_size)``, the flattened parameter in row-major
    order, zero-padded) and ``absmax`` (float32, ``(blocks,)``); element ``i`` is
    ``map[codes.flat[i]] * absmax[i // block_size]``."""

    codes: jax.Array
    absmax: jax.Array


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


def _explicit_spec(like: jax.Array) -> Any:
    """``like``'s sharding when its type splits it over mesh axes (Explicit axes), else None."""
    if not sharding.may_be_split(like):
        return None
    typed = sharding._type_sharding(like)
    return typed if getattr(typed, "spec", None) is not None and any(typed.spec) else None


def _constant(values: np.ndarray, like: jax.Array) -> jax.Array:
    """A table as an array replicated on ``like``'s mesh when ``like`` is split over it (so that it
    type-checks beside ``like``), the plain constant otherwise."""
    table = jnp.asarray(values)
    return table if _explicit_spec(like) is None else jax.sharding.reshard(table, PartitionSpec())


def _lookup(values: np.ndarray | jax.Array, index: jax.Array) -> jax.Array:
    """``values[index]``, sharded as ``index`` (a gather the explicit mesh types cannot infer)."""
    spec = _explicit_spec(index)
    if spec is None:
        return jnp.asarray(values)[index]
    return _constant(np.asarray(values) if isinstance(values, np.ndarray) else values, index).at[index].get(
        out_sharding=spec)


def _count_below(code: np.ndarray, x: jax.Array) -> jax.Array:
    """How many of the 256 sorted ``code`` entries are below each ``x`` (``searchsorted(code, x)``): a binary
    search of 8 lookups, which, unlike ``jnp.searchsorted``, type-checks on an explicitly sharded ``x``."""
    count = jnp.zeros_like(x, jnp.int32)
    for step in (128, 64, 32, 16, 8, 4, 2, 1):
        probe = count + step
        count = jnp.where(_lookup(code, probe - 1) < x, probe, count)
    return count


def _block_spec(like: jax.Array, blocks: int) -> PartitionSpec | None:
    """Where a split ``like``'s blocks go: over the mesh axes of its first split dimension when they divide the
    block count, else whole; None when ``like`` is not split over explicit mesh axes."""
    typed = _explicit_spec(like)
    if typed is None:
        return None
    sizes = dict(zip(typed.mesh.axis_names, typed.mesh.axis_sizes))
    for entry in typed.spec:
        if entry is None:
            continue
        names = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
        if blocks % math.prod(sizes[n] for n in names) == 0:
            return PartitionSpec(entry, None)
        break
    return PartitionSpec()


def _blocks(x: jax.Array, block_size: int) -> jax.Array:
    """``x`` flattened (row-major), zero-padded and cut into rows of ``block_size`` (split over its mesh axes
    by blocks when ``x`` is split)."""
    blocks = -(-x.size // block_size)
    spec = _block_spec(x, blocks)
    if spec is None:
        return jnp.pad(jnp.ravel(x), (0, blocks * block_size - x.size)).reshape(blocks, block_size)
    if spec != PartitionSpec() and x.size == blocks * block_size and _rows_split_alike(x, spec):
        # A split along the first axis whose parts are whole blocks: each device cuts its own part.
        return x.reshape(blocks, block_size, out_sharding=spec)
    whole = jax.sharding.reshard(x, PartitionSpec())  # the flat order mixes the parts: gathered, then split
    out = jnp.pad(jnp.ravel(whole), (0, blocks * block_size - x.size)).reshape(blocks, block_size)
    return jax.sharding.reshard(out, spec)


def _rows_split_alike(x: jax.Array, spec: PartitionSpec) -> bool:
    """``x`` is split along its first axis only, over the axes ``spec`` splits the blocks over."""
    entries = list(_explicit_spec(x).spec) + [None] * x.ndim
    return entries[0] == spec[0] and all(e is None for e in entries[1:x.ndim])


def _unblocked(values: jax.Array, shape: tuple[int, ...], like: jax.Array | None) -> jax.Array:
    """The first ``prod(shape)`` elements of ``values`` in ``shape``, sharded as ``like`` when it is split."""
    typed = None if like is None else _explicit_spec(like)
    if typed is None:
        return values.reshape(-1)[:math.prod(shape)].reshape(shape)
    spec = _explicit_spec(values)
    if spec is not None and values.size == math.prod(shape) and _rows_split_alike(like, spec.spec):
        return values.reshape(shape, out_sharding=typed.spec)
    out = jax.sharding.reshard(values, PartitionSpec()).reshape(-1)[:math.prod(shape)].reshape(shape)
    return jax.sharding.reshard(out, typed.spec)


def quantize_blockwise(x: jax.Array, *, signed: bool = True, block_size: int = 256,
                       rounding: str = "nearest") -> QuantizedMoment:
    """Blockwise 8-bit quantization of ``x`` with the dynamic map (SPEC.md section 10).

    Args:
      x: a floating array of any shape (computed in float32).
      signed: the signed map (a first moment) or the unsigned one (a second moment, ``x >= 0``).
      block_size: elements per block, a positive int (bitsandbytes: 256).
      rounding: ``"nearest"`` (the nearest map entry, ties to the lower) or ``"table"`` (bitsandbytes 0.50's
        CPU backend: ``x * (1 / absmax)`` to one of 65,536 points, then that point's nearest entry).

    Returns:
      A :class:`QuantizedMoment`; a block of zeros has absmax 0 and codes 0.

    Raises:
      ValueError: an unknown ``rounding``, a ``block_size`` below 1.
      TypeError: ``x`` not floating, ``signed`` not a bool.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> q = optkit.quantize_blockwise(jnp.array([0.5, -1.0, 0.0]), block_size=4)
      >>> q.codes.shape, q.absmax.tolist()
      ((1, 4), [1.0])
    """
    hyperparams.check_choice("rounding", rounding, ROUNDING)
    hyperparams.check_flag("signed", signed)
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"quantize_blockwise: x must be a floating array, got dtype {jnp.result_type(x)}")
    blocks = _blocks(jnp.asarray(x, jnp.float32), int(block_size))
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    normed = blocks * jnp.where(absmax > 0, 1 / jnp.where(absmax > 0, absmax, 1), 0)[:, None]
    code = dynamic_map(signed)
    if rounding == "table":
        position = ((jnp.clip(normed, -1.0, 1.0) + 1.0) * 0.5) * np.float32(_TABLE_SIZE - 1) + 0.5
        codes = _lookup(_table(signed), position.astype(jnp.int32))
    else:
        upper = jnp.clip(_count_below(code, normed), 1, 255)
        lower = upper - 1
        nearer_lower = jnp.abs(normed - _lookup(code, lower)) <= jnp.abs(_lookup(code, upper) - normed)
        codes = jnp.where(nearer_lower, lower, upper).astype(jnp.uint8)
    codes = jnp.where(absmax[:, None] > 0, codes, 0).astype(jnp.uint8)
    return QuantizedMoment(codes, absmax)


def dequantize_blockwise(moment: QuantizedMoment, shape: tuple[int, ...], *, signed: bool = True,
                         like: jax.Array | None = None) -> jax.Array:
    """The float32 array of ``shape`` that ``moment`` holds: ``map[code] * absmax`` of each element's block.

    Args:
      moment: a :class:`QuantizedMoment` (from :func:`quantize_blockwise` or the state of :func:`adam8bit`).
      shape: the array's shape (its size at most ``codes.size``).
      signed: the map ``moment`` was quantized with.
      like: an array whose sharding the result takes (a split parameter's gradient); None: as XLA places it.

    Returns:
      A float32 array of ``shape``.

    Raises:
      ValueError: ``shape`` holds more elements than ``moment``, or ``absmax`` does not have a value per block.
      TypeError: ``moment`` is not a ``(codes, absmax)`` pair, ``shape`` not a sequence of ints, ``signed`` not a
        bool.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> q = optkit.quantize_blockwise(jnp.array([0.5, -1.0]), block_size=2)
      >>> optkit.dequantize_blockwise(q, (2,)).tolist()
      [0.5, -1.0]
    """
    if not isinstance(moment, tuple) or len(moment) != 2:
        raise TypeError(f"dequantize_blockwise: moment must be a QuantizedMoment (codes, absmax), got "
                        f"{type(moment).__name__}")
    hyperparams.check_flag("signed", signed)
    codes, absmax = moment
    shape = trees.check_shape("shape", shape)
    size = math.prod(shape)
    if size > codes.size or absmax.shape != codes.shape[:1]:
        raise ValueError(f"dequantize_blockwise: codes {codes.shape} and absmax {absmax.shape} do not hold an "
                         f"array of shape {tuple(shape)}")
    values = _lookup(dynamic_map(signed), codes) * absmax[:, None]
    return _unblocked(values, tuple(shape), like)


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
        1.56e-5 of its block's absmax, never 0); :func:`quantize_blockwise` says how each rounds.

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

        xs = params if params is not None and reason is not None else jax.tree.map(lambda _: None, updates)
        out = jax.tree.map(per_leaf, updates, state.mu, state.nu, xs,
                           is_leaf=lambda v: v is None or _is_moment(v))
        pick = [jax.tree.map(lambda _, o, i=i: o[i], updates, out) for i in range(3)]
        return pick[0], ScaleByAdam8bitState(optax.safe_increment(state.count), pick[1], pick[2])

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
