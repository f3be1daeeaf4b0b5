"""LoRA adapters as ONNX Runtime serves them: ``with_adapter_inputs`` (a base model with adapter inputs),
``export_adapters`` (``.onnx_adapter`` files), ``with_adapter_inputs_folder`` (onnxruntime-genai's folders).

Expectations from the real runtimes: ONNX Runtime with each adapter file active (``RunOptions.add_active_adapter``)
gives ``apply_fn`` of that adapter's params; with none active, the export's own outputs; onnxruntime-genai's
greedy generation with an adapter (``Adapters``, ``Generator.set_active_adapter``) gives JAX's greedy tokens.
Bases: the committed torch.onnx exports (GPT-2 dynamo: Gemm; BERT TorchScript and LLaMA dynamo: MatMul), their
int8 (``quantize_dynamic``: MatMulInteger; ``quantize_static``: QDQ) and int4 (``MatMulNBitsQuantizer``) twins,
Optimum's LLaMA and GPT-2, the GenAI builder's LLaMA and Phi-3 folders (fp32 and int4: MatMulNBits) and its Phi-3
through ``quantize_dynamic``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax  # noqa: E402
import onnx  # noqa: E402
from flax import nnx  # noqa: E402
from onnx import TensorProto, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.api.test_lora import FILES, IDS, MODELS, _mlp, _randomized  # noqa: E402

BASES = {**FILES, "llama": MODELS / "torch_dynamo_llama.onnx", "optimum_llama": MODELS / "optimum" / "llama.onnx",
         "optimum_gpt2": MODELS / "optimum" / "gpt2.onnx",
         "int4_gpt2": MODELS / "quantized" / "ort_int4_gpt2.onnx",  # (its Gemms float, its head MatMulNBits)
         "int8_phi3": MODELS / "quantized" / "ort_int8_phi3.onnx",
         **{f"genai_{n}": MODELS / "genai" / n / "model.onnx" for n in ("llama_fp32", "phi3_fp32", "phi3_int4")}}


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # (an initializer that is also an input: ONNX Runtime warns, as for Olive's)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(session, feeds, *adapters):
    options = ort.RunOptions()
    for path in adapters:
        adapter = ort.LoraAdapter()
        adapter.Load(str(path))
        options.add_active_adapter(adapter)
    return session.run(None, feeds, options)[0]


def _feeds(name, model):
    """The saved prompt step of a decoder (its past empty), or the token ids."""
    if name.startswith("optimum_"):
        data, key = np.load(BASES[name].with_suffix(".npz")), "prompt:{}"
    elif name.startswith("genai_"):
        data, key = np.load(BASES[name].parent / "outputs.npz"), "feeds:{}"
    elif name == "int8_phi3":
        data, key = np.load(BASES[name].with_suffix(".npz")), "{}"
    else:
        return {model.graph.input[0].name: IDS}
    return {i.name: data[key.format(i.name)] for i in model.graph.input}


def _close(got, want, rtol=2e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


QUICK = {"gpt2", "int4_llama", "int8_phi3"}  # a float Gemm, a 4-bit and an 8-bit base in the quick tier


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in sorted(BASES)])
def test_onnx_runtime_gives_each_adapters_outputs_and_the_exports_with_none(name, tmp_path):
    model = onnx.load(str(BASES[name]))
    lora = optkit.onnx.LoRA(4, alpha=8)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    feeds = _feeds(name, model)
    base = optkit.onnx.with_adapter_inputs(model, lora)
    if not name.startswith(("genai_", "int8_phi3")):  # (the builder writes ORT's SimplifiedLayerNormalization in
        onnx.checker.check_model(base)                  # ONNX's domain, which onnx.checker refuses in the export too)
    session = _session(base)
    np.testing.assert_array_equal(_run(session, feeds), _session(model).run(None, feeds)[0])  # none active
    outputs = []
    for seed in (0, 1):  # two fine-tunes on one base, switched per run
        trained = _randomized(params, seed)
        path = optkit.onnx.export_adapters(model, trained, lora, tmp_path / f"{seed}.onnx_adapter")
        want = apply_fn(trained, *feeds.values())
        want = np.asarray(want[0] if isinstance(want, tuple) else want)
        outputs.append(_run(session, feeds, path))
        _close(outputs[-1], want)
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-2  # each adapter its own outputs
    old = {t.name: t.raw_data or numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}
    for t in base.graph.initializer:  # the base weights bit for bit
        if t.name in old:
            assert (t.raw_data or numpy_helper.to_array(t).tobytes()) == old[t.name], t.name


def test_input_names_follow_olive_and_a_float_adapter_serves_the_quantized_base(tmp_path):
    """Olive's convention: the reading node's module path (TorchScript, Optimum, the GenAI builder), or the
    parameter the dynamo exporter kept; quantize_dynamic's twin gets the float model's names, so an adapter file
    trained on the float GPT-2 runs on its int8 base (within the int8 base's own difference)."""
    lora = optkit.onnx.LoRA(4)
    names = optkit.onnx.adapter_input_names(str(BASES["optimum_llama"]), lora)
    assert names["onnx::MatMul_733.lora_A"] == "model.layers.0.self_attn.q_proj.lora_A.weight"
    assert names["onnx::MatMul_733.lora_B"] == "model.layers.0.self_attn.q_proj.lora_B.weight"
    genai = optkit.onnx.adapter_input_names(str(MODELS / "genai" / "llama_int4" / "model.onnx"), lora)
    assert genai["model.layers.1.mlp.down_proj.MatMul.weight_Q4.lora_A"] == "model.layers.1.mlp.down_proj.lora_A.weight"
    float_names = optkit.onnx.adapter_input_names(str(FILES["gpt2"]), lora)
    int8_names = optkit.onnx.adapter_input_names(str(FILES["int8_gpt2"]), lora)
    assert sorted(float_names.values()) == sorted(int8_names.values())
    assert "model.transformer.h.0.attn.c_attn.lora_A.weight" in float_names.values()
    gpt2, int8 = onnx.load(str(FILES["gpt2"])), onnx.load(str(FILES["int8_gpt2"]))
    apply_fn, params = optkit.onnx.to_jax(gpt2, lora=lora)
    trained = _randomized(params)
    path = optkit.onnx.export_adapters(gpt2, trained, lora, tmp_path / "gpt2.onnx_adapter")
    on_int8 = _run(_session(optkit.onnx.with_adapter_inputs(int8, lora)), {"input": IDS}, path)
    shift = np.asarray(apply_fn(trained, IDS)) - np.asarray(apply_fn({k: 0 * v for k, v in trained.items()}, IDS))
    base_gap = np.abs(_session(int8).run(None, {"input": IDS})[0] - _session(gpt2).run(None, {"input": IDS})[0]).max()
    int8_shift = on_int8 - _session(int8).run(None, {"input": IDS})[0]
    assert np.abs(int8_shift - shift).max() < 4 * base_gap + 1e-4  # the adapter moves the int8 base as the float one


def test_the_branch_is_the_lora_formula_with_gemms_alpha_and_transb_in_float64_numpy(tmp_path):
    """x @ W1 + (x A1) (s B1), then Gemm: 0.5 * (r @ W2^T + (r A2) (s B2)) + b; s = alpha / rank in the file."""
    model = _mlp(np.float64)
    lora = optkit.onnx.LoRA(2, alpha=6)
    _, params = optkit.onnx.to_jax(model, lora=lora)
    trained = {k: np.asarray(v, np.float64) for k, v in _randomized(params, scale=0.5).items()}
    path = optkit.onnx.export_adapters(model, trained, lora, tmp_path / "mlp.onnx_adapter")
    stored = _read(path)
    assert stored["up.lora_A.weight"].dtype == np.float64
    np.testing.assert_array_equal(stored["up.lora_B.weight"], 3.0 * trained["W1.lora_B"])
    x = np.random.default_rng(3).normal(size=(4, 6))
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = np.maximum(x @ w["W1"] + 3.0 * (x @ trained["W1.lora_A"]) @ trained["W1.lora_B"], 0)
    want = 0.5 * (h @ w["W2"].T + 3.0 * (h @ trained["W2.lora_A"]) @ trained["W2.lora_B"]) + w["b"]
    got = _run(_session(optkit.onnx.with_adapter_inputs(model, lora)), {"x": x}, path)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _read(path):
    """The file's tensors as NumPy copies (the OrtValues live only as long as the adapter that mapped them)."""
    adapter = ort.AdapterFormat.read_adapter(str(path))
    return {name: np.array(value.numpy()) for name, value in adapter.get_parameters().items()}


def test_a_float16_base_takes_float16_adapters_and_adapters_of_any_rank(tmp_path):
    model = _mlp(np.float16)
    base = optkit.onnx.with_adapter_inputs(model, optkit.onnx.LoRA(2))
    inputs = {i.name: i for i in base.graph.input}
    a = inputs["up.lora_A.weight"].type.tensor_type
    assert a.elem_type == TensorProto.FLOAT16 and [d.dim_value or d.dim_param for d in a.shape.dim] == [6, "lora_r"]
    session = _session(base)
    x = np.random.default_rng(7).normal(size=(4, 6)).astype(np.float16)
    for rank in (2, 6):  # one base, adapters of other ranks and alphas (lora_r is symbolic, the scale is in B)
        lora = optkit.onnx.LoRA(rank, alpha=3 * rank)
        apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
        trained = _randomized(params, seed=rank, scale=0.3)
        path = optkit.onnx.export_adapters(model, trained, lora, tmp_path / f"r{rank}.onnx_adapter")
        assert {v.dtype for v in _read(path).values()} == {np.dtype(np.float16)}
        np.testing.assert_allclose(_run(session, {"x": x}, path).astype(np.float32),
                                   np.asarray(apply_fn(trained, x)).astype(np.float32), rtol=1e-2, atol=1e-2)


def test_an_onnx_modules_adapters_export_as_its_dict(tmp_path):
    model = onnx.load(str(FILES["int4_llama"]))
    lora = optkit.onnx.LoRA(4)
    module = optkit.onnx.OnnxModule(model, lora=lora, rngs=nnx.Rngs(0, params=1))
    for variable in jax.tree.leaves(nnx.state(module, nnx.LoRAParam), is_leaf=lambda v: isinstance(v, nnx.Variable)):
        variable[...] = variable[...] + 0.05
    path = optkit.onnx.export_adapters(model, module, lora, tmp_path / "module.onnx_adapter")
    _close(_run(_session(optkit.onnx.with_adapter_inputs(model, lora)), {"input": IDS}, path), np.asarray(module(IDS)))


def test_bad_arguments_are_refused_by_name(tmp_path):
    model = _mlp()
    lora = optkit.onnx.LoRA(2)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    target = tmp_path / "x.onnx_adapter"
    with pytest.raises(ValueError, match="'b'.*not adapters"):
        optkit.onnx.export_adapters(model, {**params, "b": np.zeros(5, np.float32)}, lora, target)
    with pytest.raises(ValueError, match="needs both 'W1.lora_A' and 'W1.lora_B'"):
        optkit.onnx.export_adapters(model, {"W1.lora_A": params["W1.lora_A"]}, lora, target)
    with pytest.raises(ValueError, match=r"rank 3 on 'W1' needs \(6, 3\)"):
        optkit.onnx.export_adapters(model, params, optkit.onnx.LoRA(3), target)
    with pytest.raises(ValueError, match="no adapter"):
        optkit.onnx.export_adapters(model, {}, lora, target)
    with pytest.raises(ValueError, match="optkit's LoRA nodes"):
        optkit.onnx.with_adapter_inputs(apply_fn.model, lora)
    with pytest.raises(ValueError, match="match no weight"):
        optkit.onnx.with_adapter_inputs(model, optkit.onnx.LoRA(2, targets=["*q_proj*"]))
    with pytest.raises(FileNotFoundError, match="genai_config.json"):
        optkit.onnx.with_adapter_inputs_folder(tmp_path, tmp_path / "out", lora)
    folder = MODELS / "genai" / "llama_fp32"
    with pytest.raises(ValueError, match="another folder"):
        optkit.onnx.with_adapter_inputs_folder(folder, folder, lora)
    assert not target.exists()


def test_the_genai_folder_copy_has_the_builders_files_and_follows_no_link(tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(MODELS / "genai" / "llama_fp32", folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the model's")
    (folder / "link.txt").symlink_to(secret)
    out = optkit.onnx.with_adapter_inputs_folder(folder, tmp_path / "out", optkit.onnx.LoRA(2))
    assert sorted(p.name for p in out.iterdir()) == ["genai_config.json", "model.onnx", "model.onnx.data",
                                                     "outputs.npz", "tokenizer.json", "tokenizer_config.json"]
    written = onnx.load(str(out / "model.onnx"))  # its external data beside it
    assert {i.name for i in written.graph.input} >= {"model.layers.0.attn.qkv_proj.lora_A.weight"}


def test_a_name_taken_by_the_model_is_refused():
    model = _mlp()
    model.graph.node[0].name = "/net/up/MatMul"
    model.graph.node[1].output[0] = "net.up.lora_A.weight"
    model.graph.node[2].input[0] = "net.up.lora_A.weight"
    with pytest.raises(ValueError, match="'net.up.lora_A.weight' for 'W1' is already a tensor"):
        optkit.onnx.with_adapter_inputs(model, optkit.onnx.LoRA(2))


# ---------------------------------------------------------------------------------------------- onnxruntime-genai


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_int4", "phi3_int4", "phi3_fp32"])
def test_genai_generates_with_each_adapter_as_jax_and_as_the_builder_with_none(name, tmp_path):
    og = pytest.importorskip("onnxruntime_genai")
    from examples.onnx_llm import Decoder, greedy_genai, greedy_jax

    folder = MODELS / "genai" / name
    decoder = Decoder(folder)
    model = onnx.load(str(decoder.path))
    lora = optkit.onnx.LoRA(4, alpha=8)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    out = optkit.onnx.with_adapter_inputs_folder(folder, tmp_path / name, lora)
    assert json.loads((out / "genai_config.json").read_text()) == json.loads((folder / "genai_config.json").read_text())
    prompt = np.array([[5, 17, 33, 60, 9]], np.int64)
    genai = og.Model(str(out))
    adapters = og.Adapters(genai)
    wanted = {}
    for seed in (0, 1):
        trained = _randomized(params, seed, scale=0.3)
        adapters.load(str(optkit.onnx.export_adapters(model, trained, lora, tmp_path / f"{seed}.onnx_adapter")),
                      f"tune{seed}")
        wanted[f"tune{seed}"] = greedy_jax(decoder, apply_fn, trained, prompt, 10)[0]
    assert not np.array_equal(wanted["tune0"], wanted["tune1"])
    search = og.GeneratorParams(genai)
    search.set_search_options(do_sample=False, max_length=prompt.shape[1] + 10)
    for active in (None, "tune0", "tune1"):
        generator = og.Generator(genai, search)
        if active:
            generator.set_active_adapter(adapters, active)
        generator.append_tokens(prompt[0].astype(np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        got = np.asarray(generator.get_sequence(0))[prompt.shape[1]:]
        want = wanted[active] if active else greedy_genai(folder, prompt, 10)[0]
        np.testing.assert_array_equal(got, want, err_msg=str(active))
    shutil.rmtree(out)
