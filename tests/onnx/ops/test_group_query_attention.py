"""ONNX Runtime's ``com.microsoft::GroupQueryAttention`` (optkit/onnx/_ops/contrib_attention.py) against ONNX
Runtime's CPU kernel on single-node models: prompts and decode steps with a KV cache (sequences of different lengths
in one batch), packed and separate Q/K/V, rotary embeddings (both layouts, partial), a local window, a softcap,
smooth softmax, head sinks and an attention bias; and its gradients against float64 central differences."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import assert_gradients_match_central_differences  # noqa: E402

HEADS, KV_HEADS, HEAD = 4, 2, 32
INPUTS = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
          "sin_cache", "position_ids", "attention_bias", "head_sink"]


def _case(batch=2, length=4, past=0, seen=None, packed=False, rotary=0, interleaved=0, bias=False, sink=False,
          seed=0, static_total=False, **attrs):
    """A GroupQueryAttention node and its feeds: ``past`` cached positions (``seen``: each sequence's total length,
    default ``past + length``), ``rotary`` the rotary dimension (0: none); ``static_total``: the total sequence
    length an initializer (as the builder's files compute it from the mask's shape), not a feed."""
    rng = np.random.default_rng(seed)
    seen = np.full(batch, past + length) if seen is None else np.asarray(seen)
    total = int(seen.max())
    feeds = {}
    if packed:
        feeds["query"] = rng.normal(size=(batch, length, (HEADS + 2 * KV_HEADS) * HEAD))
    else:
        feeds["query"] = rng.normal(size=(batch, length, HEADS * HEAD))
        feeds["key"] = rng.normal(size=(batch, length, KV_HEADS * HEAD))
        feeds["value"] = rng.normal(size=(batch, length, KV_HEADS * HEAD))
    if past:
        feeds["past_key"] = rng.normal(size=(batch, KV_HEADS, past, HEAD))
        feeds["past_value"] = rng.normal(size=(batch, KV_HEADS, past, HEAD))
    feeds["seqlens_k"] = (seen - 1).astype(np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    if rotary:
        angles = np.arange(32)[:, None] / 10000 ** (np.arange(rotary // 2) / (rotary // 2))
        feeds["cos_cache"], feeds["sin_cache"] = np.cos(angles), np.sin(angles)
    if bias:
        feeds["attention_bias"] = rng.normal(size=(batch, 1, length, max(total, past)))
    if sink:
        feeds["head_sink"] = rng.normal(size=(HEADS,))
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    inputs = [name if name in feeds else "" for name in INPUTS]
    while not inputs[-1]:
        inputs.pop()
    node = helper.make_node("GroupQueryAttention", inputs, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
                            do_rotary=int(bool(rotary)), rotary_interleaved=interleaved, **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    inits = ([numpy_helper.from_array(feeds.pop("total_sequence_length"), "total_sequence_length")]
             if static_total else [])
    graph = helper.make_graph(
        [node], "gqa", [helper.make_tensor_value_info(k, elem[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, length, HEADS * HEAD])]
        + [helper.make_tensor_value_info(o, TensorProto.FLOAT, [batch, KV_HEADS, max(total, past), HEAD])
           for o in node.output[1:]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])
    return model, feeds


CASES = {
    "prompt": {},
    "prompt packed": {"packed": True},
    "prompt rotary": {"rotary": HEAD},
    "prompt rotary interleaved packed": {"rotary": HEAD, "interleaved": 1, "packed": True},
    "prompt partial rotary": {"rotary": HEAD // 2},
    "prompt padded": {"seen": [4, 2], "rotary": HEAD},
    "decode": {"length": 1, "past": 5, "rotary": HEAD},
    "decode packed interleaved": {"length": 1, "past": 5, "rotary": HEAD, "interleaved": 1, "packed": True},
    "decode right-padded cache": {"length": 1, "past": 5, "seen": [6, 3], "rotary": HEAD},
    "decode local window": {"length": 1, "past": 7, "local_window_size": 3},
    "prompt local window": {"length": 6, "local_window_size": 2},
    "prompt scale softcap": {"scale": 0.3, "softcap": 2.0},
    "decode smooth softmax": {"length": 1, "past": 4, "smooth_softmax": 1},
    "prompt head sink": {"sink": True},
    "prompt attention bias": {"bias": True},
    "decode attention bias": {"length": 1, "past": 4, "bias": True},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_group_query_attention_gives_onnx_runtimes_outputs_and_presents(name):
    model, feeds = _case(**CASES[name])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = optkit.onnx.prepare(model).run(feeds)
    seen = feeds["seqlens_k"] + 1
    rows = np.arange(feeds["query"].shape[1])[None, :] < seen[:, None]  # a padded prompt's padding rows: unused
    if feeds["query"].shape[1] > 1:
        np.testing.assert_allclose(np.asarray(got[0])[rows], want[0][rows], rtol=2e-5, atol=2e-6)
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-6)
    for g, w in zip(got[1:], want[1:]):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_group_query_attention_under_jit_decodes_the_cache_it_wrote():
    """A prompt of 4 positions, then one decode step through to_jax under jax.jit fed the present the prompt
    returned, equal one prompt of all 5 positions (the causal mask, the rotary positions and the cache agree)."""
    _, feeds = _case(length=5, rotary=HEAD)
    full = optkit.onnx.prepare(_case(length=5, rotary=HEAD)[0]).run(feeds)[0]
    prompt = {k: (v[:, :4] if k in ("query", "key", "value") else v) for k, v in feeds.items()}
    prompt["seqlens_k"], prompt["total_sequence_length"] = feeds["seqlens_k"] - 1, np.array(4, np.int32)
    out_prompt, present_key, present_value = optkit.onnx.prepare(_case(length=4, rotary=HEAD)[0]).run(prompt)
    step_model, _ = _case(length=1, past=4, rotary=HEAD, static_total=True)
    step = {"query": feeds["query"][:, 4:], "key": feeds["key"][:, 4:], "value": feeds["value"][:, 4:],
            "past_key": np.asarray(present_key), "past_value": np.asarray(present_value),
            "seqlens_k": feeds["seqlens_k"], "cos_cache": feeds["cos_cache"], "sin_cache": feeds["sin_cache"]}
    assert [i.name for i in step_model.graph.input] == list(step)
    apply_fn, params = optkit.onnx.to_jax(step_model)
    out_step = jax.jit(apply_fn)(params, *step.values())[0]
    np.testing.assert_allclose(out_prompt, np.asarray(full)[:, :4], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out_step, np.asarray(full)[:, 4:], rtol=2e-5, atol=2e-6)


@pytest.mark.x64
@pytest.mark.parametrize("name", ["decode right-padded cache", "prompt rotary interleaved packed",
                                  "prompt scale softcap", "decode smooth softmax"])
def test_group_query_attention_gradients_match_float64_central_differences(name):
    model, feeds = _case(**CASES[name])
    for value_info in model.graph.input:
        if value_info.type.tensor_type.elem_type == TensorProto.FLOAT:
            value_info.type.tensor_type.elem_type = TensorProto.DOUBLE
    floats = [k for k, v in feeds.items() if v.dtype == np.float32 and not k.endswith("_cache")]
    fn = optkit.onnx.to_graph(model).as_function(list(feeds), "output")
    args = {k: jnp.asarray(v, jnp.float64 if v.dtype == np.float32 else v.dtype) for k, v in feeds.items()}
    assert_gradients_match_central_differences(fn, args, floats)


@pytest.mark.parametrize("attrs, match", [({"qk_output": 1}, "qk_output"), ({"k_quant_type": "PER_TENSOR"},
                                                                            "k_quant_type")])
def test_group_query_attention_refuses_what_it_does_not_run_by_name(attrs, match):
    model, feeds = _case(**attrs)
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=match):
        optkit.onnx.prepare(model).run(feeds)
