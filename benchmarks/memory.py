"""Peak memory of a candidate's donated steps, measured in a fresh process (Linux ``RssAnon``)."""

from __future__ import annotations

import ctypes
import gc
import threading
import time

import jax
import jax.numpy as jnp
import optax

from benchmarks.candidates import Spec, optimizer
from benchmarks.trees import flat_abstract, make_tree, nbytes, values

__all__ = ["memory_child", "peak_rss"]


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _anon_rss() -> int:
    """Anonymous resident memory in bytes: what the process allocated (arrays, heaps).

    Unlike the whole resident set it does not include pages of the shared
    libraries (jaxlib's is 350 MB), which the kernel may drop and map again at
    any time (this machine runs proactive reclaim), so differences of it are
    stable; with no swap, anonymous pages are never dropped.
    """
    kib = _status_kib("RssAnon")
    if kib is None:
        import psutil

        return psutil.Process().memory_info().rss
    return kib * 1024


def peak_rss() -> int:
    """The process's peak resident set size in bytes (``VmHWM``)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return kib * 1024


def _settled_anon_rss(timeout: float = 5.0) -> int:
    """:func:`_anon_rss` once it has stopped moving (freeing and trimming finish asynchronously)."""
    last, stable_since, start = _anon_rss(), time.perf_counter(), time.perf_counter()
    while time.perf_counter() - start < timeout:
        time.sleep(0.05)
        now = _anon_rss()
        if abs(now - last) > (1 << 20):
            stable_since = time.perf_counter()
        elif time.perf_counter() - stable_since > 0.5:
            return now
        last = now
    return last


class _PeakSampler(threading.Thread):
    """Samples :func:`_anon_rss` every ``interval`` seconds in the background; keeps the maximum."""

    def __init__(self, interval: float = 2e-4):
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_event = interval, _anon_rss(), threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, _anon_rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, _anon_rss())
        return self.peak


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def memory_child(spec: Spec, steps: int = 20) -> dict:
    """Run in a fresh process: ``steps`` donated steps; peak RSS over the arrays' bytes."""
    abstract = spec.abstract
    tx = optimizer(spec.optimizer)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jitted = jax.jit(step, donate_argnums=(0, 1))
    abstract_params = flat_abstract(abstract) if spec.flat else abstract
    abstract_state = jax.eval_shape(tx.init, abstract_params)
    # Compile everything first, with abstract arguments, so that compilation's own memory is
    # not counted; then measure from the resident size with no arrays.
    compiled = jitted.lower(abstract_params, abstract_state, abstract_params).compile()
    init = jax.jit(tx.init).lower(abstract_params).compile()
    for shape, dtype in {(tuple(x.shape), jnp.dtype(x.dtype)) for x in jax.tree.leaves(abstract_params)}:
        values(shape, dtype, jnp.float32(0), 1.0).delete()
    warm = make_tree({"w": jax.ShapeDtypeStruct((8,), jnp.float32)}, 0.0, 1.0)
    del warm
    _trim()
    baseline = _settled_anon_rss()
    sampler = _PeakSampler()
    sampler.start()
    params = make_tree(abstract_params, 0.0, 0.01)
    grads = make_tree(abstract_params, 0.5, 1.0)
    state = init(params)
    sizes = {"params": nbytes(params), "grads": nbytes(grads), "state": nbytes(state)}
    for _ in range(steps):
        params, state = compiled(params, state, grads)
        jax.block_until_ready(params)
    peak = sampler.stop()
    analysis = compiled.memory_analysis()
    temp = int(getattr(analysis, "temp_size_in_bytes", 0) or 0)
    total = sum(sizes.values())
    return {"label": spec.label, "bytes": sizes, "total_bytes": total, "baseline_anon_rss": baseline,
            "peak_anon_rss": peak, "ratio": (peak - baseline) / total, "process_peak_rss": peak_rss(),
            "xla_temp_bytes": temp, "steps": steps}
