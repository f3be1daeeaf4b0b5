"""Warm starts: ``to_jax``'s ``apply_fn`` traced inside a caller's ``jax.jit`` (and ``jax.grad``) from a program a
process before it exported, instead of tracing and lowering the graph again.

JAX's persistent compilation cache (:mod:`optkit.onnx._run.cache`) spares a second process XLA's compile, not the
trace of the graph and its lowering to StableHLO, which it needs to find the cached program: 1-4 s of a
convolutional network's first training step. Here the first process that traces ``apply_fn`` under a caller's
``jax.jit`` exports (``jax.export``) two functions of the arrays it is fed (the trained initializers, the held
frozen ones, the inputs):

- ``forward``: the outputs and the residuals of ``jax.vjp``, the values its pullback reads;
- ``backward``: the pullback, from the residuals and the outputs' cotangents to the fed values' cotangents;

and writes them, serialized, under the cache's directory (``optkit-warm``), keyed by the model's bytes, the
options of ``to_jax``, the fed names and their shapes and dtypes, the 64-bit setting and JAX's numerical options,
the versions of JAX, jaxlib, onnx and NumPy, and optkit's code. ``apply_fn`` is then a ``jax.custom_vjp`` of the
two exported calls in that process and every later one: the caller's trace holds two calls instead of the graph,
lowering copies their modules, and the caller's program is the same in every process, so XLA's compile is read
from the persistent cache.

Only where that is the same function: inside ``jax.jit`` (and under at most one reverse-mode differentiation,
``jax.grad``/``jax.value_and_grad``/``jax.vjp``), on one device, without a mesh, without a random key or
checks. Anything else (``jax.jvp``, ``jax.vmap``, ``jax.hessian``, ``jax.grad`` of ``jax.grad``, a mesh, several
devices, eager calls) traces the graph as before. So does a model the key cannot stand for (weights in external
files, which are not in its bytes; a user's registered operator, whose code is not) and one that JAX cannot
export (host callbacks, string outputs: logged at INFO once). ``OPTKIT_COMPILATION_CACHE=off`` turns warm starts
off, even where JAX's cache has a directory of the user's own.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._run.cache import compilation_cache, opted_out

__all__ = ["WARM_MAX_BYTES", "warm_call"]

_log = logging.getLogger("optkit.onnx")

WARM_MAX_BYTES = 2**28  # the exported programs' directory bound: the oldest are removed past it
_FOLDER = "optkit-warm"
_memory: dict[str, Any] = {}  # key -> (forward, backward, meta), or None where exporting failed


def warm_call(run: Callable[..., tuple], key_parts: Callable[[], Sequence[Any] | None],
              values: Sequence[Any]) -> tuple | None:
    """``run(*values)`` from the exported pair when it can be (module docstring), else None (the caller traces
    ``run`` itself). ``key_parts()`` says what ``run`` is besides the values' types (the model's digest and the
    program's options, plain values with a stable ``repr``), or None where it cannot say."""
    if opted_out() or not _eligible(values) or not _serializable():
        return None
    directory = compilation_cache()
    parts = None if directory is None else key_parts()
    if parts is None:
        return None
    key = _key(parts, values)
    if key not in _memory:
        _memory[key] = _load(directory, key) or _export(run, values, directory, key)
    entry = _memory[key]
    if entry is None:
        return None
    try:
        return _call(entry, values)
    except Exception as err:  # noqa: BLE001 (a program JAX read but cannot call here: traced as before)
        _log.info("warm start: the exported apply_fn could not be called (%s: %s); traced instead",
                  type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        _memory[key] = None
        return None


def _eligible(values: Sequence[Any]) -> bool:
    """Inside ``jax.jit`` and at most one reverse-mode differentiation of it, on one device without a mesh."""
    try:
        from jax._src.interpreters import ad
        from jax._src.interpreters import partial_eval as pe
    except ImportError:  # (another JAX: traced as before)
        return False
    if jax.device_count() != 1 or not jax.sharding.get_abstract_mesh().empty:
        return False
    staged = False
    for value in values:
        if not isinstance(value, jax.core.Tracer):
            continue
        if type(value) is ad.LinearizeTracer:
            value = value.primal
        if type(value) is not pe.DynamicJaxprTracer:
            return False
        staged = True
    return staged


@functools.cache
def _serializable() -> bool:
    """Whether ``jax.export`` can serialize here (it needs ``flatbuffers``, which optkit's ``onnx`` extra installs;
    without it nothing is exported, rather than exported and dropped in every process)."""
    if importlib.util.find_spec("flatbuffers") is None:
        _log.info("warm start: off (jax.export's serialization needs the flatbuffers package)")
        return False
    return True


def _key(key_parts: Sequence[Any], values: Sequence[Any]) -> str:
    import jaxlib

    types = [(a.shape, str(a.dtype), a.weak_type) for a in _avals(values)]
    config = {name: str(getattr(jax.config, name, None)) for name in (
        "jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion",
        "jax_default_prng_impl", "jax_threefry_partitionable", "jax_softmax_custom_jvp")}
    import onnx

    versions = (jax.__version__, jaxlib.__version__, onnx.__version__, np.__version__)  # (onnx: the schemas' defaults)
    text = repr((tuple(key_parts), types, config, versions, jax.default_backend(), _code_digest()))
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


@functools.cache
def _code_digest() -> str:
    """optkit's own code (every module of the package): an edited checkout never reads another's programs."""
    digest = hashlib.blake2b(digest_size=20)
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _avals(values: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    """Each value's shape, dtype and weak type: what the exported pair is traced for and keyed by."""
    return [jax.ShapeDtypeStruct(tuple(np.shape(v)), jnp.result_type(v),
                                 weak_type=bool(getattr(jax.typeof(v), "weak_type", False))) for v in values]


def _floating(value: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(value), jnp.inexact))


def _export(run, values, directory, key):
    """Trace ``run`` once under ``jax.vjp``, export the forward and the pullback, write them; None on failure."""
    start = time.perf_counter()
    try:
        entry, blobs = _exported_pair(run, values)
    except Exception as err:  # noqa: BLE001 (anything JAX refuses to export: traced as before)
        _log.info("warm start: apply_fn could not be exported (%s: %s); traced in each process",
                  type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return None
    _write(pathlib.Path(directory, _FOLDER), key, blobs)
    _log.info("warm start: exported apply_fn's forward and backward in %.2f s", time.perf_counter() - start)
    return entry


def _exported_pair(run, values):
    wrt = [i for i, v in enumerate(values) if _floating(v)]
    avals = _avals(values)
    found: dict[str, Any] = {}

    def forward(*given):
        def differentiated(*chosen):
            full = list(given)
            for i, v in zip(wrt, chosen):
                full[i] = v
            outs = tuple(run(*full))
            if any(o is None for o in outs):
                raise TypeError("a string output")
            found["float_outputs"] = [j for j, o in enumerate(outs) if _floating(o)]
            return tuple(outs[j] for j in found["float_outputs"]), outs

        _, pullback, outs = jax.vjp(differentiated, *(given[i] for i in wrt), has_aux=True)
        residuals, found["treedef"] = jax.tree.flatten(pullback)
        found["outputs"] = len(outs)
        return outs, residuals

    fwd = jax.export.export(jax.jit(forward))(*avals)
    outs_avals = fwd.out_avals[:found["outputs"]]
    res_avals = fwd.out_avals[found["outputs"]:]
    treedef = found["treedef"]

    def backward(residuals, cotangents):
        return jax.tree.unflatten(treedef, residuals)(tuple(cotangents))

    ct_avals = [jax.ShapeDtypeStruct(outs_avals[j].shape, outs_avals[j].dtype) for j in found["float_outputs"]]
    bwd = jax.export.export(jax.jit(backward))(
        [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in res_avals], ct_avals)
    meta = {"wrt": wrt, "float_outputs": found["float_outputs"], "outputs": found["outputs"],
            "values": len(values)}
    return (fwd, bwd, meta), (fwd.serialize(), bwd.serialize(), meta)


def _call(entry, values):
    fwd, bwd, meta = entry
    wrt, float_outputs = meta["wrt"], meta["float_outputs"]

    @jax.custom_vjp
    def exported(*given):
        return tuple(fwd.call(*given)[0])

    def exported_fwd(*given):
        outs, residuals = fwd.call(*given)
        return tuple(outs), residuals

    def exported_bwd(residuals, cotangents):
        grads = bwd.call(residuals, [cotangents[j] for j in float_outputs])
        out: list[Any] = [None] * meta["values"]
        for i, g in zip(wrt, grads):
            out[i] = g
        return tuple(out)

    exported.defvjp(exported_fwd, exported_bwd)
    return exported(*values)


def _write(folder: pathlib.Path, key: str, blobs) -> None:
    """One file per key (written whole, then renamed into place); the oldest removed past :data:`WARM_MAX_BYTES`.
    A directory that cannot be written leaves the programs in memory only."""
    fwd, bwd, meta = blobs
    buffer = io.BytesIO()
    np.savez(buffer, forward=np.frombuffer(bytes(fwd), np.uint8), backward=np.frombuffer(bytes(bwd), np.uint8),
             meta=np.array(json.dumps(meta)))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{key}.{os.getpid()}.partial"
        partial.write_bytes(buffer.getvalue())
        os.replace(partial, folder / f"{key}.npz")
        entries = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for path in entries:
            total += path.stat().st_size
            if total > WARM_MAX_BYTES:
                path.unlink(missing_ok=True)
    except OSError as err:
        _log.info("warm start: %s cannot be written (%s); exported programs kept in memory only", folder, err)


def _load(directory: str, key: str):
    path = pathlib.Path(directory, _FOLDER, f"{key}.npz")
    if not path.is_file():
        return None
    start = time.perf_counter()
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            fwd = jax.export.deserialize(bytearray(data["forward"].tobytes()))
            bwd = jax.export.deserialize(bytearray(data["backward"].tobytes()))
        os.utime(path)  # (recently used: kept longest)
    except Exception as err:  # noqa: BLE001 (a damaged or foreign file: exported again)
        _log.info("warm start: %s unreadable (%s: %s); exporting again", path, type(err).__name__, err)
        return None
    _log.info("warm start: apply_fn's exported forward and backward read from %s in %.2f s", path,
              time.perf_counter() - start)
    return fwd, bwd, meta
