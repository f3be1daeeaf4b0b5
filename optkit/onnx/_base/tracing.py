"""The trace-time options of a graph trace, read by the operators while the graph is traced: index checks
(``checks=True``), the run's random key and, inside a scanned run of layers, each random node's stream number. Set
by the runners (:func:`optkit.onnx._run.program.graph_function`, :mod:`optkit.onnx._run.segments`) with
:func:`tracing`; read
by the operator families (:mod:`optkit.onnx._ops`). Each is a ``contextvars.ContextVar``: a trace sees the options
of the call that traces it, on any thread."""

from __future__ import annotations

import contextlib
import contextvars
import warnings
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

__all__ = ["as_key", "float16_shadows", "index_checks", "index_checks_active", "node_stream", "node_streams",
           "random_key", "random_key_active", "tracing"]

# The 64-bit types JAX narrows with 64-bit mode off (the documented dtype policy: not warned per node).
_TRUNCATED = r"Explicitly requested dtype (int64|uint64|float64|complex128) requested in .* is not available"


@contextlib.contextmanager
def _set(option: contextvars.ContextVar, value: Any):
    token = option.set(value)
    try:
        yield
    finally:
        option.reset(token)


# True while a graph traced with index checks is evaluated (to_jax(..., checks=True), prepare(..., checks=True)):
# every gathered or scattered index that is out of range raises through jax.experimental.checkify.
_INDEX_CHECKS = contextvars.ContextVar("optkit_onnx_index_checks", default=False)


# The key a graph traced with a random key draws from (apply_fn(params, *inputs, rng=key), OnnxModule with
# nnx.Rngs): Dropout in training mode, the Random* operators, Bernoulli, Multinomial and LoRA's dropout fold the
# node's name into it. None: each node's own seed attribute (0 without one).
_RANDOM_KEY = contextvars.ContextVar("optkit_onnx_random_key", default=None)


def random_key(key: Any) -> contextlib.AbstractContextManager[None]:
    """Within this block, the graph's random operators draw from ``key`` (None: from their seeds)."""
    return _set(_RANDOM_KEY, key)


def random_key_active() -> Any:
    """The key the graph being traced draws from, or None."""
    return _RANDOM_KEY.get()


# Inside a scanned run of layers (optkit.onnx._plans.layers): block 0's node names -> the traced stream number of the
# block being run, so that each layer's random operators draw what they draw unrolled.
_NODE_STREAMS = contextvars.ContextVar("optkit_onnx_node_streams", default=None)


def node_streams(streams: Mapping[str, Any] | None) -> contextlib.AbstractContextManager[None]:
    """Within this block, the nodes named in ``streams`` draw from the stream numbers given there."""
    return _set(_NODE_STREAMS, streams)


def node_stream(name: str) -> Any:
    """The stream number a random node named ``name`` folds into the run's key: its name's CRC-32 (31 bits), or
    inside a scanned run the number of the layer's node in its place."""
    streams = _NODE_STREAMS.get()
    if streams is not None and name in streams:
        return streams[name]
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# While a graph is traced, ONNX Runtime's float16 plan (optkit.onnx._plans.float16): {id(a float16 value): (the
# value, the float32 value it rounds, whether a node moved to float32 made it)}. None outside a trace: no plan.
_FLOAT16_SHADOWS = contextvars.ContextVar("optkit_onnx_float16_shadows", default=None)


def float16_shadows() -> dict | None:
    """The float32 values kept beside the float16 values of the graph being traced, or None outside a trace."""
    return _FLOAT16_SHADOWS.get()


@contextlib.contextmanager
def tracing(*, checks: bool = False, key: Any = None):
    """The trace-time options of one graph trace (:func:`index_checks`, :func:`random_key`, a fresh table of
    :func:`float16_shadows`), and ONNX's 64-bit types run narrower with 64-bit mode off left unwarned per node (the
    documented policy, not a surprise at every node)."""
    with index_checks(checks), random_key(key), _set(_FLOAT16_SHADOWS, {}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", _TRUNCATED, UserWarning)
        yield


def as_key(rng: Any, what: str = "rng") -> jax.Array:
    """``rng`` as a typed ``jax.random`` key: a typed key as it is, a raw ``uint32[2]`` key (``jax.random.PRNGKey``)
    wrapped; anything else is a ``TypeError`` naming ``what``."""
    if isinstance(rng, jax.Array) and jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if rng.shape != ():
            raise ValueError(f"{what} must be one key (shape ()), got a key array of shape {rng.shape}")
        return rng
    if hasattr(rng, "dtype") and np.dtype(rng.dtype) == np.uint32 and tuple(np.shape(rng)) == (2,):
        return jax.random.wrap_key_data(rng)
    raise TypeError(f"{what} must be a jax.random key (jax.random.key(seed)) or a uint32[2] jax.random.PRNGKey, "
                    f"got {type(rng).__name__}{'' if not hasattr(rng, 'dtype') else f' of dtype {rng.dtype}'}")


def index_checks(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Within this block, graphs are traced with ``checkify`` checks of their gather and scatter indices."""
    return _set(_INDEX_CHECKS, bool(enabled))


def index_checks_active() -> bool:
    """Whether the graph being traced checks its gather and scatter indices (``checkify.check``)."""
    return _INDEX_CHECKS.get()
