"""How many of ONNX's backend test cases optkit.onnx passes: every case, not a selection.

Runs all of ``onnx.backend.test``'s node, pytorch-converted, pytorch-operator
and simple cases (CPU) through ONNX's own runner with
:class:`optkit.onnx.Backend` as that runner calls a backend (``prepare(model).run(inputs)``, default options:
compiled, in segments around the nodes whose output sizes depend on values; ``--op-by-op``: ``jit=False``),
and sorts each into

- **pass**: every output matches, with the runner's dtype check and the
  case's tolerances;
- **refused**: ``prepare`` refused the model with an
  :class:`~optkit.onnx.UnsupportedOpError` (an operator, version, attribute
  or element type optkit does not run); the reason is counted;
- **skipped**: a case in :data:`SKIPPED`, which no backend passes by
  computing what ONNX specifies (the reason is given);
- **fail**: a wrong value or any other error.

    python -m benchmarks.onnx_conformance                # about 2 minutes on 2 cores
    python -m benchmarks.onnx_conformance --kind node --top 40
    python -m benchmarks.onnx_conformance --list fail    # the failing cases and why
    python -m benchmarks.onnx_conformance --write-cases  # rewrite tests/onnx/onnx_backend_cases.txt

``tests/onnx/onnx_backend_cases.txt`` lists the cases that pass; ``tests/onnx/ops/test_backend.py``
runs exactly those, so a case that stops passing fails the suite.

The counts are recorded in benchmarks/RESULTS.md and docs/onnx-operators.md.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import unittest
import warnings

KINDS = ("node", "pytorch-converted", "pytorch-operator", "simple")
CASES_FILE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "onnx" / "onnx_backend_cases.txt"

# Cases no backend can pass by computing what ONNX specifies, and why (counted as skipped).
SKIPPED = {
    r"^test_training_dropout(_default)?(_mask)?_cpu$":
        "Dropout in training mode with ratio > 0: ONNX leaves the random mask to the backend; "
        "the expected values come from NumPy's generator",
    r"^test_bernoulli(_double|_seed)?(_expanded)?_cpu$":
        "Bernoulli draws: the expected values come from NumPy's generator (optkit draws with jax.random, "
        "seeded by the node's seed attribute)",
    r"^test_dft_inverse(_opset19)?_cpu$":
        "an inverse DFT whose expected values carry NumPy's single-precision FFT rounding (1.9e-7 where the "
        "exact value is 0, against atol 1e-7); optkit transforms in float64 (-7e-16 there), and ONNX Runtime "
        "misses the expected values by 1.9e-5",
    r"^test_loop16_seq_none_cpu$":
        "ONNX's runner cannot compare its output: a sequence whose first tensor is 0-d, which the runner's "
        "comparison takes the length of (TypeError in onnx 1.23's assert_similar_outputs, whatever the backend "
        "returns); optkit's output equals the expected one (tests/onnx/ops/test_sequences.py runs this model)",
}


def _cases(kinds, op_by_op=False):
    import onnx.backend.test

    import optkit.onnx

    class _Backend(optkit.onnx.Backend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            if op_by_op:
                kwargs.setdefault("jit", False)
            return super().prepare(model, device, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend_test = onnx.backend.test.BackendTest(_Backend, __name__)
    by_kind = {}
    for kind in kinds:
        import onnx.backend.test.loader as loader

        for case in loader.load_model_tests(kind=kind):
            by_kind[case.name] = kind
    for case_class in backend_test.test_cases.values():
        for attr in sorted(vars(case_class)):
            name = attr[: -len("_cpu")] if attr.endswith("_cpu") else None
            if name in by_kind:
                yield by_kind[name], attr, case_class(attr)


def _reason(err: BaseException) -> str:
    """A short reason for a refusal: the operator (and version) or the type refused."""
    text = str(err)
    m = re.search(r"unsupported operators? (?:version: )?(\w+)", text)
    if m:
        return f"operator {m.group(1)}"
    m = re.search(r"unsupported operators?: (.*)", text)
    if m:
        return "operators " + m.group(1)[:60]
    m = re.search(r"has type (\w+)", text)
    if m:
        return f"graph input type {m.group(1)}"
    m = re.search(r"element type (\w+)", text)
    if m:
        return f"element type {m.group(1)}"
    return text.splitlines()[0][:80]


def run(kinds=KINDS, op_by_op=False):
    """``{kind: Counter(outcome)}``, ``{reason: count}`` of refusals, and ``[(kind, case, outcome, why)]``.

    Runs with JAX's 64-bit mode on: ONNX's INT64 and DOUBLE as themselves, as the runner's dtype check wants."""
    import jax

    from optkit.onnx import UnsupportedOpError

    jax.config.update("jax_enable_x64", True)

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    rows = []
    for kind, name, test in _cases(kinds, op_by_op):
        skip = [why for pattern, why in SKIPPED.items() if re.match(pattern, name)]
        if skip:
            counts[kind]["skipped"] += 1
            rows.append((kind, name, "skipped", skip[0]))
            continue
        result = unittest.TestResult()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            test.run(result)
        if result.skipped:
            outcome, why = "refused", result.skipped[0][1]
        elif result.errors or result.failures:
            test_err = (result.errors or result.failures)[0][1]
            if "UnsupportedOpError" in test_err:
                outcome = "refused"
                why = _reason(UnsupportedOpError(test_err))
                reasons[why] += 1
            else:
                outcome, why = "fail", test_err.strip().splitlines()[-1][:160]
        else:
            outcome, why = "pass", ""
        counts[kind][outcome] += 1
        rows.append((kind, name, outcome, why))
    return counts, reasons, rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", action="append", choices=KINDS, help="case kinds (default: all four)")
    parser.add_argument("--top", type=int, default=25, help="refusal reasons to list")
    parser.add_argument("--list", choices=("pass", "refused", "skipped", "fail"),
                        help="list the cases of one outcome")
    parser.add_argument("--write-cases", action="store_true",
                        help=f"write the passing cases to {CASES_FILE} (all four kinds)")
    parser.add_argument("--op-by-op", action="store_true", help="run every case with prepare(..., jit=False)")
    args = parser.parse_args(argv)
    counts, reasons, rows = run(tuple(args.kind or KINDS), args.op_by_op)
    if args.write_cases:
        if args.kind and set(args.kind) != set(KINDS):
            parser.error("--write-cases needs all four kinds")
        failing = [name for _, name, outcome, _ in rows if outcome == "fail"]
        if failing:
            parser.error(f"{len(failing)} cases fail ({failing[:5]}...); fix them before writing the list")
        passing = sorted(name.removesuffix("_cpu") for _, name, outcome, _ in rows if outcome == "pass")
        CASES_FILE.write_text("# ONNX backend cases optkit.onnx passes (python -m benchmarks.onnx_conformance "
                              "--write-cases)\n" + "\n".join(passing) + "\n")
    print("| kind | cases | pass | refused | skipped | fail |")
    print("|---|---:|---:|---:|---:|---:|")
    total = collections.Counter()
    for kind, c in counts.items():
        total.update(c)
        print(f"| {kind} | {sum(c.values())} | {c['pass']} | {c['refused']} | {c['skipped']} | {c['fail']} |")
    print(f"| all | {sum(total.values())} | {total['pass']} | {total['refused']} | {total['skipped']} | "
          f"{total['fail']} |")
    print("\nrefusals by reason:")
    for why, n in reasons.most_common(args.top):
        print(f"  {n:4d}  {why}")
    if args.list:
        print()
        for kind, name, outcome, why in rows:
            if outcome == args.list:
                print(f"{kind:18s} {name:60s} {why}")


if __name__ == "__main__":
    main()
