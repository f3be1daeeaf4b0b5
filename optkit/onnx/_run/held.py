"""Weights held on the device for a runner's compiled program: the one rule of both runners.

A compiled program reads an initializer either as a constant (its bytes copied into the program) or as an argument
held on the device (:func:`held_weights`): the weights mapped from external data, which a constant would copy, and,
for a LoRA fine-tune, the frozen base. A scanned run's per-layer weights among them are stacked once
(:func:`stack_once`) instead of inside the program at every call.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optkit.onnx._base.values import is_mapped, release_pages
from optkit.onnx._plans.layers import stacked_name

__all__ = ["held_weights", "on_device", "holdable", "stack_once", "stacked_groups", "stacked_specs",
           "gathered_where_used"]


def held_weights(initializers: Mapping[str, Any], layers: Any, skip: Container[str], *, device: Any = None,
                 min_bytes: int | None = None) -> dict[str, Any]:
    """The initializers a runner holds on the device and gives its compiled program as arguments: every one not in
    ``skip`` (trained, or read where a value must be known before running) that is mapped from external data in a
    dtype JAX keeps (:func:`holdable`) or, with ``min_bytes``, of that many bytes or more (a LoRA fine-tune's
    frozen base); the per-layer ones of a scanned run (``layers``, :class:`optkit.onnx._plans.layers.Layers`)
    stacked once under :func:`~optkit.onnx._plans.layers.stacked_name`.

    Returns:
      ``{name: jax.Array}`` on ``device`` (None: JAX's default), the stacked runs last.
    """
    held = {name: value for name, value in initializers.items()
            if name not in skip and (holdable(value) or (min_bytes is not None
                                                          and np.asarray(value).nbytes >= min_bytes))}
    stacked = stack_once(held, layers, lambda value: on_device(value, device))
    return {**{name: on_device(value, device) for name, value in held.items()}, **stacked}


def on_device(value: np.ndarray, device: Any = None) -> jax.Array:
    """``value`` as a device array: a weight mapped from external data, in a dtype JAX keeps (not 64-bit with x64
    off), by ``jax.device_put``, which on the CPU makes no copy of a page-aligned array (the device array is the
    mapped file); anything else by ``jnp.asarray`` (a copy, in JAX's dtype)."""
    if holdable(value):
        return jax.device_put(value, device)
    return jax.device_put(jnp.asarray(value), device) if device is not None else jnp.asarray(value)


def holdable(value: Any) -> bool:
    """A value mapped from external data whose dtype JAX keeps as it is: :func:`on_device` aliases it."""
    return is_mapped(value) and jax.dtypes.canonicalize_dtype(value.dtype) == value.dtype


def stack_once(held: dict[str, Any], layers: Any, put: Callable[[Any], Any]) -> dict[str, Any]:
    """The per-layer tensors of the runs of ``layers`` (:class:`optkit.onnx._plans.layers.Layers`) that are all in
    ``held`` (same dtype and shape), stacked once by ``put`` (each to the device) and ``jnp.stack``, under
    :func:`~optkit.onnx._plans.layers.stacked_name`; their names are taken out of ``held``, and the pages of those
    mapped from external data are given back as each is stacked. A runner feeds them instead of stacking them at every
    call (a copy of every layer's weights per step)."""
    stacked: dict[str, Any] = {}
    for run in layers.runs if layers else ():
        for names in run.layer_names:
            if all(name in held for name in names) and len({(np.dtype(held[n].dtype), np.shape(held[n]))
                                                            for n in names}) == 1:
                stacked[stacked_name(names)] = jnp.stack([put(held[name]) for name in names])
                for name in names:
                    release_pages(held.pop(name))
    return stacked


def stacked_groups(layers: Any, initializers: Mapping[str, Any], trainable: Container[str]) -> list[tuple[str, ...]]:
    """The per-layer initializers of the scanned runs of ``layers`` that a runner can hold stacked as one trained
    parameter each (``to_jax(..., stacked_params=True)``): for each run (less those run unrolled) cut where its
    per-layer initializers change shape or dtype (ResNet's stages; as
    :func:`optkit.onnx._run.scanned.evaluate` cuts it), each stretch of 2 blocks or more whose tensors of one
    per-layer input are all in ``trainable``; in the graph's order. The names' order is the layers' order."""
    groups: list[tuple[str, ...]] = []
    taken: set[str] = set()
    for r, run in enumerate(layers.runs if layers else ()):
        if r in layers.unrolled:
            continue

        def signature(k: int, run=run) -> tuple:
            return tuple((np.shape(initializers[names[k]]), np.asarray(initializers[names[k]]).dtype)
                         if names[k] in initializers else None for names in run.layer_names)

        start = 0
        for k in range(1, len(run.blocks) + 1):
            if k < len(run.blocks) and signature(k) == signature(start):
                continue
            for names in (names[start:k] for names in run.layer_names) if k - start >= 2 else ():
                # (a tensor that two per-layer inputs read, or one of two runs: stacked once, for the first)
                if all(name in trainable and name in initializers and name not in taken for name in names):
                    groups.append(names)
                    taken.update(names)
            start = k
    return groups


def stacked_specs(specs: Mapping[str, tuple], groups: Sequence[tuple[str, ...]], initializers: Container[str]
                  ) -> tuple[dict[str, tuple], dict[str, tuple[str, ...]]]:
    """``(specs, stacked)``: the parameters' ``{name: (shape, dtype)}`` with each group of :func:`stacked_groups` as
    one entry ``"<first name>...<last name>"`` of shape ``(layers, *shape)``, where its first layer's was (the
    others' left out), and ``{that name: the group}``.

    Raises:
      ValueError: such a name is an initializer's.
    """
    first = {names[0]: names for names in groups}
    grouped = {name for names in groups for name in names}
    out: dict[str, tuple] = {}
    stacked: dict[str, tuple[str, ...]] = {}
    for name, (shape, dtype) in specs.items():
        if name in first:
            names = first[name]
            key = f"{names[0]}...{names[-1]}"
            if key in specs or key in initializers or key in out:
                raise ValueError(f"stacked_params: the stacked parameter's name {key!r} is an initializer's")
            out[key] = ((len(names), *shape), dtype)
            stacked[key] = names
        elif name not in grouped:
            out[name] = (shape, dtype)
    return out, stacked


def gathered_where_used(params: dict[str, Any], inputs: Sequence[Any]) -> dict[str, Any]:
    """``params`` with each one split over a mesh axis that also splits an input gathered over that axis, on an
    explicit mesh (``jax.make_mesh``'s default axis types): FSDP, parameters split over ``data`` like the batch
    (``optkit.state_sharding(params, mesh, "data")``, ``optkit.fsdp_rule``), all-gathered where the model uses
    them (an explicit mesh refuses an operation whose operands split one axis two ways; XLA compiles the gather
    to an all-gather, its gradient to a reduce-scatter). Other axes (a ``model`` axis of tensor parallelism) are
    kept; off an explicit mesh, as they are. Both runners' ``apply_fn`` (``to_jax``, ``OnnxModule``) call it."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or not mesh.explicit_axes:
        return params

    def axes(value: Any) -> set[str]:
        spec = getattr(getattr(jax.typeof(value), "sharding", None), "spec", None) or ()
        return {name for entry in spec if entry is not None
                for name in (entry if isinstance(entry, tuple) else (entry,))}

    batch = set().union(*(axes(x) for x in jax.tree.leaves(inputs) if hasattr(x, "shape"))) & set(mesh.explicit_axes)
    if not batch:
        return params
    out = {}
    for name, value in params.items():
        spec = getattr(getattr(jax.typeof(value), "sharding", None), "spec", None)
        if spec is None or not axes(value) & batch:
            out[name] = value
            continue
        kept = [tuple(a for a in (e if isinstance(e, tuple) else (e,)) if a not in batch) or None
                if e is not None else None for e in spec]
        kept = [e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in kept]
        out[name] = jax.sharding.reshard(value, PartitionSpec(*kept))
    return out
