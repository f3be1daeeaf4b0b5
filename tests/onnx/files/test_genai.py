"""Files that onnxruntime-genai's model builder writes (LLaMA, Qwen2 and Phi-3 configs at fp32 and int4;
tests/onnx/models/make_genai.py): ONNX Runtime's logits and presents on a prompt and on a decode step with the KV
cache, greedy decoding through ``to_jax`` under ``jax.jit``, and gradients of the float weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

GENAI = ONNX_TESTS / "models" / "genai"
FOLDERS = sorted(p.name for p in GENAI.iterdir() if p.is_dir())


def _saved(folder):
    data = np.load(GENAI / folder / "outputs.npz")
    return {phase: {k.split(":", 1)[1]: data[k] for k in data if k.startswith(phase + ":")}
            for phase in ("feeds", "step", "prefill", "decode")}


def test_the_fixtures_are_the_builders_files_of_three_families_at_two_precisions():
    assert FOLDERS == [f"{f}_{p}" for f in ("llama", "phi3", "qwen2") for p in ("fp32", "int4")]
    ops = {(n.domain, n.op_type) for n in onnx.load(str(GENAI / "llama_int4" / "model.onnx"),
                                                    load_external_data=False).graph.node}
    assert {("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "MatMulNBits"),
            ("com.microsoft", "SkipSimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization")} <= ops


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_genai_file_gives_onnx_runtimes_logits_and_presents_on_prompt_and_decode(folder):
    saved = _saved(folder)
    path = GENAI / folder / "model.onnx"
    names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    rep = optkit.onnx.prepare(str(path))
    for feeds, phase in ((saved["feeds"], "prefill"), (saved["step"], "decode")):
        got = rep.run(feeds)
        assert len(got) == len(names) == len(saved[phase])
        for name, value in zip(names, got):
            want = saved[phase][name]
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=name)


def _greedy(step, params, prompt, new_tokens, layers, kv_heads, head):
    """Greedy decoding with the KV cache: ``step(params, input_ids, attention_mask, *pasts) -> (logits,
    *presents)``, the builder's input order (pasts as key.0, key.1, ..., then value.0, ...)."""
    batch = prompt.shape[0]
    pasts = [np.zeros((batch, kv_heads, 0, head), np.float32) for _ in range(2 * layers)]
    ids, mask, tokens = prompt, np.ones_like(prompt), []
    for _ in range(new_tokens):
        logits, *presents = step(params, ids, mask, *pasts)
        ids = np.asarray(jnp.argmax(logits[:, -1], axis=-1)).astype(np.int64)[:, None]
        tokens.append(ids)
        mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
        pasts = presents
    return np.concatenate(tokens, axis=1)


@pytest.mark.parametrize("folder", ["llama_int4", "qwen2_fp32"])
def test_greedy_decoding_through_to_jax_under_jit_gives_onnx_runtimes_tokens(folder):
    ort = pytest.importorskip("onnxruntime")
    path = GENAI / folder / "model.onnx"
    model = onnx.load(str(path))
    inputs = [i.name for i in model.graph.input]
    assert inputs[:2] == ["input_ids", "attention_mask"]
    pasts = [i.type.tensor_type.shape.dim for i in model.graph.input[2:]]
    layers, kv_heads = len(pasts) // 2, pasts[0][1].dim_value
    head = np.load(GENAI / folder / "outputs.npz")["prefill:present.0.key"].shape[-1]
    prompt = _saved(folder)["feeds"]["input_ids"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def ort_step(_, ids, mask, *pasts):
        return session.run(None, {"input_ids": ids, "attention_mask": mask, **dict(zip(inputs[2:], pasts))})

    apply_fn, params = optkit.onnx.to_jax(model)
    want = _greedy(ort_step, None, prompt, 6, layers, kv_heads, head)
    got = _greedy(jax.jit(apply_fn), params, prompt, 6, layers, kv_heads, head)
    np.testing.assert_array_equal(got, want)


def _next_token_loss(model):
    apply_fn, params = optkit.onnx.to_jax(model)
    feeds = _saved("llama_fp32")["feeds"]
    ids = feeds["input_ids"]
    pasts = [feeds[i.name] for i in model.graph.input[2:]]

    def loss(p):
        logits = apply_fn(p, ids, feeds["attention_mask"], *pasts)[0]
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    return loss, params


def _central_difference(loss, params, eps=1e-3):
    rng = np.random.default_rng(0)
    direction = {k: jnp.asarray(rng.normal(size=np.shape(v)), jnp.float32) for k, v in params.items()}
    moved = [{k: v + s * eps * direction[k] for k, v in params.items()} for s in (1, -1)]
    return direction, (float(loss(moved[0])) - float(loss(moved[1]))) / (2 * eps)


@pytest.mark.parametrize("folder", ["llama_fp32", "llama_int4"])
def test_gradients_of_a_genai_files_float_weights_match_central_differences(folder):
    """The next-token loss of the prompt, differentiated in every float weight (the int4 file: its norms and the
    MatMulNBits scales; not the rotary caches, tables that are not trained by default), against float32 central
    differences along a random direction. The int4 file's ``accuracy_level=4`` rounds the activations to int8,
    which central differences cannot see through: its gradient (straight-through) is checked at level 0, and at
    level 4 against that one."""
    model = onnx.load(str(GENAI / folder / "model.onnx"))
    quantized = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    levels = [next(a for a in n.attribute if a.name == "accuracy_level") for n in quantized]
    assert (folder == "llama_int4") == bool(levels) and all(a.i == 4 for a in levels)
    loss, params = _next_token_loss(model)
    assert len(params) >= 5 and not {"cos_cache", "sin_cache"} & set(params)
    grads = jax.jit(jax.grad(loss))(params)
    if levels:
        for a in levels:
            a.i = 0
        float_loss, _ = _next_token_loss(model)
        float_grads = jax.jit(jax.grad(float_loss))(params)
        for k in params:  # int8 activations move the gradient by their rounding only
            assert np.linalg.norm(grads[k] - float_grads[k]) < 0.1 * np.linalg.norm(float_grads[k]), k
        loss, grads = float_loss, float_grads
    direction, want = _central_difference(loss, params)
    got = sum(float(jnp.sum(grads[k] * direction[k])) for k in params)
    assert abs(want) > 1e-3
    np.testing.assert_allclose(got, want, rtol=2e-2)
