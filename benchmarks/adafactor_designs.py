"""The Adafactor designs compared for issue 18, on the issue's trees: first call and step against optax.adam.

optkit ships one design; the others are rebuilt here by changing the knobs of
``optkit._src.adafactor`` in this process only (nothing of optkit is changed
on disk), so that each can be measured with the same harness::

    python -m benchmarks.adafactor_designs first-call --tree transformer --design reductions+jit
    python -m benchmarks.adafactor_designs step --tree gpt --designs 0.1.0,reductions+jit --rounds 15
    python -m benchmarks.adafactor_designs table          # every design, first calls and steps (about 25 min)

Designs (``factored_dims="largest", min_dim_size_to_factor=128``, as ``benchmarks/run.py``):

- ``0.1.0``: optkit 0.1.0's statistics: on CPU every factored matrix from
  65,536 elements takes a loop over blocks of rows that reads ``G`` once for
  both column sums (24 B a parameter), smaller ones reductions; ``sum U^2``
  from the column sums ``w_j = sum_i G_ij^2 / r_i``; each leaf traced on its
  own. The loop is the one optkit still ships for large matrices
  (``optkit._src.adafactor._factored_blocked``) with 0.1.0's blocks and
  ``sum X^2`` apart (:func:`_blocked_x_apart`);
- ``0.1.0+jit``: the same, each distinct leaf traced once (``_leaf_step``);
- ``w-form+jit``: reductions only, ``sum U^2`` as ``sum_j w_j / c_j``, which
  XLA:CPU merges into one reduction over both axes that runs 10x slower on
  tall matrices (the GPT-2 embedding);
- ``reductions``: the shipped statistics (reductions, the loop only for
  matrices from 2^22 elements or wider than 6144), each leaf traced on its own;
- ``blocks-2^14+jit``: shipped before the loop's blocks of rows grew from
  2^14 to 2^17 elements and ``sum X^2`` moved into the loop (which only runs
  for large or wide matrices);
- ``reductions+jit``: shipped;
- ``grouped+jit``: shipped, with the unfactored leaves of one shape stacked
  into one array and run as one (``jax.vmap``), then split.

``first-call`` runs in the process it is given (run it in a fresh one per
measurement: the table does, 3 times each, alternating with ``optax.adam``).
``step`` times the candidates round-robin in one process, in a new random
order each round, parameters and state donated, and prints medians and the
median of the per-round ratios to the last candidate (``optax.adam``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import optax

import optkit
from benchmarks._hlo import kernel_count, tree_traffic
from benchmarks.run import _make_tree, gpt_tree, transformer_tree
from optkit._src import adafactor as _af

DESIGNS = ("0.1.0", "0.1.0+jit", "w-form+jit", "reductions", "blocks-2^14+jit", "reductions+jit", "grouped+jit")
TREES = {
    "transformer": lambda: transformer_tree(False)[0],
    "gpt": lambda: gpt_tree(False),
    "matrix": lambda: {"w": jax.ShapeDtypeStruct((8192, 4096), jnp.float32)},
}
_SHIPPED = (_af._factored_moments, _af._leaf_step, _af._step)
_SHIPPED_LOOP = (_af._factored_blocked, _af._BLOCK_ELEMENTS)


def _blocked_x_apart(g, x, nu, b2, eps1, row, col, guard, dtype):
    """The row-block loop as it was before ``sum X^2`` moved into it: ``X^2`` reduced on its own."""
    moments = _SHIPPED_LOOP[0](g, None, nu, b2, eps1, row, col, guard, dtype)
    return moments._replace(sum_x2=None if x is None else jnp.sum(jnp.square(x.astype(dtype))))


def _untraced_leaf(g, x, nu, m, *, axes, b2, lr, config, dtype, split):
    return _af._adafactor_leaf(g, x, nu, m, axes=axes, b2=b2, lr=lr, config=config, dtype=dtype, split=split)


def _factored_w_form(g, x, nu, b2, eps1, row, col, guard, dtype):
    """Reductions, with ``sum U^2 = sum_others mean(r) * sum_j w_j / c_j`` (0.1.0's form for small leaves)."""
    g = g.astype(dtype)
    g_col = jax.lax.optimization_barrier(g)  # no G^2 shared by the two means
    v_row = _af._ema(nu.v_row.astype(dtype), jnp.mean(g * g, axis=col), b2, eps1)
    v_col = _af._ema(nu.v_col.astype(dtype), jnp.mean(g_col * g_col, axis=row), b2, eps1)
    w = jnp.sum(g * (g * jnp.expand_dims(_af._inverse(v_row, guard), col)), axis=row)
    row_in_r = row if row < col else row - 1
    col_in_c = col if col < row else col - 1
    mean_r = jnp.mean(v_row, axis=row_in_r)
    sum_u2 = jnp.sum(mean_r * jnp.sum(w * _af._inverse(v_col, guard), axis=col_in_c))
    sum_x2 = None if x is None else jnp.sum(jnp.square(x.astype(dtype)))
    return _af._Moments(_af.FactoredSecondMoment(v_row, v_col), sum_u2, sum_x2,
                        _af._factors(v_row, v_col, row, col, guard))


def _factored_0_1_0(g, x, nu, b2, eps1, row, col, guard, dtype, split):
    """0.1.0's choice on one CPU device: the loop from 65,536 elements, the w-form reductions otherwise."""
    shape = g.shape
    if {row, col} == {len(shape) - 2, len(shape) - 1} and shape[-2] >= 8 and g.size >= 1 << 16:
        return _blocked_x_apart(g, x, nu, b2, eps1, row, col, guard, dtype)
    return _factored_w_form(g, x, nu, b2, eps1, row, col, guard, dtype)


def _grouped_step(grads, nodes, xs, mus, scalars, config, factored_dims):
    """Unfactored leaves without a first moment, grouped by shape and dtype, stacked and vmapped."""
    groups: dict = {}
    for i, (g, node) in enumerate(zip(grads, nodes)):
        if isinstance(node, _af.FullSecondMoment) and mus[i] is None and not _af.sharding.may_be_split(g):
            groups.setdefault((jnp.shape(g), jnp.result_type(g), node.v.dtype), []).append(i)
    grouped = {i for members in groups.values() for i in members}
    rest = [i for i in range(len(grads)) if i not in grouped]
    updates, new_nu = [None] * len(grads), [None] * len(grads)
    if rest:
        u, n, _ = _SHIPPED[2]([grads[i] for i in rest], [nodes[i] for i in rest], [xs[i] for i in rest],
                              [mus[i] for i in rest], scalars, config, factored_dims)
        for j, i in enumerate(rest):
            updates[i], new_nu[i] = u[j], n[j]
    for (_, g_dtype, v_dtype), members in groups.items():
        g = jnp.stack([grads[i] for i in members])
        v = jnp.stack([nodes[i].v for i in members])
        x = None if xs[members[0]] is None else jnp.stack([xs[i] for i in members])
        dtype = _af.compute_dtype(g_dtype, v_dtype, None if x is None else x.dtype)
        b2, lr = scalars(dtype)

        def one(g1, v1, x1, b2=b2, lr=lr, dtype=dtype):
            update, nu, _ = _af._adafactor_leaf(g1, x1, _af.FullSecondMoment(v1), None, axes=None, b2=b2, lr=lr,
                                                config=config, dtype=dtype)
            return update, nu.v

        u, nv = jax.vmap(one, in_axes=(0, 0, None if x is None else 0))(g, v, x)
        out_dtype = g_dtype if x is None else x.dtype
        for j, i in enumerate(members):
            updates[i] = u[j].astype(out_dtype)
            new_nu[i] = _af.FullSecondMoment(nv[j].astype(v_dtype))
    return updates, new_nu, []


def use(design: str) -> None:
    """Set ``optkit._src.adafactor``'s functions to ``design``'s (in this process only)."""
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; known: {DESIGNS}")
    moments, leaf_step, step = _SHIPPED
    _af._factored_blocked, _af._BLOCK_ELEMENTS = _SHIPPED_LOOP
    if design.startswith("0.1.0"):
        moments = _factored_0_1_0
        _af._factored_blocked, _af._BLOCK_ELEMENTS = _blocked_x_apart, 1 << 14  # 0.1.0's loop
    elif design.startswith("blocks-2^14"):
        _af._factored_blocked, _af._BLOCK_ELEMENTS = _blocked_x_apart, 1 << 14
    elif design.startswith("w-form"):
        moments = lambda *args: _factored_w_form(*args[:-1])  # noqa: E731 (no split: one device)
    _af._factored_moments = moments
    _af._leaf_step = leaf_step if design.endswith("+jit") else _untraced_leaf
    _af._step = _grouped_step if design.startswith("grouped") else step
    # The per-leaf traces are cached by static options only, which the designs
    # share: drop them, or the next design would reuse the last one's.
    _af._adafactor_leaf_jit.clear_cache()


def _stepper(name: str, abstract):
    if name == "optax.adam":
        tx = optax.adam(1e-3)
    else:
        use(name)
        tx = optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params, grads = _make_tree(abstract, 0.0, 0.01), _make_tree(abstract, 0.5, 1.0)
    jax.block_until_ready((params, grads))
    return jax.jit(step, donate_argnums=(0, 1)), params, tx.init(params), grads


def _compiled_stepper(name: str, abstract):
    """``_stepper`` traced and compiled now, while ``name``'s design is the one in use.

    The design's functions are module globals of ``optkit._src.adafactor``, read
    when the step is traced; a step traced later, after another ``use``, would
    be that other design.
    """
    jitted, params, state, grads = _stepper(name, abstract)
    return jitted.lower(params, state, grads).compile(), params, state, grads


def first_call(tree: str, name: str) -> dict:
    """Trace + compile + one run of the jitted step (this process must not have compiled it before)."""
    abstract = TREES[tree]()
    jitted, params, state, grads = _stepper(name, abstract)
    start = time.perf_counter()
    lowered = jitted.lower(params, state, grads)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    jax.block_until_ready(compiled(params, state, grads))
    end = time.perf_counter()
    hlo = compiled.as_text()
    leaves = jax.tree.leaves(abstract)
    sizes = {x.size for x in leaves if x.size >= 1 << 16}
    large = sum(x.size for x in leaves if x.size in sizes)
    traffic = tree_traffic(hlo, sizes)
    return {"tree": tree, "design": name, "first_call_s": end - start, "trace_lower_s": lowered_at - start,
            "compile_s": compiled_at - lowered_at, "kernels": kernel_count(hlo),
            "kernels_per_leaf": kernel_count(hlo) / len(leaves),
            "hlo_bytes_per_param": (traffic["read_bytes"] + traffic["written_bytes"]) / large}


def steps(tree: str, names: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Step medians (ms) and medians of per-round ratios to the last name, timed round-robin in one process.

    The rounds are split into four epochs with every candidate's arrays in new
    buffers for each (see ``benchmarks.run.time_rotated``).
    """
    abstract = TREES[tree]()
    state = {}
    for name in names:
        state[name] = list(_compiled_stepper(name, abstract))
    times: dict[str, list[float]] = {name: [] for name in names}
    order = list(names)
    rng = random.Random(0)
    per_epoch = max(1, -(-rounds // 4))
    for r in range(rounds + 2):
        if r > 2 and (r - 2) % per_epoch == 0:  # new buffers for every candidate (benchmarks.run.time_rotated)
            old = [entry[1:] for entry in state.values()]
            for entry in state.values():
                entry[1:] = [jax.tree.map(lambda x: jnp.array(x, copy=True), t) for t in entry[1:]]
            jax.block_until_ready([entry[1:] for entry in state.values()])
            del old
        rng.shuffle(order)
        for name in order:
            jitted, params, opt_state, grads = state[name]
            time.sleep(0.005)
            start = time.perf_counter()
            params, opt_state = jitted(params, opt_state, grads)
            jax.block_until_ready(params)
            if r >= 2:
                times[name].append(time.perf_counter() - start)
            state[name][1:3] = [params, opt_state]
    base = times[names[-1]]
    return {name: {"median_ms": 1e3 * statistics.median(t),
                   "ratio": statistics.median(a / b for a, b in zip(t, base))} for name, t in times.items()}


def _fresh(tree: str, name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.adafactor_designs", "first-call", "--tree", tree,
                          "--design", name], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(trees: list[str], designs: list[str], runs: int, rounds: int) -> str:
    lines = ["| tree | design | step ms | step / optax.adam | first call s | first call / optax.adam | "
             "trace+lower s | compile s | kernels (a leaf) | HLO B/param |", "|" + "---|" * 10]
    for tree in trees:
        firsts: dict[str, list[dict]] = {name: [] for name in [*designs, "optax.adam"]}
        for _ in range(runs):
            for name in firsts:
                firsts[name].append(_fresh(tree, name))
        step = steps(tree, [*designs, "optax.adam"], rounds)
        base = statistics.median(r["first_call_s"] for r in firsts["optax.adam"])
        for name, records in firsts.items():
            first = statistics.median(r["first_call_s"] for r in records)
            med = {k: statistics.median(r[k] for r in records) for k in ("trace_lower_s", "compile_s")}
            r0 = records[0]
            lines.append(f"| {tree} | {name} | {step[name]['median_ms']:.1f} | {step[name]['ratio']:.3f} | "
                         f"{first:.2f} | {first / base:.2f} | {med['trace_lower_s']:.2f} | {med['compile_s']:.2f} | "
                         f"{r0['kernels']} ({r0['kernels_per_leaf']:.1f}) | {r0['hlo_bytes_per_param']:.1f} |")
        print("\n".join(lines[-len(firsts):]), file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["first-call", "step", "table"])
    parser.add_argument("--tree", default="transformer", choices=sorted(TREES))
    parser.add_argument("--design", default="reductions+jit")
    parser.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated (step, table)")
    parser.add_argument("--trees", default="transformer,gpt,matrix", help="comma-separated (table)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per first call (table)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (step, table)")
    args = parser.parse_args(argv)
    if args.mode == "first-call":
        print(json.dumps(first_call(args.tree, args.design)))
    elif args.mode == "step":
        names = [*args.designs.split(","), "optax.adam"]
        for name, r in steps(args.tree, names, args.rounds).items():
            print(f"{args.tree:12s} {name:16s} {r['median_ms']:8.2f} ms  / optax.adam {r['ratio']:.3f}")
    else:
        print(table(args.trees.split(","), args.designs.split(","), args.runs, args.rounds))


if __name__ == "__main__":
    main()
