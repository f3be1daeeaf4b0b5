"""Files that Optimum's ONNX exporter and its ONNX Runtime optimizer write, for tests/onnx/files/test_optimum.py.

Tiny random-weight GPT-2, LLaMA, T5 and BERT configs (hidden 32, 2 layers) built with transformers and saved with
``save_pretrained`` (nothing downloaded), exported by ``optimum-cli export onnx`` (GPT-2 and LLaMA as
``text-generation-with-past``: ``past_key_values.*`` in, ``present.*`` out; T5 as ``text2text-generation-with-past``:
its encoder and the merged decoder, whose ``If`` on ``use_cache_branch`` has branches of different shapes; BERT as
``feature-extraction``), and BERT and LLaMA also through ``optimum-cli onnxruntime optimize -O3`` (ONNX Runtime's
fusions: ``Attention``, ``FastGelu``, ``SkipLayerNormalization``; ``QuickGelu``, ``SkipSimplifiedLayerNormalization``).
``optimum/<name>.onnx`` and ``<name>.npz``: the feeds of a prompt (``prompt:``) and, for the decoders, of one step
with a cache of 3 positions (``step:``), with ONNX Runtime's outputs (``out:<phase>:<output>``); ``versions.json``
the versions. optimum-onnx wants transformers < 4.58, which the other scripts' tools do not: make the files in an
environment of their own (``pip install "transformers<4.58" optimum-onnx onnxruntime torch``)::

    python tests/onnx/models/make_optimum.py
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "optimum"
# name: (family, task, file the exporter writes, optimized with -O3)
FILES = {
    "gpt2": ("gpt2", "text-generation-with-past", "model.onnx", False),
    "llama": ("llama", "text-generation-with-past", "model.onnx", False),
    "llama_o3": ("llama", "text-generation-with-past", "model.onnx", True),
    "bert_o3": ("bert", "feature-extraction", "model.onnx", True),
    "t5_encoder": ("t5", "text2text-generation-with-past", "encoder_model.onnx", False),
    "t5_decoder_merged": ("t5", "text2text-generation-with-past", "decoder_model_merged.onnx", False),
}


def models():
    import transformers

    return {
        "gpt2": (transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4),
                 transformers.GPT2LMHeadModel),
        "llama": (transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
                  transformers.LlamaForCausalLM),
        "t5": (transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                     num_heads=4, decoder_start_token_id=0), transformers.T5ForConditionalGeneration),
        "bert": (transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64), transformers.BertModel),
    }


def feeds(model, past: int, rng, batch: int = 2, length: int = 5) -> dict[str, np.ndarray]:
    """Feeds for each graph input by its name: ids, masks and a cache of ``past`` positions (0: empty)."""
    out = {}
    for value in model.graph.input:
        dims = [d.dim_value or None for d in value.type.tensor_type.shape.dim]
        name = value.name
        if name in ("input_ids", "decoder_input_ids"):
            out[name] = rng.integers(0, 100, (batch, 1 if past else length)).astype(np.int64)  # a step: one token
        elif name == "attention_mask":
            out[name] = np.ones((batch, (past + 1) if past else length), np.int64)
        elif name == "encoder_attention_mask":
            out[name] = np.ones((batch, length), np.int64)
        elif name == "token_type_ids":
            out[name] = np.zeros((batch, length), np.int64)
        elif name == "position_ids":
            out[name] = (np.tile(np.arange(past, past + 1), (batch, 1)) if past
                         else np.tile(np.arange(length), (batch, 1))).astype(np.int64)
        elif name == "use_cache_branch":
            out[name] = np.array([past > 0])
        elif name == "encoder_hidden_states":
            out[name] = rng.normal(size=(batch, length, dims[2])).astype(np.float32)
        elif name.startswith("past_key_values"):
            cached = length if ".encoder." in name else past
            out[name] = rng.normal(size=(batch, dims[1], cached, dims[3])).astype(np.float32)
        else:
            raise ValueError(f"no feed for input {name!r}")
    return out


def main() -> None:
    import onnx
    import onnxruntime
    import torch
    import transformers

    torch.manual_seed(0)
    OUT.mkdir(exist_ok=True)
    made = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for family, (config, kind) in models().items():
            kind(config).eval().save_pretrained(tmp / f"src_{family}")
        exported = {}
        for name, (family, task, filename, optimize) in FILES.items():
            folder = tmp / f"export_{family}"
            if family not in exported:
                subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model",
                                str(tmp / f"src_{family}"), "--task", task, str(folder)], check=True,
                               capture_output=True)
                exported[family] = folder
            source = folder / filename
            if optimize:
                optimized = tmp / f"o3_{family}"
                subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "onnxruntime", "optimize",
                                "--onnx_model", str(folder), "-O3", "-o", str(optimized)], check=True,
                               capture_output=True)
                source = optimized / filename.replace(".onnx", "_optimized.onnx")
            target = OUT / f"{name}.onnx"
            shutil.copy(source, target)
            model = onnx.load(str(target))
            session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(0)
            saved = {}
            phases = {"prompt": 0}
            if any(i.name.startswith("past_key_values") for i in model.graph.input):
                phases["step"] = 3
            for phase, past in phases.items():
                given = feeds(model, past, rng)
                saved.update({f"{phase}:{k}": v for k, v in given.items()})
                for output, value in zip(session.get_outputs(), session.run(None, given)):
                    saved[f"out:{phase}:{output.name}"] = value
            np.savez(OUT / f"{name}.npz", **saved)
            made[name] = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node
                                 if n.domain not in ("", "ai.onnx")} | {"phases:" + ",".join(phases)})
    (OUT / "versions.json").write_text(json.dumps(
        {"optimum-onnx": importlib.metadata.version("optimum-onnx"), "onnxruntime":
         onnxruntime.__version__, "onnx": onnx.__version__, "torch": torch.__version__,
         "transformers": transformers.__version__, "files": made}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(made, indent=1))


if __name__ == "__main__":
    main()
