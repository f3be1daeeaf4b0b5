"""A BERT as ONNX Runtime's transformer optimizer fuses it (``EmbedLayerNormalization``, ``Attention``,
``SkipLayerNormalization``, ``BiasGelu``; and the float16 conversion it offers; tests/onnx/models/make_optimized.py)
runs as ONNX Runtime runs it on a padded batch, is differentiated in its float weights and trains."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402

import optkit.onnx  # noqa: E402

OPTIMIZED = pathlib.Path(__file__).parent / "models" / "optimized"
FEEDS = ("input_ids", "attention_mask", "token_type_ids")


def _saved(name):
    data = np.load(OPTIMIZED / f"{name}.npz")
    return {k: data[k] for k in FEEDS}, data["output"]


def test_the_optimized_bert_gives_onnx_runtimes_output_on_a_padded_batch():
    model = onnx.load(str(OPTIMIZED / "ort_optimized_bert.onnx"))
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"} <= {
        n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    feeds, want = _saved("ort_optimized_bert")
    assert feeds["attention_mask"].min() == 0  # a padded sequence
    (got,) = optkit.onnx.prepare(model).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_its_float16_conversion_stays_within_two_float16_steps_of_onnx_runtime():
    """The float16 file (Casts kept at the inputs and output) against ONNX Runtime's float16 output: equal to
    two float16 steps; and no farther from the float32 model's output than ONNX Runtime's is, to 1.5x."""
    feeds, want = _saved("ort_optimized_bert_fp16")
    _, reference = _saved("ort_optimized_bert")
    (got,) = optkit.onnx.prepare(str(OPTIMIZED / "ort_optimized_bert_fp16.onnx")).run(feeds)
    got = np.asarray(got, np.float32)
    step = 2.0 ** -10 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * step)
    assert np.abs(got - reference).mean() < 1.5 * np.abs(want - reference).mean()


def test_the_optimized_berts_gradient_matches_central_differences_and_it_trains():
    model = onnx.load(str(OPTIMIZED / "ort_optimized_bert.onnx"))
    apply_fn, params = optkit.onnx.to_jax(model)
    assert any("qkv_weight" in k for k in params)  # the fused Attention weights are trained
    feeds, _ = _saved("ort_optimized_bert")
    target = jnp.asarray(np.random.default_rng(3).normal(size=(2, 8, 32)), jnp.float32)

    def loss(p):
        return jnp.mean((apply_fn(p, feeds) - target) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    rng = np.random.default_rng(0)
    direction = {k: jnp.asarray(rng.normal(size=np.shape(v)), jnp.float32) for k, v in params.items()}
    eps = 1e-3
    moved = [{k: v + s * eps * direction[k] for k, v in params.items()} for s in (1, -1)]
    want = (float(loss(moved[0])) - float(loss(moved[1]))) / (2 * eps)
    got = sum(float(jnp.sum(grads[k] * direction[k])) for k in params)
    np.testing.assert_allclose(got, want, rtol=2e-2)
    tx = optax.adam(1e-2)
    state, losses = tx.init(params), []

    @jax.jit
    def step(p, s):
        value, g = jax.value_and_grad(loss)(p)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    for _ in range(3):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert losses[-1] < losses[0], losses
