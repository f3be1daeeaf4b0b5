"""Optimizer-step speed and memory: optkit against Optax (and PyTorch's fused CPU optimizers).

One command runs every case of the performance issue and prints markdown tables
(and writes the same numbers as JSON)::

    python -m benchmarks                 # full sizes: about 15 minutes on 2 cores, 13 GiB peak
    python -m benchmarks --skip-slow     # without the per-leaf 10000-leaf runs: about 5 minutes
    python -m benchmarks --quick         # tiny sizes, under a minute (CI smoke test)
    python -m benchmarks --cases adam_1x64M,adagrad_1x64M --json /tmp/r.json

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
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from benchmarks._hlo import full_array_traffic, kernel_count, tree_traffic  # noqa: E402
from benchmarks._timing import summary, time_rotated  # noqa: E402
from benchmarks.candidates import (  # noqa: E402 (PyTorch's thread pool starts before JAX's runtime there)
    BYTES_MODEL,
    JaxStepper,
    Spec,
    make_stepper,
    torch,
    torch_available,
)
from benchmarks.cases import Case, build_cases  # noqa: E402
from benchmarks.memory import memory_child, peak_rss  # noqa: E402
from benchmarks.report import machine_info, report  # noqa: E402
from benchmarks.trees import nparams  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "out" / "results.json"


# ---------------------------------------------------------------------------
# Candidates in processes of their own


def timing_child(spec: Spec, repeats: int, warmup: int) -> dict:
    """Run in a fresh process: one candidate's first call and step times, alone."""
    stepper = make_stepper(spec)
    start = time.perf_counter()
    jax.block_until_ready(stepper())
    stepper.first_call_s = time.perf_counter() - start
    times = time_rotated({spec.label: stepper}, repeats=repeats, warmup=warmup)[spec.label]
    entry = candidate_entry(spec, stepper, times)
    entry["separate_process"] = True
    entry["process_peak_rss"] = peak_rss()
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
# One case


def bytes_model(spec: Spec) -> int:
    """Bytes per parameter a step must move at least, for the candidate's algorithm (see the module notes)."""
    return BYTES_MODEL[spec.optimizer.split(".")[1].split()[0]]  # "optkit.adafactor paper" -> adafactor


def candidate_entry(spec: Spec, stepper, seconds: list[float]) -> dict:
    """One row of the step-time table: statistics, first call, GB/s and what the HLO moves."""
    stats = summary(seconds)
    n = nparams(spec.abstract)
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
    with_torch = torch_available() and not args.no_torch
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
