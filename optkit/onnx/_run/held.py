"""Weights held on the device for a runner's compiled program: the one rule of both runners.

A compiled program reads an initializer either as a constant (its bytes copied into the program) or as an argument
held on the device (:func:`held_weights`): the weights mapped from external data, which a constant would copy, and,
for a LoRA fine-tune, the frozen base. A scanned run's per-layer weights among them are stacked once
(:func:`stack_once`) instead of inside the program at every call.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import is_mapped, release_pages
from optkit.onnx._plans.layers import stacked_name

__all__ = ["held_weights", "on_device", "holdable", "stack_once"]


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
