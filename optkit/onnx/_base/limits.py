"""What a model from a stranger may use: bytes of one tensor, Gradient nesting, expanded functions.

Each bound is checked at load time where the model declares the size, and when
the graph is traced (before XLA runs anything) for what it computes. The docs
page "The ONNX backend", "Loading ONNX files from strangers", lists them with
their defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np

from optkit.onnx._base.errors import TensorTooLargeError

__all__ = ["Limits", "default_max_tensor_bytes", "check_size", "MAX_GRADIENT_DEPTH",
           "GRADIENT_DEPTH_CEILING", "MAX_EXPANDED_NODES", "MAX_DIM", "MAX_EMPTY_EXTENT", "MAX_GRADIENT_PASSES",
           "MAX_ANALYSIS_STEPS", "MAX_SUBGRAPH_DEPTH", "MAX_NODE_WORK", "MAX_LOOP_STEPS", "MAX_TRIP_COUNT",
           "jax_device", "check_work", "jaxpr_as_fun", "jaxpr_work"]

# Gradient nodes nested deeper than this are refused at load time: each level of
# nesting differentiates the level below it again, about tripling the work (8
# levels take 1.6 s on a 2-core CPU, 12 over two minutes), and Python's recursion
# limit is reached near 64. ``max_gradient_depth`` may raise it up to the ceiling.
MAX_GRADIENT_DEPTH = 8
GRADIENT_DEPTH_CEILING = 16


# The most nodes a model's local functions may expand it to (or the nodes its file holds, if more):
# a model at the bound loads in seconds (34 microseconds a node on a 2-core CPU).
MAX_EXPANDED_NODES = 100_000
# The reverse passes a model's Gradient nodes may ask for in all (``max_gradient_passes``): the
# work of differentiating, which nesting and fan-out multiply (docs/onnx.md, "Loading ONNX files from strangers").
MAX_GRADIENT_PASSES = 4096
# The steps the load-time walks over the Gradient nodes' sub-graphs may take in all.
MAX_ANALYSIS_STEPS = 5_000_000
# Sub-graphs (If branches, Loop and Scan bodies) nested deeper than this are refused at load time: tracing an If
# whose condition is computed traces both branches, so nested Ifs cost 2**depth traces (8 levels: 256, about
# a second), and each level takes Python frames (Python's recursion limit is near 1000).
MAX_SUBGRAPH_DEPTH = 8
# The elements one node may produce or iterate over, checked before it runs: a Resize's output times the input
# elements each output element reads (its taps), a Loop's or Scan's iterations times the elements its body computes
# in one (nested loops multiplied in). 2**32 element operations take XLA:CPU seconds on 2 cores; a Resize of 32
# elements by a scale of 2**16, a few milliseconds of output, is far below it and runs.
MAX_NODE_WORK = 2**32
# The body nodes a Loop run op by op (on concrete values, between prepare's compiled segments) may evaluate in all:
# iterations times the body's nodes, a nested Loop's counted in the one that runs it. An evaluation costs Python
# 0.1-0.3 ms on a 2-core CPU for a small node (a few seconds at the bound), more for a heavy one (a MatMul by a
# language model's head as the body: 2.7 ms, 27 s at the bound).
MAX_LOOP_STEPS = 10_000
# The iterations of a Loop or Scan, whatever its body: a compiled while loop at the bound runs seconds.
MAX_TRIP_COUNT = 10**7
# The largest dimension of any tensor a model declares or computes.
MAX_DIM = 2**31 - 1
# An empty tensor's non-zero dimensions multiply to at most this: XLA:CPU's cost for an empty array
# grows with its other dimensions (Neg of [65536, 65536, 0] took 2 GB and aborted the process).
MAX_EMPTY_EXTENT = 2**24


def _available_bytes(device: Any) -> int | None:
    """Bytes of memory free on ``device`` now (an accelerator's free memory, else the host's)."""
    if device is not None and device.platform != "cpu":
        try:
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            stats = {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    candidates = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:  # a container's own limit (cgroup v2)
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            candidates.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return max(min(candidates), 0)


def jax_device(device: str) -> Any:
    """The JAX device for an ONNX device string (``"CPU"``, ``"CUDA"``, ``"CUDA:1"``)."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'CPU' or 'CUDA:0', got {device!r}")
    kind, _, index = device.partition(":")
    platform = {"CPU": "cpu", "CUDA": "gpu"}.get(kind.upper())
    if platform is None or (index and not index.isdigit()):
        raise ValueError(f"device must be 'CPU' or 'CUDA[:index]', got {device!r}")
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        raise ValueError(f"device {device!r}: JAX has no {platform} backend here") from None
    i = int(index) if index else 0
    if not 0 <= i < len(devices):
        raise ValueError(f"device {device!r}: JAX sees {len(devices)} {platform} device(s)")
    return devices[i]


def default_max_tensor_bytes(device: Any = None) -> int:
    """The default limit on one tensor's bytes: half the memory available on ``device`` now.

    Half the free memory of an accelerator (``device.memory_stats()``), or of
    the host for CPU devices (``MemAvailable``, within a container's cgroup
    limit); 2**38 bytes (256 GiB) when neither can be read. A graph that
    declares or computes one tensor larger than this is refused with
    :class:`optkit.onnx.TensorTooLargeError` before anything is allocated
    (XLA would otherwise abort the process, or take the machine's memory).
    Pass ``max_tensor_bytes=`` to :func:`optkit.onnx.prepare` to raise it.

    Args:
      device: a ``jax.Device``, or None for the host's memory.

    Returns:
      The limit in bytes (an int >= 1).

    Raises:
      TypeError: ``device`` is neither a ``jax.Device`` nor None.

    Example:
      >>> import optkit.onnx
      >>> optkit.onnx.default_max_tensor_bytes() > 0
      True
    """
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"device must be a jax.Device or None, got {device!r}")
    available = _available_bytes(device)
    return 2**38 if available is None else max(available // 2, 1)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a loaded model may use: bytes of one tensor, depth of nested Gradient nodes, reverse passes.

    Attributes:
      max_tensor_bytes: the largest tensor (declared or computed) in bytes.
      max_gradient_depth: how deep Gradient nodes may nest (a Gradient whose
        ``y`` is computed through another Gradient is one level deeper).
      max_gradient_passes: the reverse passes the Gradient nodes may need in all.
      max_node_work: the elements one node may produce or iterate over (:data:`MAX_NODE_WORK`).
      max_loop_steps: the body nodes a Loop run op by op may evaluate (:data:`MAX_LOOP_STEPS`).
    """

    max_tensor_bytes: int
    max_gradient_depth: int = MAX_GRADIENT_DEPTH
    max_gradient_passes: int = MAX_GRADIENT_PASSES
    max_node_work: int = MAX_NODE_WORK
    max_loop_steps: int = MAX_LOOP_STEPS

    @classmethod
    def make(cls, max_tensor_bytes: int | None = None, max_gradient_depth: int | None = None,
             device: Any = None, max_gradient_passes: int | None = None, *, max_node_work: int | None = None,
             max_loop_steps: int | None = None) -> Limits:
        """The limits with defaults filled in, each checked (a positive int; the depth at most the ceiling)."""
        if max_tensor_bytes is None:
            max_tensor_bytes = default_max_tensor_bytes(device)
        if isinstance(max_tensor_bytes, bool) or not isinstance(max_tensor_bytes, (int, np.integer)) \
                or max_tensor_bytes < 1:
            raise ValueError(f"max_tensor_bytes must be a positive integer, got {max_tensor_bytes!r}")
        depth = MAX_GRADIENT_DEPTH if max_gradient_depth is None else max_gradient_depth
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not \
                1 <= depth <= GRADIENT_DEPTH_CEILING:
            raise ValueError(f"max_gradient_depth must be an integer from 1 to {GRADIENT_DEPTH_CEILING} "
                             f"(each level about triples the work), got {depth!r}")
        passes = MAX_GRADIENT_PASSES if max_gradient_passes is None else max_gradient_passes
        if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 1:
            raise ValueError(f"max_gradient_passes must be a positive integer, got {passes!r}")
        work = _positive("max_node_work", MAX_NODE_WORK if max_node_work is None else max_node_work)
        steps = _positive("max_loop_steps", MAX_LOOP_STEPS if max_loop_steps is None else max_loop_steps)
        return cls(int(max_tensor_bytes), int(depth), int(passes), work, steps)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_work(elements: float, what: str, limit: int) -> None:
    """Raise a ``ValueError`` naming ``what`` if a node's work of ``elements`` (produced or iterated over) is above
    ``limit`` (``max_node_work``), before the node runs."""
    if elements > limit:
        raise ValueError(f"{what}: {elements:.4g} element operations, more than optkit.onnx's limit of {limit} "
                         f"({limit:.3g}) for one node; it is refused before it runs (pass max_node_work= to raise "
                         f"the limit)")


def jaxpr_as_fun(closed: Any) -> Any:
    """``f(*flat values) -> list of flat outputs`` evaluating a closed jaxpr (``jax.extend.core.jaxpr_as_fun``)."""
    import jax.extend.core

    return jax.extend.core.jaxpr_as_fun(closed)


def jaxpr_work(jaxpr: Any) -> int:
    """The elements the equations of a (closed) jaxpr produce: a ``scan``'s body counted once per iteration, a
    ``cond``'s costliest branch, a ``while``'s body once (its iterations are bounded where it is made)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        inner = []
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (tuple, list)) else (param,)):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    inner.append(jaxpr_work(sub))
        if inner:
            times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
            total += times * (max(inner) if eqn.primitive.name == "cond" else sum(inner))
    return total


def check_size(shape: tuple[int, ...], dtype: np.dtype | None, what: str, limit: int) -> None:
    """Raise :class:`TensorTooLargeError` naming ``what`` if a tensor of ``shape`` exceeds the bounds.

    The bounds: each dimension at most :data:`MAX_DIM`, and the tensor's bytes
    at most ``limit``, counting a dimension of 0 as 1 (an empty tensor costs
    XLA:CPU work and memory in its other dimensions: [65536, 65536, 0] took
    gigabytes), so that ``size * itemsize <= limit`` for non-empty tensors.
    """
    dims = tuple(int(d) for d in shape)
    kind = "" if dtype is None else f" of {np.dtype(dtype).name}"
    huge = [d for d in dims if d > MAX_DIM]
    if huge:
        raise TensorTooLargeError(
            f"{what} has shape {dims}: the dimension {huge[0]} is above optkit.onnx's bound of {MAX_DIM} "
            f"(2**31 - 1) on one dimension; it is refused before anything is allocated")
    counted = math.prod(max(d, 1) for d in dims)
    if 0 in dims and counted > MAX_EMPTY_EXTENT:
        raise TensorTooLargeError(
            f"{what} has shape {dims}: an empty tensor whose other dimensions multiply to {counted:.4g}, above "
            f"optkit.onnx's bound of {MAX_EMPTY_EXTENT} (2**24) for empty tensors (XLA's work for an empty "
            f"array grows with its other dimensions); it is refused before anything is allocated")
    itemsize = 1 if dtype is None else np.dtype(dtype).itemsize
    if counted * itemsize > limit:
        empty = " (a dimension of 0 counts as 1: an empty tensor costs XLA work in its other dimensions)" \
            if 0 in dims else ""
        raise TensorTooLargeError(
            f"{what} has shape {dims}: {counted:.4g} elements{kind}, {counted * itemsize:.4g} bytes{empty}, "
            f"more than optkit.onnx's limit of {limit} bytes ({limit / 2**30:.3g} GiB) for one tensor; it is "
            f"refused before anything is allocated (the default limit is half the memory available when "
            f"the model is loaded; pass max_tensor_bytes= to raise it)")
