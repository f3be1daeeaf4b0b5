"""Smoke test of the benchmark harness (benchmarks/run.py) in --quick mode: it runs and writes its JSON.

No timing is asserted: only that every case ran and reported the numbers the
RESULTS table is made of.
"""

import json
import os
import pathlib

import pytest

from benchmarks import run


def test_quick_run_writes_json_with_every_column(tmp_path, capsys):
    out = tmp_path / "results.json"
    cases = "adam_1x1M,adam_500x64,transformer"
    run.main(["--quick", "--repeats", "2", "--warmup", "0", "--cases", cases, "--json", str(out)])
    printed = capsys.readouterr().out
    assert "## Step time" in printed and "## Ratios and goals" in printed and "## Peak memory" in printed

    results = json.loads(out.read_text())
    assert set(results) == {"meta", "cases", "markdown"}
    assert {"date", "quick", "repeats", "warmup", "machine", "load_start", "load_end", "torch"} <= set(
        results["meta"]
    )
    assert {"jax", "optax", "optkit"} <= set(results["meta"]["machine"]["versions"])
    assert [c["name"] for c in results["cases"]] == cases.split(",")
    for case in results["cases"]:
        assert case["candidates"] and case["ratios"]
        for candidate in case["candidates"]:
            assert {"label", "median_ms", "min_ms", "max_ms", "first_call_s", "gbps", "n_params"} <= set(candidate)
            assert candidate["median_ms"] > 0 and candidate["first_call_s"] > 0
        for ratio in case["ratios"]:
            assert {"label", "value", "paired", "goal", "met"} <= set(ratio)
        for memory in case["memory"]:
            assert "error" not in memory, memory
            assert {"total_bytes", "peak_anon_rss", "baseline_anon_rss", "ratio", "met"} <= set(memory)
            assert memory["peak_anon_rss"] > memory["baseline_anon_rss"]
    one_leaf = results["cases"][0]["candidates"]
    # One-leaf cases report the traffic of the compiled program: 3 passes, 40 bytes a parameter.
    assert all(c["hlo_bytes_per_param"] >= 28 for c in one_leaf if "hlo_bytes_per_param" in c)
    many = {c["label"]: c for c in results["cases"][1]["candidates"]}
    assert many["optkit.adam FlatParams"]["hlo_kernels"] < many["optkit.adam per leaf"]["hlo_kernels"]



def test_the_suite_time_plugin_counts_each_tests_compiles(tmp_path):
    """benchmarks.suite_time, loaded into a pytest run of two tests: the jitted one is recorded with its two XLA
    programs (one per input shape) and their compile time, the NumPy one with none; the report sums them."""
    import subprocess
    import sys

    from benchmarks import suite_time

    (tmp_path / "test_two.py").write_text(
        "import jax, jax.numpy as jnp, numpy as np\n"
        "def test_jitted():\n"
        "    f = jax.jit(lambda x: jnp.tanh(x) * 2)\n"
        "    x3, x4 = np.ones(3, np.float32), np.ones(4, np.float32)\n"
        "    f(x3).block_until_ready(); f(x4).block_until_ready(); f(x3).block_until_ready()\n"
        "def test_numpy():\n"
        "    assert np.ones(3).sum() == 3\n")
    records = tmp_path / "records"
    root = pathlib.Path(suite_time.__file__).resolve().parent.parent
    env = {**os.environ, "OPTKIT_SUITE_TIME_DIR": str(records), "PYTHONPATH": str(root)}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "-p", "benchmarks.suite_time", str(tmp_path / "test_two.py")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    got = {record["test"].split("::")[1]: record for record in suite_time.read(records)}
    assert set(got) == {"test_jitted", "test_numpy"}
    assert got["test_jitted"]["compile_n"] == 2 and got["test_jitted"]["compile"] > 0
    assert got["test_jitted"]["trace"] > 0 and got["test_jitted"]["lower"] > 0
    assert got["test_numpy"]["compile_n"] == 0 and got["test_numpy"]["compile"] == 0
    assert all(record["wall"] >= record["compile"] for record in got.values())
    text = suite_time.report(suite_time.read(records))
    assert text.startswith("2 tests:") and "2 programs" in text and "test_two.py" in text
    with pytest.raises(ValueError, match="no records"):
        suite_time.report(suite_time.read(tmp_path / "nothing"))


def test_the_quick_tier_keeps_each_functions_cheapest_case_then_the_cheapest_within_the_budget(tmp_path):
    """benchmarks.suite_time.quick_tier on hand-made records: every function keeps its cheapest case when it is
    under the cap; a module whose functions are all over it keeps its cheapest test; the rest are kept cheapest
    first while the budget allows; the ids left out are what conftest.py marks slow."""
    from benchmarks import suite_time

    def record(test, wall):
        return {"test": test, "wall": wall}

    records = [record("a.py::f[0]", 1.0), record("a.py::f[1]", 0.5), record("a.py::f[2]", 3.0),
               record("a.py::g", 0.2), record("b.py::h[x]", 9.0), record("b.py::h[y]", 8.0),
               record("c.py::k[0]", 0.1), record("c.py::k[1]", 0.1)]
    left_out = suite_time.quick_tier(records, budget=9.5, cap=2.0)
    # kept: f[1] 0.5, g 0.2, k[0] 0.1 (cheapest of each under the cap), h[y] 8.0 (b.py's only representative),
    # then cheapest first within 9.5: k[1] 0.1 (8.9), f[0] 1.0 would make 9.9: left out
    assert left_out == ["a.py::f[0]", "a.py::f[2]", "b.py::h[x]"]
    with pytest.raises(ValueError, match="no records"):
        suite_time.quick_tier([], 10, 1)
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "slow_cases.txt"
    suite_time.main([str(folder), "--quick-tier", "9.5", "--cap", "2", "--write", str(out)])
    lines = [line for line in out.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    assert lines == left_out


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_the_optimizer_benchmarks_agreement_rows_hold_what_the_docs_say():
    """benchmarks.optimizers' agreement with the references: optkit's float64 runs equal torch's and schedulefree's
    to rounding, Optax's Muon and Optax's schedule-free AdamW with ``r`` do not, and the two 8-bit roundings sit
    where docs/recent-optimizers.md puts them."""
    from benchmarks import optimizers

    by_optimizer = {}
    for row in optimizers.agreement():
        by_optimizer.setdefault(row["optimizer"], []).append(row["max_relative_difference"])
    assert max(by_optimizer["optkit.muon(ns_dtype=float64)"]) < 1e-14
    assert max(by_optimizer["optkit.schedule_free_adamw"]) < 1e-14
    assert min(by_optimizer["optax.contrib.muon"]) > 1e-3
    assert max(by_optimizer["optax.contrib.schedule_free_adamw (no r)"]) > 1e-3  # the case with r
    assert min(by_optimizer["optax.contrib.schedule_free_adamw (no r)"]) < 1e-13  # the case without
    assert by_optimizer["optkit.adam8bit(rounding='table')"][0] < 1e-3 < by_optimizer[
        "optkit.adam8bit(rounding='nearest')"][0]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_the_native_floor_computes_one_function_in_each_form(family):
    """benchmarks.onnx_native's models written in JAX: the scanned form (stacked weights, ``jax.lax.scan``) and the
    Flax NNX modules give the unrolled functional model's outputs (the floor's forms time one computation)."""
    pytest.importorskip("flax")
    import jax
    import numpy as np

    from benchmarks.onnx_native import _forward, _init, _nnx_model

    values = _init(family, 3)
    ids = np.random.default_rng(0).integers(0, 1000, (2, 8)).astype(np.int32)
    unrolled = _forward(family, jax.tree.map(np.asarray, values), ids, scan=False)
    stacked = {**values, "layers": jax.tree.map(lambda *v: np.stack(v), *values["layers"])}
    np.testing.assert_allclose(_forward(family, stacked, ids, scan=True), unrolled, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(_nnx_model(family, 3)(ids), unrolled, rtol=2e-5, atol=2e-5)
    assert unrolled.shape == (2, 8, 128) and np.isfinite(unrolled).all()
