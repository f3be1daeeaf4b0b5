"""Adafactor as Optax transformations: :func:`scale_by_factored_rms`, :func:`scale_by_adafactor`, :func:`adafactor`.

Each runs the engine (:class:`~optkit._src.adafactor.engine.Adafactor`) with the paper's factoring planner,
:func:`paper_planner`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from optkit._src import hyperparams, trees
from optkit._src.adafactor import fast
from optkit._src.adafactor.engine import Adafactor, heuristic
from optkit._src.adafactor.factoring import check_factoring
from optkit._src.adafactor.rules import HEURISTIC, Plan, Rules, heuristic_plan, plan_of
from optkit._src.adafactor.state import ScaleByFactoredRmsState

__all__ = ["scale_by_factored_rms", "scale_by_adafactor", "adafactor"]


def paper_planner(name: str, rules: Rules, factored: bool, factored_dims: str):
    """The paper's factoring, as :func:`adafactor` documents it: a factor rule applied as given at every rank
    (``"heuristic"`` or no rules: :func:`optkit.factored_axes`); ``factored=False`` keeps every rule's batch
    axes and factors nothing. Returns the engine's ``planner(path, shape, names, min_dim) -> Plan``."""

    def planner(path: str, shape: tuple[int, ...], names, min_dim: int | None) -> Plan:
        rule = rules.roles(path, len(shape), names) if rules.any else HEURISTIC
        if rule is None:
            return heuristic_plan(shape, None)
        if rule == HEURISTIC:
            return heuristic(shape, factored, factored_dims, min_dim)
        if not factored:
            rule = tuple("none" if r in ("row", "column") else r for r in rule)
        return plan_of(rule, shape, f"{name}: {path!r}")

    return planner


def _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype):
    hyperparams.check_scalar("decay_rate", decay_rate, low=0.0, low_open=True)
    hyperparams.check_scalar("eps1", eps1, low=0.0)
    check_factoring(factored, factored_dims, min_dim_size_to_factor)
    return hyperparams.check_dtype("nu_dtype", nu_dtype)


def scale_by_factored_rms(
    decay_rate: float = 0.8,
    eps1: float = 1e-30,
    *,
    factored: bool = True,
    factored_dims: str = "last",
    min_dim_size_to_factor: int = 1,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
) -> optax.GradientTransformation:
    """Adafactor's normalised gradient ``U_t = G_t / sqrt(V_t)``, before clipping and step size.

    With ``t = count + 1`` and ``b2_t = 1 - t^(-decay_rate)`` (so ``b2_1 = 0``:
    no bias correction is needed), for a factored leaf ``G`` (n x m over its
    factored axes, see :func:`optkit.factored_axes`; any other axes index independent
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
      factor_map, logical_factor_rules, param_logical_axes: factor rules
        (SPEC 5b), as :func:`adafactor` takes them.

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
    nu_dtype = _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
    rules = Rules(factor_map=factor_map, logical_factor_rules=logical_factor_rules,
                  param_logical_axes=param_logical_axes, multiply_by_parameter_scale=False)
    # U_t alone: the Adafactor step with a unit step size, no parameter scale, no clipping.
    planner = paper_planner("scale_by_factored_rms", rules, factored, factored_dims)
    af = Adafactor("scale_by_factored_rms", planner=planner, rules=rules, learning_rate=1, decay_rate=decay_rate,
                   options=fast.Options(eps1, None, None, None, None),
                   min_dim_size_to_factor=min_dim_size_to_factor, mu_dtype=None, nu_dtype=nu_dtype, params_reason=None)

    def init_fn(params):
        return ScaleByFactoredRmsState(count=jnp.zeros([], jnp.int32), nu=af.init_nu(params))

    def update_fn(updates, state, params=None):
        del params
        state = trees.check_state(state, ScaleByFactoredRmsState, af.name)
        hyperparams.check_count(state.count, af.name)
        new_updates, nu, _ = af.step(updates, state.count, state.nu, None, None)
        return new_updates, ScaleByFactoredRmsState(optax.safe_increment(state.count), nu)

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
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
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
      decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype: as
        :func:`scale_by_factored_rms`.
      eps2: the paper's ``epsilon_2``, the floor of the parameter scale
        (default 1e-3), >= 0.
      clipping_threshold: the paper's ``d`` (default 1), > 0, or None for no
        update clipping.
      multiply_by_parameter_scale: False drops the ``max(eps2, RMS(X_{t-1}))``
        factor (then ``params`` are only needed for weight decay).
      weight_decay_rate: decoupled weight decay ``w`` scaled by the step size,
        as Hugging Face's Adafactor (SPEC 5, Decision (weight decay)), >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      factor_map, logical_factor_rules, param_logical_axes: factor rules
        (SPEC 5b), as :func:`adafactor` takes them.

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
    hyperparams.check_scalar("learning_rate", learning_rate, low=0.0, allow_schedule=True, allow_none=True)
    hyperparams.check_decay("b1", b1, allow_none=True)
    nu_dtype = _check_nu(decay_rate, eps1, factored, factored_dims, min_dim_size_to_factor, nu_dtype)
    hyperparams.check_scalar("eps2", eps2, low=0.0)
    hyperparams.check_scalar("clipping_threshold", clipping_threshold, low=0.0, low_open=True, allow_none=True)
    hyperparams.check_flag("multiply_by_parameter_scale", multiply_by_parameter_scale)
    hyperparams.check_scalar("weight_decay_rate", weight_decay_rate, low=0.0, allow_none=True)
    mu_dtype = hyperparams.check_dtype("mu_dtype", mu_dtype)
    decay_reason = hyperparams.params_needed_for("weight_decay_rate", weight_decay_rate)
    if multiply_by_parameter_scale:
        params_reason = "multiply_by_parameter_scale=True (the step size max(eps2, RMS(X)) * rho_t)"
    else:
        params_reason = decay_reason
    options = fast.Options(eps1, eps2, clipping_threshold, b1, None if decay_reason is None else weight_decay_rate)
    rules = Rules(factor_map=factor_map, logical_factor_rules=logical_factor_rules,
                  param_logical_axes=param_logical_axes,
                  multiply_by_parameter_scale=bool(multiply_by_parameter_scale))
    af = Adafactor("scale_by_adafactor", planner=paper_planner("scale_by_adafactor", rules, factored, factored_dims),
                   rules=rules, learning_rate=learning_rate, decay_rate=decay_rate, options=options,
                   min_dim_size_to_factor=min_dim_size_to_factor, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                   params_reason=params_reason)

    return optax.GradientTransformation(lambda params: af.init_state(params, with_mu=b1 is not None),
                                        lambda updates, state, params=None: af.update_state(updates, state, params))


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
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
    factor_map: Any = None,
    logical_factor_rules: Any = None,
    param_logical_axes: Any = None,
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
      factored_dims: ``"last"`` or ``"largest"``; see :func:`optkit.factored_axes`.
      min_dim_size_to_factor: leaves whose chosen axes are shorter keep a full
        second moment (default 1: every leaf of rank >= 2 is factored).
      weight_decay_rate: ``w`` in ``- w * alpha_t * X_{t-1}``, >= 0, or None.
      mu_dtype: dtype of the first moment; None keeps each parameter's dtype.
      nu_dtype: dtype of the second-moment statistics; None keeps each
        parameter's dtype. For bfloat16 parameters, ``nu_dtype=jnp.float32``
        keeps float32 statistics (the mixed-precision setting); float16
        statistics overflow when the mean of ``G^2`` over a row or column
        reaches 65520 (an RMS gradient of 256), and the tensor's updates are
        NaN from then on (docs/usage.md).
      factor_map: factor rules by path (SPEC 5b): ``(regex, rule)`` pairs,
        ``re.search``-ed against the parameter's path joined by ``/`` (dict
        keys, attribute names, indices), first match wins, no match is a
        ``ValueError``. A rule is a tuple of per-axis roles, ``"row"``,
        ``"column"`` (or ``"col"``), ``"batch"``, ``"none"`` (or None), one
        per axis; ``"heuristic"`` (this optimizer's own factoring, as
        without rules); or None (not factored). Several row (or column) axes
        act as one; a ``"batch"`` axis is never averaged over: statistics,
        ``RMS(X)``, ``RMS(U)`` and the clipping are per slice, so layers
        stacked into one parameter train exactly as separate ones. Unlike
        :func:`t5x_adafactor`, a rule is applied as given at every rank
        (T5X falls back to its heuristic for rank <= 2 without a batch axis).
      logical_factor_rules: a mapping from logical axis name to role (e.g.
        :func:`t5x_standard_logical_factor_rules`), applied to each
        parameter's axis names from ``param_logical_axes`` or, where not
        given there, from its Flax metadata (``nnx.with_partitioning``,
        ``nnx.vmap`` or ``nnx.scan`` with ``transform_metadata``, linen
        ``nn.Partitioned``); it supersedes ``factor_map``. Names giving rows
        but no columns (or the reverse) mean not factored, batch axes kept;
        rows and columns with a ``"none"`` axis are a ``ValueError``.
      param_logical_axes: a tree like the parameters of tuples of logical
        names or ``PartitionSpec`` objects, or None.

    A NaN or infinite gradient element makes its whole tensor's update NaN
    (the statistics and RMS are shared over rows, columns and the tensor),
    and the tensor stays NaN; wrap the optimizer in ``optax.apply_if_finite``
    to skip such steps (docs/usage.md).

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
        ``min_dim_size_to_factor < 1``, an unknown role (at construction);
        mismatched trees, ``params=None`` with the parameter scale or weight
        decay (at update); a rule of the wrong length, no ``factor_map``
        match, an unknown logical name, rows without columns (at ``init``,
        naming the parameter's path).
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
            factor_map=factor_map,
            logical_factor_rules=logical_factor_rules,
            param_logical_axes=param_logical_axes,
        ),
        optax.scale(-1.0),
    )
