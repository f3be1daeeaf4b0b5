"""Muon exactly as ``torch.optim.Muon`` computes it (SPEC.md section 8).

SPEC 8, for one matrix ``X`` of shape ``(A, B)`` with gradient ``G`` and momentum buffer ``M``::

    M_new  = M + (1 - momentum) * (G - M)                  torch: buf.lerp_(grad, 1 - momentum)
    U      = G + momentum * (M_new - G)   if nesterov      torch: grad.lerp(buf, momentum)
             M_new                        otherwise
    O      = NS(U)                        ns_steps Newton-Schulz iterations (below)
    X_new  = X * (1 - lr * weight_decay) - lr * ratio * O
    ratio  = sqrt(max(1, A / B))          adjust_lr = "original" (Keller Jordan's)
             0.2 * sqrt(max(A, B))        adjust_lr = "match_rms_adamw" (Moonshot's)

    NS(U): Y = U in ns_dtype, transposed when A > B; Y = Y / max(||Y||_F, eps); then ns_steps times
           S = Y Y^T;  S = b * S + c * S S;  Y = a * Y + S Y         (a, b, c) = ns_coefficients
           and Y transposed back.

Each matrix product and each ``addmm`` of torch's iteration is rounded once to ``ns_dtype``, as torch's
bfloat16 kernels round their results: the products accumulate in at least float32 here.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec
from jax.typing import DTypeLike

from optkit._src import hyperparams, sharding, trees
from optkit._src.numerics import compute_dtype, map_leaves

__all__ = ["ScaleByMuonState", "muon", "newton_schulz"]

ADJUST_LR = ("original", "match_rms_adamw")
DEFAULT_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
MAX_NS_STEPS = 100  # torch refuses ns_steps >= 100 ("for computational efficiency")


class ScaleByMuonState(NamedTuple):
    """State of :func:`muon`.

    Attributes:
      count: int32 scalar, the number of updates made so far (the learning-rate schedule's step).
      mu: the momentum buffers (torch's ``momentum_buffer``), one per matrix, in each parameter's dtype.
    """

    count: jax.Array
    mu: optax.Updates


def _rounded(x: jax.Array, dtype: np.dtype) -> jax.Array:
    return x.astype(dtype)


def newton_schulz(
    update: jax.Array,
    *,
    ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
    ns_steps: int = 5,
    eps: float = 1e-7,
    ns_dtype: DTypeLike | None = "bfloat16",
) -> jax.Array:
    """Muon's orthogonalization of one matrix: ``ns_steps`` quintic Newton-Schulz iterations (SPEC.md section 8).

    ``torch.optim.Muon``'s ``_zeropower_via_newtonschulz``: the matrix in ``ns_dtype``, transposed when it has
    more rows than columns, divided by ``max(||U||_F, eps)``, then ``Y <- a Y + (b S + c S^2) Y`` with
    ``S = Y Y^T``. Every product and sum torch rounds to bfloat16 once is rounded once to ``ns_dtype`` here
    (accumulating in at least float32; on CPU the operands are widened first, which can move a result by one
    bfloat16 step against XLA's own bfloat16 product). The result's singular values lie near 1 (in about
    [0.5, 1.5] with the default coefficients), not exactly at 1.

    Args:
      update: a 2-D floating array ``(A, B)``.
      ns_coefficients: ``(a, b, c)``, the polynomial's coefficients (Keller Jordan's by default).
      ns_steps: iterations, an int in ``[0, 100)``.
      eps: the floor of the Frobenius norm, > 0.
      ns_dtype: the iteration's dtype: bfloat16 as torch computes it, or float32 / float64 for the exact
        iteration; None for ``update``'s dtype (at least float32).

    Returns:
      An ``(A, B)`` array in ``ns_dtype`` (None: ``update``'s dtype, at least float32).

    Raises:
      ValueError: ``update`` not 2-D, ``ns_steps`` outside ``[0, 100)``, three coefficients not given.

    Example:
      >>> import jax.numpy as jnp, optkit
      >>> o = optkit.newton_schulz(jnp.array([[3.0, 0.0], [0.0, 1.0]]), ns_dtype=jnp.float32)
      >>> o.shape, o.dtype
      ((2, 2), dtype('float32'))
    """
    if jnp.ndim(update) != 2:
        raise ValueError(f"newton_schulz: update must be a 2-D matrix, got shape {jnp.shape(update)}")
    a, b, c = _coefficients(ns_coefficients)
    _check_steps(ns_steps)
    dtype = compute_dtype(update.dtype) if ns_dtype is None else jnp.dtype(ns_dtype)
    acc = compute_dtype(dtype)  # what the products accumulate in
    tall = update.shape[0] > update.shape[1]
    y = _rounded(update, dtype)
    if tall:
        y = y.T
    y32 = y.astype(acc)
    norm = _rounded(jnp.sqrt(jnp.sum(y32 * y32)), dtype).astype(acc)
    y = _rounded(y32 / jnp.maximum(norm, jnp.asarray(eps, dtype).astype(acc)), dtype)

    # Products of ``dtype`` operands accumulated in ``acc``: natively where the backend multiplies bfloat16
    # matrices (GPU, TPU), else with the operands widened to ``acc`` first (exact; XLA:CPU in jaxlib 0.8 has no
    # bfloat16 product). Each result is rounded once to ``dtype``, as torch rounds its bfloat16 kernels' results.
    widen = jax.default_backend() == "cpu"

    def product(u, v):
        return jnp.matmul(u.astype(acc), v.astype(acc)) if widen else jnp.matmul(u, v, preferred_element_type=acc)

    def iteration(_, y):
        s = _rounded(product(y, y.T), dtype)
        s = _rounded(b * s.astype(acc) + c * product(s, s), dtype)
        return _rounded(a * y.astype(acc) + product(s, y), dtype)

    y = jax.lax.fori_loop(0, ns_steps, iteration, y)
    return y.T if tall else y


def _coefficients(ns_coefficients: Any) -> tuple[float, float, float]:
    try:
        values = tuple(ns_coefficients)
    except TypeError:
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {ns_coefficients!r}") from None
    if len(values) != 3:
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {len(values)}: {values!r}")
    for name, value in zip("abc", values):
        hyperparams.check_scalar(f"ns_coefficients[{'abc'.index(name)}] ({name})", value)
    return values  # type: ignore[return-value]


def _check_steps(ns_steps: Any) -> None:
    """An int in [0, 100); a traced count (``optax.inject_hyperparams``) is checked where it is concrete."""
    if isinstance(ns_steps, jax.core.Tracer):
        return
    if isinstance(ns_steps, (bool, np.bool_)) or not jnp.issubdtype(jnp.result_type(ns_steps), jnp.integer) \
            or jnp.ndim(ns_steps) != 0:
        raise TypeError(f"ns_steps must be an int, got {ns_steps!r}")
    if not 0 <= int(ns_steps) < MAX_NS_STEPS:
        raise ValueError(f"ns_steps must be in [0, {MAX_NS_STEPS}) (torch.optim.Muon's bound), got {ns_steps}")


def _ratio(shape: tuple[int, ...], adjust_lr: str) -> float:
    """The learning rate's shape factor (torch's ``_adjust_lr``), exact in float64."""
    rows, cols = shape
    if adjust_lr == "original":
        return math.sqrt(max(1.0, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))


def _check_matrices(tree: Any, name: str) -> None:
    """Every leaf 2-D, else a ``ValueError`` naming its path (torch.optim.Muon refuses other ranks)."""
    for path, leaf in sharding.leaves_with_paths(tree):
        if jnp.ndim(leaf) != 2:
            raise ValueError(
                f"muon: {name}{trees.keystr(path)} has shape {tuple(jnp.shape(leaf))}; Muon orthogonalizes "
                f"2-D matrices only (as torch.optim.Muon). Give the other leaves another optimizer, e.g. "
                f"optax.partition({{'muon': optkit.muon(...), 'adamw': optax.adamw(...)}}, labels)")


def _whole(x: jax.Array) -> tuple[jax.Array, PartitionSpec | None]:
    """``x`` gathered whole when its type splits it over mesh axes (Explicit axes), and the spec it had.

    The orthogonalization needs the whole matrix (its norm and ``Y Y^T`` mix every row and column): under
    FSDP or ZeRO-1 each split matrix is gathered once, orthogonalized whole, and split back as it was. With
    ``Auto`` axes XLA's partitioner makes the same gathers itself; on one device nothing happens.
    """
    spec = getattr(sharding._type_sharding(x), "spec", None)
    if spec is None or not any(entry is not None for entry in spec) or not sharding.may_be_split(x):
        return x, None
    return jax.sharding.reshard(x, PartitionSpec()), spec


def _check(learning_rate, momentum, weight_decay, nesterov, ns_coefficients, ns_steps, eps, adjust_lr, ns_dtype):
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True)
    hyperparams.check_scalar("momentum", momentum, low=0.0)
    hyperparams.check_scalar("weight_decay", weight_decay, low=0.0)
    hyperparams.check_scalar("eps", eps, low=0.0, low_open=True)
    hyperparams.check_flag("nesterov", nesterov)
    hyperparams.check_choice("adjust_lr", adjust_lr, ADJUST_LR)
    _coefficients(ns_coefficients)
    _check_steps(ns_steps)
    return hyperparams.check_dtype("ns_dtype", ns_dtype)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.95,
    *,
    nesterov: bool = True,
    weight_decay: float = 0.1,
    ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
    ns_steps: int = 5,
    eps: float = 1e-7,
    adjust_lr: str = "original",
    ns_dtype: DTypeLike | None = "bfloat16",
) -> optax.GradientTransformation:
    """Muon exactly as ``torch.optim.Muon`` (torch 2.9+) computes it, for 2-D parameters (SPEC.md section 8).

    ``optax.apply_updates(X, updates)`` gives torch's parameters after ``Muon.step()``: the momentum buffer
    an exponential average of the gradients (``lerp``), Nesterov's look-ahead by default, the Newton-Schulz
    orthogonalization of :func:`newton_schulz`, decoupled weight decay scaled by the learning rate, and the
    step scaled by the matrix's shape (``adjust_lr``). ``learning_rate`` is torch's ``lr``.

    How it differs from ``optax.contrib.muon``: Optax bias-corrects its averaged momentum (and its Nesterov
    look-ahead), adds its eps (1e-8) to the norm instead of taking a floor, scales by shape its own way and runs
    the iteration in the gradient's dtype; the docs page "Muon, schedule-free AdamW and 8-bit Adam" tables the
    differences, with the measured gap.

    Args:
      learning_rate: torch's ``lr``, >= 0: a float or an Optax schedule (called with ``state.count``).
      momentum: the buffer's decay, >= 0 (0.95).
      nesterov: Nesterov's look-ahead (True, torch's default).
      weight_decay: decoupled weight decay, >= 0; ``X`` shrinks by ``lr * weight_decay`` (not the adjusted lr).
      ns_coefficients: ``(a, b, c)`` of the iteration.
      ns_steps: Newton-Schulz iterations, in ``[0, 100)``.
      eps: floor of the Frobenius norm in the iteration, > 0 (torch's 1e-7).
      adjust_lr: ``"original"`` (``sqrt(max(1, A / B))``) or ``"match_rms_adamw"`` (``0.2 * sqrt(max(A, B))``).
      ns_dtype: dtype of the iteration: bfloat16 as torch (the default, written as a string so that
        ``optax.inject_hyperparams`` leaves it static; ``jnp.bfloat16`` is the same); float32 or float64 (with
        JAX's 64-bit mode) for the exact iteration; None for each parameter's dtype (at least float32).

    Returns:
      An ``optax.GradientTransformation`` whose state is ``(ScaleByMuonState,)``; ``update`` needs ``params``
      when ``weight_decay`` is not 0. Every numeric argument works under ``optax.inject_hyperparams``
      (``ns_coefficients``, ``adjust_lr``, ``nesterov`` and ``ns_dtype`` stay static). Under FSDP or ZeRO-1
      (``optkit.state_sharding``) each matrix is gathered whole for its orthogonalization and its update split
      back as the gradient was; the buffer is sharded like the parameter.

    Raises:
      ValueError: a leaf that is not 2-D (named by its path; partition it off to another optimizer), a negative
        hyperparameter, an unknown ``adjust_lr``, ``ns_steps`` out of range, ``params=None`` with weight decay.
      TypeError: non-floating leaves, a non-bool ``nesterov``, a non-floating ``ns_dtype``.

    Example (Muon on the matrices, AdamW on the rest, as torch's docs pair them):
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
      >>> labels = jax.tree.map(lambda p: "muon" if p.ndim == 2 else "adamw", params)
      >>> tx = optax.partition({"muon": optkit.muon(0.02), "adamw": optax.adamw(3e-4)}, labels)
      >>> updates, state = tx.update(params, tx.init(params), params)
      >>> updates["w"].shape
      (4, 3)
    """
    ns_dtype = _check(learning_rate, momentum, weight_decay, nesterov, ns_coefficients, ns_steps, eps, adjust_lr,
                      ns_dtype)
    reason = hyperparams.params_needed_for("weight_decay", weight_decay)

    def init_fn(params):
        trees.check_floating(params, "params")
        _check_matrices(params, "params")
        return ScaleByMuonState(jnp.zeros([], jnp.int32), jax.tree.map(lambda p: sharding.full_like(p, 0), params))

    def update_fn(updates, state, params=None):
        state = trees.check_state(state, ScaleByMuonState, "muon")
        hyperparams.check_count(state.count, "muon")
        trees.check_update_inputs("muon", updates, {"state.mu": state.mu}, params, reason)
        _check_matrices(updates, "updates")
        rate = learning_rate(state.count) if callable(learning_rate) else learning_rate

        def per_leaf(g, m, x):
            dtype = compute_dtype(g.dtype, m.dtype, None if x is None else x.dtype)
            g_c, m_c = g.astype(dtype), m.astype(dtype)
            lr = jnp.asarray(rate, dtype)
            mom = jnp.asarray(momentum, dtype)
            m_new = m_c + (1 - mom) * (g_c - m_c)
            u = g_c + mom * (m_new - g_c) if nesterov else m_new
            whole, spec = _whole(u)
            o = newton_schulz(whole, ns_coefficients=ns_coefficients, ns_steps=ns_steps, eps=eps,
                              ns_dtype=dtype if ns_dtype is None else ns_dtype).astype(dtype)
            if spec is not None:
                o = jax.sharding.reshard(o, spec)
            step = -(lr * _ratio(g.shape, adjust_lr)) * o
            if x is not None and reason is not None:
                step = step - lr * jnp.asarray(weight_decay, dtype) * x.astype(dtype)
            return step.astype(g.dtype), m_new.astype(m.dtype)

        new_updates, new_mu = map_leaves(per_leaf, 2, updates, state.mu, params if reason is not None else None)
        return new_updates, ScaleByMuonState(optax.safe_increment(state.count), new_mu)

    return optax.chain(optax.GradientTransformation(init_fn, update_fn))
