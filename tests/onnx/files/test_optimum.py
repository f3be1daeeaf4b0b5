"""Files that Optimum's ONNX exporter writes, and what ``optimum-cli onnxruntime optimize -O3`` makes of them
(tests/onnx/models/make_optimum.py): GPT-2 and LLaMA decoders with their KV cache, T5's encoder and merged decoder
(an ``If`` on ``use_cache_branch`` whose branches differ in shape), BERT and LLaMA with ONNX Runtime's fusions.
Each gives ONNX Runtime's outputs on a prompt and on a decode step."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import onnx  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

OPTIMUM = ONNX_TESTS / "models" / "optimum"
NAMES = sorted(p.stem for p in OPTIMUM.glob("*.onnx"))


def _phases(name):
    data = np.load(OPTIMUM / f"{name}.npz")
    phases = sorted({k.split(":")[0] for k in data if not k.startswith("out:")})
    return {phase: ({k.split(":", 1)[1]: data[k] for k in data if k.startswith(phase + ":")},
                    {k.split(":", 2)[2]: data[k] for k in data if k.startswith(f"out:{phase}:")}) for phase in phases}


def test_the_fixtures_hold_each_kind_optimum_writes():
    assert NAMES == ["bert_o3", "gpt2", "llama", "llama_o3", "t5_decoder_merged", "t5_encoder"]
    merged = onnx.load(str(OPTIMUM / "t5_decoder_merged.onnx"))
    assert [n.op_type for n in merged.graph.node if n.op_type == "If"] and "use_cache_branch" in [
        i.name for i in merged.graph.input]
    assert set(_phases("gpt2")) == {"prompt", "step"}


@pytest.mark.parametrize("name", NAMES)
def test_an_optimum_file_gives_onnx_runtimes_outputs_on_a_prompt_and_a_decode_step(name):
    model = onnx.load(str(OPTIMUM / f"{name}.onnx"))
    rep = optkit.onnx.prepare(model)
    outputs = [o.name for o in model.graph.output]
    for phase, (feeds, want) in _phases(name).items():
        got = rep.run(feeds)
        assert set(want) == set(outputs)
        for output, value in zip(outputs, got):
            w = want[output]
            np.testing.assert_allclose(value, w, rtol=1e-5, atol=1e-5 * max(np.abs(w).max(initial=0), 1e-3),
                                       err_msg=f"{phase}: {output}")


def test_the_merged_decoder_runs_both_branches_through_to_jax_under_jit():
    """``use_cache_branch`` fed as a concrete bool chooses the branch before running, so the branch without a
    cache (empty presents) and the one with it both run in one ``to_jax`` function, jitted around it."""
    model = onnx.load(str(OPTIMUM / "t5_decoder_merged.onnx"))
    apply_fn, params = optkit.onnx.to_jax(model)
    names = [i.name for i in model.graph.input]
    for phase, (feeds, want) in _phases("t5_decoder_merged").items():
        cache = feeds.pop("use_cache_branch")
        assert bool(cache[0]) == (phase == "step")
        step = jax.jit(lambda p, f, c=cache: apply_fn(p, {**f, "use_cache_branch": c}))
        got = step(params, feeds)
        logits = np.asarray(got[0])
        w = want[model.graph.output[0].name]
        np.testing.assert_allclose(logits, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=phase)
    assert "use_cache_branch" in names
