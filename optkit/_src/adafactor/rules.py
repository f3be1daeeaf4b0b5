"""Factor rules: which axes of a parameter are rows, columns, batch or neither (SPEC 5b).

A rule gives each axis of a parameter a role:

- ``"row"`` and ``"column"``: the factored axes. Several row axes (or column
  axes) act as one, flattened: an attention kernel ``[embed, heads, kv]``
  with ``("row", "column", "column")`` is the matrix ``embed x (heads*kv)``.
- ``"batch"``: a stack of independent parameters (``nnx.scan`` layers). Never
  averaged over: the statistics, the mean of the row statistics, ``RMS(X)``,
  ``RMS(U)`` and the clipping are per slice.
- ``"none"``: kept whole. In a rule with rows and columns it indexes
  independent matrices whose ``RMS`` is still shared (T5X's reading); without
  rows and columns the parameter keeps a full second moment.

Rules come from a ``factor_map`` (``(regex, rule)`` pairs matched with
``re.search`` against the parameter's path joined by ``/``, first match wins),
or from the logical names of the parameter's axes through
``logical_factor_rules`` (T5X's vocabulary), names given by
``param_logical_axes`` or read from Flax's partitioning metadata. Source:
``t5x/adafactor.py`` (google-research/t5x), ``_parse_rule`` and
``set_param_axes``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import PartitionSpec

from optkit._src import trees

__all__ = ["ROLES", "HEURISTIC", "Plan", "Rules", "plan_of", "heuristic_plan", "t5x_standard_logical_factor_rules"]

ROLES = ("row", "column", "batch", "none")
HEURISTIC = "heuristic"
_ALIASES = {"row": "row", "col": "column", "column": "column", "batch": "batch", "none": "none",
            "unfactorized": "none"}


def t5x_standard_logical_factor_rules() -> dict[str, str]:
    """T5X's standard table from logical axis names to factoring roles.

    The same table as ``t5x.adafactor.standard_logical_factor_rules()``
    (google-research/t5x, ``t5x/adafactor.py``): embeddings' ``embed`` axis is a
    row, ``vocab``, ``mlp``, ``heads``, ``kv`` and the fused axes are columns,
    ``layers`` (scanned layers) and ``stack`` (stacked parameters) are batch
    axes, ``relpos_buckets`` and ``layer_norm_scale`` are not factored.

    Returns:
      A new ``dict`` (yours to change) from logical name to ``"row"``,
      ``"column"``, ``"batch"`` or ``"none"``, for ``logical_factor_rules``.

    Example:
      >>> import optkit
      >>> rules = optkit.t5x_standard_logical_factor_rules()
      >>> rules["layers"], rules["embed"], rules["mlp"]
      ('batch', 'row', 'column')
    """
    return {
        "vocab": "column", "embed": "row", "mlp": "column", "heads": "column", "kv": "column",
        "joined_kv": "column", "relpos_buckets": "none", "layers": "batch", "stack": "batch",
        "q_wi_fused": "column", "o_wo_fused": "column", "multiquery_heads": "column", "kv_fused": "column",
        "layer_norm_scale": "none", "mlp_activations": "column",
    }


def _role(value: Any, where: str) -> str:
    """One axis's role from a name (case-insensitive), None (``"none"``), or an enum with such a name."""
    if value is None:
        return "none"
    name = getattr(value, "name", value)  # t5x.adafactor.FactorDim.ROW and the like
    if isinstance(name, str) and name.lower() in _ALIASES:
        return _ALIASES[name.lower()]
    raise ValueError(f"{where}: unknown factoring role {value!r}; expected one of "
                     f"{sorted(_ALIASES)} or None")


def _check_pairs(name: str, pairs: Any, check_value) -> tuple[tuple[re.Pattern, Any], ...]:
    if pairs is None:
        return ()
    if isinstance(pairs, (str, bytes, Mapping)) or not hasattr(pairs, "__iter__"):
        raise TypeError(f"{name} must be a sequence of (regex, value) pairs, got {type(pairs).__name__}")
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str):
            raise TypeError(f"{name}[{i}] must be a (regex, value) pair with a str regex, got {pair!r}")
        try:
            pattern = re.compile(pair[0])
        except re.error as e:
            raise ValueError(f"{name}[{i}]: {pair[0]!r} is not a regular expression: {e}") from None
        out.append((pattern, check_value(pair[1], f"{name}[{i}]")))
    return tuple(out)


def _check_rule(rule: Any, where: str) -> tuple[str, ...] | str | None:
    if rule is None:
        return None
    if getattr(rule, "name", None) == "token" or (isinstance(rule, str) and rule.lower() == HEURISTIC):
        return HEURISTIC  # T5X's HEURISTIC_RULE
    if isinstance(rule, str) or not isinstance(rule, (tuple, list)):
        raise TypeError(f"{where}: a rule is a tuple of per-axis roles, {HEURISTIC!r} or None, got {rule!r}")
    return tuple(_role(r, where) for r in rule)


def _check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: multiply_by_parameter_scale values must be bools, got {value!r}")
    return bool(value)


class Plan(NamedTuple):
    """How one parameter is factored and laid out for the step: the one description of a leaf's factoring.

    Factor rules and the default heuristic (:func:`optkit.factored_axes`) both
    give a Plan (:func:`plan_of`). A plan with one row axis, one column axis
    and no batch axis runs on the parameter as it is, factored over
    ``axes``; any other factored plan runs on the parameter transposed to
    batch axes, whole axes, rows, columns (several row or column axes
    flattened into one).

    Attributes:
      roles: the role of each axis of the parameter.
      param_shape: the parameter's shape.
      perm: the parameter's axes in the step's order (``jnp.transpose``'s ``axes``).
      shape: the step's shape.
      batch_ndim: how many leading axes of ``shape`` are batch axes.
      factored: whether there are row and column axes.
      axes: the step's ``(row, col)`` axes, or None (a full second moment).
      recorded: whether the statistics' node types record ``roles`` (a
        factor rule's plan is part of the state's structure; the heuristic's
        is read again from the parameter's shape).
    """

    roles: tuple[str, ...]
    param_shape: tuple[int, ...]
    perm: tuple[int, ...]
    shape: tuple[int, ...]
    batch_ndim: int
    factored: bool
    axes: tuple[int, int] | None
    recorded: bool

    @property
    def in_place(self) -> bool:
        """Whether the step runs on the parameter's own layout (no transposition or reshape)."""
        return self.perm == tuple(range(len(self.perm))) and self.shape == self.param_shape

    def axes_of(self, role: str) -> tuple[int, ...]:
        """The parameter's axes that have ``role``."""
        return tuple(i for i, r in enumerate(self.roles) if r == role)

    def unfactored(self) -> Plan:
        """The same parameter with a full second moment (its row and column axes kept whole)."""
        roles = tuple("none" if r in ("row", "column") else r for r in self.roles)
        return plan_of(roles, self.param_shape, "", recorded=self.recorded)

    def stat_perm(self, dropped: str) -> tuple[int, ...]:
        """The order of a statistic's axes (the parameter's without the ``dropped`` role's) for the step."""
        kept = [i for i, r in enumerate(self.roles) if r != dropped]
        return tuple(kept.index(a) for a in self.perm if self.roles[a] != dropped)

    def stat_shape(self, dropped: str) -> tuple[int, ...]:
        """A statistic's shape as stored: the parameter's shape without the ``dropped`` role's axes."""
        return tuple(d for d, r in zip(self.param_shape, self.roles) if r != dropped)

    def stat_step_shape(self, dropped: str) -> tuple[int, ...]:
        """A statistic's shape in the step: the step's shape without its column or row axis."""
        return self.shape[:-1] if dropped == "column" else self.shape[:-2] + self.shape[-1:]


def plan_of(roles: tuple[str, ...], shape: tuple[int, ...], where: str, *, recorded: bool = True) -> Plan:
    """The step's plan for a parameter of ``shape`` whose axes have ``roles``.

    ``recorded`` (a factor rule's plan) makes the statistics' node types carry
    ``roles``; the heuristic's plans (:func:`heuristic_plan`) are not recorded.

    Raises:
      ValueError: ``roles`` not of the parameter's rank, or row axes without
        column axes (or the reverse).
    """
    shape = tuple(int(d) for d in shape)
    if len(roles) != len(shape):
        raise ValueError(f"{where}: the factor rule {roles} has {len(roles)} roles, but the parameter has rank "
                         f"{len(shape)} (shape {shape})")
    rows = tuple(i for i, r in enumerate(roles) if r == "row")
    cols = tuple(i for i, r in enumerate(roles) if r == "column")
    if bool(rows) != bool(cols):
        raise ValueError(f"{where}: the factor rule {roles} has {'row' if rows else 'column'} axes but no "
                         f"{'column' if rows else 'row'} axes; give both, or neither (a full second moment)")
    batch = tuple(i for i, r in enumerate(roles) if r == "batch")
    whole = tuple(i for i, r in enumerate(roles) if r == "none")
    if rows and len(rows) == len(cols) == 1 and not batch:  # one matrix per leading index: no transposition
        perm, step_shape, axes = tuple(range(len(shape))), shape, (rows[0], cols[0])
    elif rows:
        perm = batch + whole + rows + cols
        step_shape = (tuple(shape[a] for a in batch + whole) + (int(np.prod([shape[a] for a in rows])),)
                      + (int(np.prod([shape[a] for a in cols])),))
        axes = (len(step_shape) - 2, len(step_shape) - 1)
    else:
        perm = batch + tuple(i for i in range(len(shape)) if i not in batch)
        step_shape, axes = tuple(shape[a] for a in perm), None
    return Plan(tuple(roles), shape, perm, step_shape, len(batch), bool(rows), axes, recorded)


def heuristic_plan(shape: tuple[int, ...], axes: tuple[int, int] | None) -> Plan:
    """The plan of the default heuristic: ``axes`` from :func:`optkit.factored_axes` (row, column) or None."""
    roles = ["none"] * len(shape)
    if axes is not None:
        roles[axes[0]], roles[axes[1]] = "row", "column"
    return plan_of(tuple(roles), shape, "", recorded=False)


class Rules:
    """The factoring configuration of one Adafactor: where each parameter's roles come from.

    Built at construction (arguments checked there); :meth:`roles` answers per
    parameter at ``init`` (with Flax metadata) and at ``update`` (paths only).
    """

    def __init__(self, *, factor_map: Any = None, logical_factor_rules: Any = None, param_logical_axes: Any = None,
                 multiply_by_parameter_scale: Any = True):
        self.factor_map = _check_pairs("factor_map", factor_map, _check_rule)
        if logical_factor_rules is not None and not isinstance(logical_factor_rules, Mapping):
            raise TypeError(f"logical_factor_rules must be a mapping from logical axis name to role, got "
                            f"{type(logical_factor_rules).__name__}")
        self.logical = None if logical_factor_rules is None else {
            k: _role(v, f"logical_factor_rules[{k!r}]") for k, v in logical_factor_rules.items()}
        self.axes_by_path = None if param_logical_axes is None else _axes_by_path(param_logical_axes)
        if isinstance(multiply_by_parameter_scale, (bool, np.bool_)):
            self.scale_map, self.scale_default = (), bool(multiply_by_parameter_scale)
        else:
            self.scale_map = _check_pairs("multiply_by_parameter_scale", multiply_by_parameter_scale, _check_bool)
            self.scale_default = None

    @property
    def any(self) -> bool:
        """Whether any rule is given (without, every parameter is factored as before)."""
        return bool(self.factor_map) or self.logical is not None

    @property
    def may_scale(self) -> bool:
        return self.scale_default if self.scale_default is not None else any(v for _, v in self.scale_map)

    def multiply_by_parameter_scale(self, path: str) -> bool:
        if self.scale_default is not None:
            return self.scale_default
        for pattern, value in self.scale_map:
            if pattern.search(path):
                return value
        raise ValueError(f"multiply_by_parameter_scale: no pattern matches the parameter {path!r}")

    def roles(self, path: str, ndim: int, names: Any = None) -> tuple[str, ...] | str | None:
        """The rule of the parameter at ``path`` (``"a/b/c"``): roles per axis, :data:`HEURISTIC`, or None.

        ``names`` are the logical names of its axes read from Flax metadata
        (used when ``param_logical_axes`` does not give them). None from
        here means unfactored (a ``factor_map`` rule of None).
        """
        if self.logical is not None:
            given = None if self.axes_by_path is None else self.axes_by_path.get(path)
            names = given if given is not None else names
            if names is not None:
                return self._from_names(names, path, ndim)
        for pattern, rule in self.factor_map:
            if pattern.search(path):
                return rule
        if self.factor_map:
            raise ValueError(f"factor_map: no pattern matches the parameter {path!r}")
        return HEURISTIC

    def _from_names(self, names: Any, path: str, ndim: int) -> tuple[str, ...]:
        names = _names(names, path)
        if len(names) != ndim:
            raise ValueError(f"{path}: {len(names)} logical axis names {names} for a parameter of rank {ndim}")
        roles = []
        for i, name in enumerate(names):
            if name is None:
                raise ValueError(f"{path}: axis {i} has no logical name ({names}); logical_factor_rules needs "
                                 f"a name for every axis")
            if name not in self.logical:
                raise ValueError(f"{path}: the logical axis name {name!r} is not in logical_factor_rules "
                                 f"(known: {sorted(self.logical)})")
            roles.append(self.logical[name])
        if "row" in roles and "column" in roles and "none" in roles:
            raise ValueError(f"{path}: incomplete factoring: logical axes {names} give roles {tuple(roles)}, "
                             f"rows and columns with an unfactored axis")
        if "row" not in roles or "column" not in roles:  # partly factored: unfactored, batch axes kept
            roles = ["none" if r in ("row", "column") else r for r in roles]
        return tuple(roles)


def _names(names: Any, path: str) -> tuple[str | None, ...]:
    if isinstance(names, PartitionSpec):
        names = tuple(names)
    if not isinstance(names, (tuple, list)):
        raise TypeError(f"{path}: logical axis names must be a tuple of names or a PartitionSpec, got {names!r}")
    out = []
    for name in names:
        if isinstance(name, (tuple, list)):
            raise ValueError(f"{path}: an axis with several logical names {tuple(name)} cannot be factored")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{path}: logical axis names must be str or None, got {name!r}")
        out.append(name)
    return tuple(out)


def _axes_by_path(param_logical_axes: Any) -> dict[str, Any]:
    """``param_logical_axes`` (a tree of name tuples or PartitionSpecs) as ``path -> names``."""
    is_names = lambda x: isinstance(x, PartitionSpec) or (  # noqa: E731
        isinstance(x, tuple) and not hasattr(x, "_fields") and all(n is None or isinstance(n, str) for n in x))
    flat, _ = jax.tree_util.tree_flatten_with_path(param_logical_axes, is_leaf=is_names)
    out = {}
    for path, names in flat:
        name = trees.keystr(path, "/")
        out[name] = _names(names, f"param_logical_axes at {name!r}")
    return out


def metadata_names(box: Any) -> Any:
    """The logical axis names Flax put on a parameter's box, or None.

    nnx: ``out_sharding`` (``nnx.with_partitioning``; ``nnx.vmap`` or ``nnx.scan``
    with ``transform_metadata={nnx.PARTITION_NAME: ...}`` insert their axis),
    or the older ``sharding_names``/``sharding``; linen: ``nn.Partitioned.names``.
    """
    if box is None:
        return None
    get = getattr(box, "get_metadata", None)
    if callable(get):
        metadata = get()
        for key in ("out_sharding", "sharding_names", "sharding"):
            value = metadata.get(key)
            if isinstance(value, (tuple, list, PartitionSpec)):
                return tuple(value)
        return None
    names = getattr(box, "names", None)
    return tuple(names) if isinstance(names, (tuple, list, PartitionSpec)) else None
