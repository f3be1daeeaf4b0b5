"""What a model from a stranger may use: bytes of one tensor, Gradient nesting, expanded functions.

Each bound is checked at load time where the model declares the size, and when
the graph is traced (before XLA runs anything) for what it computes. README
"Loading ONNX files from strangers" lists them with their defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np
import onnx

from optkit.onnx._errors import TensorTooLargeError
from optkit.onnx._ops._values import DTYPES

__all__ = ["Limits", "default_max_tensor_bytes", "check_size", "check_declared_shape", "MAX_GRADIENT_DEPTH",
           "GRADIENT_DEPTH_CEILING", "MAX_EXPANDED_NODES"]

# Gradient nodes nested deeper than this are refused at load time: each level of
# nesting differentiates the level below it again, about tripling the work (8
# levels take 1.6 s on a 2-core CPU, 12 over two minutes), and Python's recursion
# limit is reached near 64. ``max_gradient_depth`` may raise it up to the ceiling.
MAX_GRADIENT_DEPTH = 8
GRADIENT_DEPTH_CEILING = 16


# The most nodes a model may have once its model-local functions are expanded.
MAX_EXPANDED_NODES = 1_000_000


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


def default_max_tensor_bytes(device: jax.Device | None = None) -> int:
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
    """What a loaded model may use: bytes of one tensor, depth of nested Gradient nodes.

    Attributes:
      max_tensor_bytes: the largest tensor (declared or computed) in bytes.
      max_gradient_depth: how deep Gradient nodes may nest (a Gradient whose
        ``y`` is computed through another Gradient is one level deeper).
    """

    max_tensor_bytes: int
    max_gradient_depth: int = MAX_GRADIENT_DEPTH

    @classmethod
    def make(cls, max_tensor_bytes: int | None = None, max_gradient_depth: int | None = None,
             device: Any = None) -> Limits:
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
        return cls(int(max_tensor_bytes), int(depth))


def check_size(shape: tuple[int, ...], dtype: np.dtype | None, what: str, limit: int) -> None:
    """Raise :class:`TensorTooLargeError` naming ``what`` if a tensor of ``shape`` exceeds ``limit`` bytes."""
    elements = math.prod(shape)
    itemsize = 1 if dtype is None else np.dtype(dtype).itemsize
    if elements * itemsize > limit:
        kind = "" if dtype is None else f" of {np.dtype(dtype).name}"
        raise TensorTooLargeError(
            f"{what} has shape {tuple(shape)}: {elements:.4g} elements{kind}, {elements * itemsize:.4g} bytes, "
            f"more than optkit.onnx's limit of {limit} bytes ({limit / 2**30:.3g} GiB) for one tensor; it is "
            f"refused before anything is allocated (the default limit is half the memory available when "
            f"the model is loaded; pass max_tensor_bytes= to raise it)")


def check_declared_shape(value_info: onnx.ValueInfoProto, what: str, limit: int) -> None:
    """A declared (graph output or value_info) tensor shape: no negative or oversized dimensions."""
    if value_info.type.WhichOneof("value") != "tensor_type":
        return
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return
    fixed = [int(d.dim_value) for d in tensor.shape.dim if d.WhichOneof("value") == "dim_value"]
    negative = [d for d in fixed if d < 0]
    if negative:
        raise ValueError(f"{what} {value_info.name!r} declares the negative dimension {negative[0]}")
    dtype = DTYPES.get(tensor.elem_type)
    check_size(tuple(fixed), dtype, f"{what} {value_info.name!r}", limit)
