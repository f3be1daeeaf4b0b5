"""Helpers the family modules share: axes checked against a rank, integer tests, indices made safe, softmax."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from optkit.onnx._base.tracing import index_checks_active, node_stream, random_key_active
from optkit.onnx._ops._registry import NodeContext

__all__ = ["body_runner", "aligned", "sharded_like", "reshape", "reshape_sharding", "on_cpu", "axis_index",
           "axis_indices", "is_integer", "lowest", "checked_indices", "below_max", "softmax", "log_softmax"]


def node_key(ctx: NodeContext, seed: Any = None) -> jax.Array:
    """The ``jax.random`` key a random node draws from: the run's key (``apply_fn(..., rng=key)``) with the node's
    name folded in, one stream per node; without one, ``jax.random.key(seed)`` (0 when the node has no seed)."""
    drawn = random_key_active()
    if drawn is None:
        return jax.random.key(int(seed) if seed is not None else 0)
    return jax.random.fold_in(drawn, node_stream(ctx.name))


def axis_index(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """Normalize a possibly negative axis against ``rank``, naming the node on error."""
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def axis_indices(ctx: NodeContext, axes: Sequence[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    normalized = tuple(axis_index(ctx, int(a), rank, what) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"{what} {list(axes)} repeats an axis")
    return normalized


def is_integer(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.integer)


def lowest(dtype: Any) -> Any:
    """The identity of ``max``: -inf for floats, the smallest value otherwise."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min



def checked_indices(ctx: NodeContext, indices: Any, size: int, where: str) -> Any:
    """int32 or int64 indices into an axis of ``size`` with negatives counted from the end, for ``mode="fill"``.

    Indices known at load time (constants) that are out of range raise here.
    Others are tested in their own dtype, and every out-of-range one becomes
    ``size``: JAX gathers with int32 indices when the axis fits, so an int64
    index of 2**32 + 1 would otherwise wrap to row 1; ``size`` is out of range
    in any dtype, and ``mode="fill"`` then gives NaN (floats) or the fill value
    of the type, as for any out-of-range index, never a valid element.

    With index checks on (``to_jax(..., checks=True)``, :mod:`optkit.onnx._run.feeds`), an out-of-range index
    fails a ``checkify.check`` that names the node, as ONNX Runtime raises.

    Raises:
      TypeError: indices of another type (ONNX's type constraint; uint64
        indices would silently give NaN, int8 ones overflow).
    """
    dtype = jnp.result_type(indices)
    if dtype not in (jnp.int32, jnp.int64):
        raise TypeError(ctx.message(f"indices must be int32 or int64 (ONNX's type constraint), got {dtype}"))
    if isinstance(indices, (np.ndarray, np.generic)):
        values = np.asarray(indices)
        bad = values[(values < -size) | (values >= size)]
        if bad.size:
            raise ctx.error(f"indices {bad.tolist()[:8]} are out of range for {where} of size {size}")
        # (in NumPy: JAX's eager ops on a constant compile one small program each, while the graph is traced)
        return np.where(values < 0, values + np.asarray(size, values.dtype), values)
    indices = jnp.asarray(indices)
    valid = (indices >= -size) & (indices < size)
    if index_checks_active():
        checkify.check(jnp.all(valid), ctx.message(f"an index is out of range for {where} of size {size} "
                                                   f"(valid: -{size} to {size - 1})"))
    normalized = jnp.where(indices < 0, indices + size, indices)
    return jnp.where(valid, normalized, jnp.asarray(size, indices.dtype))


def below_max(x: Any, axis: int) -> Any:
    """``x - max(x)`` along ``axis``: exactly 0 at the maximum and never above it (a maximum that is not
    finite is not subtracted).

    XLA:CPU may contract the multiplication that last computed ``x`` into the
    subtraction (a fused multiply-add), which subtracts the rounded maximum
    from unrounded products: for the zoo's SqueezeNet (constant weights, equal
    logits of 1.05e10, where one float32 unit is 1024) every ``x - max`` came
    out as +365 or as -365 depending on the thread schedule, and the softmax as
    ``exp`` overflowing or summing to 0: NaN. The difference's own maximum is
    subtracted again (no multiplication is left to contract: the maximum is then
    exactly 0, so the softmax's sum is at least 1), and what remains above 0 is
    that rounding: 0 (a ``where``, not ``jnp.minimum``, whose derivative at the
    maximum would be 1/2). The maxima are constants for differentiation, as in
    ``jax.nn.softmax``.
    """
    d = x
    for _ in range(2):
        top = lax.stop_gradient(jnp.max(d, axis, keepdims=True))
        d = d - jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    return jnp.where(d > 0, jnp.zeros_like(d), d)


def gather_sharding(x: Any, indices: Any, axis: int) -> Any:
    """The output ``PartitionSpec`` of gathering ``x`` along ``axis`` by ``indices`` when either carries explicit
    mesh axes (as arrays placed on ``jax.make_mesh``'s default, explicit axes do), which JAX then requires to be
    stated: ``x``'s axes around ``axis``, ``indices``' axes in its place (a batch of token ids sharded over
    ``"data"`` gives embeddings sharded the same way). None where nothing is sharded explicitly, or where the
    gathered axis itself is (JAX's own rule then decides)."""
    x_spec, i_spec = _explicit_spec(x), _explicit_spec(indices)
    if x_spec is None and i_spec is None:
        return None
    x_spec = x_spec or (None,) * jnp.ndim(x)
    if x_spec[axis] is not None:
        return None
    return jax.sharding.PartitionSpec(*x_spec[:axis], *(i_spec or (None,) * jnp.ndim(indices)), *x_spec[axis + 1:])


def take(x: Any, indices: Any, axis: int, mode: str = "fill") -> Any:
    """``jnp.take(x, indices, axis, mode=mode)``, its output sharding stated where explicit mesh axes require it
    (:func:`gather_sharding`): every gather of a table by computed or fed indices (Gather, embeddings, rotary
    caches) goes through here, so it runs on ``jax.make_mesh``'s default mesh with the indices sharded. A table
    split along the gathered axis is gathered whole first (a mask built from the sharded batch, indexed)."""
    if isinstance(x, np.ndarray) and isinstance(indices, np.ndarray) and mode == "fill":  # (constants: in range)
        return np.take(x, indices, axis=axis)
    x_spec = _explicit_spec(x)
    if x_spec is not None and x_spec[axis] is not None:  # (rows picked from a table split along them: gathered)
        x = resharded(x, (*x_spec[:axis], None, *x_spec[axis + 1:]))
    spec = gather_sharding(x, indices, axis)
    if spec is not None:
        where = (slice(None),) * axis + (indices,)
        return jnp.asarray(x).at[where].get(mode=mode, out_sharding=output_sharding(spec, x, indices))
    return jnp.take(x, indices, axis=axis, mode=mode)


def _explicit_spec(x: Any) -> tuple | None:
    """``x``'s ``PartitionSpec`` entries, one per axis, when it carries explicit mesh axes; else None."""
    try:
        spec = tuple(jax.typeof(x).sharding.spec)
    except (AttributeError, TypeError):
        return None
    spec += (None,) * (jnp.ndim(x) - len(spec))
    return None if all(s is None for s in spec) else spec


def output_sharding(spec: Sequence[Any], *operands: Any) -> Any:
    """The sharding of an output whose ``PartitionSpec`` entries are ``spec``, stated from its operands: a
    ``NamedSharding`` on the mesh of the first operand that carries explicit mesh axes (the first operand's
    when none does). JAX takes a bare ``PartitionSpec`` only under ``jax.set_mesh``, and arrays placed with a
    ``NamedSharding`` of explicit axes carry them without one: every operator that must state an output's
    sharding (gathers, reshapes, carried values, aligned operands) states it here."""
    like = next((x for x in operands if x is not None and _explicit_spec(x) is not None), operands[0])
    return jax.sharding.NamedSharding(jax.typeof(like).sharding.mesh, jax.sharding.PartitionSpec(*spec))


def resharded(x: Any, spec: Sequence[Any], *operands: Any) -> Any:
    """``x`` moved to the sharding :func:`output_sharding` states for ``spec`` from ``operands`` (``x`` itself when
    none is given)."""
    return jax.sharding.reshard(x, output_sharding(spec, *(operands or (x,))))


def _axis_size(x: Any, entry: Any) -> int:
    mesh = jax.typeof(x).sharding.mesh
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[name] for name in names)


def reshape_sharding(x: Any, shape: Sequence[int]) -> tuple[Any, Any] | None:
    """Where ``x`` carries explicit mesh axes (``jax.make_mesh``'s default), the output ``PartitionSpec`` of
    reshaping it to ``shape`` that JAX then requires, and the spec ``x`` must first take (its own, or with the
    axes of a group of dimensions dropped where no sharding carries over): None where nothing is sharded
    explicitly. Dimensions are matched in groups of equal product; a group whose major dimension alone is
    sharded keeps that sharding on the major dimension of its reshaped group when that dimension divides by
    the axis size (a batch sharded over ``data`` merged with the sequence: the same contiguous blocks)."""
    spec = _explicit_spec(x)
    source = tuple(jnp.shape(x))
    if spec is None or 0 in source or 0 in shape:
        return None
    target, out, before = tuple(shape), [], list(spec)
    i = j = 0
    while i < len(source) or j < len(target):
        si, sj = i, j
        have = source[i] if i < len(source) else 1
        want = target[j] if j < len(target) else 1
        i, j = min(i + 1, len(source)), min(j + 1, len(target))
        while have != want:
            if have < want and i < len(source):
                have, i = have * source[i], i + 1
            elif want < have and j < len(target):
                want, j = want * target[j], j + 1
            else:
                return None
        group = spec[si:i]
        width = j - sj
        if all(s is None for s in group):
            out += [None] * width
        elif (group[0] is not None and all(s is None for s in group[1:]) and width
              and target[sj] % _axis_size(x, group[0]) == 0):
            out += [group[0]] + [None] * (width - 1)
        else:  # (no sharding carries over: the group is gathered first)
            before[si:i] = [None] * (i - si)
            out += [None] * width
    return jax.sharding.PartitionSpec(*out), jax.sharding.PartitionSpec(*before)


def reshape(x: Any, shape: Sequence[int]) -> Any:
    """``jnp.reshape(x, shape)``, its output sharding stated where explicit mesh axes require it
    (:func:`reshape_sharding`): Reshape and Flatten go through here, so a batch sharded over ``data`` on
    ``jax.make_mesh``'s default mesh may be merged with the sequence (GPT-2's attention)."""
    specs = reshape_sharding(x, shape)
    if specs is None:
        return jnp.reshape(x, shape)
    out, before = specs
    if tuple(before) != tuple(_explicit_spec(x)):
        x = resharded(x, before)
    return jnp.reshape(x, shape, out_sharding=output_sharding(out, x))


def sharded_like(value: Any, like: Any) -> Any:
    """``value`` with ``like``'s explicit mesh axes (a loop's new carried value in the type of the old one, which
    JAX requires: a hidden state that the sharded batch made sharded, carried in a replicated one)."""
    want, have = _explicit_spec(like), _explicit_spec(value)
    if want == have:
        return value
    return resharded(value, want or (None,) * jnp.ndim(value), like, value)


def aligned(xs: Sequence[Any], skip: Sequence[int] = ()) -> list[Any]:
    """Operands of one operation made to agree on explicit mesh axes (``jax.make_mesh``'s default), as JAX then
    requires of a concatenation's or a batched matmul's operands: on each axis (counted from the right, as
    broadcasting counts: ``skip`` lists those left alone, 1 being the last) where one operand is sharded over a
    mesh axis, the others of the same size there that are not take that sharding too, by a local slice (a
    replicated class token concatenated to patches sharded by the batch; a broadcast mask times sharded
    scores). Unchanged where nothing is sharded explicitly."""
    specs = [_explicit_spec(x) if x is not None else None for x in xs]
    if all(spec is None for spec in specs):
        return list(xs)
    wanted: dict[int, tuple[Any, int]] = {}
    for x, spec in zip(xs, specs):
        for k in range(1, len(spec or ()) + 1):
            if spec[-k] is not None and k not in skip:
                wanted.setdefault(k, (spec[-k], jnp.shape(x)[-k]))
    out = []
    for x, spec in zip(xs, specs):
        if x is None or not jnp.ndim(x):
            out.append(x)
            continue
        own = list(spec or (None,) * jnp.ndim(x))
        new = list(own)
        for k, (entry, size) in wanted.items():
            if k <= len(new) and new[-k] is None and jnp.shape(x)[-k] == size and entry not in new:
                new[-k] = entry
        out.append(x if new == own else resharded(x, new, *(v for v, spec in zip(xs, specs) if spec is not None)))
    return out


def _widened(x: Any) -> tuple[Any, Any]:
    """``x`` in float32 if it is a 16-bit float (ONNX Runtime's kernels compute those in float32 and round once),
    and its own dtype to round back to."""
    dtype = jnp.result_type(x)
    return (jnp.asarray(x).astype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else x), dtype


def softmax(x: Any, axis: int) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (ONNX Softmax, version 13), NaN-free under XLA:CPU's
    fused multiply-adds (:func:`below_max`), 16-bit floats computed in float32 and rounded once; differentiates
    as ``jax.nn.softmax``."""
    x, dtype = _widened(x)
    e = jnp.exp(below_max(x, axis))
    return (e / jnp.sum(e, axis, keepdims=True)).astype(dtype)


def log_softmax(x: Any, axis: int) -> Any:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``, as :func:`softmax`."""
    x, dtype = _widened(x)
    shifted = below_max(x, axis)
    return (shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis, keepdims=True))).astype(dtype)


def on_cpu(device: Any = None) -> bool:
    """The one CPU decision of optkit.onnx: whether what is traced now runs on XLA's CPU backend (JAX's default
    backend), or, given a ``jax.Device``, whether that device is a CPU. The channels-last plan, the
    shifted-slices depthwise convolution and :class:`~optkit.onnx.BackendRep`'s compile options follow it."""
    if device is not None:
        return getattr(device, "platform", None) == "cpu"
    return jax.default_backend() == "cpu"


def body_runner(body, captured: dict[str, Any] | None):
    """``run(*inputs) -> tuple of outputs`` of a converted sub-graph (an ``If`` branch, a ``Loop``, ``Scan`` or
    ``SequenceMap`` body: :meth:`~optkit.onnx._ops._registry.NodeContext.convert_subgraph`), the enclosing graphs'
    names it reads fed from ``captured``."""
    names = [info.name for info in body.inputs]
    outer = {name: (captured or {})[name] for name in body.captures}

    def run(*values):
        feeds = {**outer, **dict(zip(names, values))}
        result = body.graph.evaluate(feeds, list(body.outputs), check_feeds=False)
        return tuple(result[name] for name in body.outputs)

    return run
