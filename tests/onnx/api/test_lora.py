"""Low-rank adapters on exported models (``to_jax(..., lora=LoRA(...))``, ``OnnxModule(..., lora=...)``), and
random keys for the random operators (``apply_fn(..., rng=key)``).

Expectations: ONNX Runtime on the written-back models (merged, or the side branch in standard operators),
the adapter formula ``x @ W + (alpha / rank) * (x @ A) @ B`` in NumPy float64, central differences in
float64, and the base model's own outputs (an adapter starts at zero). Exported models are the committed
fixtures: torch.onnx's GPT-2 (dynamo: Gemm weights), BERT (TorchScript: MatMul weights), and their 4-bit
``MatMulNBits`` twins written by ONNX Runtime's ``MatMulNBitsQuantizer`` (tests/onnx/models/make_quantized.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

MODELS = ONNX_TESTS / "models"
FILES = {"gpt2": MODELS / "torch_dynamo_gpt2.onnx", "bert": MODELS / "torch_torchscript_bert.onnx",
         "int4_llama": MODELS / "quantized" / "ort_int4_llama.onnx",
         "int4_bert": MODELS / "quantized" / "ort_int4_bert.onnx",
         "int8_llama": MODELS / "quantized" / "ort_int8_llama.onnx",
         "int8_gpt2": MODELS / "quantized" / "ort_int8_gpt2.onnx",
         "qdq_llama": MODELS / "quantized" / "ort_qdq_llama.onnx"}
IDS = np.random.default_rng(44).integers(0, 100, (2, 8)).astype(np.int64)


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _randomized(params, seed=0, scale=0.1):
    """Adapters with B non-zero too, so the adapter term is not zero."""
    keys = jax.random.split(jax.random.key(seed), len(params))
    return {name: scale * jax.random.normal(k, v.shape, v.dtype) for (name, v), k in zip(params.items(), keys)}


def _mlp(dtype=np.float32):
    """x -> MatMul(W1) -> Relu -> Gemm(W2, b; transB=1, alpha=0.5): the two weight layouts LoRA adapts."""
    rng = np.random.default_rng(1)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(rng.normal(size=(6, 8)).astype(dtype), "W1"),
             numpy_helper.from_array(rng.normal(size=(5, 8)).astype(dtype), "W2"),
             numpy_helper.from_array(rng.normal(size=5).astype(dtype), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="up"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b"], ["y"], name="down", transB=1, alpha=0.5)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", elem, ["N", 6])],
                              [helper.make_tensor_value_info("y", elem, ["N", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------------------------------------- to_jax


@pytest.mark.parametrize("name", sorted(FILES))
def test_params_are_the_adapters_and_the_model_starts_as_exported(name):
    model = onnx.load(str(FILES[name]))
    base_fn, _ = optkit.onnx.to_jax(model, trainable=[])
    apply_fn, params = optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(4))
    assert params and all(k.endswith((".lora_A", ".lora_B")) for k in params)
    assert set(params) == set(apply_fn.adapters)
    for k, v in params.items():
        assert v.dtype == jnp.float32 and (v.shape[1] == 4 if k.endswith("_A") else v.shape[0] == 4)
        assert k.endswith("_A") or not np.any(np.asarray(v))  # B starts at zero
    # B = 0: the adapter term is exactly 0; XLA fuses the graph around it differently (float32 rounding).
    want = np.asarray(base_fn(_, IDS))
    np.testing.assert_allclose(apply_fn(params, IDS), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    if name.startswith(("int4", "int8", "qdq")):  # every quantized matmul's weight, no float copy of it in params
        weights = {n.input[1] for n in model.graph.node if n.op_type in ("MatMulNBits", "MatMulInteger")}
        inits = {t.name for t in model.graph.initializer}
        dequantized = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        weights |= {dequantized[n.input[1]] for n in model.graph.node if n.op_type == "MatMul"
                    and n.input[1] in dequantized and dequantized[n.input[1]] in inits}
        assert {k.rsplit(".lora_", 1)[0] for k in params} == weights


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("merge", [True, False])
def test_written_back_model_gives_onnx_runtime_the_outputs_of_apply_fn(name, merge):
    model = onnx.load(str(FILES[name]))
    lora = optkit.onnx.LoRA(4, alpha=8)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    params = _randomized(params)
    want = np.asarray(apply_fn(params, IDS))
    written = optkit.onnx.with_initializers(model, params, lora=lora, merge=merge)
    got = _ort(written, {"input": IDS})
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    base = np.asarray(optkit.onnx.to_jax(model, trainable=[])[0]({}, IDS))
    assert np.abs(want - base).max() > 1e-3  # the adapters act
    side_branch = not merge or name.startswith(("int4", "int8", "qdq"))
    assert (len(written.graph.node) > len(model.graph.node)) == side_branch
    if side_branch:  # the base weights bit for bit as they were
        old = {t.name: t.raw_data or numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}
        for t in written.graph.initializer:
            if t.name in old:
                assert (t.raw_data or numpy_helper.to_array(t).tobytes()) == old[t.name], t.name


@pytest.mark.parametrize("merge", [True, False])
def test_a_float16_model_keeps_its_dtype_and_onnx_runtime_agrees(merge):
    model = _mlp(np.float16)
    lora = optkit.onnx.LoRA(2)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    assert all(v.dtype == jnp.float32 for v in params.values())  # float32 adapters on a float16 base
    params = _randomized(params, scale=0.3)
    x = np.random.default_rng(7).normal(size=(4, 6)).astype(np.float16)
    want = np.asarray(apply_fn(params, x))
    assert want.dtype == np.float16
    written = optkit.onnx.with_initializers(model, params, lora=lora, merge=merge)
    assert {t.data_type for t in written.graph.initializer} == {TensorProto.FLOAT16}
    np.testing.assert_allclose(_ort(written, {"x": x}).astype(np.float32), want.astype(np.float32), rtol=1e-2,
                               atol=1e-2)  # float16 rounding, in a different order


def test_the_adapter_term_is_its_formula_at_each_node():
    """x @ W1 + s (x A1) B1, then Gemm: 0.5 * (r @ W2^T + s (r A2) B2) + b, in float64 NumPy."""
    model = _mlp()
    lora = optkit.onnx.LoRA(3, alpha=6)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    p = {k: np.asarray(v, np.float64) for k, v in _randomized(params, scale=0.5).items()}
    x = np.random.default_rng(2).normal(size=(4, 6))
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    s = 2.0
    h = np.maximum(x @ w["W1"] + s * (x @ p["W1.lora_A"]) @ p["W1.lora_B"], 0)
    want = 0.5 * (h @ w["W2"].T + s * (h @ p["W2.lora_A"]) @ p["W2.lora_B"]) + w["b"]
    got = apply_fn({k: jnp.asarray(v, jnp.float32) for k, v in p.items()}, x.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.x64
def test_adapter_gradients_match_central_differences_in_float64():
    apply_fn, params = optkit.onnx.to_jax(_mlp(np.float64), lora=optkit.onnx.LoRA(2, alpha=3))
    params = {k: v.astype(jnp.float64) for k, v in _randomized(params, scale=0.5).items()}
    x = jnp.asarray(np.random.default_rng(3).normal(size=(4, 6)))
    c = jnp.asarray(np.random.default_rng(4).normal(size=(4, 5)))
    loss = lambda p: jnp.sum(apply_fn(p, x) * c)  # noqa: E731
    grads = jax.grad(loss)(params)
    h = 1e-6
    for name, value in params.items():
        flat = np.asarray(value).ravel()
        for i in range(0, flat.size, 3):
            bump = np.zeros_like(flat)
            bump[i] = h
            up = {**params, name: jnp.asarray((flat + bump).reshape(value.shape))}
            down = {**params, name: jnp.asarray((flat - bump).reshape(value.shape))}
            numeric = (loss(up) - loss(down)) / (2 * h)
            np.testing.assert_allclose(np.asarray(grads[name]).ravel()[i], numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name, tx", [("gpt2", optax.adamw(3e-2)), ("int4_llama", optkit.adam(3e-2)),
                                      ("int4_bert", optax.sgd(0.5)), ("int8_llama", optax.adamw(3e-2))])
def test_lora_trains_and_leaves_the_base_unchanged(name, tx):
    model = onnx.load(str(FILES[name]))
    before = onnx.ModelProto()
    before.CopyFrom(model)
    apply_fn, params = optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(4, targets=None))
    target = jnp.asarray(np.random.default_rng(5).normal(size=np.shape(apply_fn(params, IDS))), jnp.float32)

    def loss(p):
        return jnp.mean((apply_fn(p, IDS) - target) ** 2)

    @jax.jit
    def step(p, state):
        value, grads = jax.value_and_grad(loss)(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state, losses = tx.init(params), []
    for _ in range(4):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert losses[-1] < losses[0], losses
    assert model == before  # the caller's model untouched
    base = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = apply_fn.model  # the adapted model holds the base initializers as they were read
    for t in folded.graph.initializer:
        if t.name in base:
            np.testing.assert_array_equal(numpy_helper.to_array(t), base[t.name])


def test_targets_select_weights_by_glob_and_an_unmatched_pattern_lists_them():
    model = onnx.load(str(FILES["bert"]))
    _, params = optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(2, targets=["*query*", "*value*"]))
    queries = [n for n in model.graph.node if n.op_type == "MatMul" and ("query" in n.name or "value" in n.name)]
    assert len(params) == 2 * len({n.input[1] for n in queries}) > 0
    _, both = optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(2, targets="onnx::MatMul_283"))
    assert sorted(both) == ["onnx::MatMul_283.lora_A", "onnx::MatMul_283.lora_B"]
    with pytest.raises(ValueError, match=r"LoRA targets \['\*q_proj\*'\] match no weight.*the weights are"):
        optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(2, targets=["*q_proj*"]))


def test_trainable_adds_named_initializers_beside_the_adapters():
    _, params = optkit.onnx.to_jax(_mlp(), lora=optkit.onnx.LoRA(2), trainable=["b"])
    assert sorted(params) == ["W1.lora_A", "W1.lora_B", "W2.lora_A", "W2.lora_B", "b"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rank": 0}, ValueError, "rank must be a positive integer"),
    ({"rank": 2, "dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
    ({"rank": 2, "alpha": -1}, ValueError, "alpha must be a positive number"),
    ({"rank": 2, "targets": [3]}, TypeError, "targets must be glob patterns"),
])
def test_bad_lora_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        optkit.onnx.LoRA(**kwargs)


def test_with_initializers_needs_the_lora_and_the_original_model():
    model = _mlp()
    apply_fn, params = optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(2))
    with pytest.raises(ValueError, match="pass lora="):
        optkit.onnx.with_initializers(model, params)
    with pytest.raises(ValueError, match="LoRA nodes"):
        optkit.onnx.with_initializers(apply_fn.model, params, lora=apply_fn.lora)
    with pytest.raises(ValueError, match="needs both"):
        optkit.onnx.with_initializers(model, {"W1.lora_A": params["W1.lora_A"]}, lora=apply_fn.lora)


# ---------------------------------------------------------------------------------------------- Flax NNX


@pytest.mark.parametrize("name", ["int4_llama", "int8_llama"])
def test_onnx_module_holds_lora_params_and_nnx_optimizer_trains_only_them(name):
    model = onnx.load(str(FILES[name]))
    module = optkit.onnx.OnnxModule(model, lora=optkit.onnx.LoRA(4), rngs=nnx.Rngs(0, params=1))
    adapters = nnx.state(module, nnx.LoRAParam)
    assert len(jax.tree.leaves(adapters)) == 2 * 15  # A and B of every MatMulNBits (MatMulInteger) weight
    assert all(isinstance(p, nnx.LoRAParam) for p in module.params.values())
    optimizer = nnx.Optimizer(module, optax.adamw(3e-2), wrt=nnx.LoRAParam)
    target = jnp.ones((2, 8, 100), jnp.float32)

    @nnx.jit
    def step(module, optimizer):
        def loss(m):
            return jnp.mean((m(IDS) - target) ** 2)

        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(module)
        optimizer.update(module, grads)
        return value

    losses = [float(step(module, optimizer)) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    written = optkit.onnx.with_initializers(model, module)  # the module brings its LoRA
    want = np.asarray(module(IDS))
    np.testing.assert_allclose(_ort(written, {"input": IDS}), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


# ---------------------------------------------------------------------------------------------- random keys


def _dropout_model():
    """A training-mode Dropout (ratio 0.5) and a RandomNormal, as a model exported in training mode has."""
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="drop"),
             helper.make_node("RandomNormal", [], ["r"], shape=[64], name="noise")]
    inits = [numpy_helper.from_array(np.float32(0.5), "ratio"), numpy_helper.from_array(np.bool_(True), "training")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64]),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, [64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("jit", [False, True])
def test_random_operators_draw_from_the_key_fresh_per_key_and_repeatable(jit):
    apply_fn, params = optkit.onnx.to_jax(_dropout_model())
    run = jax.jit(lambda k: apply_fn(params, x, rng=k)) if jit else (lambda k: apply_fn(params, x, rng=k))
    x = np.ones(64, np.float32)
    a, b, c = run(jax.random.key(1)), run(jax.random.key(1)), run(jax.random.key(2))
    for i in range(2):
        np.testing.assert_array_equal(a[i], b[i])
        assert np.any(np.asarray(a[i]) != np.asarray(c[i]))
    kept = np.asarray(a[0]) != 0
    np.testing.assert_array_equal(np.asarray(a[0])[kept], 2.0)  # scaled by 1 / (1 - ratio)
    assert 16 < kept.sum() < 48
    seeded, again = apply_fn(params, x), apply_fn(params, x)  # without a key: the seed's numbers, every call
    np.testing.assert_array_equal(seeded[0], again[0])
    np.testing.assert_array_equal(run(jax.random.PRNGKey(1))[1], a[1])  # a raw uint32[2] key is the same key
    with pytest.raises(TypeError, match="rng must be a jax.random key"):
        apply_fn(params, x, rng=1)


def test_lora_dropout_uses_the_key_and_is_off_without_one_or_in_eval():
    model = _mlp()
    module = optkit.onnx.OnnxModule(model, lora=optkit.onnx.LoRA(4, dropout=0.5), rngs=nnx.Rngs(0))
    for variable in jax.tree.leaves(nnx.state(module, nnx.LoRAParam), is_leaf=lambda v: isinstance(v, nnx.Variable)):
        variable[...] = jnp.ones_like(variable[...])  # B non-zero: the adapter term shows
    x = np.random.default_rng(6).normal(size=(4, 6)).astype(np.float32)
    first, second = np.asarray(module(x)), np.asarray(module(x))
    assert np.abs(first - second).max() > 1e-3  # a fresh key per call
    np.testing.assert_array_equal(module(x, rngs=nnx.Rngs(dropout=7)), module(x, rngs=nnx.Rngs(dropout=7)))
    module.eval()
    off = np.asarray(module(x))
    np.testing.assert_array_equal(off, module(x))
    apply_fn = module.apply_fn
    values = {k: v[...] for k, v in module.params.items()}
    np.testing.assert_allclose(off, apply_fn(values, x), rtol=1e-6)  # no key: no dropout


@pytest.mark.parametrize("merge", [True, False])
def test_lora_trains_a_float16_export_and_onnx_runtime_runs_it_written_back(merge):
    """The BERT that ONNX Runtime's transformer optimizer fused and converted to float16
    (tests/onnx/models/optimized): adapters on its float16 MatMul weights train, and the written-back model
    (merged into the float16 weights, or as a side branch) gives ONNX Runtime apply_fn's output to two float16
    steps."""
    folder = MODELS / "optimized"
    model = onnx.load(str(folder / "ort_optimized_bert_fp16.onnx"))
    data = np.load(folder / "ort_optimized_bert_fp16.npz")
    feeds = {k: data[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    lora = optkit.onnx.LoRA(4, alpha=8)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    weights = {t.name: t for t in model.graph.initializer}
    assert params and all(weights[k.rsplit(".lora_", 1)[0]].data_type == TensorProto.FLOAT16 for k in params)
    target = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 32)), jnp.float32)
    tx = optax.adamw(1e-2)

    @jax.jit
    def step(p, state):
        value, grads = jax.value_and_grad(lambda q: jnp.mean((apply_fn(q, feeds).astype(jnp.float32) - target) ** 2))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state, losses = tx.init(params), []
    for _ in range(4):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert losses[-1] < losses[0], losses
    want = np.asarray(apply_fn(params, feeds), np.float32)
    got = _ort(optkit.onnx.with_initializers(model, params, lora=lora, merge=merge), feeds).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 2.0 ** -10 * np.abs(want).max())
