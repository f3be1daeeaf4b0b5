"""The Adafactor step as it runs: :func:`optkit._src.adafactor.paper.adafactor_leaf`, computed in fewer passes.

Three things differ from the paper-literal step, each tested equal to it
(tests/optimizers/test_adafactor.py):

- Reciprocal square roots. With ``V_ij = r_i c_j / mean(r)``,
  ``U = G * rsqrt(r_i) * rsqrt(c_j) * sqrt(mean(r))`` and
  ``sum_ij U_ij^2 = mean(r) * sum_ij (G_ij rsqrt(r_i) rsqrt(c_j))^2``:
  the two reciprocal square roots are computed once and serve both
  ``RMS(U)`` and the update (:func:`_factors`), and no product ``r_i c_j``
  is formed (it can underflow to 0 in float32). So a step reads ``G`` four
  times and ``X`` twice and writes ``X`` once. On CPU, optimization barriers
  keep XLA from computing ``G^2`` once into a temporary as large as the leaf
  (each statistic then squares ``G`` itself).
- The CPU row-block loop (:func:`_factored_blocked`). For a matrix that is
  large (:data:`LOOP_MIN_SIZE` elements) or wide (more than
  :data:`WIDE_COLUMNS` columns) the column sums, ``w_j = sum_i G_ij^2 / r_i``
  and ``sum X^2`` are taken in one pass over blocks of rows whose
  accumulators stay in cache, where XLA:CPU's column reductions are slow.
  It slices ``G`` along its rows, so a leaf that is, or may be, split among
  devices takes the reductions instead, which XLA partitions with
  vector-sized all-reduces. Other platforms take the plain reductions.
- Tracing once per kind of leaf (:func:`leaf_step`): a transformer repeats a
  few shapes many times; an inner ``jax.jit`` per distinct leaf signature
  makes JAX trace and lower each kind once, and XLA inlines the calls.

Why these thresholds, and the designs measured and dropped: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit._src.adafactor.factoring import without
from optkit._src.adafactor.state import FactoredSecondMoment, FullSecondMoment

__all__ = ["Options", "leaf_step", "LOOP_MIN_SIZE", "WIDE_COLUMNS", "BLOCK_ELEMENTS"]

# The CPU row-block loop takes matrices of at least this many elements, or wider than WIDE_COLUMNS
# columns, in blocks of rows of about BLOCK_ELEMENTS elements (benchmarks/RESULTS.md).
LOOP_MIN_SIZE = 1 << 22
WIDE_COLUMNS = 6144
BLOCK_ELEMENTS = 1 << 17


class Options(NamedTuple):
    """The hyperparameters of one Adafactor step (arrays, or Python numbers; None: the term is off).

    Attributes:
      eps1: ``epsilon_1``, added to ``G^2``.
      eps2: ``epsilon_2``, the floor of the parameter scale (used with ``multiply_by_parameter_scale``).
      clipping_threshold: ``d``; None: no update clipping.
      b1: the first-moment decay; None: no first moment.
      weight_decay_rate: decoupled weight decay; None: none.
      max_parameter_scale: the ceiling of the parameter scale (T5X); None: none.
    """

    eps1: Any
    eps2: Any
    clipping_threshold: Any
    b1: Any
    weight_decay_rate: Any
    max_parameter_scale: Any = None


class _Static(NamedTuple):
    """What decides the program of one leaf's step (``jax.jit``'s static argument)."""

    axes: tuple[int, int] | None
    dtype: np.dtype
    split: bool  # the leaf is, or may be, divided among devices
    multiply_by_parameter_scale: bool
    guard: bool  # eps1 may be 0: divisions by statistics are guarded
    loop: tuple[int, int, int]  # (LOOP_MIN_SIZE, WIDE_COLUMNS, BLOCK_ELEMENTS), read at each call
    batch_ndim: int = 0  # leading axes never averaged over: RMS(X), RMS(U) and the clipping per slice
    decay_by_alpha: bool = True  # weight decay scaled by the step size (the paper's; T5X: False)


def leaf_step(g, x, nu, m, *, axes, b2, lr, options: Options, multiply_by_parameter_scale: bool, guard: bool,
              dtype, split: bool, batch_ndim: int = 0, decay_by_alpha: bool = True):
    """SPEC 5 for one tensor: ``(update, new statistics, new first moment)``, with ``X_t = X_{t-1} - update``.

    Args:
      g, x, nu, m: the gradient, the parameter (None when nothing needs it),
        the statistics node and the first moment (None without ``b1``).
      axes: the leaf's factored axes, or None for a full second moment.
      b2, lr: the step's ``b2_t`` and ``rho_t`` (or learning rate), in ``dtype``.
      options: the hyperparameters; multiply_by_parameter_scale, guard: switches.
      dtype: the compute dtype; split: whether the leaf is, or may be, sharded.
      batch_ndim: the leading axes that are batch axes (factor rules): each
        slice is its own tensor for ``RMS(X)``, ``RMS(U)`` and the clipping
        (the statistics are per leading index anyway).
      decay_by_alpha: whether weight decay is scaled by ``alpha_t`` (the
        paper's, Hugging Face's) or not (T5X's).

    Traced once per distinct leaf (shapes, dtypes, switches): the
    hyperparameters are arguments (they may be traced under
    ``optax.inject_hyperparams``), the rest is static.
    """
    numbers = Options(*(None if v is None else jnp.asarray(v, dtype) for v in options))
    static = _Static(axes, np.dtype(dtype), bool(split), bool(multiply_by_parameter_scale), bool(guard),
                     (LOOP_MIN_SIZE, WIDE_COLUMNS, BLOCK_ELEMENTS), int(batch_ndim), bool(decay_by_alpha))
    return _leaf_step_jit(g, x, nu, m, b2, lr, numbers, static=static)


@functools.partial(jax.jit, static_argnames=("static",))
def _leaf_step_jit(g, x, nu, m, b2, lr, o: Options, *, static: _Static):
    dtype, axes = static.dtype, static.axes
    x_for_scale = x if static.multiply_by_parameter_scale else None
    nb = static.batch_ndim
    size = int(np.prod(g.shape[nb:]))  # the elements of one slice (of the whole leaf without batch axes)
    if axes is None:
        moments = _full_moments(g, x_for_scale, nu, b2, o.eps1, static.guard, dtype, nb)
    else:
        moments = _factored_moments(g, x_for_scale, nu, b2, o.eps1, *axes, static, dtype)
    alpha = lr                                                                  # alpha_t
    if static.multiply_by_parameter_scale:
        parameter_scale = jnp.maximum(jnp.asarray(o.eps2, dtype), _rms(moments.sum_x2, size, dtype))
        if o.max_parameter_scale is not None:
            parameter_scale = jnp.minimum(parameter_scale, jnp.asarray(o.max_parameter_scale, dtype))
        alpha = lr * parameter_scale
    scale = alpha
    if o.clipping_threshold is not None:                                        # update clipping
        rms_u = _rms(moments.sum_u2, size, dtype)
        scale = alpha / jnp.maximum(jnp.asarray(1, dtype), rms_u / jnp.asarray(o.clipping_threshold, dtype))
    update = _normalized(g, moments, axes, scale, dtype)                         # alpha_t * U_t
    m_new = None
    if o.b1 is not None:
        b1 = jnp.asarray(o.b1, dtype)
        update = b1 * m.astype(dtype) + (1 - b1) * update
        m_new = update
    if o.weight_decay_rate is not None:
        rate = jnp.asarray(o.weight_decay_rate, dtype)
        update = update + (rate * alpha if static.decay_by_alpha else rate) * x.astype(dtype)
    return update, moments.nu, m_new


class _Moments(NamedTuple):
    """What the statistics pass returns (all in the compute dtype)."""

    nu: Any  # FactoredSecondMoment or FullSecondMoment, new values
    sum_u2: jax.Array  # sum of U_t^2 over the leaf (for RMS(U_t))
    sum_x2: jax.Array | None  # sum of X_{t-1}^2 over the leaf (for RMS(X_{t-1})), if asked
    # U_t without the clipping: G * factors[0] (unfactored, rsqrt(V)), or
    # G * rsqrt(r_i) * rsqrt(c_j) * sqrt(mean(r)) (factored: the three factors,
    # the last with the row axis kept, of size 1); computed once for sum U^2 and the update.
    factors: tuple


def _rms(sum_sq, size, dtype):
    return jnp.sqrt(sum_sq / jnp.asarray(max(size, 1), dtype))


def _sum(a, batch_ndim: int):
    """The sum of ``a``: over everything (a scalar), or per slice of its ``batch_ndim`` leading axes
    (kept, with the other axes of size 1, so that it broadcasts against the leaf)."""
    if batch_ndim == 0:
        return jnp.sum(a)
    return jnp.sum(a, axis=tuple(range(batch_ndim, a.ndim)), keepdims=True)


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


def _full_moments(g, x, nu, b2, eps1, guard, dtype, batch_ndim=0) -> _Moments:
    """New second moment, ``sum U^2`` and ``sum X^2`` for an unfactored leaf."""
    g = g.astype(dtype)
    v = _ema(nu.v.astype(dtype), g * g, b2, eps1)
    factor = _rsqrt(v, guard)
    sum_u2 = _sum(jnp.square(g * factor), batch_ndim)
    sum_x2 = None if x is None else _sum(jnp.square(x.astype(dtype)), batch_ndim)
    return _Moments(FullSecondMoment(v), sum_u2, sum_x2, (factor,))


def _factored_moments(g, x, nu, b2, eps1, row, col, static: _Static, dtype) -> _Moments:
    """New row/column statistics, ``sum U^2`` and ``sum X^2`` for a factored leaf, by platform."""
    args = (g, x, nu, b2, eps1, row, col, static.guard, dtype, static.batch_ndim)
    loop_min_size, wide_columns, block_elements = static.loop
    shape = g.shape
    loop = ({row, col} == {len(shape) - 2, len(shape) - 1} and shape[-2] >= 8
            and (shape[-1] > wide_columns or g.size >= loop_min_size))
    if loop and not static.split:
        cpu = lambda: _factored_blocked(*args, block_elements)  # noqa: E731
    else:
        cpu = lambda: _factored_plain(*args, separate=True)  # noqa: E731
    # GPUs and TPUs run the reductions at memory speed and fuse them into one pass over G.
    return lax.platform_dependent(cpu=cpu, default=lambda: _factored_plain(*args))


def _factors(v_row, v_col, row, col, guard):
    """``(rsqrt(r), rsqrt(c), sqrt(mean(r)))`` with ``V_ij = r_i c_j / mean(r)``: ``U = G * all three``.

    ``sqrt(mean(r))`` keeps ``r``'s averaged axis (size 1) and gets the column
    axis inserted, so that it broadcasts against ``G``.
    """
    row_in_r = row if row < col else row - 1
    mean_r = jnp.mean(v_row, axis=row_in_r, keepdims=True)
    return _rsqrt(v_row, guard), _rsqrt(v_col, guard), jnp.expand_dims(jnp.sqrt(mean_r), col)


def _factored_plain(g, x, nu, b2, eps1, row, col, guard, dtype, batch_ndim=0, separate=False) -> _Moments:
    """The statistics pass as reductions, each over one or two axes of ``G``.

    ``sum U^2 = sum_others mean(r) * sum_ij G_ij^2 / (r_i c_j)``: one reduction
    over the two factored axes with both statistics broadcast. ``separate``
    (CPU): optimization barriers make each reduction square ``G`` itself.
    """
    barrier = lax.optimization_barrier if separate else (lambda a: a)
    g = g.astype(dtype)
    g_col = barrier(g)
    v_row = _ema(nu.v_row.astype(dtype), jnp.mean(g * g, axis=col), b2, eps1)
    v_col = _ema(nu.v_col.astype(dtype), jnp.mean(g_col * g_col, axis=row), b2, eps1)
    factors = _factors(v_row, v_col, row, col, guard)
    g_u, row_factor, col_factor = barrier((g, factors[0], factors[1]))
    unit = (g_u * jnp.expand_dims(row_factor, col)) * jnp.expand_dims(col_factor, row)  # G / sqrt(r_i c_j)
    sum_u2 = _sum(factors[2] ** 2 * jnp.sum(unit * unit, axis=(row, col), keepdims=True), batch_ndim)
    sum_x2 = None if x is None else _sum(jnp.square(x.astype(dtype)), batch_ndim)
    return _Moments(FactoredSecondMoment(v_row, v_col), sum_u2, sum_x2, factors)


def _column_sums_blocked(g, x, inv_inner, dtype, block_elements):
    """``sum_i G_pij^2`` and ``sum_i G_pij^2 * inv_inner_pi`` (both (P, m)) and ``sum X^2`` (or None), one pass.

    ``g`` and ``x`` are (P, n, m). A loop over blocks of rows adds each block's
    squares element-wise into (2, block, m) accumulators, or (3, block, m)
    with ``X^2``, that stay in cache; each iteration is one fused
    element-wise kernel, and the accumulators' rows are summed once per
    matrix at the end. Matrices ``p`` are looped over too.
    """
    num_matrices, n, m = g.shape
    block = min(n, max(8, min(256, block_elements // m)))
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
    return sums[:, 0], sums[:, 1], None if x is None else sums[:, 2]


def _per_matrix_sum(values, shape, batch_ndim: int):
    """Per-matrix sums (``values[p]`` for matrix ``p`` of the leading axes) summed as :func:`_sum` sums the leaf."""
    if batch_ndim == 0:
        return jnp.sum(values)
    leading = jnp.sum(values.reshape(values.shape[0], -1), axis=-1).reshape(shape[:-2])
    return jnp.sum(leading, axis=tuple(range(batch_ndim, len(shape) - 2)), keepdims=True)[..., None, None]


def _factored_blocked(g, x, nu, b2, eps1, row, col, guard, dtype, batch_ndim, block_elements) -> _Moments:
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
    outer_sum, w, sum_x2 = _column_sums_blocked(g3, x3, _inverse(inner, guard), dtype, block_elements)
    sum_x2 = None if sum_x2 is None else _per_matrix_sum(sum_x2, shape, batch_ndim)
    outer = _ema(outer_old, outer_sum / n, b2, eps1)
    mean_r = jnp.mean(inner if inner_is_row else outer, axis=-1)
    sum_u2 = _per_matrix_sum(mean_r * jnp.sum(w * _inverse(outer, guard), axis=-1), shape, batch_ndim)
    if inner_is_row:
        v_row, v_col = inner.reshape(without(shape, col)), outer.reshape(without(shape, row))
    else:
        v_row, v_col = outer.reshape(without(shape, col)), inner.reshape(without(shape, row))
    return _Moments(FactoredSecondMoment(v_row, v_col), sum_u2, sum_x2, _factors(v_row, v_col, row, col, guard))


def _normalized(g, moments: _Moments, axes, scale, dtype):
    """``scale * U_t`` for one leaf, from the factors of ``U_t`` (see :class:`_Moments`)."""
    g = g.astype(dtype)
    if axes is None:
        return g * (scale * moments.factors[0])
    row, col = axes
    row_factor, col_factor, sqrt_mean_r = moments.factors
    return g * jnp.expand_dims(row_factor, col) * jnp.expand_dims(col_factor, row) * (scale * sqrt_mean_r)
