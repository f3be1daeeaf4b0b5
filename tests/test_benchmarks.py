"""Smoke test of the benchmark harness (benchmarks/run.py) in --quick mode: it runs and writes its JSON.

No timing is asserted: only that every case ran and reported the numbers the
RESULTS table is made of.
"""

import json

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


def test_adafactor_designs_compute_the_shipped_numbers():
    """Every design compared in benchmarks/RESULTS.md (issue 18) is the same algorithm: same updates."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import optkit
    from benchmarks import adafactor_designs as designs

    rng = np.random.default_rng(0)
    shapes = {"big": (256, 512), "w0": (48, 64), "w1": (48, 64), "b0": (64,), "b1": (64,)}
    params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}
    grads = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}

    def updates():
        tx = optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=16)
        state = tx.init(params)
        for _ in range(2):
            u, state = jax.jit(tx.update)(grads, state, params)
        return u

    try:
        designs.use("reductions+jit")
        want = updates()
        for design in designs.DESIGNS:
            designs.use(design)
            got = updates()
            for k in shapes:
                np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-9, err_msg=f"{design} {k}")
    finally:
        designs.use("reductions+jit")
