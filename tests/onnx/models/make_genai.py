"""Language models written by onnxruntime-genai's model builder, for tests/onnx/files/test_genai.py and the examples.

Tiny random-weight LLaMA, Qwen2 and Phi-3 configs (hidden 32, 2 query heads sharing 1 key/value head of 16,
2 layers), a byte-level BPE tokenizer trained here on ``textwrap``'s source (``tokenizers``; nothing is
downloaded), saved with ``save_pretrained`` and turned into ONNX by ``python -m onnxruntime_genai.models.builder
-e cpu`` at fp32 and int4 (``MatMulNBits``, ``accuracy_level=4``): ``genai/<family>_<precision>/`` holds the
builder's ``model.onnx``, its external data, ``genai_config.json`` and the tokenizer. ``outputs.npz`` beside it
holds ONNX Runtime's logits and presents for a prompt of 2 x 5 tokens and for one decode step with the cache
(``feeds:`` and ``prefill:``/``decode:`` keys), and ``versions.json`` the versions.

The builder wants torch, transformers 5 and onnxruntime-genai, which optkit does not depend on; make the files
in an environment of their own (``pip install torch transformers onnxruntime-genai onnxruntime``)::

    python tests/onnx/models/make_genai.py
"""

from __future__ import annotations

import inspect
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "genai"
FAMILIES = ("llama", "qwen2", "phi3")
PRECISIONS = ("fp32", "int4")
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 64}


def tokenizer():
    """A byte-level BPE of 256 tokens plus 3 special ones, trained on ``textwrap``'s source."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([inspect.getsource(textwrap)], trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def config(family: str, vocab: int):
    import transformers

    kind = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "phi3": transformers.Phi3Config}[family]
    extra = {"original_max_position_embeddings": SHAPE["max_position_embeddings"]} if family == "phi3" else {}
    # (Phi-3 with a longer context than it was trained on would be the builder's LongRoPE variant)
    return kind(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                **SHAPE, **extra)


def reference_outputs(folder: pathlib.Path) -> None:
    """ONNX Runtime's outputs for a prompt and one decode step, saved as ``folder/outputs.npz``."""
    import onnx
    import onnxruntime

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    batch, length = 2, 5
    vocab = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim][-1]
    feeds = {"input_ids": rng.integers(3, vocab, (batch, length)).astype(np.int64),
             "attention_mask": np.ones((batch, length), np.int64)}
    for i in model.graph.input:
        if i.name.startswith("past_key_values"):
            kv_heads, head = SHAPE["num_key_value_heads"], SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
            feeds[i.name] = np.zeros((batch, kv_heads, 0, head), np.float32)
    names = [o.name for o in model.graph.output]
    prefill = dict(zip(names, session.run(None, feeds)))
    step = {"input_ids": rng.integers(3, vocab, (batch, 1)).astype(np.int64),
            "attention_mask": np.ones((batch, length + 1), np.int64)}
    step.update({n.replace("present", "past_key_values"): v for n, v in prefill.items() if n.startswith("present")})
    decode = dict(zip(names, session.run(None, step)))
    np.savez(folder / "outputs.npz", **{f"feeds:{k}": v for k, v in feeds.items()},
             **{f"step:{k}": v for k, v in step.items()},
             **{f"prefill:{k}": v for k, v in prefill.items()}, **{f"decode:{k}": v for k, v in decode.items()})


def main() -> None:
    import onnxruntime
    import onnxruntime_genai
    import torch
    import transformers

    torch.manual_seed(0)
    tok = tokenizer()
    OUT.mkdir(exist_ok=True)
    made = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            source = pathlib.Path(tmp) / family
            model = transformers.AutoModelForCausalLM.from_config(config(family, len(tok))).eval()
            model.save_pretrained(source)
            tok.save_pretrained(source)
            for precision in PRECISIONS:
                folder = OUT / f"{family}_{precision}"
                shutil.rmtree(folder, ignore_errors=True)
                subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
                                "-o", str(folder), "-p", precision, "-e", "cpu",
                                "-c", str(pathlib.Path(tmp) / "cache")], check=True, capture_output=True)
                reference_outputs(folder)
                made[folder.name] = sorted(p.name for p in folder.iterdir())
    (OUT / "versions.json").write_text(json.dumps(
        {"onnxruntime-genai": onnxruntime_genai.__version__, "onnxruntime": onnxruntime.__version__,
         "transformers": transformers.__version__, "torch": torch.__version__, "shape": SHAPE, "files": made},
        indent=1, sort_keys=True) + "\n")
    print(json.dumps(made, indent=1))


if __name__ == "__main__":
    main()
