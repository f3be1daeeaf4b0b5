"""Blockwise 8-bit quantization with Dettmers' dynamic maps, as bitsandbytes computes it (SPEC.md section 10).

A moment of ``n`` elements is held as ``n`` uint8 codes (row-major, cut into blocks of ``block_size`` and
zero-padded) and one float32 ``absmax`` per block; element ``i`` is ``map[code_i] * absmax[i // block_size]``.
``quantize_blockwise`` finds each code as the nearest map entry to ``x * (1 / absmax)`` (``rounding="nearest"``:
the paper's, bitsandbytes' CUDA kernels') or through bitsandbytes 0.50's CPU table of 65,536 points
(``rounding="table"``). The maps are computed in float32 as bitsandbytes computes them (its ``torch.linspace``
rounds once per value). On a mesh of explicit axes the codes and absmax are split over the same blocks, and the
lookups are gathers whose sharding is given.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optkit._src import hyperparams, sharding, trees

__all__ = ["QuantizedMoment", "quantize_blockwise", "dequantize_blockwise", "dynamic_map"]

ROUNDING = ("nearest", "table")
BLOCK_SIZE = 256  # bitsandbytes' blockwise size
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


@functools.lru_cache(maxsize=2)
def _bucket_starts(signed: bool) -> np.ndarray:
    """For each of the 65,536 buckets of float32 values sharing their top 16 bits, how many map entries lie below
    the bucket. The dynamic maps' entries are at least 0.8% apart relative to their size and a bucket spans 0.8%
    at most, so a bucket holds at most one entry (checked here): ``searchsorted(map, x)`` is the bucket's start,
    plus 1 if that entry is below ``x``."""
    code = _dynamic_map(signed)
    keys = np.arange(_TABLE_SIZE, dtype=np.uint32)
    ends = np.stack([keys << 16, (keys << 16) | 0xFFFF]).view(np.float32)
    finite = np.isfinite(ends).all(axis=0)
    low, high = np.where(finite, ends.min(axis=0), 0), np.where(finite, ends.max(axis=0), 0)
    start = np.searchsorted(code, low, side="left")
    if np.any((np.searchsorted(code, high, side="right") - start)[finite] > 1):
        raise AssertionError("a bucket of float32 values holds two map entries")
    return np.minimum(start, code.size - 1).astype(np.int32)


def _count_below(signed: bool, x: jax.Array) -> jax.Array:
    """How many of the 256 sorted map entries are below each float32 ``x`` (``searchsorted(map, x)``): the
    bucket's start (:func:`_bucket_starts`), plus 1 if the entry there is below ``x``."""
    bucket = (jax.lax.bitcast_convert_type(x, jnp.uint32) >> 16).astype(jnp.int32)
    start = _lookup(_bucket_starts(signed), bucket)
    return start + (_lookup(_dynamic_map(signed), start) < x).astype(jnp.int32)


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
    # A block of subnormal values (absmax below float32's smallest normal) is held as zeros: 1 / absmax would
    # overflow, and XLA flushes subnormal operands to zero anyway.
    absmax = jnp.where(absmax >= np.finfo(np.float32).tiny, absmax, 0)
    normed = blocks * jnp.where(absmax > 0, 1 / jnp.where(absmax > 0, absmax, 1), 0)[:, None]
    code = dynamic_map(signed)
    if rounding == "table":
        position = ((jnp.clip(normed, -1.0, 1.0) + 1.0) * 0.5) * np.float32(_TABLE_SIZE - 1) + 0.5
        codes = _lookup(_table(signed), position.astype(jnp.int32))
    else:
        upper = jnp.clip(_count_below(signed, normed), 1, 255)
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
      >>> [round(v, 4) for v in optkit.dequantize_blockwise(q, (2,)).tolist()]  # the nearest map entries
      [0.5008, -0.993]
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


