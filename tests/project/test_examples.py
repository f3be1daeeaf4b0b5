"""The examples run end to end (with few steps: these are smoke tests, not accuracy checks)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from examples import quickstart

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quickstart_runs_and_learns(tmp_path):
    results = quickstart.main(["--steps", "40", "--hidden", "64", "--out", str(tmp_path)])
    names = {r["name"] for r in results}
    assert {"optkit.adagrad", "optkit.adam", "optkit.momentum"} <= names
    for r in results:
        if r["name"].startswith("optkit"):
            # 40 steps of batch 64 already beat chance (10%) by far on digits.
            assert r["test_accuracy"] > 0.3, r
        assert np.mean(r["losses"][-5:]) < r["losses"][0]
        assert r["state_bytes"] > 0
    assert (tmp_path / "quickstart_loss.png").stat().st_size > 0


def test_scanned_lm_trains_as_the_unrolled_one(tmp_path):
    from examples import lm_scanned

    result = lm_scanned.main(["--steps", "12", "--d-model", "32", "--layers", "3", "--out", str(tmp_path)])
    assert result["gap"] < 1e-5
    assert result["scanned"][-1] < result["scanned"][0]
    without = lm_scanned.main(["--steps", "12", "--d-model", "32", "--layers", "3", "--no-rules",
                               "--out", str(tmp_path)])
    assert without["gap"] > 10 * result["gap"]  # the rules are what makes them equal


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("optimizer", ["adafactor", "adamw", "adam", "adam8bit"])
def test_onnx_finetune_jax_trains_with_any_optimizer_and_onnx_runtime_agrees(tmp_path, optimizer):
    from examples import onnx_finetune_jax

    result = onnx_finetune_jax.main(["--optimizer", optimizer, "--steps", "60", "--out", str(tmp_path)])
    assert result["accuracy"] > result["accuracy_before"] + 0.3, result
    assert np.mean(result["losses"][-5:]) < result["losses"][0]
    pytest.importorskip("onnxruntime")
    assert result["ort_accuracy"] == result["accuracy"]
    assert pathlib.Path(result["plot"]).stat().st_size > 0


def test_onnx_finetune_jax_is_data_parallel_over_4_devices(tmp_path):
    """The same script on 4 simulated CPU devices (a child process: XLA reads the flag at start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    env["XLA_FLAGS"] = " ".join([*(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f),
                                 "--xla_force_host_platform_device_count=4"])
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run([sys.executable, os.path.join("examples", "onnx_finetune_jax.py"), "--steps", "30", "--out",
                             str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 device(s)" in result.stdout, result.stdout


def test_onnx_finetune_trains_an_exported_model_and_saves_it(tmp_path):
    import onnx

    from examples import onnx_finetune

    result = onnx_finetune.main(["--steps", "40", "--out", str(tmp_path)])
    assert result["accuracy"] > result["accuracy_before"] + 0.3, result
    assert np.mean(result["losses"][-5:]) < result["losses"][0]
    saved = onnx.load(result["path"])
    onnx.checker.check_model(saved)
    assert not any(n.domain == "ai.onnx.preview.training" for n in saved.graph.node)  # inference only
    if result["ort_accuracy"] is not None:
        assert result["ort_accuracy"] == result["accuracy"]
    assert (tmp_path / "onnx_finetune_loss.png").stat().st_size > 0


def test_onnx_llm_decodes_a_genai_builder_model_through_to_jax_as_onnx_runtime():
    from examples import onnx_llm

    result = onnx_llm.main(["--tokens", "10"])
    assert result["tokens"].shape == (1, 10) and result["prompt"].shape[1] > 5
    pytest.importorskip("onnxruntime")
    np.testing.assert_array_equal(result["tokens"], result["ort_tokens"])


def test_onnx_lora_fine_tunes_the_int4_genai_model_and_onnx_runtime_runs_what_it_wrote(tmp_path):
    import onnx

    from examples import onnx_lora

    result = onnx_lora.main(["--steps", "30", "--out", str(tmp_path)])
    assert result["after"] < result["before"] - 0.5, result["before"]  # the held-out windows' loss
    assert all(k.endswith((".lora_A", ".lora_B")) for k in result["params"])
    base = onnx.load(str(onnx_lora.DEFAULT_MODEL / "model.onnx"))
    written = onnx.load(str(tmp_path / "model.onnx"))
    old = {t.name: onnx.numpy_helper.to_array(t) for t in base.graph.initializer}
    for t in written.graph.initializer:  # the 4-bit weights and their scales bit for bit as the builder wrote them
        if t.name in old:
            np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), old[t.name])
    assert len(written.graph.node) > len(base.graph.node)
    pytest.importorskip("onnxruntime")
    np.testing.assert_allclose(result["ort_logits"], result["logits"], rtol=1e-5,
                               atol=1e-5 * np.abs(result["logits"]).max())
    np.testing.assert_array_equal(result["ort_tokens"], result["tokens"])


def test_onnx_adapters_serves_two_fine_tunes_of_one_int4_base_by_adapter_file(tmp_path):
    """Two adapter files on one base: each lowers its own text's held-out loss most; ONNX Runtime with either
    active gives apply_fn's logits and greedy tokens (onnxruntime-genai too where installed); none active, the
    builder's model."""
    pytest.importorskip("onnxruntime")  # (the adapter files are written by onnxruntime's AdapterFormat)
    from examples import onnx_adapters

    result = onnx_adapters.main(["--steps", "100", "--out", str(tmp_path)])
    losses = result["losses"]
    for own, other in (("textwrap", "pydoc"), ("pydoc", "textwrap")):
        assert losses[own, own] < losses[other, own] < losses["none", own] - 1.0, losses
    assert {p.name for p in result["files"].values()} == {"textwrap.onnx_adapter", "pydoc.onnx_adapter"}
    for name in result["files"]:
        want = result["logits"][name]
        np.testing.assert_allclose(result["ort_logits"][name], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(result["ort_tokens"][name], result["tokens"][name])
        if result["genai_tokens"]:
            np.testing.assert_array_equal(result["genai_tokens"][name], result["tokens"][name])
    np.testing.assert_array_equal(result["ort_base_logits"], result["ort_builder_logits"])
