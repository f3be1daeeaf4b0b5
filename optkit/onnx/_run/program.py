"""The compiled program of a loaded graph, for both runners: its key, its trace, its compile, its log.

:func:`graph_function` is what :class:`~optkit.onnx.BackendRep` (``prepare``) and
:class:`~optkit.onnx.OnnxFunction` (``to_jax``) call with their checked feeds (:mod:`optkit.onnx._run.feeds`): one
function per :func:`program_key` (the fed names, the :class:`Program` options, the caller's 64-bit setting and the
static values), cut into the stages a call goes through the first time:

1. :func:`traced_run`: the graph evaluated under the trace-time options (:func:`optkit.onnx._base.tracing.tracing`),
   its repeated layers as scans (:func:`optkit.onnx._run.scanned.evaluate`);
2. :func:`compiled`: that function under ``jax.jit`` (with ``checkify`` when asked), the held weights
   (:mod:`optkit.onnx._run.held`) given after the values;
3. :func:`logged`: each call that compiles timed and logged at INFO on the ``optkit.onnx`` logger, with its cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import checkify

from optkit import Graph
from optkit.onnx._base.tracing import tracing
from optkit.onnx._base.values import STRING, is_string
from optkit.onnx._run import scanned

_log = logging.getLogger("optkit.onnx")

__all__ = ["Program", "graph_function", "program_key", "static_key", "stages", "describe_stages"]

# jax.monitoring's duration events of a compile, by stage. A program's own events come after those of anything it
# compiled while being traced (a constant folded eagerly), so the last of each kind is the program's.
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile",
           "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read"}
_recording: list[dict[str, float]] = []
_listening: list[bool] = []


def _listen(event: str, duration: float, **_: Any) -> None:
    stage = _EVENTS.get(event)
    if stage is not None:
        for record in _recording:  # (a block inside another: both see the program)
            record[stage] = duration


@contextlib.contextmanager
def stages() -> Iterator[dict[str, float]]:
    """Where a first call's time goes: a dict filled, when the block ends, with the seconds of ``trace``, ``lower``
    (to StableHLO), ``compile`` (XLA) or ``cache_read`` (JAX's persistent compilation cache hit: no compile),
    ``run`` (the rest: running, and optkit's checks) and ``total``, from ``jax.monitoring``'s events of the last
    program compiled inside the block. Stages that did not happen (a program already compiled) are absent."""
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_listen)
        _listening.append(True)
    record: dict[str, float] = {}
    _recording.append(record)
    start = time.perf_counter()
    try:
        yield record
    finally:
        del _recording[next(i for i, r in enumerate(_recording) if r is record)]  # (by identity: dicts compare equal)
        total = time.perf_counter() - start
        if "cache_read" in record:  # (JAX times the cache read inside its compile step)
            record.pop("compile", None)
        record["run"] = max(0.0, total - sum(record.values()))
        record["total"] = total


def describe_stages(record: Mapping[str, float]) -> str:
    """``trace 0.41 s, lower 0.08 s, XLA compile 1.52 s, run 0.20 s`` (or ``read from the compilation cache``)."""
    names = {"trace": "trace", "lower": "lower", "compile": "XLA compile", "cache_read": "read from the compilation "
             "cache", "run": "run"}
    return ", ".join(f"{names[k]} {record[k]:.2f} s" for k in names if k in record)


@dataclasses.dataclass(frozen=True)
class Program:
    """How a graph function is made: the options of one compiled program.

    Attributes:
      jit: compile it (False: op by op, the checks left to a caller's ``checkify.checkify``).
      donate: the positions of the fed values whose buffers XLA may reuse (``jax.jit``'s ``donate_argnums``).
      options: XLA compiler options (``jax.jit``'s ``compiler_options``), or None.
      checks: index checks (``jax.experimental.checkify``): a compiled function raises the first failed check
        after running.
      rng: the function takes a typed ``jax.random`` key first, which the random operators draw from.
      layers: the runs of repeated layers to scan (:class:`optkit.onnx._plans.layers.Layers`), or None.
      held: ``{name: array}``, compiled only: initializers given to the program as arguments after the values
        instead of as constants (:func:`optkit.onnx._run.held.held_weights`).
    """

    jit: bool = True
    donate: tuple[int, ...] = ()
    options: Mapping[str, Any] | None = None
    checks: bool = False
    rng: bool = False
    layers: Any = None
    held: Mapping[str, Any] | None = None


def program_key(dynamic: tuple[str, ...], how: Program, static: Mapping[str, np.ndarray]) -> tuple:
    """What one compiled program depends on: the fed names, compiled or traced into a caller's, the options that
    change the program, the caller's 64-bit setting and the static values (the last item: :func:`_related`
    compares it)."""
    return (dynamic, how.jit, how.donate, tuple(sorted((how.options or {}).items())), how.checks, how.rng,
            bool(jax.config.jax_enable_x64), static_key(static))


def graph_function(cache: dict[Any, Any], graph: Graph, outputs: Sequence[str], static: dict[str, np.ndarray],
                   dynamic: tuple[str, ...], how: Program = Program()) -> Callable[..., tuple]:
    """``f(*values)`` -> the ``outputs`` of ``graph`` fed ``dynamic`` names positionally and ``static`` values as
    constants (the feeds checked by :class:`~optkit.onnx._run.feeds.Feeds`), made as ``how`` says
    (:class:`Program`; with ``how.rng``, ``f(key, *values)``) once per :func:`program_key`, kept in ``cache``.

    Each call that compiles (the first, new input shapes or dtypes, new static values) is logged at INFO on the
    ``optkit.onnx`` logger with its cause and its time.
    """
    key = program_key(dynamic, how, static)
    fn = cache.get(key)
    if fn is not None:
        return fn
    host: dict[int, np.ndarray] = {}  # string outputs, computed on the host while tracing
    kept = tuple(how.held or ()) if how.jit else ()
    run = traced_run(graph, list(outputs), static, dynamic, how, (kept, host))
    if not how.jit:
        def eager(*values):
            start = time.perf_counter()
            out = run(*values)
            if any(isinstance(v, jax.core.Tracer) for v in values):  # (to_jax's apply_fn in a caller's jit or grad)
                _log.info("traced inside a caller's transformation in %.2f s (%d nodes)", time.perf_counter() - start,
                          len(graph.nodes))
            return tuple(host.get(i, o) for i, o in enumerate(out)) if host else out

        eager.traceable = run  # type: ignore[attr-defined]  # (string outputs left as None: for eval_shape)
        fn = cache[key] = eager
        return fn
    kept_values = tuple(how.held[name] for name in kept)
    program, jitted = compiled(run, how, kept_values, host)
    names = ("(rng key)", *dynamic) if how.rng else dynamic
    fn = cache[key] = logged(jitted, names, len(graph.nodes), _related(cache, key))
    # (the jax.jit function: .lower(...) reads its HLO)
    fn.jitted = _WithHeld(program, kept_values) if kept else program  # type: ignore
    return fn


def traced_run(graph: Graph, outputs: list[str], static: Mapping[str, np.ndarray], dynamic: tuple[str, ...],
               how: Program, kept_host: tuple[tuple[str, ...], dict[int, Any]]) -> Callable[..., tuple]:
    """The function that traces ``graph``: ``run(*values)`` (after the rng key when ``how.rng``, before the
    ``kept`` held weights) -> the ``outputs``, a string output left as None and put in ``host`` by position."""
    kept, host = kept_host

    def run(*values):
        drawn, values = (values[0], values[1:]) if how.rng else (None, values)
        feeds = dict(zip(dynamic, values[:len(values) - len(kept)]))
        feeds.update(zip(kept, values[len(values) - len(kept):]))
        feeds.update(static)
        start = time.perf_counter()
        with tracing(checks=how.checks, key=drawn):
            result = (scanned.evaluate(graph, how.layers, feeds, outputs) if how.layers
                      else graph.evaluate(feeds, outputs, check_feeds=False))
        if how.jit:
            _log.info("traced the graph (%d nodes) in %.2f s", len(graph.nodes), time.perf_counter() - start)
        # A string output was computed on the host from static values while tracing: it leaves the compiled
        # program as that constant (the function is cached per static value).
        host.update((i, result[name]) for i, name in enumerate(outputs) if is_string(result[name]))
        return tuple(None if i in host else result[name] for i, name in enumerate(outputs))

    return run


def compiled(run: Callable[..., tuple], how: Program, kept_values: tuple[Any, ...],
             host: Mapping[int, Any]) -> tuple[Any, Callable[..., tuple]]:
    """``(program, jitted)``: ``run`` under ``jax.jit`` (the checks functionalized inside the program and raised
    after it ran, with ``how.checks``), and the function that calls it with the held weights and puts the host's
    string outputs back."""
    if how.checks:
        checked = jax.jit(checkify.checkify(run, errors=checkify.user_checks), donate_argnums=how.donate,
                          compiler_options=how.options)

        def program(*values):
            err, out = checked(*values)
            err.throw()
            return out
    else:
        program = jax.jit(run, donate_argnums=how.donate, compiler_options=how.options)

    def jitted(*values):
        out = program(*values, *kept_values)
        return tuple(host.get(i, o) for i, o in enumerate(out)) if host else out

    return program, jitted


def logged(jitted: Callable[..., tuple], names: tuple[str, ...], nodes: int,
           related: tuple[list[str], Any]) -> Callable[..., tuple]:
    """``jitted`` with each call that compiles (the first, and any with new input shapes or dtypes: ``jax.jit``
    traces and compiles again) timed and logged with its cause; inside a caller's ``jax.jit`` it only traces.
    ``related``: the static inputs whose values differ from a function of the same cache, and that function
    (:func:`_related`)."""
    seen: dict[tuple, None] = {}
    static_changed, other = related

    def call(*values):
        if any(isinstance(v, jax.core.Tracer) for v in values):
            start = time.perf_counter()
            out = jitted(*values)
            _log.info("traced inside a caller's transformation in %.2f s", time.perf_counter() - start)
            return out
        signature = tuple(map(_signature, values))  # every call: 55 us for 200 arrays
        if signature in seen:
            return jitted(*values)
        last = next(reversed(seen), None) or next(reversed(getattr(other, "signatures", {})), None)
        causes = [_listed("new static values of ", static_changed)] if static_changed and not seen else []
        if last is not None:
            causes.append(_listed("new input shapes: ", [f"{name} {_spec(old)} -> {_spec(new)}"
                                                          for name, old, new in zip(names, last, signature)
                                                          if old != new]))
        cause = "; ".join(c for c in causes if c) or "its first input shapes"
        with stages() as record:
            out = jitted(*values)
            jax.block_until_ready(out)
        seen[signature] = None
        call.first = record  # type: ignore[attr-defined]
        _log.info("compiled the graph (%d nodes) for %s: %.2f s (%s)", nodes, cause, record["total"],
                  describe_stages(record))
        return out

    call.signatures = seen  # type: ignore[attr-defined]
    call.first = {}  # type: ignore[attr-defined]  # (the stages of the latest call that compiled: stages())
    return call


class _WithHeld:
    """A compiled graph function's ``jax.jit`` function with its held initializers given after the values."""

    def __init__(self, program: Any, held: tuple[Any, ...]) -> None:
        self.program, self.held = program, held

    def lower(self, *values: Any) -> Any:
        return self.program.lower(*values, *self.held)


def static_key(static: Mapping[str, np.ndarray]) -> tuple:
    """The static values as a cache key: name, dtype, shape and bytes (an array of strings: the strings)."""
    return tuple((n, v.dtype.str, v.shape, repr(v.tolist()) if v.dtype == STRING else v.tobytes())
                 for n, v in sorted(static.items()))


def _signature(value: Any) -> Any:
    """What a compile depends on in a fed value: ``(shape, dtype)``; ``("sequence", those of its tensors)`` for a
    sequence (a list); None for an empty optional."""
    if hasattr(value, "dtype"):
        return value.shape, value.dtype  # (str(dtype) took 0.7 ms for 200 arrays)
    if isinstance(value, list):
        return "sequence", tuple(map(_signature, value))
    return None if value is None else (np.shape(value), np.result_type(value))


def _spec(signature: Any) -> str:
    if signature is None:
        return "none"
    if signature[0] == "sequence":
        return "[" + ", ".join(map(_spec, signature[1])) + "]"
    shape, dtype = signature
    return f"{dtype}{list(shape)}"


def _listed(head: str, items: list[str]) -> str:
    return head + ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "") if items else ""


def _related(cache: dict[Any, Any], key: tuple) -> tuple[list[str], Any]:
    """The static inputs whose values differ between ``key`` and a function already in ``cache`` that differs from
    it only in those values (shape tensors, a sequence length fed as a value), and that function."""
    new = {name: rest for name, *rest in key[-1]}
    for other, fn in reversed(list(cache.items())):  # the latest first
        if other[:-1] == key[:-1] and other[-1] != key[-1]:
            old = {name: rest for name, *rest in other[-1]}
            return sorted(name for name in new.keys() | old.keys() if new.get(name) != old.get(name)), fn
    return [], None
