"""Control flow: ``If``, ``Loop`` and ``Scan``, their bodies converted by the model's own converter.

Each body (a sub-graph attribute) is converted once at load time by
:meth:`~optkit.onnx._ops._registry.NodeContext.convert_subgraph`: the same
pipeline as the model's graph, the enclosing graphs' names visible (the node
gets their values as ``captured``), the same bounds. How each runs:

- ``If``: the branch its condition picks when the condition is known before
  running (folded at load time when everything is); ``lax.cond`` otherwise,
  whose branches must give the same shapes and dtypes.
- ``Scan``: ``lax.scan`` over the scan axis (any axis, either direction); differentiable.
- ``Loop``: run op by op in Python when every value is concrete (between
  ``prepare``'s compiled segments, or with ``jit=False``: every ONNX semantics, values whose shape changes per
  iteration and data-dependent lengths included). Traced: ``lax.scan`` when
  the trip count is known and the condition is constant-true (scan outputs
  stacked; differentiable); a scan that stops updating once the condition is
  false when the trip count is known and at most :data:`MASKED_SCAN_MAX`
  (differentiable, no scan outputs); ``lax.while_loop`` otherwise (no scan
  outputs; forward only: a gradient through it is refused, naming the node).

Bounds (:mod:`optkit.onnx._base.limits`), each refused naming the node: a ``Loop`` that neither its trip count
nor its condition can stop (no trip count, a constant-true condition) before it runs; at most
:data:`~optkit.onnx._base.limits.MAX_TRIP_COUNT` iterations; a compiled ``Loop``'s or ``Scan``'s iterations times
the elements its body computes in one at most ``max_node_work``, checked when it is traced (a condition-driven one
stops at that many iterations and raises if its condition still holds); a ``Loop`` run op by op evaluates at most
``max_loop_steps`` body nodes in all, nested Loops counted in (checked before it runs when the trip count is
known, else as it runs); stacked scan outputs are held to ``max_tensor_bytes`` before they are made.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optkit.onnx._base.errors import PAST_CAP, RUNS_IN_SEGMENTS, ValueDependentError
from optkit.onnx._base.limits import MAX_TRIP_COUNT, jaxpr_as_fun, jaxpr_work
from optkit.onnx._base.values import as_static
from optkit.onnx._ops._common import body_runner, sharded_like
from optkit.onnx._ops._registry import FLOAT16_KERNEL, Family, Float16

OPS = Family("control")

MASKED_SCAN_MAX = 4096  # a known trip count up to this runs as a differentiable masked scan


def _concrete(values) -> bool:
    return all(v is None or (all(as_static(e) is not None for e in v) if isinstance(v, list) else
                             as_static(v) is not None) for v in values)


def _traced_once(step, *args) -> tuple[Any, Any, Any]:
    """``step`` traced once for ``args``: ``(closed jaxpr, output shapes, replay)``, ``replay(*args)`` evaluating
    the jaxpr. A loop built from ``replay`` does not run the body's converter again, so loops nested ``d`` deep
    trace the innermost body once per level (``d`` times), not once per trace of each enclosing level (``3**d``:
    8 levels of a 2-iteration Loop took 30 s to trace)."""
    closed, shapes = jax.make_jaxpr(step, return_shape=True)(*args)
    tree, as_fun = jax.tree.structure(shapes), jaxpr_as_fun(closed)

    def replay(*values):
        return jax.tree.unflatten(tree, as_fun(*jax.tree.leaves(values)))

    return closed, shapes, replay


def _check_iterations(ctx, closed, length: int) -> None:
    """``length`` iterations of a body (``closed``, its jaxpr) refused when their work is above ``max_node_work``."""
    each = max(jaxpr_work(closed), 1)
    ctx.check_work(length * each, f"{length} iterations of its body, which computes {each} elements in each")


def _checked_step(ctx, step, length: int, *args) -> tuple[Any, Any]:
    """One iteration's ``step`` traced once: its output shapes and its replay (:func:`_traced_once`), ``length``
    iterations of its work refused when above ``max_node_work``, before anything runs."""
    closed, shapes, replay = _traced_once(step, *args)
    _check_iterations(ctx, closed, length)
    return shapes, replay


def _single(outputs: tuple) -> Any:
    return outputs[0] if len(outputs) == 1 else outputs


def _carried(ctx, out, carry, what):
    """A body's new carried values in the dtypes of the old ones (a traced loop's carry keeps its type); a
    changed shape is refused naming the node (op by op, ``jit=False``, ONNX lets it change)."""
    new = tuple(jnp.asarray(o).astype(c.dtype) for o, c in zip(out, carry))
    for value, old, name in zip(new, carry, ctx.outputs):
        if value.shape != old.shape:
            raise ValueDependentError(ctx.message(f"{what} {name!r} changes shape from {old.shape} to {value.shape} "
                                                  f"in the body: {RUNS_IN_SEGMENTS}"))
    return tuple(sharded_like(value, old) for value, old in zip(new, carry))


# ----------------------------------------------------------------------------- If


@OPS.op("If", 1, 11, 13, 16, 19, 21, 23, 24, 25, static_when_fed=(0,), float16=FLOAT16_KERNEL)
def _if(ctx):
    then_body, else_body = ctx.convert_subgraph("then_branch"), ctx.convert_subgraph("else_branch")
    if len(then_body.outputs) != len(else_body.outputs):
        raise ctx.error(f"then_branch has {len(then_body.outputs)} outputs but else_branch "
                        f"{len(else_body.outputs)}")
    if len(then_body.outputs) != len(ctx.outputs):
        raise ctx.error(f"the branches have {len(then_body.outputs)} outputs, the node {len(ctx.outputs)}")

    def if_(cond, captured=None):
        run_then, run_else = body_runner(then_body, captured), body_runner(else_body, captured)
        if np.size(cond) != 1:
            raise ctx.error(f"the condition must hold one element, got shape {np.shape(cond)}")
        known = as_static(cond)
        if known is not None:
            return _single(run_then() if bool(known.reshape(-1)[0]) else run_else())
        try:
            out = lax.cond(jnp.reshape(cond, ()).astype(bool), lambda: tuple(map(jnp.asarray, run_then())),
                           lambda: tuple(map(jnp.asarray, run_else())))
        except TypeError as err:
            raise ValueDependentError(ctx.message(
                f"its condition is computed while running, so both branches must give the same shapes and dtypes "
                f"(lax.cond), but they differ: {err}; {RUNS_IN_SEGMENTS}")) from None
        return _single(out)

    return if_


# ----------------------------------------------------------------------------- Scan


def _scan_attrs(ctx, n_scan_inputs: int, n_scan_outputs: int):
    def listed(name, count):
        values = list(ctx.attrs.get(name) or [0] * count)
        if len(values) != count:
            raise ctx.error(f"{name} has {len(values)} entries for {count} scan tensors")
        return [int(v) for v in values]

    return (listed("scan_input_axes", n_scan_inputs), listed("scan_input_directions", n_scan_inputs),
            listed("scan_output_axes", n_scan_outputs), listed("scan_output_directions", n_scan_outputs))


def _scan_core(ctx, run, states, scans, in_axes, in_dirs, out_axes, out_dirs, n_out_scans):
    """ONNX Scan (version 9 on) over ``scans`` (axes and directions per tensor), ``run`` the body."""
    moved = []
    for x, axis, direction in zip(scans, in_axes, in_dirs):
        x = jnp.asarray(x)
        a = axis % x.ndim if -x.ndim <= axis < x.ndim else None
        if a is None:
            raise ctx.error(f"scan_input_axes entry {axis} is out of range for a scan input of rank {x.ndim}")
        x = jnp.moveaxis(x, a, 0)
        moved.append(jnp.flip(x, 0) if direction else x)
    lengths = {x.shape[0] for x in moved}
    if len(lengths) != 1:
        raise ctx.error(f"the scan inputs have different lengths {sorted(lengths)} along their scan axes")
    length = lengths.pop()
    init = tuple(jnp.asarray(s) for s in states)

    def step(carry, xs):
        out = run(*carry, *xs)
        return _carried(ctx, out[:len(carry)], carry, "state"), tuple(jnp.asarray(o) for o in out[len(carry):])

    shapes, replay = _checked_step(ctx, step, length, init, tuple(x[0] for x in moved))
    shapes = shapes[1]
    for shape, name in zip(shapes, ctx.outputs[len(init):]):
        ctx.check_size((length, *shape.shape), shape.dtype, f"scan output {name!r}")
    final, stacked = lax.scan(replay, init, tuple(moved), length=length)
    outs = []
    for y, axis, direction in zip(stacked, out_axes, out_dirs):
        y = jnp.flip(y, 0) if direction else y
        rank = y.ndim
        if not -rank <= axis < rank:
            raise ctx.error(f"scan_output_axes entry {axis} is out of range for a scan output of rank {rank}")
        outs.append(jnp.moveaxis(y, 0, axis % rank))
    return (*final, *outs)


@OPS.op("Scan", 9, 11, 16, 19, 21, 23, 24, 25, float16=Float16(kernel_since=8))
def _scan(ctx):
    body = ctx.convert_subgraph("body")
    m = int(ctx.attrs.get("num_scan_inputs", 0))
    n = len(body.inputs) - m
    if m < 1 or n < 0 or len(ctx.inputs) != n + m:
        raise ctx.error(f"num_scan_inputs={m} does not fit a body of {len(body.inputs)} inputs and a node of "
                        f"{len(ctx.inputs)}")
    k = len(body.outputs) - n
    attrs = _scan_attrs(ctx, m, k)

    def scan(*values, captured=None):
        run = body_runner(body, captured)
        return _single(_scan_core(ctx, run, values[:n], values[n:], *attrs, k))

    return scan


@OPS.op("Scan", 8, float16=Float16(kernel_since=8))
def _scan8(ctx):
    """Version 8: a leading batch axis on every state and scan input, the scan axis next; no per-tensor axes."""
    body = ctx.convert_subgraph("body")
    m = int(ctx.attrs.get("num_scan_inputs", 0))
    n = len(body.inputs) - m
    k = len(body.outputs) - n
    directions = list(ctx.attrs.get("directions") or [0] * m)

    def scan(sequence_lens, *values, captured=None):
        if sequence_lens is not None:
            raise ctx.unsupported("Scan-8's sequence_lens is not supported; leave it empty")
        run = body_runner(body, captured)

        def one(states, scans):
            return _scan_core(ctx, run, states, scans, [0] * m, directions, [0] * k, [0] * k, k)

        return _single(jax.vmap(one)(tuple(values[:n]), tuple(values[n:])))

    return scan


# ----------------------------------------------------------------------------- Loop


@OPS.op("Loop", 1, 11, 13, 16, 19, 21, 23, 24, 25, float16=FLOAT16_KERNEL)
def _loop(ctx):
    body = ctx.convert_subgraph("body")
    n = len(body.inputs) - 2
    if n < 0 or len(body.outputs) < 1 + n:
        raise ctx.error(f"the body must take (iteration_num, condition, {max(n, 0)} loop-carried values) and give "
                        f"(condition, the loop-carried values, scan outputs); it has {len(body.inputs)} inputs "
                        f"and {len(body.outputs)} outputs")
    k = len(body.outputs) - 1 - n

    def loop(trip_count, cond, *values, captured=None):
        run = body_runner(body, captured)
        trip = as_static(trip_count)
        trip = None if trip is None else int(np.reshape(trip, -1)[0])
        if trip is not None and trip < 0:
            trip = 0
        if _concrete([trip_count, cond, *values, *(captured or {}).values()]):
            return _loop_eagerly(ctx, run, body.graph.node_count, trip, cond, values, n, k)
        return _loop_traced(ctx, body, captured, trip, trip_count, cond, values, n, k)

    return loop


# The body-node evaluations the Loops run op by op in this run have left: set by the outermost one, spent by the
# Loops nested in it.
_STEPS_LEFT = contextvars.ContextVar("optkit_onnx_loop_steps", default=None)


@contextlib.contextmanager
def _step_budget(ctx):
    """The run's budget of op-by-op body-node evaluations (``max_loop_steps``), the outermost Loop's own."""
    if _STEPS_LEFT.get() is not None:
        yield _STEPS_LEFT.get()
        return
    token = _STEPS_LEFT.set([ctx.max_loop_steps])
    try:
        yield _STEPS_LEFT.get()
    finally:
        _STEPS_LEFT.reset(token)


def _spend(ctx, left: list, steps: int, what: str) -> None:
    if steps > left[0]:
        raise ctx.error(f"{what}: more than the {ctx.max_loop_steps} body-node evaluations a Loop run op by op "
                        f"may make (max_loop_steps, nested Loops counted in); pass max_loop_steps= to raise it")
    left[0] -= steps


def _loop_eagerly(ctx, run, nodes, trip, cond, values, n, k):
    """Every value concrete: ONNX's loop, op by op (shapes may change, scan outputs of any length); ``nodes`` the
    body's node count."""
    keep_going = True if cond is None else bool(np.reshape(as_static(cond), -1)[0])
    if trip is None and cond is None:
        raise ctx.error("neither a trip count nor a condition is given: the loop would never stop")
    constant = keep_going and _constant_true_condition(run, n, values)
    if trip is None and constant:
        raise ctx.error("it has no trip count and its body's condition is always true: the loop would never stop")
    with _step_budget(ctx) as left:
        if trip is not None and constant:
            if trip > MAX_TRIP_COUNT:
                raise ctx.error(f"a trip count of {trip} is more than optkit.onnx runs ({MAX_TRIP_COUNT})")
            _spend(ctx, [left[0]], trip * max(nodes, 1), f"{trip} iterations of a body of {nodes} nodes")
        carried, stacked, i = list(values), [[] for _ in range(k)], 0
        while keep_going and (trip is None or i < trip):
            if i >= MAX_TRIP_COUNT:
                raise ctx.error(f"the loop runs more than {MAX_TRIP_COUNT} iterations")
            _spend(ctx, left, max(nodes, 1), f"iteration {i} of a body of {nodes} nodes")
            out = run(np.asarray(i, np.int64), np.asarray(keep_going), *carried)
            keep_going = bool(np.reshape(np.asarray(out[0]), -1)[0])
            carried = list(out[1:1 + n])
            for j, y in enumerate(out[1 + n:]):
                y = np.asarray(y)  # (stacked on the host at the end: one copy, no XLA concatenate of them all)
                stacked[j].append(y)
                ctx.check_size((len(stacked[j]), *y.shape), y.dtype, f"scan output {j}")
            i += 1
    scans = []
    for j, ys in enumerate(stacked):
        if ys:
            if len({y.shape for y in ys}) != 1:
                raise ctx.error(f"scan output {j} changes shape between iterations: "
                                f"{sorted({y.shape for y in ys})}")
            scans.append(jnp.asarray(np.stack(ys)))
        else:  # no iteration: an empty stack of the body's output shape
            shape = jax.eval_shape(lambda *v, j=j: run(np.asarray(0, np.int64), np.asarray(True), *v)[1 + n + j],
                                   *carried)
            scans.append(jnp.zeros((0, *shape.shape), shape.dtype))
    return _single((*carried, *scans))


def _constant_true_condition(run, n, values) -> bool:
    """Whether the body's condition output is True whatever its inputs (a NumPy True when they are traced)."""
    found = []

    def probe(i, c, *v):
        out = run(i, c, *v)
        found.append(as_static(out[0]) if not isinstance(out[0], jax.core.Tracer) else None)
        return ()

    # The condition fed to an iteration is the one the last gave: True throughout a constant-true loop.
    try:
        jax.make_jaxpr(lambda i, *v: probe(i, np.asarray(True), *v))(jnp.zeros((), _counter()),
                                                                       *(jnp.asarray(v) for v in values))
    except (ValueDependentError, TypeError, ValueError):  # a body that runs only on concrete values (a Slice by
        return False  # the counter), carried sequences: not shown constant (an error of the body's shows as it runs)
    return found[0] is not None and bool(np.all(found[0]))


def _loop_traced(ctx, body, captured, trip, trip_count, cond, values, n, k):
    run = body_runner(body, captured)
    init = tuple(jnp.asarray(v) for v in values)
    outer_true = cond is None or (as_static(cond) is not None and bool(np.reshape(as_static(cond), -1)[0]))
    if cond is not None and as_static(cond) is not None and not outer_true:
        trip = 0

    def fixed(out, carry):
        return _carried(ctx, out, carry, "loop-carried value")

    found = []  # the condition the body gives when given True: a NumPy True when it cannot change

    def step(carry, i):
        out = run(i, np.asarray(True), *carry)
        found.append(None if isinstance(out[0], jax.core.Tracer) else as_static(out[0]))
        return fixed(out[1:1 + n], carry), tuple(jnp.asarray(y) for y in out[1 + n:])

    if outer_true:  # (traced once: the constant check and the scan's step are the same trace)
        closed, shapes, replay = _traced_once(step, init, jnp.zeros((), _counter()))
    constant = outer_true and found[0] is not None and bool(np.all(found[0]))
    if trip is not None and constant:
        if trip > MAX_TRIP_COUNT:
            raise ctx.error(f"a trip count of {trip} is more than optkit.onnx runs ({MAX_TRIP_COUNT})")
        _check_iterations(ctx, closed, trip)
        for shape, name in zip(shapes[1], ctx.outputs[n:]):
            ctx.check_size((trip, *shape.shape), shape.dtype, f"scan output {name!r}")
        final, stacked = lax.scan(replay, init, jnp.arange(trip, dtype=_counter()), length=trip)
        return _single((*final, *stacked))
    if k:
        raise ValueDependentError(ctx.message(
            "its scan outputs have a length that depends on values (the condition is computed while running): "
            f"{RUNS_IN_SEGMENTS}"))
    if trip is None and trip_count is None and constant:
        raise ctx.error("it has no trip count and its body's condition is always true: the loop would never stop")
    c0 = jnp.ones((), bool) if cond is None else jnp.reshape(jnp.asarray(cond), ()).astype(bool)
    if trip is not None and trip <= MASKED_SCAN_MAX:
        def masked(state, i):
            going, carry = state
            out = run(i, going, *carry)
            new = fixed(out[1:1 + n], carry)
            kept = tuple(jnp.where(going, a, b) for a, b in zip(new, carry))
            return (jnp.logical_and(going, jnp.reshape(out[0], ()).astype(bool)), kept), ()

        replay = _checked_step(ctx, masked, trip, (c0, init), jnp.zeros((), _counter()))[1]
        (_, final), _ = lax.scan(replay, (c0, init), jnp.arange(trip, dtype=_counter()), length=trip)
        return _single(final)
    if trip is not None:  # known: at most what the counter holds (int32 with 64-bit mode off, never wrapped:
        limit = jnp.asarray(min(trip, int(np.iinfo(_counter()).max)), _counter())  # torch.onnx: 2^63 - 1)
    else:
        limit = None if trip_count is None else jnp.reshape(jnp.asarray(trip_count), ()).astype(_counter())
    return _single(_while(ctx, body, captured, n, limit, c0, init))


def _counter() -> np.dtype:
    """The iteration counter's dtype: ONNX's INT64, as the caller's 64-bit setting runs it (int32 when off)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.int64))


def _iteration_cap(ctx, closed) -> int:
    """The iterations a compiled condition-driven loop may run: :data:`MAX_TRIP_COUNT`, and ``max_node_work`` over
    the elements its body (``closed``, its jaxpr) computes in one."""
    each = max(jaxpr_work(closed), 1)
    return int(max(1, min(MAX_TRIP_COUNT, ctx.max_node_work // each, np.iinfo(_counter()).max)))


def _past_cap(ctx, cap, still_going) -> None:
    if bool(still_going):
        raise ValueError(PAST_CAP + ctx.message(
            f"its condition still holds after {cap} iterations, the most optkit.onnx runs of its body "
            f"({MAX_TRIP_COUNT}, or max_node_work over the elements its body computes in one)"))


def _while(ctx, body, captured, n, limit, c0, init):
    """``lax.while_loop`` over ``(i, condition, carried)``; a gradient through it is refused, naming the node.

    Everything traced reaches the ``custom_vjp`` as an argument (it may not close over tracers); NumPy
    values (static ones a body's ``Reshape`` reads) stay closed over.
    """
    captured = dict(captured or {})
    static = {k: v for k, v in captured.items() if as_static(v) is not None and not isinstance(v, jax.Array)}
    traced_names = tuple(k for k in captured if k not in static)

    def forward(limit, c0, init, traced):
        run = body_runner(body, {**static, **dict(zip(traced_names, traced))})

        def keep_going(state):
            i, going, _ = state
            return going if limit is None else jnp.logical_and(going, i < limit)

        def step(state):
            i, going, carry = state
            out = run(i, going, *carry)
            return i + 1, jnp.reshape(out[0], ()).astype(bool), _carried(ctx, out[1:1 + n], carry, "loop-carried value")

        state = (jnp.zeros((), _counter()), c0, init)
        closed, _, replay = _traced_once(step, state)
        cap = _iteration_cap(ctx, closed)

        def bounded(state):
            return jnp.logical_and(keep_going(state), state[0] < cap)

        i, going, final = lax.while_loop(bounded, replay, state)
        jax.debug.callback(functools.partial(_past_cap, ctx, cap), jnp.logical_and(keep_going((i, going, ())),
                                                                                   i >= cap))
        return final

    @jax.custom_vjp
    def guarded(limit, c0, init, traced):
        return forward(limit, c0, init, traced)

    def fwd(limit, c0, init, traced):
        return guarded(limit, c0, init, traced), None

    def bwd(_, g):
        raise ctx.error("a gradient through this Loop is not defined here: its condition is computed while "
                        "running and its trip count is unknown or above "
                        f"{MASKED_SCAN_MAX} (lax.while_loop is forward-only)")

    guarded.defvjp(fwd, bwd)
    return guarded(limit, c0, init, tuple(jnp.asarray(captured[k]) for k in traced_names))
