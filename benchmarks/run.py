"""Optimizer-step speed and memory: optkit against Optax (and PyTorch's fused CPU optimizers).

One command runs every case of the performance issue and prints markdown tables
(and writes the same numbers as JSON)::

    python -m benchmarks                 # full sizes: about 15 minutes on 2 cores, 13 GiB peak
    python -m benchmarks --skip-slow     # without the per-leaf 10000-leaf runs: about 5 minutes
    python -m benchmarks --quick         # tiny sizes, under a minute (CI smoke test)
    python benchmarks/run.py --cases adam_1x64M,adagrad_1x64M --json /tmp/r.json

The per-leaf 10000-leaf candidates (the default path and Optax's) each take
about 3-4 minutes and 13 GiB of memory to compile on XLA:CPU (one program
of 30000 kernels), so each is timed alone in a process of its own, one after the
other; ``--skip-slow`` leaves them out.

What is timed: the whole jitted step ``params, state = step(params, state,
grads)`` (``tx.update`` then ``optax.apply_updates``) with parameters and state
donated, so XLA updates them in place, as a training loop would. All
candidates of a case live in one process and are timed round-robin, in a
new random order every round and each after 5 ms of idling, after a warm-up; the first call of each (trace +
compile + one run) is timed separately. Where a ratio of first calls is a
goal (Adafactor against Adam on the trees), each of the two candidates' first
calls is also taken in fresh processes (3, alternating; ``--first-call-runs``)
and the ratio is of their medians: in one process the second candidate
compiled finds JAX's caches warm. PyTorch's ``fused=True`` optimizers
join when ``torch`` is importable (it is not a dependency of optkit).

Columns: median, min and max of the step in milliseconds; first call in
seconds; GB/s under the minimal-traffic model of the algorithm (bytes per
parameter each step: Adam 28 = read x, g, m, v and write x, m, v; Adagrad 20 =
read x, g, h and write x, h; Adafactor 12 = read x, g and write x, its
factored statistics being negligible); and, from the compiled HLO, the
bytes per parameter that the program really moves (full-size operands read
plus results written by its top-level kernels; for a tree, counted over its
leaves of at least 65536 elements) with its number of kernels (fusions and
loops) and kernels per leaf.

Memory: each optkit candidate (and its Optax counterpart where compiling it
takes seconds) runs again in a fresh process: compiled first, then the
arrays made and 20 donated steps taken while a thread samples the anonymous
resident memory (Linux ``RssAnon``; the shared libraries' pages, which the
kernel may drop at any time, left out) every 0.2 ms; its peak minus its value
before the arrays were made, against the bytes of parameters + gradients +
optimizer state.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    # PyTorch, when present, must start its thread pool before JAX's runtime does: imported
    # after JAX, its many-tensor steps ran 25-50x slower here (thread contention).
    import torch

    torch.ones(1).add_(1)
except ImportError:
    torch = None

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

import optkit
from benchmarks._hlo import full_array_traffic, kernel_count, tree_traffic
from benchmarks._timing import block, markdown_table, summary

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "out" / "results.json"
BYTES_MODEL = {"adam": 28, "adagrad": 20, "adafactor": 12}

# ---------------------------------------------------------------------------
# Parameter trees and deterministic values


@functools.partial(jax.jit, static_argnums=(0, 1))
def _values(shape, dtype, seed, scale):
    """Deterministic, smooth pseudo-random values; one output buffer, no temporaries."""
    n = int(np.prod(shape, dtype=np.int64))
    i = jnp.arange(n, dtype=jnp.float32)
    return (scale * jnp.sin(i * 0.7071 + seed * 1.618)).astype(dtype).reshape(shape)


def _make_tree(abstract, seed: float, scale: float):
    """Concrete arrays for a tree of ``jax.ShapeDtypeStruct``, each made directly on device."""
    leaves, treedef = jax.tree.flatten(abstract)
    return treedef.unflatten(
        [_values(tuple(x.shape), jnp.dtype(x.dtype), jnp.float32(seed + k), scale) for k, x in enumerate(leaves)]
    )


def _abstract_leaves(count: int, shape: tuple[int, ...]):
    return {f"layer{i:05d}": jax.ShapeDtypeStruct(shape, jnp.float32) for i in range(count)}


def transformer_tree(quick: bool):
    """The transformer parameter tree of the Adafactor issue, as ``jax.ShapeDtypeStruct``.

    Taken from ``examples/transformer.py`` (GPT-2-small sizes: d_model 768, 12
    layers, 1024 positions, 256 tokens) when that module exists; otherwise a
    stand-in with the same layout defined here. Returns ``(tree, source)``.
    """
    sizes = dict(vocab_size=256, d_model=768, num_heads=12, num_layers=12, max_len=1024)
    if quick:
        sizes = dict(vocab_size=64, d_model=64, num_heads=2, num_layers=2, max_len=32)
    try:
        from examples.transformer import TransformerConfig, abstract_params
    except ImportError:
        pass
    else:
        return abstract_params(TransformerConfig(**sizes)), "examples/transformer.py"
    d, V, L, ff = sizes["d_model"], sizes["vocab_size"], sizes["max_len"], 4 * sizes["d_model"]

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def norm():
        return {"scale": s(d), "bias": s(d)}

    block = lambda: {  # noqa: E731
        "ln1": norm(), "ln2": norm(),
        "attn": {"qkv": {"kernel": s(d, 3 * d), "bias": s(3 * d)}, "out": {"kernel": s(d, d), "bias": s(d)}},
        "mlp": {"up": {"kernel": s(d, ff), "bias": s(ff)}, "down": {"kernel": s(ff, d), "bias": s(d)}},
    }
    tree = {
        "embed": {"embedding": s(V, d)}, "pos_embed": {"embedding": s(L, d)},
        "blocks": {str(i): block() for i in range(sizes["num_layers"])},
        "ln_f": norm(), "head": {"kernel": s(d, V)},
    }
    return tree, "stand-in defined in benchmarks/run.py (examples/transformer.py not found)"


def gpt_tree(quick: bool):
    """A GPT-2-style tree (issue 18): 6 layers, d_model 768, vocabulary 50257 tied to the output, 1024 positions.

    76 leaves: token and position embeddings, per layer two LayerNorms (scale,
    bias), a fused QKV projection (768 x 2304), the attention output (768 x
    768) and the MLP (768 x 3072, 3072 x 768), each with a bias; a final
    LayerNorm. No separate output matrix (tied embedding).
    """
    d, layers, vocab, positions = (64, 2, 512, 32) if quick else (768, 6, 50257, 1024)

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def norm():
        return {"scale": s(d), "bias": s(d)}

    def block():
        return {"ln1": norm(), "ln2": norm(),
                "attn": {"qkv": {"kernel": s(d, 3 * d), "bias": s(3 * d)}, "out": {"kernel": s(d, d), "bias": s(d)}},
                "mlp": {"up": {"kernel": s(d, 4 * d), "bias": s(4 * d)},
                        "down": {"kernel": s(4 * d, d), "bias": s(d)}}}

    return {"wte": {"embedding": s(vocab, d)}, "wpe": {"embedding": s(positions, d)},
            "blocks": {str(i): block() for i in range(layers)}, "ln_f": norm()}


def _flat_abstract(abstract_tree):
    """The :class:`optkit.FlatParams` layout of a tree, with abstract buffers (nothing computed)."""
    return jax.eval_shape(optkit.FlatParams.from_tree, abstract_tree)


def _nbytes(tree) -> int:
    return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _nparams(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


# ---------------------------------------------------------------------------
# Candidates


def _rho(count):
    """The Adafactor paper's relative step size as an Optax schedule (as benchmarks/adafactor.py)."""
    return jnp.minimum(1e-2, 1 / jnp.sqrt(count + 1.0))


def _optimizer(name: str) -> optax.GradientTransformation:
    if name == "optkit.adam":
        return optkit.adam(1e-3)
    if name == "optax.adam":
        return optax.adam(1e-3)
    if name == "optkit.adagrad":
        return optkit.adagrad(1e-2)
    if name == "optax.adagrad":
        return optax.adagrad(1e-2)
    if name == "optkit.adafactor":
        # The configuration of optax.adafactor's: two largest axes, factored from 128.
        return optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128)
    if name == "optax.adafactor":
        return optax.adafactor(learning_rate=_rho, min_dim_size_to_factor=128)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclass
class Spec:
    """One candidate of a case: an optimizer on a parameter tree, per leaf or as FlatParams."""

    label: str
    optimizer: str
    abstract: object  # tree of jax.ShapeDtypeStruct
    flat: bool = False
    torch: bool = False
    memory: bool = False  # measure peak RSS in a fresh process
    isolated: bool = False  # time in a process of its own (its compilation needs gigabytes)

    def to_json(self) -> dict:
        leaves = jax.tree.leaves(self.abstract)
        return {"label": self.label, "optimizer": self.optimizer, "flat": self.flat, "torch": self.torch,
                "shapes": [list(x.shape) for x in leaves]}

    @classmethod
    def from_json(cls, data: dict) -> Spec:
        abstract = {f"layer{i:05d}": jax.ShapeDtypeStruct(tuple(s), jnp.float32) for i, s in enumerate(data["shapes"])}
        return cls(data["label"], data["optimizer"], abstract, flat=data["flat"], torch=data["torch"])


class JaxStepper:
    """A jitted, donated step on the candidate's own parameters and state."""

    def __init__(self, spec: Spec):
        tx = _optimizer(spec.optimizer)

        def step(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        self.jitted = jax.jit(step, donate_argnums=(0, 1))
        abstract = _flat_abstract(spec.abstract) if spec.flat else spec.abstract
        self.params = _make_tree(abstract, 0.0, 0.01)
        self.grads = _make_tree(abstract, 0.5, 1.0)
        # Eager: a jitted init of 10000 leaves would be one more program of 20000 outputs to compile.
        self.state = tx.init(self.params)
        self.first_call_s = None

    def bytes(self) -> dict[str, int]:
        return {"params": _nbytes(self.params), "grads": _nbytes(self.grads), "state": _nbytes(self.state)}

    def compiled(self):
        return self.jitted.lower(self.params, self.state, self.grads).compile()

    def __call__(self):
        self.params, self.state = self.jitted(self.params, self.state, self.grads)
        return self.params

    def reallocate(self):
        """Move parameters, state and gradients to new buffers; returns the old ones (free them after).

        A donated step runs in the same buffers for the whole run, and the same
        program ran up to 1.4x faster or slower depending on the memory those
        buffers landed in (optax.adam on 8192x4096: 14.9 to 21.4 ms in six
        allocations in one process). Timing over several allocations per
        candidate keeps that luck out of the ratios.
        """
        if len(jax.tree.leaves(self.grads)) > _REALLOCATE_MAX_LEAVES:
            return None
        old = (self.params, self.state, self.grads)
        self.params, self.state, self.grads = (jax.tree.map(lambda x: jnp.array(x, copy=True), t) for t in old)
        jax.block_until_ready((self.params, self.state, self.grads))
        return old


# Trees with more leaves keep their buffers (copying 10000 leaves one by one takes longer than the run).
_REALLOCATE_MAX_LEAVES = 1000


class TorchStepper:
    """``torch.optim.Adam``/``Adagrad`` with ``fused=True`` on tensors of the same shapes."""

    def __init__(self, spec: Spec):
        shapes = [tuple(x.shape) for x in jax.tree.leaves(spec.abstract)]
        self.params = []
        for k, shape in enumerate(shapes):
            n = int(np.prod(shape, dtype=np.int64))
            p = torch.nn.Parameter(0.01 * torch.sin(torch.arange(n, dtype=torch.float32) * 0.7071 + k).reshape(shape))
            p.grad = torch.sin(torch.arange(n, dtype=torch.float32) * 0.7071 + k + 0.5).reshape(shape)
            self.params.append(p)
        cls = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}[spec.optimizer.split(".")[1]]
        self.opt = cls(self.params, lr=1e-3, fused=True)
        self.first_call_s = None

    def __call__(self):
        self.opt.step()


def _torch_available() -> bool:
    return torch is not None


def make_stepper(spec: Spec):
    return TorchStepper(spec) if spec.torch else JaxStepper(spec)


# ---------------------------------------------------------------------------
# Cases


@dataclass
class Ratio:
    """``numerator / denominator`` of two candidates' medians (or first calls), with a goal."""

    label: str
    numerator: str
    denominator: str | None  # None: the numerator's own first-call time in seconds
    goal: float | None
    goal_text: str = ""
    first_call: bool = False  # the ratio of first calls, each the median of fresh processes


@dataclass
class Case:
    name: str
    title: str
    algorithm: str  # the algorithm the case is about
    specs: list[Spec]
    ratios: list[Ratio] = field(default_factory=list)
    note: str = ""


def _has_adafactor() -> bool:
    return hasattr(optkit, "adafactor")


def build_cases(quick: bool, with_torch: bool, skip_slow: bool = False) -> list[Case]:
    big = 1 << 20 if quick else 1 << 26
    # (leaves, leaf size, goal for FlatParams / one leaf, goal for its first call in s)
    many = [(200, 1024, 1.2, None), (500, 64, 2.0, 10.0)] if quick else [
        (1000, 16384, 1.2, None), (10000, 1024, 2.0, 10.0)]
    matrix = (512, 512) if quick else (8192, 8192)

    def one(n):
        return {"x": jax.ShapeDtypeStruct((n,), jnp.float32)}

    label_big = f"{big >> 20}M"
    cases = []
    for algo in ("adam", "adagrad"):
        specs = [Spec(f"optkit.{algo}", f"optkit.{algo}", one(big), memory=True),
                 Spec(f"optax.{algo}", f"optax.{algo}", one(big), memory=not quick)]
        if with_torch:
            specs.append(Spec(f"torch {algo} fused", f"torch.{algo}", one(big), torch=True))
        ratios = [Ratio(f"optkit.{algo} / optax.{algo}", f"optkit.{algo}", f"optax.{algo}", 0.7, "<= 0.7")]
        if with_torch:
            ratios.append(Ratio(f"optkit.{algo} / torch fused", f"optkit.{algo}", f"torch {algo} fused", None))
        cases.append(Case(f"{algo}_1x{label_big}", f"{algo.capitalize()}, one {label_big} leaf", algo, specs, ratios))

    for count, size, limit, first_call_limit in many:
        tree = _abstract_leaves(count, (size,))
        same = one(count * size)
        # Per leaf, 10000 leaves take minutes and about 13 GiB to compile (XLA:CPU, one program
        # holding 30000 kernels): each such candidate is timed alone in a process of its own,
        # and has no memory run. Quick mode sends one small one there to test the path.
        slow = count >= 10000
        specs = [
            Spec("optkit.adam FlatParams", "optkit.adam", tree, flat=True, memory=True),
            Spec("optkit.adam per leaf", "optkit.adam", tree, memory=not slow, isolated=slow),
            Spec("optax.adam per leaf", "optax.adam", tree, memory=not slow and not quick,
                 isolated=slow or (quick and size == 64)),
            Spec("optkit.adam one leaf, same size", "optkit.adam", same),
            Spec("optax.adam one leaf, same size", "optax.adam", same),
        ]
        if slow and skip_slow:
            specs = [s for s in specs if "per leaf" not in s.label]
        if with_torch:
            specs.append(Spec("torch adam fused", "torch.adam", tree, torch=True))
        labels = {s.label for s in specs}
        ratios = [
            Ratio("FlatParams / one leaf", "optkit.adam FlatParams", "optkit.adam one leaf, same size", limit,
                  f"<= {limit}"),
            Ratio("FlatParams / optax per leaf", "optkit.adam FlatParams", "optax.adam per leaf", None),
            Ratio("optkit per leaf / one leaf (default path)", "optkit.adam per leaf",
                  "optkit.adam one leaf, same size", None),
            Ratio("optax per leaf / one leaf", "optax.adam per leaf", "optax.adam one leaf, same size", None),
        ]
        if first_call_limit is not None:
            ratios.append(Ratio("FlatParams first call (s)", "optkit.adam FlatParams", None, first_call_limit,
                                f"< {first_call_limit:g} s"))
        ratios.append(Ratio("optkit per leaf first call (s)", "optkit.adam per leaf", None, None))
        ratios.append(Ratio("optax per leaf first call (s)", "optax.adam per leaf", None, None))
        if with_torch:
            ratios.append(Ratio("FlatParams / torch fused", "optkit.adam FlatParams", "torch adam fused", None))
        ratios = [r for r in ratios if r.numerator in labels and (r.denominator is None or r.denominator in labels)]
        note = ""
        if slow:
            note = ("per-leaf candidates timed alone, each in a process of its own (compiling them takes minutes "
                    "and gigabytes), so not interleaved with the others")
        cases.append(Case(f"adam_{count}x{size}", f"Adam, {count} leaves x {size}", "adam", specs, ratios, note))

    if _has_adafactor():
        # Issue 18: Adafactor against Adam on one large matrix (goal 0.8, aim 0.75).
        shape = (512, 256) if quick else (8192, 4096)
        m = {"w": jax.ShapeDtypeStruct(shape, jnp.float32)}
        specs = [Spec("optkit.adafactor", "optkit.adafactor", m), Spec("optax.adam", "optax.adam", m)]
        ratios = [Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 0.8, "<= 0.8 (aim 0.75)")]
        cases.append(Case(f"adafactor_{shape[0]}x{shape[1]}", f"Adafactor, {shape[0]}x{shape[1]}", "adafactor",
                          specs, ratios))
        tree = gpt_tree(quick)
        specs = [Spec("optkit.adafactor", "optkit.adafactor", tree), Spec("optax.adam", "optax.adam", tree)]
        ratios = [Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 0.8, "<= 0.8"),
                  Ratio("first call: optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 2.0,
                        "<= 2.0 (aim 1.5)", first_call=True)]
        cases.append(Case("gpt", "GPT-style parameter tree", "adafactor", specs, ratios,
                          f"{len(jax.tree.leaves(tree))} leaves, {_nparams(tree):,} parameters"))

    if _has_adafactor():
        m = {"w": jax.ShapeDtypeStruct(matrix, jnp.float32)}
        specs = [Spec("optkit.adafactor", "optkit.adafactor", m, memory=True),
                 Spec("optax.adafactor", "optax.adafactor", m, memory=True),
                 Spec("optax.adam", "optax.adam", m)]
        ratios = [Ratio("optkit.adafactor / optax.adafactor", "optkit.adafactor", "optax.adafactor", None),
                  Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", None)]
        cases.append(Case(f"adafactor_{matrix[0]}x{matrix[1]}", f"Adafactor, {matrix[0]}x{matrix[1]}",
                          "adafactor", specs, ratios))

    tree, source = transformer_tree(quick)
    specs = []
    if _has_adafactor():
        specs += [Spec("optkit.adafactor", "optkit.adafactor", tree, memory=True),
                  Spec("optax.adafactor", "optax.adafactor", tree)]
    specs += [Spec("optkit.adam FlatParams", "optkit.adam", tree, flat=True, memory=True),
              Spec("optkit.adam per leaf", "optkit.adam", tree, memory=True),
              Spec("optax.adam per leaf", "optax.adam", tree)]
    ratios = [Ratio("optkit.adam FlatParams / per leaf", "optkit.adam FlatParams", "optkit.adam per leaf", None),
              Ratio("optkit.adam per leaf / optax.adam", "optkit.adam per leaf", "optax.adam per leaf", None)]
    if _has_adafactor():
        ratios[:0] = [Ratio("optkit.adafactor / optax.adafactor", "optkit.adafactor", "optax.adafactor", None),
                      Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam per leaf", 0.8,
                            "<= 0.8"),
                      Ratio("first call: optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam per leaf",
                            2.0, "<= 2.0 (aim 1.5)", first_call=True)]
    note = f"tree: {source}; {len(jax.tree.leaves(tree))} leaves, {_nparams(tree):,} parameters"
    if not _has_adafactor():
        note += "; optkit.adafactor not in this build, so Adam only"
    cases.append(Case("transformer", "Transformer parameter tree", "adafactor" if _has_adafactor() else "adam",
                      specs, ratios, note))
    return cases


# ---------------------------------------------------------------------------
# Memory, in a fresh process


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


def _peak_rss() -> int:
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
    tx = _optimizer(spec.optimizer)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jitted = jax.jit(step, donate_argnums=(0, 1))
    abstract_params = _flat_abstract(abstract) if spec.flat else abstract
    abstract_state = jax.eval_shape(tx.init, abstract_params)
    # Compile everything first, with abstract arguments, so that compilation's own memory is
    # not counted; then measure from the resident size with no arrays.
    compiled = jitted.lower(abstract_params, abstract_state, abstract_params).compile()
    init = jax.jit(tx.init).lower(abstract_params).compile()
    for shape, dtype in {(tuple(x.shape), jnp.dtype(x.dtype)) for x in jax.tree.leaves(abstract_params)}:
        _values(shape, dtype, jnp.float32(0), 1.0).delete()
    warm = _make_tree({"w": jax.ShapeDtypeStruct((8,), jnp.float32)}, 0.0, 1.0)
    del warm
    _trim()
    baseline = _settled_anon_rss()
    sampler = _PeakSampler()
    sampler.start()
    params = _make_tree(abstract_params, 0.0, 0.01)
    grads = _make_tree(abstract_params, 0.5, 1.0)
    state = init(params)
    nbytes = {"params": _nbytes(params), "grads": _nbytes(grads), "state": _nbytes(state)}
    for _ in range(steps):
        params, state = compiled(params, state, grads)
        jax.block_until_ready(params)
    peak = sampler.stop()
    analysis = compiled.memory_analysis()
    temp = int(getattr(analysis, "temp_size_in_bytes", 0) or 0)
    total = sum(nbytes.values())
    return {"label": spec.label, "bytes": nbytes, "total_bytes": total, "baseline_anon_rss": baseline,
            "peak_anon_rss": peak, "ratio": (peak - baseline) / total, "process_peak_rss": _peak_rss(),
            "xla_temp_bytes": temp, "steps": steps}


def timing_child(spec: Spec, repeats: int, warmup: int) -> dict:
    """Run in a fresh process: one candidate's first call and step times, alone."""
    stepper = make_stepper(spec)
    start = time.perf_counter()
    jax.block_until_ready(stepper())
    stepper.first_call_s = time.perf_counter() - start
    times = time_rotated({spec.label: stepper}, repeats=repeats, warmup=warmup)[spec.label]
    entry = candidate_entry(spec, stepper, times)
    entry["separate_process"] = True
    entry["process_peak_rss"] = _peak_rss()
    return entry


def first_call_child(spec: Spec) -> dict:
    """Run in a fresh process: the first call of the candidate's step (trace + compile + one run)."""
    stepper = make_stepper(spec)
    start = time.perf_counter()
    jax.block_until_ready(stepper())
    return {"label": spec.label, "first_call_s": time.perf_counter() - start}


def run_child(mode: str, spec: Spec, *args) -> dict:
    """``memory_child`` or ``timing_child`` in a fresh Python process; its JSON result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    payload = json.dumps({"mode": mode, "spec": spec.to_json(), "args": list(args)})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--child", payload],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return {"label": spec.label, "error": why}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_main(payload: str) -> dict:
    data = json.loads(payload)
    spec = Spec.from_json(data["spec"])
    if data["mode"] == "memory":
        return memory_child(spec, *data["args"])
    if data["mode"] == "first_call":
        return first_call_child(spec)
    return timing_child(spec, *data["args"])


# ---------------------------------------------------------------------------
# Running and reporting


def reallocate_all(steps) -> None:
    """:meth:`JaxStepper.reallocate` for every stepper that has it, all new buffers made before any old one is freed."""
    held = [s.reallocate() for s in steps if hasattr(s, "reallocate")]
    del held


def time_rotated(steps: dict, *, repeats: int, warmup: int, gap: float = 0.005,
                 seed: int = 0, epochs: int = 4) -> dict[str, list[float]]:
    """Round-robin timing as ``benchmarks._timing.time_interleaved``, in a new order every round.

    A fixed (or merely rotated) order puts the same candidate after the same
    neighbour every round, and it then pays for whatever that neighbour leaves
    behind: PyTorch's OpenMP threads spin for a while after a step, which slowed
    the step after it by 20-50%. So each round runs in a fresh random order,
    and ``gap`` seconds of idling (not timed) precede every timed call so that
    every step starts from a quiet machine. The rounds are split into
    ``epochs``, and before each epoch but the first every candidate's arrays
    move to new buffers (:meth:`JaxStepper.reallocate`). Returns seconds per call.
    """
    rng = random.Random(seed)
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            block(steps[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    per_epoch = max(1, -(-repeats // max(1, epochs)))
    for i in range(repeats):
        if i and i % per_epoch == 0:
            reallocate_all(steps.values())
            for name in names:  # one untimed step in the new buffers
                block(steps[name]())
        rng.shuffle(names)
        for name in names:
            time.sleep(gap)
            start = time.perf_counter()
            block(steps[name]())
            times[name].append(time.perf_counter() - start)
    return times


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import psutil

    versions = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "optax": optax.__version__, "optkit": optkit.__version__, "numpy": np.__version__}
    if _torch_available():
        versions["torch"] = torch.__version__
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": jax.devices()[0].platform, "device": str(jax.devices()[0].device_kind),
            "versions": versions}


def bytes_model(spec: Spec) -> int:
    """Bytes per parameter a step must move at least, for the candidate's algorithm (see the module notes)."""
    return BYTES_MODEL[spec.optimizer.split(".")[1]]


def candidate_entry(spec: Spec, stepper, seconds: list[float]) -> dict:
    """One row of the step-time table: statistics, first call, GB/s and what the HLO moves."""
    stats = summary(seconds)
    n = _nparams(spec.abstract)
    model = bytes_model(spec)
    entry = {"label": spec.label, "n_params": n, "n_leaves": len(jax.tree.leaves(spec.abstract)), **stats,
             "first_call_s": stepper.first_call_s, "bytes_per_param_model": model,
             "gbps": model * n / (stats["median_ms"] * 1e-3) / 1e9}
    if isinstance(stepper, JaxStepper):
        hlo = stepper.compiled().as_text()
        entry["hlo_kernels"] = kernel_count(hlo)
        entry["hlo_kernels_per_leaf"] = entry["hlo_kernels"] / entry["n_leaves"]
        if entry["n_leaves"] == 1:
            traffic = full_array_traffic(hlo, n)
            entry["hlo_full_size_kernels"] = traffic["kernels"]
            entry["hlo_bytes_per_param"] = 4 * (traffic["reads"] + traffic["writes"])
        elif not spec.flat:
            # Leaves of at least 65536 elements (the statistics vectors are shorter).
            sizes = {x.size for x in jax.tree.leaves(spec.abstract) if x.size >= 1 << 16}
            large = sum(x.size for x in jax.tree.leaves(spec.abstract) if x.size in sizes)
            if large:
                traffic = tree_traffic(hlo, sizes)
                entry["hlo_bytes_per_param"] = (traffic["read_bytes"] + traffic["written_bytes"]) / large
    return entry


def run_case(case: Case, repeats: int, warmup: int, with_memory: bool, log, quick: bool = False,
             first_call_runs: int = 3) -> dict:
    load_before = os.getloadavg()
    result = {"name": case.name, "title": case.title, "algorithm": case.algorithm, "note": case.note,
              "candidates": [], "ratios": [], "memory": []}
    entries = {}
    for spec in case.specs:
        if spec.isolated:
            log(f"  {spec.label}: in a separate process ...")
            entries[spec.label] = run_child("timing", spec, repeats, warmup)
    steppers = {}
    for spec in case.specs:
        if spec.isolated:
            continue
        log(f"  building {spec.label} ...")
        stepper = make_stepper(spec)
        start = time.perf_counter()
        jax.block_until_ready(stepper())
        stepper.first_call_s = time.perf_counter() - start
        log(f"  {spec.label}: first call {stepper.first_call_s:.2f} s")
        steppers[spec.label] = stepper
    times = time_rotated(steppers, repeats=repeats, warmup=warmup)
    load_after = os.getloadavg()
    for label, stepper in steppers.items():
        spec = next(s for s in case.specs if s.label == label)
        entries[label] = candidate_entry(spec, stepper, times[label])
    del steppers
    gc.collect()
    fresh = sorted({label for r in case.ratios if r.first_call for label in (r.numerator, r.denominator)})
    for _ in range(first_call_runs if fresh else 0):
        for label in fresh:  # alternating, so that both see the same machine conditions
            spec = next(s for s in case.specs if s.label == label)
            log(f"  first call of {label} in a fresh process ...")
            child = run_child("first_call", spec)
            if "first_call_s" in child:
                entries[label].setdefault("first_call_fresh_s", []).append(child["first_call_s"])
    result["candidates"] = [entries[spec.label] for spec in case.specs]
    for ratio in case.ratios:
        numerator = entries[ratio.numerator]
        denominator = entries.get(ratio.denominator) if ratio.denominator else None
        if "error" in numerator or (denominator is not None and "error" in denominator):
            continue
        if ratio.first_call:
            runs = numerator.get("first_call_fresh_s"), denominator.get("first_call_fresh_s")
            if not all(runs):
                continue
            value = statistics.median(runs[0]) / statistics.median(runs[1])
        elif ratio.denominator is None:
            value = numerator["first_call_s"]
        else:
            value = numerator["median_ms"] / denominator["median_ms"]
        # Both timed in the same rounds: the median of the per-round ratios, which other
        # load on the machine (it comes and goes between rounds) disturbs less.
        paired = None
        if (not ratio.first_call and ratio.denominator is not None and ratio.numerator in times
                and ratio.denominator in times):
            paired = statistics.median(a / b for a, b in zip(times[ratio.numerator], times[ratio.denominator]))
        met = None if ratio.goal is None else bool(value <= ratio.goal)
        result["ratios"].append({"label": ratio.label, "value": value, "paired": paired, "goal": ratio.goal,
                                 "goal_text": ratio.goal_text, "met": met})
    if with_memory:
        measured = [spec for spec in case.specs if spec.memory and not spec.torch]
        # Quick mode: one child per case is enough to test the path.
        for spec in measured[:1] if quick else measured:
            log(f"  memory: {spec.label} ...")
            mem = run_child("memory", spec)
            if "ratio" in mem:
                mem["goal"] = 1.05
                mem["met"] = bool(mem["ratio"] <= 1.05)
            result["memory"].append(mem)
    result["load_before"] = list(load_before)
    result["load_after"] = list(load_after)
    return result


def _fmt(value, digits=3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def report(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"# optkit step benchmarks ({'quick' if meta['quick'] else 'full'})",
        "",
        f"{meta['date']}; {meta['machine']['cpu']}, {meta['machine']['cpu_count']} CPUs, "
        f"{meta['machine']['memory_gib']} GiB, {meta['machine']['platform']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["machine"]["versions"].items()),
        f"float32; jitted step, parameters and state donated; {meta['repeats']} interleaved rounds after "
        f"{meta['warmup']} warm-up; load average (1, 5, 15 min) at start {_load(meta['load_start'])}, "
        f"at end {_load(meta['load_end'])}. PyTorch: {meta['torch']}.",
        *(["", "Quick mode: sizes far too small for the goals to mean anything (a smoke test)."]
          if meta["quick"] else []),
        "",
        "## Step time",
        "",
    ]
    rows = []
    for case in results["cases"]:
        for c in case["candidates"]:
            if "error" in c:
                rows.append([case["title"], c["label"], "error", " ".join(c["error"]), "", "", ""])
                continue
            hlo = ""
            if "hlo_full_size_kernels" in c:
                hlo = f"{c['hlo_bytes_per_param']} B ({c['hlo_full_size_kernels']} kernels)"
            elif "hlo_bytes_per_param" in c:
                hlo = (f"{c['hlo_bytes_per_param']:.1f} B ({c['hlo_kernels']} kernels, "
                       f"{c['hlo_kernels_per_leaf']:.1f} a leaf)")
            elif "hlo_kernels_per_leaf" in c and c["n_leaves"] > 1:
                hlo = f"{c['hlo_kernels']} kernels, {c['hlo_kernels_per_leaf']:.1f} a leaf"
            elif "hlo_kernels" in c:
                hlo = f"{c['hlo_kernels']} kernels"
            first = f"{c['first_call_s']:.2f}"
            if c.get("first_call_fresh_s"):
                first += f" (fresh: {statistics.median(c['first_call_fresh_s']):.2f})"
            label = c["label"]
            if c.get("separate_process"):
                label += " (alone, own process)"
                hlo += f"; process peak RSS {c['process_peak_rss'] / 2**30:.1f} GiB"
            rows.append([case["title"], label, f"{c['median_ms']:.2f}", f"{c['min_ms']:.2f}-{c['max_ms']:.2f}",
                         first, f"{c['gbps']:.1f} ({c['bytes_per_param_model']} B)", hlo])
    lines.append(markdown_table(["case", "candidate", "median ms", "min-max ms", "first call s",
                                 "GB/s (model)", "HLO traffic/param"], rows))
    lines += ["", "## Ratios and goals", ""]
    rows = []
    for case in results["cases"]:
        for r in case["ratios"]:
            met = "" if r["met"] is None else ("met" if r["met"] else "**not met**")
            paired = "" if r.get("paired") is None else f"{r['paired']:.3f}"
            rows.append([case["title"], r["label"], f"{r['value']:.3f}", paired, r["goal_text"] or "-", met])
    lines.append(markdown_table(["case", "ratio", "value (of medians)", "median of per-round ratios", "goal", ""],
                                rows))
    mem_rows = []
    for case in results["cases"]:
        for m in case["memory"]:
            if "error" in m:
                mem_rows.append([case["title"], m["label"], "error", " ".join(m["error"]), "", "", ""])
                continue
            mem_rows.append([case["title"], m["label"], f"{m['total_bytes'] / 2**20:.1f}",
                             f"{(m['peak_anon_rss'] - m['baseline_anon_rss']) / 2**20:.1f}", f"{m['ratio']:.3f}",
                             f"{m['xla_temp_bytes'] / 2**20:.1f}", "met" if m["met"] else "**not met**"])
    if mem_rows:
        lines += ["", "## Peak memory of 20 donated steps (fresh process; goal <= 1.05)", ""]
        lines.append(markdown_table(["case", "candidate", "params+grads+state MiB", "peak - baseline RSS MiB",
                                     "ratio", "XLA temp MiB", ""], mem_rows))
    notes = [f"- {case['title']}: {case['note']}" for case in results["cases"] if case["note"]]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def _load(load) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few rounds: under a minute")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write results ({DEFAULT_JSON})")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 20, quick 5)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 3, quick 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out even if importable")
    parser.add_argument("--skip-slow", action="store_true",
                        help="leave out the per-leaf 10000-leaf candidates (minutes and gigabytes to compile)")
    parser.add_argument("--first-call-runs", type=int, default=None,
                        help="fresh processes per candidate for the first-call ratios (default 3, quick 1)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child_main(args.child)))
        return {}
    repeats = args.repeats or (5 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    with_torch = _torch_available() and not args.no_torch
    cases = build_cases(args.quick, with_torch, skip_slow=args.skip_slow)
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.name for c in cases}
        if unknown:
            parser.error(f"unknown cases {sorted(unknown)}; known: {[c.name for c in cases]}")
        cases = [c for c in cases if c.name in wanted]

    def log(text):
        print(text, file=sys.stderr, flush=True)

    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "quick": args.quick,
            "repeats": repeats, "warmup": warmup, "machine": machine_info(), "load_start": list(os.getloadavg()),
            "torch": f"fused=True, {torch.__version__}" if with_torch else "not importable (n/a)"}
    results = {"meta": meta, "cases": []}
    for case in cases:
        log(f"{case.name}: {case.title}")
        results["cases"].append(run_case(case, repeats, warmup, not args.no_memory, log, quick=args.quick,
                                         first_call_runs=args.first_call_runs or (1 if args.quick else 3)))
    meta["load_end"] = list(os.getloadavg())
    text = report(results)
    results["markdown"] = text
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(text)
    log(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
