"""Adafactor exactly as Shazeer & Stern (ICML 2018) define it (SPEC.md section 5).

Layout of this module:

1. state node types: a factored leaf keeps its row and column statistics
   (:class:`FactoredSecondMoment`), any other leaf one full second-moment array
   (:class:`FullSecondMoment`); nothing else, no placeholder arrays;
2. per-leaf formulas (the paper's algorithm for one tensor), with one CPU path
   for the column sums of large or wide matrices;
3. the Optax transformations: :func:`scale_by_factored_rms` (the factored
   second-moment normalisation alone), :func:`scale_by_adafactor` (the whole
   step, positive) and the :func:`adafactor` alias.

Passes over memory. For a factored matrix the step needs the row and column
means of ``G^2``, ``RMS(X_{t-1})`` and ``RMS(U_t)`` before any element of the
update can be written, so ``G`` and ``X`` must each be read at least twice.
With ``V_ij = r_i c_j / mean(r)``,

    sum_ij U_ij^2 = mean(r) * sum_ij (G_ij rsqrt(r_i) rsqrt(c_j))^2,

and the two reciprocal square roots are the factors of the update too
(:func:`_factors`). Each statistic is one reduction that squares ``G``
itself (on CPU, optimization barriers keep XLA from computing ``G^2`` once
into a temporary as large as the leaf): a step reads ``G`` four times and
``X`` twice and writes ``X`` once, 28 bytes a float32 parameter against
``optax.adam``'s 40 (seven arrays read, three written; ``benchmarks/run.py``).
On CPU a matrix of 2^22 elements or more, or wider than 6144 columns, takes a
loop over blocks of rows for both column sums and ``sum X^2``
(``w_j = sum_i G_ij^2 / r_i`` beside the column means, 24 bytes a parameter;
:func:`_column_sums_blocked`).
That loop slices ``G`` along its rows, so a leaf that is, or may be, sharded
takes the reductions, which XLA partitions with vector-sized all-reduces.

Compile time: :func:`_leaf_step` traces each distinct kind of leaf once (a
transformer repeats a few shapes many times) and XLA compiles identical
kernels once, so the first call grows with the number of distinct leaf
shapes rather than with the number of leaves (``benchmarks/RESULTS.md``,
issue 18, which also records the designs that were measured and dropped).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from optkit._src import checks, flat, sharding
from optkit._src.numerics import compute_dtype, per_dtype

__all__ = [
    "FactoredSecondMoment",
    "FullSecondMoment",
    "ScaleByFactoredRmsState",
    "ScaleByAdafactorState",
    "scale_by_factored_rms",
    "scale_by_adafactor",
    "adafactor",
    "factored_axes",
]

_FACTORED_DIMS = ("last", "largest")


# ---------------------------------------------------------------------------
# 1. State


class FactoredSecondMoment(NamedTuple):
    """The second-moment statistics of one factored tensor (the paper's ``R_t`` and ``C_t``).

    For a leaf factored over (row axis ``a``, column axis ``b``), see
    :func:`factored_axes`:

    Attributes:
      v_row: ``R_t / m``, the exponential average of the mean of ``G^2 + eps1``
        over axis ``b``: the leaf's shape with axis ``b`` removed.
      v_col: ``C_t / n``, the same over axis ``a``: the leaf's shape with axis
        ``a`` removed.

    Both keep the leaf's other axes in their order, so a sharding of the leaf
    maps onto them by dropping one axis.
    """

    v_row: jax.Array
    v_col: jax.Array


class FullSecondMoment(NamedTuple):
    """The second moment of one unfactored tensor (vectors, scalars, or ``factored=False``).

    Attributes:
      v: the exponential average of ``G^2 + eps1``, the leaf's shape.
    """

    v: jax.Array


class ScaleByFactoredRmsState(NamedTuple):
    """State of :func:`scale_by_factored_rms`.

    Attributes:
      count: int32 scalar, the number of updates made so far; the update being
        made is the paper's step ``t = count + 1``.
      nu: a tree with the parameters' structure whose leaves are
        :class:`FactoredSecondMoment` or :class:`FullSecondMoment` nodes, in
        ``nu_dtype`` or each parameter's dtype.
    """

    count: jax.Array
    nu: Any


class ScaleByAdafactorState(NamedTuple):
    """State of :func:`scale_by_adafactor` (and of :func:`adafactor`'s first link).

    Attributes:
      count: int32 scalar, the number of updates made so far (``t = count + 1``).
      nu: the second-moment statistics, as in :class:`ScaleByFactoredRmsState`.
      mu: the first moment (an exponential average of the final scaled update
        ``alpha_t * U_t``) with the parameters' structure, in ``mu_dtype`` or
        each parameter's dtype; None when ``b1`` is None.
    """

    count: jax.Array
    nu: Any
    mu: Any


# ---------------------------------------------------------------------------
# 2. Per-leaf formulas


def factored_axes(
    shape: tuple[int, ...],
    *,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
) -> tuple[int, int] | None:
    """Which two axes of a tensor of ``shape`` Adafactor factors over, or None (SPEC 5).

    ``"last"`` takes the last two axes (SPEC 5, Decision (rank > 2): the
    paper's matrix case for every leading index); ``"largest"`` the two
    largest, the second largest as the row axis, ties broken as
    ``optax.scale_by_factored_rms`` breaks them (``numpy.argsort``).

    Args:
      shape: the parameter's shape.
      factored: False: never factor.
      factored_dims: ``"last"`` or ``"largest"``.
      min_dim_size_to_factor: both chosen axes must be at least this long.

    Returns:
      ``(row_axis, col_axis)``, non-negative: the row statistics average over
      ``col_axis`` and the column statistics over ``row_axis``. None (a full
      second moment) for rank < 2, ``factored=False``, or a chosen axis
      shorter than ``min_dim_size_to_factor`` or empty.

    Raises:
      TypeError: ``shape`` is not a sequence of integers, a non-bool
        ``factored``, a non-integer ``min_dim_size_to_factor``.
      ValueError: a negative entry in ``shape``, an unknown
        ``factored_dims``, ``min_dim_size_to_factor < 1``.

    Example:
      >>> import optkit
      >>> optkit.factored_axes((3, 512, 256), factored_dims="largest")
      (2, 1)
      >>> optkit.factored_axes((3, 512, 256)), optkit.factored_axes((3, 512, 256), min_dim_size_to_factor=300)
      ((1, 2), None)
    """
    shape = checks.check_shape("shape", shape)
    checks.check_factoring(factored, factored_dims, min_dim_size_to_factor, _FACTORED_DIMS)
    if not factored or len(shape) < 2:
        return None
    if factored_dims == "last":
        row, col = len(shape) - 2, len(shape) - 1
    else:
        order = np.argsort(shape)
        row, col = int(order[-2]), int(order[-1])
    if min(shape[row], shape[col]) < max(1, min_dim_size_to_factor):
        return None
    return row, col


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1 :]


def _inverse(v, guard: bool):
    """``1 / v``; 0 where ``v == 0`` if ``guard`` (only possible when eps1 may be 0)."""
    if not guard:
        return 1 / v
    return jnp.where(v == 0, jnp.zeros_like(v), 1 / jnp.where(v == 0, jnp.ones_like(v), v))


def _rsqrt(v, guard: bool):
    """``1 / sqrt(v)``; 0 where ``v == 0`` if ``guard``."""
    if not guard:
        return lax.rsqrt(v)
    return jnp.where(v == 0, jnp.zeros_like(v), lax.rsqrt(jnp.where(v == 0, jnp.ones_like(v), v)))


def _ema(old, new_mean, b2, eps1):
    """``b2 * old + (1 - b2) * (mean(G^2) + eps1)``: the paper's R_t, C_t and V_t updates.

    ``eps1`` is added to the mean instead of to every element of ``G^2``: the
    same number (the mean of a constant is the constant) for one addition per
    statistic instead of one per element.
    """
    return b2 * old + (1 - b2) * (new_mean + eps1)


class _Moments(NamedTuple):
    """What the per-leaf statistics pass returns (all in the compute dtype)."""

    nu: Any  # FactoredSecondMoment or FullSecondMoment, new values
    sum_u2: jax.Array  # sum of U_t^2 over the leaf (for RMS(U_t))
    sum_x2: jax.Array | None  # sum of X_{t-1}^2 over the leaf (for RMS(X_{t-1})), if asked
    # U_t without the clipping: G * factors[0] (unfactored, rsqrt(V)), or
    # G * rsqrt(r_i) * rsqrt(c_j) * sqrt(mean(r)) (factored: the three factors,
    # the last with the row axis kept, of size 1); computed once for sum U^2 and the update.
    factors: tuple


# On CPU, a matrix takes the loop of _column_sums_blocked (both column sums in
# one pass over G, 24 bytes a float32 parameter instead of 28) when it is
# large or wide. Large: from 2^22 elements the pass saved is worth the loop's
# compilation (about 0.1 s for each distinct leaf shape in the first call),
# and smaller leaves are mostly read from cache anyway. Wide: XLA:CPU reduces
# over the rows of a matrix (one sum per column) at memory speed up to about
# 6144 columns and 2-6x slower beyond (the accumulators of one row no longer
# fit in the first-level cache): 11.7 ms for 2^25 float32 elements in 8192
# columns against 5.4 ms in 6144 (benchmarks/RESULTS.md).
_LOOP_MIN_SIZE = 1 << 22
_WIDE_COLUMNS = 6144
# Elements per block of rows in that loop: 2 x 512 KiB of float32 accumulators,
# which stay in the two cores' second-level caches (1 MiB each here). Each
# iteration costs a few microseconds besides its bytes, so blocks this large
# (32 rows of 4096, 170 of 768) took 8192x4096 from 0.86x to 0.81x of
# optax.adam's step and the 50257x768 embedding from 0.91x to 0.83x, against
# 2^14 elements (benchmarks/RESULTS.md, issue 18).
_BLOCK_ELEMENTS = 1 << 17


def _factored_plain(g, x, nu, b2, eps1, row, col, guard, dtype, separate=False) -> _Moments:
    """The statistics pass for a factored leaf as reductions, each over one or two axes of ``G``.

    ``sum U^2 = sum_others mean(r) * sum_ij G_ij^2 / (r_i c_j)``: one reduction
    over the two factored axes with both statistics broadcast.

    ``separate`` (CPU): without optimization barriers XLA computes ``G^2``
    once for the row and column means, into a temporary as large as the leaf
    that is then read twice; behind them each reduction squares ``G`` itself
    and reads only ``G``.
    """
    barrier = lax.optimization_barrier if separate else (lambda a: a)
    g = g.astype(dtype)
    g_col = barrier(g)
    v_row = _ema(nu.v_row.astype(dtype), jnp.mean(g * g, axis=col), b2, eps1)
    v_col = _ema(nu.v_col.astype(dtype), jnp.mean(g_col * g_col, axis=row), b2, eps1)
    factors = _factors(v_row, v_col, row, col, guard)
    g_u, row_factor, col_factor = barrier((g, factors[0], factors[1]))
    unit = (g_u * jnp.expand_dims(row_factor, col)) * jnp.expand_dims(col_factor, row)  # G / sqrt(r_i c_j)
    sum_u2 = jnp.sum(factors[2] ** 2 * jnp.sum(unit * unit, axis=(row, col), keepdims=True))
    sum_x2 = None if x is None else jnp.sum(jnp.square(x.astype(dtype)))
    return _Moments(FactoredSecondMoment(v_row, v_col), sum_u2, sum_x2, factors)


def _factors(v_row, v_col, row, col, guard):
    """``(rsqrt(r), rsqrt(c), sqrt(mean(r)))`` with ``V_ij = r_i c_j / mean(r)``: ``U = G * all three``.

    ``sqrt(mean(r))`` keeps ``r``'s averaged axis (size 1) and gets the column
    axis inserted, so that it broadcasts against ``G``. No product ``r_i c_j``
    is formed, which could underflow to 0 in float32 when the gradient is 0.
    """
    row_in_r = row if row < col else row - 1
    mean_r = jnp.mean(v_row, axis=row_in_r, keepdims=True)
    return _rsqrt(v_row, guard), _rsqrt(v_col, guard), jnp.expand_dims(jnp.sqrt(mean_r), col)


def _column_sums_blocked(g, x, inv_inner, dtype):
    """CPU: ``sum_i G_pij^2`` and ``sum_i G_pij^2 * inv_inner_pi`` (both (P, m)) and ``sum X^2`` (or None), one pass.

    ``g`` and ``x`` are (P, n, m). For large or wide matrices
    (``_LOOP_MIN_SIZE``, ``_WIDE_COLUMNS``): a loop over blocks of rows adds
    each block's squares element-wise into (2, block, m) accumulators, or
    (3, block, m) with ``X^2``, that stay in cache; each iteration is one
    fused element-wise kernel, and the accumulators' rows are summed once per
    matrix at the end. Matrices ``p`` are looped over too. Reading ``X`` here
    rather than in a reduction of its own took 3-4% off the step of an
    8192x4096 matrix (benchmarks/RESULTS.md, issue 18).
    """
    num_matrices, n, m = g.shape
    block = min(n, max(8, min(256, _BLOCK_ELEMENTS // m)))
    num_blocks = n // block
    tail = n - num_blocks * block
    parts = 2 if x is None else 3

    def terms(p, lo, size):
        gb = lax.dynamic_slice(g, (p, lo, 0), (1, size, m))[0].astype(dtype)
        inv = lax.dynamic_slice(inv_inner, (p, lo), (1, size))[0]
        g2 = gb * gb
        if x is None:
            return jnp.stack([g2, g2 * inv[:, None]])
        xb = lax.dynamic_slice(x, (p, lo, 0), (1, size, m))[0].astype(dtype)
        return jnp.stack([g2, g2 * inv[:, None], xb * xb])

    def matrix(p):
        acc = lax.fori_loop(
            0, num_blocks, lambda i, acc: acc + terms(p, i * block, block), jnp.zeros((parts, block, m), dtype)
        )
        sums = jnp.sum(acc, axis=1)
        if tail:
            sums = sums + jnp.sum(terms(p, num_blocks * block, tail), axis=1)
        return sums

    sums = matrix(0)[None] if num_matrices == 1 else lax.map(matrix, jnp.arange(num_matrices))
    return sums[:, 0], sums[:, 1], None if x is None else jnp.sum(sums[:, 2])


def _factored_blocked(g, x, nu, b2, eps1, row, col, guard, dtype) -> _Moments:
    """The statistics pass for a large or wide leaf whose factored axes are its last two (CPU).

    The leaf is P matrices (n, m). The statistic averaged over the contiguous
    last axis ("inner": the row statistic for ``factored_dims="last"``) is one
    fast row reduction; the other ("outer") and ``w_j = sum_i G_ij^2 / inner_i``
    are column sums, taken by :func:`_column_sums_blocked` in one pass with
    ``sum X^2`` (when asked), and ``sum_ij G^2 / (r_i c_j) = sum_j w_j / outer_j``.
    """
    shape = g.shape
    n, m = shape[-2], shape[-1]
    num_matrices = g.size // (n * m)
    g3 = g.reshape(num_matrices, n, m)
    inner_is_row = col == len(shape) - 1
    inner_old = (nu.v_row if inner_is_row else nu.v_col).reshape(num_matrices, n).astype(dtype)
    outer_old = (nu.v_col if inner_is_row else nu.v_row).reshape(num_matrices, m).astype(dtype)
    gc = g3.astype(dtype)
    inner = _ema(inner_old, jnp.mean(gc * gc, axis=-1), b2, eps1)
    x3 = None if x is None else x.reshape(num_matrices, n, m)
    outer_sum, w, sum_x2 = _column_sums_blocked(g3, x3, _inverse(inner, guard), dtype)
    outer = _ema(outer_old, outer_sum / n, b2, eps1)
    mean_r = jnp.mean(inner if inner_is_row else outer, axis=-1)
    sum_u2 = jnp.sum(mean_r * jnp.sum(w * _inverse(outer, guard), axis=-1))
    if inner_is_row:
        v_row, v_col = inner.reshape(_without(shape, col)), outer.reshape(_without(shape, row))
    else:
        v_row, v_col = outer.reshape(_without(shape, col)), inner.reshape(_without(shape, row))
    return _Moments(FactoredSecondMoment(v_row, v_col), sum_u2, sum_x2, _factors(v_row, v_col, row, col, guard))


def _factored_moments(g, x, nu, b2, eps1, row, col, guard, dtype, split) -> _Moments:
    """New row/column statistics, ``sum U^2`` and ``sum X^2`` for a factored leaf.

    ``split``: the leaf is, or may be, divided among devices (decided by the
    caller on the arrays it holds, see :func:`_step`).
    """
    args = (g, x, nu, b2, eps1, row, col, guard, dtype)
    shape = g.shape
    loop = ({row, col} == {len(shape) - 2, len(shape) - 1} and shape[-2] >= 8
            and (shape[-1] > _WIDE_COLUMNS or g.size >= _LOOP_MIN_SIZE))
    # The loop slices G along its rows and matrices; were those split among
    # devices, XLA would gather all of G onto every device for it. A leaf that
    # is (or, on a mesh with Auto axes, may be) sharded takes the reductions,
    # which XLA partitions with only vector-sized all-reduces.
    if loop and not split:
        cpu = lambda: _factored_blocked(*args)  # noqa: E731
    else:
        cpu = lambda: _factored_plain(*args, separate=True)  # noqa: E731
    # GPUs and TPUs run the reductions at memory speed and fuse them into one pass over G.
    return lax.platform_dependent(cpu=cpu, default=lambda: _factored_plain(*args))


def _full_moments(g, x, nu, b2, eps1, guard, dtype) -> _Moments:
    """New second moment, ``sum U^2`` and ``sum X^2`` for an unfactored leaf."""
    g = g.astype(dtype)
    v = _ema(nu.v.astype(dtype), g * g, b2, eps1)
    factor = _rsqrt(v, guard)
    sum_u2 = jnp.sum(jnp.square(g * factor))
    sum_x2 = None if x is None else jnp.sum(jnp.square(x.astype(dtype)))
    return _Moments(FullSecondMoment(v), sum_u2, sum_x2, (factor,))


def _statistics(g, x, nu, b2, eps1, axes, guard, dtype, split=False) -> _Moments:
    """The statistics pass: new ``R_t, C_t`` (or ``V_t``), ``sum U_t^2`` and ``sum X_{t-1}^2`` (if ``x``)."""
    if axes is None:
        return _full_moments(g, x, nu, b2, eps1, guard, dtype)
    return _factored_moments(g, x, nu, b2, eps1, *axes, guard, dtype, split)


def _normalized(g, moments: _Moments, axes, scale, dtype):
    """``scale * U_t`` for one leaf, from the factors of ``U_t`` (see :class:`_Moments`)."""
    g = g.astype(dtype)
    if axes is None:
        return g * (scale * moments.factors[0])
    row, col = axes
    row_factor, col_factor, sqrt_mean_r = moments.factors
    return g * jnp.expand_dims(row_factor, col) * jnp.expand_dims(col_factor, row) * (scale * sqrt_mean_r)


class _Config(NamedTuple):
    """The options of one Adafactor step, fixed when the transformation is made."""

    eps1: Any
    eps2: Any
    clipping_threshold: Any  # None: no update clipping
    multiply_by_parameter_scale: bool
    b1: Any  # None: no first moment
    weight_decay_rate: Any  # None: no weight decay
    guard: bool  # eps1 may be 0: divisions by statistics guarded


def _adafactor_leaf(g, x, nu, m, *, axes, b2, lr, config: _Config, dtype, split=False):
    """SPEC 5 for one tensor: ``(update, new statistics, new first moment)``, with ``X_t = X_{t-1} - update``.

    ``axes`` are the leaf's factored axes (None: a full second moment), ``b2``
    and ``lr`` the step's ``b2_t`` and ``rho_t`` (or learning rate) in
    ``dtype``; ``x`` is the parameter (needed for the parameter scale and the
    weight decay), ``m`` the first moment (with ``b1``)::

        R_t, C_t (or V_t)                     # _statistics
        alpha_t = max(eps2, RMS(X_{t-1})) * rho_t
        U_t     = G_t / sqrt(V_t)
        U_t     = U_t / max(1, RMS(U_t) / d)
        update  = alpha_t * U_t                 # _normalized, the two scalars folded in
        update  = b1 * M_{t-1} + (1 - b1) * update          (b1)
        update  = update + weight_decay_rate * alpha_t * X_{t-1}   (weight decay)
    """
    x_for_scale = x if config.multiply_by_parameter_scale else None
    moments = _statistics(g, x_for_scale, nu, b2, config.eps1, axes, config.guard, dtype, split)
    alpha = lr
    if config.multiply_by_parameter_scale:
        alpha = lr * jnp.maximum(jnp.asarray(config.eps2, dtype), _rms(moments.sum_x2, g.size, dtype))
    scale = alpha
    if config.clipping_threshold is not None:
        rms_u = _rms(moments.sum_u2, g.size, dtype)
        d = jnp.asarray(config.clipping_threshold, dtype)
        scale = alpha / jnp.maximum(jnp.asarray(1, dtype), rms_u / d)
    update = _normalized(g, moments, axes, scale, dtype)
    m_new = None
    if config.b1 is not None:
        b1 = jnp.asarray(config.b1, dtype)
        update = b1 * m.astype(dtype) + (1 - b1) * update
        m_new = update
    if config.weight_decay_rate is not None:
        update = update + (jnp.asarray(config.weight_decay_rate, dtype) * alpha) * x.astype(dtype)
    return update, moments.nu, m_new


@functools.partial(jax.jit, static_argnames=("static",))
def _adafactor_leaf_jit(g, x, nu, m, b2, lr, numbers, *, static):
    axes, dtype, split, multiply_by_parameter_scale, guard = static[:5]
    eps1, eps2, clipping_threshold, b1, weight_decay_rate = numbers
    config = _Config(eps1=eps1, eps2=eps2, clipping_threshold=clipping_threshold,
                     multiply_by_parameter_scale=multiply_by_parameter_scale, b1=b1,
                     weight_decay_rate=weight_decay_rate, guard=guard)
    return _adafactor_leaf(g, x, nu, m, axes=axes, b2=b2, lr=lr, config=config, dtype=dtype, split=split)


def _leaf_step(g, x, nu, m, *, axes, b2, lr, config: _Config, dtype, split):
    """:func:`_adafactor_leaf` traced once per distinct leaf (shapes, dtypes, options), not once per leaf.

    A parameter tree repeats a few shapes many times (a transformer's layers).
    Under ``jax.jit`` the inner ``jax.jit`` makes JAX trace and lower each
    distinct leaf once and call it at every leaf of that kind; XLA inlines the
    calls, so the compiled program is the one the plain calls would give, and
    XLA compiles the identical kernels once. On the 149-leaf transformer tree
    of ``benchmarks/run.py`` tracing and lowering took 0.3 s instead of 0.9 s
    (benchmarks/RESULTS.md, issue 18). Called eagerly, each distinct leaf is
    one compiled call instead of dozens of dispatched operations.

    The hyperparameters are arguments (they may be traced under
    ``optax.inject_hyperparams``); what decides the program is static: the
    factored axes, the dtype, ``split`` (decided outside, on the arrays the
    caller holds, whose shardings are known), the options, and the CPU loop's
    thresholds (read now, so that changing them retraces).
    """
    numbers = tuple(None if v is None else jnp.asarray(v, dtype) for v in
                    (config.eps1, config.eps2, config.clipping_threshold, config.b1, config.weight_decay_rate))
    static = (axes, np.dtype(dtype), bool(split), bool(config.multiply_by_parameter_scale), bool(config.guard),
              _LOOP_MIN_SIZE, _WIDE_COLUMNS, _BLOCK_ELEMENTS)
    return _adafactor_leaf_jit(g, x, nu, m, b2, lr, numbers, static=static)


def _b2(count, decay_rate, dtype):
    """``b2_t = 1 - t^(-decay_rate)`` with ``t = count + 1``, in ``dtype`` (so ``b2_1 = 0``)."""
    t = count.astype(dtype) + 1  # in dtype: count + 1 in int32 wraps to -2^31 at the last count
    return 1 - t ** (-jnp.asarray(decay_rate, dtype))


def _step_scalars(count, learning_rate, decay_rate):
    """The step's ``(b2_t, lr_t)`` per dtype, for the update with ``t = count + 1``: computed once per step.

    ``lr_t`` is ``rho_t = min(1e-2, 1/sqrt(t))`` when ``learning_rate`` is None
    (SPEC 5), ``schedule(count)`` for an Optax schedule (called once, with the
    number of updates already made, as ``optax.scale_by_learning_rate`` calls
    it), or the number itself. Returns ``dtype -> (b2_t, lr_t)``, memoized.
    """
    value = learning_rate(count) if callable(learning_rate) else learning_rate

    def scalars(dtype):
        b2 = _b2(count, decay_rate, dtype)
        if value is None:
            t = count.astype(dtype) + 1
            return b2, jnp.minimum(jnp.asarray(1e-2, dtype), 1 / jnp.sqrt(t))
        return b2, jnp.asarray(value).astype(dtype)

    return per_dtype(scalars)


def _rms(sum_sq, size, dtype):
    return jnp.sqrt(sum_sq / jnp.asarray(max(size, 1), dtype))


# ---------------------------------------------------------------------------
# State: building and reading it


def _init_nu(params, factored, factored_dims, min_dim_size_to_factor, nu_dtype):
    min_dim = checks.concrete_min_dim_size(min_dim_size_to_factor)

    def leaf(p):
        # A Flax box (nnx.Param, nn.Partitioned) is unwrapped, and each statistic is
        # boxed again with the box's metadata, its sharding names reduced as the array is.
        box = p if sharding.is_box(p) else None
        p = sharding.unbox(p)
        p = p if isinstance(p, jax.ShapeDtypeStruct) else jnp.asarray(p)
        dtype = nu_dtype or p.dtype
        axes = factored_axes(
            p.shape, factored=factored, factored_dims=factored_dims, min_dim_size_to_factor=min_dim
        )
        if axes is None:
            return FullSecondMoment(sharding.rebox(box, sharding.full_like(p, 0, dtype)))
        row, col = axes
        return FactoredSecondMoment(
            v_row=sharding.rebox(box, sharding.zeros_without_axis(p, col, dtype), drop_axis=col),
            v_col=sharding.rebox(box, sharding.zeros_without_axis(p, row, dtype), drop_axis=row),
        )

    return jax.tree.map(leaf, params, is_leaf=sharding.is_box)


_NODE_FIELDS = {frozenset(FactoredSecondMoment._fields): FactoredSecondMoment,
                frozenset(FullSecondMoment._fields): FullSecondMoment}


def _read_nu(nu, updates, factored_dims, transformation, name="state.nu"):
    """The statistics of every leaf of ``updates``, and a function that writes new ones back.

    The statistics are matched to the gradients by path, not by container
    type: ``init`` gives NamedTuple nodes in the parameters' containers, but
    ``nnx.Optimizer`` hands them back inside ``nnx.State`` and its variables,
    linen inside ``nn.Partitioned`` boxes, and ``flax.serialization.to_state_dict``
    as plain dicts. Every such form is read, and the new statistics are written
    into the same form, so that the state keeps its structure from step to step
    (``jax.jit``, ``lax.scan``, ``nnx.update``).

    Returns:
      ``(nodes, write)``: one :class:`FactoredSecondMoment` or
      :class:`FullSecondMoment` of plain arrays per leaf of ``updates`` (in
      leaf order), and ``write(new_nodes)``, the new ``nu`` in ``nu``'s structure.

    Raises:
      ValueError: the statistics are for other leaf paths, or a leaf's are
        neither ``v`` nor ``v_row`` and ``v_col``, or do not fit its shape; the
        message names the optimizer and the path.
    """
    grads = sharding.leaves_with_paths(updates)
    names = [tuple(map(sharding.key_name, path)) for path, _ in grads]
    index = {n: i for i, n in enumerate(names)}
    stats = sharding.leaves_with_paths(nu)
    fields: list[dict[str, Any]] = [{} for _ in grads]
    slots = []
    for path, leaf in stats:
        field = sharding.key_name(path[-1]) if path else None
        i = index.get(tuple(map(sharding.key_name, path[:-1]))) if path else None
        if i is None or field not in ("v", "v_row", "v_col"):
            # Name the first difference between the leaf paths of the statistics and of the updates.
            owners = list(dict.fromkeys(jax.tree_util.keystr(p[:-1]) or "<root>" for p, _ in stats))
            checks.check_same_paths(owners, [jax.tree_util.keystr(p) or "<root>" for p, _ in grads],
                                    f"{transformation}: {name}", "updates")
            raise ValueError(f"{transformation}: {name} holds {jax.tree_util.keystr(path)}, which is "
                             f"not the statistics v, v_row or v_col of a leaf of updates")
        fields[i][field] = leaf
        slots.append((i, field))
    nodes = []
    for (path, g), found in zip(grads, fields):
        where = f"{transformation}: {name} at {jax.tree_util.keystr(path) or '<root>'}"
        node_type = _NODE_FIELDS.get(frozenset(found))
        if node_type is None:
            raise ValueError(
                f"{where} does not match updates: expected the statistics v (unfactored) or v_row and "
                f"v_col (factored) of the update there, found {sorted(found) or 'nothing'}; was the "
                f"state made for other parameters?"
            )
        node = node_type(**found)
        shape = np.shape(g)
        if node_type is FullSecondMoment:
            if np.shape(node.v) != shape:
                raise ValueError(f"{where}: v has shape {np.shape(node.v)} but the update has shape {shape}")
        else:
            axes = factored_axes(shape, factored=True, factored_dims=factored_dims)
            expected = None if axes is None else (_without(shape, axes[1]), _without(shape, axes[0]))
            got = (np.shape(node.v_row), np.shape(node.v_col))
            if expected != got:
                raise ValueError(
                    f"{where}: factored statistics of shapes {got} do not fit an update of shape "
                    f"{shape} factored over factored_dims={factored_dims!r} (expected {expected})"
                )
        nodes.append(node)
    treedef = jax.tree.structure(nu)

    def write(new_nodes):
        return treedef.unflatten([getattr(new_nodes[i], field) for i, field in slots])

    return nodes, write


def _step(grads, nodes, xs, mus, scalars, config: _Config, factored_dims: str):
    """One step over the leaves: ``(updates, new statistics nodes, new first moments)``, each a list.

    A leaf's factored axes are found once here (the state decided them at
    init); its arithmetic runs in the promotion of its gradient's, statistics',
    parameter's and first moment's dtypes with float32, and every result is
    stored back in its own dtype (updates in the parameter's, or the
    gradient's without params).
    """
    new_updates, new_nu, new_mu = [], [], []
    for g, node, x, m in zip(grads, nodes, xs, mus):
        g = jnp.asarray(g)
        x = None if x is None else jnp.asarray(x)
        dtype = compute_dtype(g.dtype, *(leaf.dtype for leaf in node), None if x is None else x.dtype,
                              None if m is None else m.dtype)
        axes, split = None, False
        if isinstance(node, FactoredSecondMoment):
            axes = factored_axes(g.shape, factored=True, factored_dims=factored_dims, min_dim_size_to_factor=1)
            split = any(sharding.may_be_split(a) for a in (g, *node))
        b2, lr = scalars(dtype)
        update, nu, m_new = _leaf_step(g, x, node, m, axes=axes, b2=b2, lr=lr, config=config, dtype=dtype,
                                       split=split)
        new_updates.append(update.astype(g.dtype if x is None else x.dtype))
        new_nu.append(type(node)(*(a.astype(b.dtype) for a, b in zip(nu, node))))
        if m_new is not None:
            new_mu.append(m_new.astype(m.dtype))
    return new_updates, new_nu, new_mu


# ---------------------------------------------------------------------------
# 3. Transformations


def scale_by_factored_rms(
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    *,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adafactor's normalised gradient ``U_t = G_t / sqrt(V_t)``, before clipping and step size.

    With ``t = count + 1`` and ``b2_t = 1 - t^(-decay_rate)`` (so ``b2_1 = 0``:
    no bias correction is needed), for a factored leaf ``G`` (n x m over its
    factored axes, see :func:`factored_axes`; any other axes index independent
    matrices)::

        R_t = b2_t * R_{t-1} + (1 - b2_t) * mean_j(G_t^2 + eps1)     # row statistics
        C_t = b2_t * C_{t-1} + (1 - b2_t) * mean_i(G_t^2 + eps1)     # column statistics
        V_t = R_t C_t / mean_i(R_t)
        U_t = G_t / sqrt(V_t)

    and for any other leaf ``V_t = b2_t * V_{t-1} + (1 - b2_t) * (G_t^2 + eps1)``
    (SPEC.md section 5; Shazeer & Stern 2018, Algorithms 4 and 5). The paper's
    sums become means (the same ``V_t``). This is the building block that
    ``optax.scale_by_factored_rms`` also provides, with the paper's defaults and
    a state without placeholder arrays. :func:`scale_by_adafactor` is the whole
    algorithm.

    Args:
      decay_rate: the exponent in ``b2_t = 1 - t^(-decay_rate)`` (the paper's
        0.8), > 0.
      eps1: the paper's ``epsilon_1``, added to ``G^2`` (default 1e-30), >= 0.
        With 0, a coordinate whose ``V_t`` is 0 (its gradient has always been
        0) gets ``U = 0`` instead of 0/0.
      factored: False keeps a full second moment for every leaf.
      factored_dims: ``"last"`` (factor over the last two axes, as the paper,
        tensor2tensor and Hugging Face) or ``"largest"`` (the two largest
        axes, as Optax).
      min_dim_size_to_factor: a leaf whose chosen axes are not both at least
        this long keeps a full second moment; default 1 factors every leaf of
        rank >= 2. It decides the state's structure, so under
        ``optax.inject_hyperparams`` with a traced ``init`` it must be static.
      nu_dtype: dtype of the statistics; None keeps each parameter's dtype.
        float32 for bfloat16 parameters costs little (the factored statistics
        are vectors) and keeps the averages precise.

    Returns:
      An ``optax.GradientTransformation`` with state
      :class:`ScaleByFactoredRmsState`; updates have the gradients' dtypes
      (arithmetic in float32 or wider).

    Raises:
      ValueError: ``decay_rate <= 0``, ``eps1 < 0``, an unknown
        ``factored_dims``, ``min_dim_size_to_factor < 1`` (at construction);
        gradients that do not match the state (at update, naming the path).
      TypeError: non-floating leaves, a non-bool ``factored``, a non-integer
        ``min_dim_size_to_factor``, a non-floating ``nu_dtype``.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_factored_rms(), optax.clip_by_block_rms(1.0),
      ...                  optax.scale_by_learning_rate(1e-2))
      >>> state = tx.init({"w": jnp.ones((3, 4))})
      >>> state[0].nu["w"].v_row.shape, state[0].nu["w"].v_col.shape
      ((3,), (4,))
    """
    checks.check_scalar("decay_rate", decay_rate, low=0.0, low_open=True)
    checks.check_scalar("eps1", eps1, low=0.0)
    checks.check_factoring(factored, factored_dims, min_dim_size_to_factor, _FACTORED_DIMS)
    nu_dtype = checks.check_dtype("nu_dtype", nu_dtype)
    guard = not checks.is_concrete_positive(eps1)

    config = _Config(eps1=eps1, eps2=None, clipping_threshold=None, multiply_by_parameter_scale=False, b1=None,
                     weight_decay_rate=None, guard=guard)

    def init_fn(params):
        flat.refuse_flat(params, "scale_by_factored_rms")
        checks.check_floating(params, "params")
        nu = _init_nu(params, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
        return ScaleByFactoredRmsState(count=jnp.zeros([], jnp.int32), nu=nu)

    def update_fn(updates, state, params=None):
        del params
        state = checks.check_state(state, ScaleByFactoredRmsState, "scale_by_factored_rms")
        checks.check_count(state.count, "scale_by_factored_rms")
        flat.refuse_flat(updates, "scale_by_factored_rms")
        checks.check_floating(updates, "updates")
        nodes, write_nu = _read_nu(state.nu, updates, factored_dims, "scale_by_factored_rms")
        treedef = jax.tree.structure(updates)
        grads = treedef.flatten_up_to(updates)
        # U_t alone: the Adafactor step with a unit step size, no parameter scale, no clipping.
        scalars = _step_scalars(state.count, 1, decay_rate)
        new_updates, new_nu, _ = _step(grads, nodes, [None] * len(grads), [None] * len(grads), scalars, config,
                                       factored_dims)
        count = optax.safe_increment(state.count)
        return treedef.unflatten(new_updates), ScaleByFactoredRmsState(count, write_nu(new_nu))

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_adafactor(
    learning_rate: optax.ScalarOrSchedule | None = None,
    *,
    b1: float | None = None,
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    eps2: float = 1e-3,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    weight_decay_rate: float | None = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
    """The whole Adafactor step, as a positive quantity: ``X_t = X_{t-1} - update``.

    :func:`adafactor` is this followed by a sign flip. Per leaf, with
    ``t = count + 1`` and ``U_t`` from :func:`scale_by_factored_rms`::

        U_t     = U_t / max(1, RMS(U_t) / d)                    # d = clipping_threshold
        alpha_t = max(eps2, RMS(X_{t-1})) * rho_t               # rho_t: see learning_rate
        M_t     = b1 * M_{t-1} + (1 - b1) * alpha_t * U_t        # only with b1
        update  = M_t (or alpha_t * U_t) + weight_decay_rate * alpha_t * X_{t-1}

    ``RMS(A) = sqrt(mean(A^2))`` over the whole leaf. All of it is one
    transformation because ``rho_t``, ``b2_t``, the first moment and the decay
    share one step count and the first moment averages the *scaled* update.

    Args:
      learning_rate: None for the paper's relative step ``rho_t = min(1e-2,
        1/sqrt(t))``; a float or an Optax schedule (called with ``count``, the
        number of updates already made) replaces ``rho_t`` (SPEC 5, Decision
        (learning rate)), >= 0.
      b1: the first-moment decay (the paper's ``beta_1``), in [0, 1), or None
        (default: no first moment, and no state for it).
      decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor,
        nu_dtype: as :func:`scale_by_factored_rms`.
      eps2: the paper's ``epsilon_2``, the floor of the parameter scale
        (default 1e-3), >= 0.
      clipping_threshold: the paper's ``d`` (default 1), > 0, or None for no
        update clipping.
      multiply_by_parameter_scale: False drops the ``max(eps2, RMS(X_{t-1}))``
        factor (then ``params`` are only needed for weight decay).
      weight_decay_rate: decoupled weight decay ``w`` scaled by the step size,
        as Hugging Face's Adafactor (SPEC 5, Decision (weight decay)), >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByAdafactorState`.
      Updates have the parameters' dtypes (the gradients' without params);
      arithmetic runs in float32 or wider, and the scalars (``t``, ``b2_t``,
      ``rho_t``, ``alpha_t``) in that dtype.

    Raises:
      ValueError: a hyperparameter out of range or an unknown ``factored_dims``
        (at construction); mismatched trees or ``params=None`` where the
        parameter scale or weight decay needs them (at update).
      TypeError: non-floating leaves, non-bool flags, a non-integer
        ``min_dim_size_to_factor``, non-floating state dtypes.

    Example:
      >>> import jax.numpy as jnp, optax, optkit
      >>> tx = optax.chain(optkit.scale_by_adafactor(), optax.scale(-1.0))  # = optkit.adafactor()
      >>> state = tx.init({"w": jnp.ones((3, 4)), "b": jnp.zeros(4)})
    """
    checks.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True, allow_none=True)
    checks.check_decay("b1", b1, allow_none=True)
    checks.check_scalar("decay_rate", decay_rate, low=0.0, low_open=True)
    checks.check_scalar("eps1", eps1, low=0.0)
    checks.check_scalar("eps2", eps2, low=0.0)
    checks.check_scalar("clipping_threshold", clipping_threshold, low=0.0, low_open=True, allow_none=True)
    if not isinstance(multiply_by_parameter_scale, (bool, np.bool_)):
        raise TypeError(f"multiply_by_parameter_scale must be a bool, got {multiply_by_parameter_scale!r}")
    checks.check_factoring(factored, factored_dims, min_dim_size_to_factor, _FACTORED_DIMS)
    checks.check_scalar("weight_decay_rate", weight_decay_rate, low=0.0, allow_none=True)
    mu_dtype = checks.check_dtype("mu_dtype", mu_dtype)
    nu_dtype = checks.check_dtype("nu_dtype", nu_dtype)
    guard = not checks.is_concrete_positive(eps1)
    decay_reason = (
        None if weight_decay_rate is None else checks.params_needed_for("weight_decay_rate", weight_decay_rate)
    )
    if multiply_by_parameter_scale:
        params_reason = "multiply_by_parameter_scale=True (the step size max(eps2, RMS(X)) * rho_t)"
    else:
        params_reason = decay_reason
    config = _Config(eps1=eps1, eps2=eps2, clipping_threshold=clipping_threshold,
                     multiply_by_parameter_scale=bool(multiply_by_parameter_scale), b1=b1,
                     weight_decay_rate=None if decay_reason is None else weight_decay_rate, guard=guard)

    def init_fn(params):
        flat.refuse_flat(params, "scale_by_adafactor")
        checks.check_floating(params, "params")
        nu = _init_nu(params, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
        mu = None if b1 is None else sharding.tree_zeros_like(params, mu_dtype)
        return ScaleByAdafactorState(count=jnp.zeros([], jnp.int32), nu=nu, mu=mu)

    def update_fn(updates, state, params=None):
        state = checks.check_state(state, ScaleByAdafactorState, "scale_by_adafactor")
        checks.check_count(state.count, "scale_by_adafactor")
        flat.refuse_flat(updates, "scale_by_adafactor")
        checks.check_floating(updates, "updates")
        nodes, write_nu = _read_nu(state.nu, updates, factored_dims, "scale_by_adafactor")
        if b1 is not None:
            if state.mu is None:
                raise ValueError("state.mu is None but b1 is set: the state was made with b1=None")
            checks.check_same_shapes(state.mu, updates, "state.mu", "updates")
        if params is None:
            if params_reason is not None and nodes:  # an empty tree has nothing to scale
                checks.check_params_given(params, "adafactor", params_reason)
        else:
            checks.check_params(params, updates)
        treedef = jax.tree.structure(updates)
        grads = treedef.flatten_up_to(updates)
        xs = [None] * len(grads) if params is None else treedef.flatten_up_to(params)
        mus = [None] * len(grads) if b1 is None else treedef.flatten_up_to(state.mu)
        scalars = _step_scalars(state.count, learning_rate, decay_rate)
        new_updates, new_nu, new_mu = _step(grads, nodes, xs, mus, scalars, config, factored_dims)
        count = optax.safe_increment(state.count)
        mu = None if b1 is None else treedef.unflatten(new_mu)
        return treedef.unflatten(new_updates), ScaleByAdafactorState(count, write_nu(new_nu), mu)

    return optax.GradientTransformation(init_fn, update_fn)


def adafactor(
    learning_rate: optax.ScalarOrSchedule | None = None,
    *,
    b1: float | None = None,
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    eps2: float = 1e-3,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    weight_decay_rate: float | None = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adafactor exactly as Shazeer & Stern (ICML 2018) define it, with sublinear memory.

    ``optax.apply_updates(X, updates)`` gives, for each parameter tensor
    (SPEC.md section 5), with ``t = count + 1``::

        alpha_t = max(eps2, RMS(X_{t-1})) * rho_t,   rho_t = min(1e-2, 1/sqrt(t))
        b2_t    = 1 - t^(-decay_rate)                                 # b2_1 = 0
        R_t     = b2_t * R_{t-1} + (1 - b2_t) * mean_j(G_t^2 + eps1)   # factored leaves:
        C_t     = b2_t * C_{t-1} + (1 - b2_t) * mean_i(G_t^2 + eps1)   #   rows and columns
        V_t     = R_t C_t / mean_i(R_t)       # other leaves: b2_t V_{t-1} + (1 - b2_t)(G_t^2 + eps1)
        U_t     = G_t / sqrt(V_t)
        U_t     = U_t / max(1, RMS(U_t) / d)
        X_t     = X_{t-1} - alpha_t * U_t

    with the options: a first moment ``M_t = b1 M_{t-1} + (1 - b1) alpha_t U_t``
    replacing ``alpha_t U_t`` (tensor2tensor), and decoupled weight decay
    ``- weight_decay_rate * alpha_t * X_{t-1}`` (Hugging Face). With the
    defaults it is also Hugging Face ``transformers.optimization.Adafactor``
    with its defaults.

    Memory: a factored leaf of shape (..., n, m) keeps ``(..., n)`` row and
    ``(..., m)`` column statistics; other leaves one array of their shape; a
    first moment only with ``b1``; one int32 step count.

    Sharding (``jax.sharding``): ``tx.init`` and ``jax.jit(tx.init)`` on
    sharded parameters (and ``jax.eval_shape(tx.init, ...)`` with ``Explicit``
    mesh axes) give the first moment and unfactored statistics each
    parameter's ``NamedSharding``, the row statistics the parameter's
    ``PartitionSpec`` without the column axis and the column statistics
    without the row axis; the count is replicated.
    Reductions across shards (row and column means, ``RMS(X)``, ``RMS(U)``)
    are XLA's all-reduces of vectors and scalars.

    How it differs from ``optax.adafactor``: there, ``learning_rate=None``
    means no step size at all (``rho_t`` is absent) and the default
    ``min_dim_size_to_factor`` is 128 over the two largest axes; and Optax's
    weight decay is not scaled by the step size. ``optax.adafactor(
    learning_rate=lambda c: jnp.minimum(1e-2, 1 / jnp.sqrt(c + 1)))`` equals
    ``optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128)``.

    Args:
      learning_rate: None (default) for the paper's relative step size
        ``rho_t``; a float or an Optax schedule replaces ``rho_t``, >= 0.
      b1: the first-moment decay ``beta_1`` in [0, 1), or None (the paper's
        default: no first moment).
      decay_rate: the exponent of ``b2_t = 1 - t^(-decay_rate)``, > 0 (paper: 0.8).
      eps1: ``epsilon_1``, added to ``G^2`` (paper: 1e-30), >= 0.
      eps2: ``epsilon_2``, the floor of the parameter scale (paper: 1e-3), >= 0.
      clipping_threshold: ``d`` (paper: 1), > 0, or None for no update clipping.
      multiply_by_parameter_scale: False uses ``alpha_t = rho_t``.
      factored: False keeps a full second moment for every leaf.
      factored_dims: ``"last"`` or ``"largest"``; see :func:`factored_axes`.
      min_dim_size_to_factor: leaves whose chosen axes are shorter keep a full
        second moment (default 1: every leaf of rank >= 2 is factored).
      weight_decay_rate: ``w`` in ``- w * alpha_t * X_{t-1}``, >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      nu_dtype: dtype of the second-moment statistics; None keeps each
        parameter's dtype. For bfloat16 parameters, ``nu_dtype=jnp.float32``
        keeps float32 statistics (the mixed-precision setting); float16
        statistics overflow when the mean of ``G^2`` over a row or column
        reaches 65520 (an RMS gradient of 256), and the tensor's updates are
        NaN from then on (README "Precision").

    A NaN or infinite gradient element makes its whole tensor's update NaN
    (the statistics and RMS are shared over rows, columns and the tensor),
    and the tensor stays NaN; wrap the optimizer in ``optax.apply_if_finite``
    to skip such steps (README "Non-finite gradients").

    Returns:
      An ``optax.GradientTransformation``: ``optax.chain`` of
      :func:`scale_by_adafactor` and ``optax.scale(-1)``; its state is
      ``(ScaleByAdafactorState, EmptyState())``. Updates have the parameters'
      dtypes. Every numeric argument works under ``optax.inject_hyperparams``
      (``min_dim_size_to_factor`` must be static if ``init`` is traced).

    Raises:
      ValueError: ``decay_rate <= 0``, ``eps1 < 0``, ``eps2 < 0``,
        ``clipping_threshold <= 0``, ``b1`` outside [0, 1), a negative learning
        or weight-decay rate, an unknown ``factored_dims``,
        ``min_dim_size_to_factor < 1`` (at construction); mismatched trees,
        ``params=None`` with the parameter scale or weight decay (at update).
      TypeError: non-floating leaves or state dtypes, non-bool flags.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
      >>> tx = optkit.adafactor()
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: jnp.sum((jnp.ones(4) @ p["w"] + p["b"]) ** 2))(params)
      >>> updates, state = tx.update(grads, state, params)
      >>> params = optax.apply_updates(params, updates)
    """
    return optax.chain(
        scale_by_adafactor(
            learning_rate,
            b1=b1,
            decay_rate=decay_rate,
            eps1=eps1,
            eps2=eps2,
            clipping_threshold=clipping_threshold,
            multiply_by_parameter_scale=multiply_by_parameter_scale,
            factored=factored,
            factored_dims=factored_dims,
            min_dim_size_to_factor=min_dim_size_to_factor,
            weight_decay_rate=weight_decay_rate,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
        ),
        optax.scale(-1.0),
    )
