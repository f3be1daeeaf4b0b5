"""ONNX Runtime's fused attention and embedding operators that its transformer optimizer and Optimum write
(``com.microsoft`` ``Attention``, ``MultiHeadAttention``, ``EmbedLayerNormalization``, ``RotaryEmbedding``;
optkit/onnx/_ops/contrib_attention.py, contrib.py) against ONNX Runtime's CPU kernels on single-node models, every
form its CPU kernel runs, and their gradients against float64 central differences."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import assert_gradients_match_central_differences  # noqa: E402

RNG = np.random.default_rng(0)
B, S, L, N, H = 2, 3, 4, 2, 8
D = N * H
SCHEMAS = {
    "Attention": ["input", "weights", "bias", "mask_index", "past", "attention_bias"],
    "MultiHeadAttention": ["query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key",
                           "past_value"],
    "EmbedLayerNormalization": ["input_ids", "segment_ids", "word_embedding", "position_embedding",
                                "segment_embedding", "gamma", "beta", "mask", "position_ids"],
    "RotaryEmbedding": ["input", "position_ids", "cos_cache", "sin_cache"],
}
ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
        np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def f(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def _model(op, inputs, attrs, outputs):
    names = [n if n in inputs else "" for n in SCHEMAS[op]]
    while not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], domain="com.microsoft", **attrs)
    floats = ELEM[inputs[SCHEMAS[op][2 if op == "EmbedLayerNormalization" else 0]].dtype]
    types = [TensorProto.INT32 if (op, i) == ("EmbedLayerNormalization", 1) else floats for i in range(outputs)]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, ELEM[v.dtype], list(v.shape))
                                            for k, v in inputs.items()],
                              [helper.make_tensor_value_info(o, t, None) for o, t in zip(node.output, types)])
    for out in graph.output:
        out.type.tensor_type.shape.SetInParent()
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


COS = np.cos(np.arange(40)[:, None] / (1 + np.arange(8))).astype(np.float32)
SIN = np.sin(np.arange(40)[:, None] / (1 + np.arange(8))).astype(np.float32)
WORDS, SEGMENTS = RNG.integers(0, 30, (B, S)).astype(np.int32), RNG.integers(0, 2, (B, S)).astype(np.int32)
EMBED = {"input_ids": WORDS, "segment_ids": SEGMENTS, "word_embedding": f(30, D), "position_embedding": f(16, D),
         "segment_embedding": f(2, D), "gamma": f(D), "beta": f(D)}
CASES = {  # name: (op, inputs, attributes, outputs)
    "Attention": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D), "bias": f(3 * D)}, {"num_heads": N}, 2),
    "Attention mask lengths": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D), "bias": f(3 * D),
                                             "mask_index": np.array([2, 3], np.int32)}, {"num_heads": N}, 1),
    "Attention mask ends and starts": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D),
                                                     "mask_index": np.array([3, 2, 1, 0], np.int32)},
                                       {"num_heads": N}, 1),
    "Attention raw mask 2-D": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D),
                                             "mask_index": np.array([[1, 1, 0], [1, 0, 1]], np.int32)},
                               {"num_heads": N, "mask_filter_value": -50.0}, 1),
    "Attention raw mask 3-D": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D),
                                             "mask_index": RNG.integers(0, 2, (B, S, S)).astype(np.int32)},
                               {"num_heads": N}, 1),
    "Attention past unidirectional": ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D), "bias": f(3 * D),
                                                    "mask_index": np.ones((B, S + 2), np.int32),
                                                    "past": f(2, B, N, 2, H)},
                                      {"num_heads": N, "unidirectional": 1}, 2),
    "Attention qkv sizes scale bias": ("Attention", {"input": f(B, S, D), "weights": f(D, D + D + 2 * D),
                                                     "attention_bias": f(1, N, S, S)},
                                       {"num_heads": N, "qkv_hidden_sizes": [D, D, 2 * D], "scale": 0.3}, 1),
    "MultiHeadAttention": ("MultiHeadAttention", {"query": f(B, S, D), "key": f(B, L, D), "value": f(B, L, D),
                                                  "bias": f(3 * D)}, {"num_heads": N}, 3),
    "MultiHeadAttention padding mask": ("MultiHeadAttention", {
        "query": f(B, S, D), "key": f(B, S, D), "value": f(B, S, D),
        "key_padding_mask": np.array([[1, 1, 0], [1, 1, 1]], np.int32)}, {"num_heads": N}, 1),
    "MultiHeadAttention lengths": ("MultiHeadAttention", {"query": f(B, S, D), "key": f(B, L, D),
                                                          "value": f(B, L, D),
                                                          "key_padding_mask": np.array([2, 4], np.int32)},
                                   {"num_heads": N}, 1),
    "MultiHeadAttention past unidirectional": ("MultiHeadAttention", {
        "query": f(B, S, D), "key": f(B, S, D), "value": f(B, S, D), "past_key": f(B, N, 2, H),
        "past_value": f(B, N, 2, H)}, {"num_heads": N, "unidirectional": 1}, 3),
    "MultiHeadAttention cross cache": ("MultiHeadAttention", {"query": f(B, S, D), "key": f(B, N, L, H),
                                                              "value": f(B, N, L, H)}, {"num_heads": N}, 1),
    "MultiHeadAttention bias scale": ("MultiHeadAttention", {"query": f(B, S, D), "key": f(B, L, D),
                                                             "value": f(B, L, D), "attention_bias": f(B, N, S, L)},
                                      {"num_heads": N, "scale": 0.2}, 3),
    "EmbedLayerNormalization": ("EmbedLayerNormalization", {
        **EMBED, "mask": np.array([[1, 1, 0], [1, 1, 1]], np.int32)}, {}, 3),
    "EmbedLayerNormalization no segments eps": ("EmbedLayerNormalization", {
        k: v for k, v in EMBED.items() if not k.startswith("segment")}, {"epsilon": 1e-3}, 2),
    "EmbedLayerNormalization positions": ("EmbedLayerNormalization", {
        **EMBED, "position_ids": RNG.integers(0, 16, (B, S)).astype(np.int32)}, {}, 2),
    "RotaryEmbedding offset": ("RotaryEmbedding", {"input": f(B, S, 2 * D), "position_ids": np.array([3], np.int64),
                                                   "cos_cache": COS, "sin_cache": SIN}, {"num_heads": 2}, 1),
    "RotaryEmbedding interleaved 4-D": ("RotaryEmbedding", {
        "input": f(B, N, S, 16), "position_ids": RNG.integers(0, 40, (B, S)).astype(np.int64), "cos_cache": COS,
        "sin_cache": SIN}, {"interleaved": 1}, 1),
    "RotaryEmbedding partial": ("RotaryEmbedding", {"input": f(B, S, 2 * 32), "position_ids": np.array([1], np.int64),
                                                    "cos_cache": COS, "sin_cache": SIN},
                                {"num_heads": 2, "rotary_embedding_dim": 16}, 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_fused_attention_operator_gives_onnx_runtimes_outputs(name):
    op, inputs, attrs, outputs = CASES[name]
    model = _model(op, inputs, attrs, outputs)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    got = optkit.onnx.prepare(model).run(inputs)
    assert len(got) == len(want) == outputs
    for g, w in zip(got, want):
        assert np.shape(g) == w.shape and np.asarray(g).dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.x64
@pytest.mark.parametrize("name", ["Attention past unidirectional", "Attention raw mask 2-D",
                                  "MultiHeadAttention past unidirectional", "EmbedLayerNormalization",
                                  "RotaryEmbedding partial"])
def test_fused_attention_gradients_match_float64_central_differences(name):
    op, inputs, attrs, outputs = CASES[name]
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in inputs.items()}
    fn = optkit.onnx.to_graph(_model(op, wide, attrs, outputs)).as_function(list(wide), "y0")
    floats = [k for k, v in wide.items() if v.dtype == np.float64 and not k.endswith("_cache")]
    assert_gradients_match_central_differences(fn, {k: jnp.asarray(v) for k, v in wide.items()}, floats)


@pytest.mark.parametrize("op, inputs, attrs, match", [
    ("MultiHeadAttention", {"query": f(B, S, N, 3, H)}, {"num_heads": N}, "packed"),
    ("Attention", {"input": f(B, S, D), "weights": f(D, 3 * D)}, {"num_heads": N, "do_rotary": 1}, "do_rotary"),
])
def test_fused_attention_forms_onnx_runtimes_cpu_kernel_does_not_run_are_refused_by_name(op, inputs, attrs, match):
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=match):
        optkit.onnx.prepare(_model(op, inputs, attrs, 1)).run(inputs)
