"""Smoke test of the benchmark harness (benchmarks/run.py) in --quick mode: it runs and writes its JSON.

No timing is asserted: only that every case ran and reported the numbers the
RESULTS table is made of.
"""

import json

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


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
