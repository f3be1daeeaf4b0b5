"""Generate text with a language model that onnxruntime-genai's model builder wrote, through ``to_jax``.

The model is ``tests/onnx/models/genai/llama_int4`` (``--model`` for another builder folder:
``llama_fp32``, ``qwen2_*``, ``phi3_*``): a tiny LLaMA with random weights that the builder turned into
ONNX with 4-bit ``MatMulNBits`` weights and ONNX Runtime's ``GroupQueryAttention`` with a KV cache
(tests/onnx/models/make_genai.py; its tokenizer was trained there on ``textwrap``'s source). The model is
random, so the text is noise; what matters is that every token is ONNX Runtime's.

:func:`optkit.onnx.to_jax` gives ``apply_fn(params, input_ids, attention_mask, *past_key_values)``, which
returns the logits and the present cache. Greedy decoding keeps the cache in fixed buffers of the
model's context length: the attention mask is padded with zeros to that length, so the graph's total
sequence length (computed from the mask's shape) never changes and ``jax.jit`` compiles twice, once for
the prompt and once for every decode step. ONNX Runtime decodes the same prompt with its own growing
cache, and onnxruntime-genai too when it is installed; the tokens must agree.

Run from the repository root::

    python examples/onnx_llm.py                        # a few seconds on 2 CPU cores
    python examples/onnx_llm.py --model tests/onnx/models/genai/qwen2_fp32 --tokens 24
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "tests" / "onnx" / "models" / "genai" / "llama_int4"


class Decoder:
    """What greedy decoding needs to know of a builder folder: its ``genai_config.json`` (cache layout,
    context length) and its tokenizer (``tokenizers``, which reads the builder's ``tokenizer.json``)."""

    def __init__(self, folder: pathlib.Path) -> None:
        from tokenizers import Tokenizer

        config = json.loads((folder / "genai_config.json").read_text())["model"]
        decoder = config["decoder"]
        self.folder = folder
        self.path = folder / decoder["filename"]
        self.layers, self.kv_heads = decoder["num_hidden_layers"], decoder["num_key_value_heads"]
        self.head, self.context = decoder["head_size"], config["context_length"]
        names, outputs = decoder["inputs"], decoder["outputs"]
        self.pasts = [names[f"past_{kind}_names"] % i for kind in ("key", "value") for i in range(self.layers)]
        self.presents = [outputs[f"present_{kind}_names"] % i for kind in ("key", "value")
                         for i in range(self.layers)]  # the present of each past, in the same order
        self.logits = outputs["logits"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def cache(self, batch: int, length: int) -> dict[str, np.ndarray]:
        """Empty past key/value buffers of ``length`` positions, by input name."""
        return {name: np.zeros((batch, self.kv_heads, length, self.head), np.float32) for name in self.pasts}


def greedy_jax(decoder: Decoder, apply_fn, params, prompt: np.ndarray, tokens: int) -> np.ndarray:
    """``tokens`` greedy tokens after ``prompt`` (batch x length int64) from ``apply_fn`` under ``jax.jit``,
    the cache in buffers of the context length (the mask padded with zeros to it)."""
    batch, length = prompt.shape
    if length + tokens > decoder.context:
        raise ValueError(f"{length} prompt tokens and {tokens} new ones exceed the context of {decoder.context}")
    step = jax.jit(apply_fn)
    cache = decoder.cache(batch, decoder.context)
    mask = np.zeros((batch, decoder.context), np.int64)
    mask[:, :length] = 1
    ids, out = prompt, []
    for _ in range(tokens):
        results = dict(zip(apply_fn.outputs, step(params, {"input_ids": ids, "attention_mask": mask, **cache})))
        ids = np.asarray(jnp.argmax(results[decoder.logits][:, -1], axis=-1), np.int64)[:, None]
        out.append(ids)
        # present.*: the same buffers with the new positions written
        cache = {past: results[present] for past, present in zip(decoder.pasts, decoder.presents)}
        mask[:, int(mask[0].sum())] = 1
    return np.concatenate(out, axis=1)


def greedy_onnx_runtime(decoder: Decoder, prompt: np.ndarray, tokens: int, adapter: pathlib.Path | None = None
                        ) -> np.ndarray:
    """The same greedy decoding by ONNX Runtime, its cache growing by one position a step; ``adapter``: an
    ``.onnx_adapter`` file active in every run (``RunOptions.add_active_adapter``)."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    if adapter is not None:
        lora = onnxruntime.LoraAdapter()
        lora.Load(str(adapter))
        options.add_active_adapter(lora)
    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3  # (adapter inputs with defaults: ONNX Runtime warns of each)
    session = onnxruntime.InferenceSession(str(decoder.path), session_options, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **decoder.cache(len(prompt), 0)}
    names = [o.name for o in session.get_outputs()]
    out = []
    for _ in range(tokens):
        results = dict(zip(names, session.run(None, feeds, options)))
        ids = results[decoder.logits][:, -1].argmax(-1).astype(np.int64)[:, None]
        out.append(ids)
        feeds = {"input_ids": ids, "attention_mask": np.concatenate([feeds["attention_mask"], np.ones_like(ids)], 1)}
        feeds.update({past: results[present] for past, present in zip(decoder.pasts, decoder.presents)})
    return np.concatenate(out, axis=1)


def greedy_genai(folder: pathlib.Path, prompt: np.ndarray, tokens: int, adapter: pathlib.Path | None = None
                 ) -> np.ndarray | None:
    """onnxruntime-genai's own greedy generation (None when it is not installed); ``adapter``: an
    ``.onnx_adapter`` file loaded into ``og.Adapters`` and made each generator's active one."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt.shape[1] + tokens)
    adapters, name = None, adapter.stem if adapter is not None else ""
    if adapter is not None:
        adapters = og.Adapters(model)
        adapters.load(str(adapter), name)
    out = []
    for row in prompt:
        generator = og.Generator(model, params)
        if adapters is not None:
            generator.set_active_adapter(adapters, name)
        generator.append_tokens(row.astype(np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        out.append(np.asarray(generator.get_sequence(0))[prompt.shape[1]:])
    return np.stack(out).astype(np.int64)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, default=DEFAULT_MODEL, help="an onnxruntime-genai builder folder")
    parser.add_argument("--prompt", default="def wrap(text, width=70):", help="the text to continue")
    parser.add_argument("--tokens", type=int, default=16, help="how many tokens to generate")
    args = parser.parse_args(argv)

    import optkit.onnx

    decoder = Decoder(args.model)
    prompt = np.asarray([decoder.tokenizer.encode(args.prompt).ids], np.int64)
    start = time.perf_counter()
    apply_fn, params = optkit.onnx.to_jax(str(decoder.path))
    tokens = greedy_jax(decoder, apply_fn, params, prompt, args.tokens)
    seconds = time.perf_counter() - start
    text = decoder.tokenizer.decode(tokens[0].tolist())
    print(f"{args.model.name}: {prompt.shape[1]} prompt tokens, {args.tokens} generated in {seconds:.1f} s "
          f"(load, two compiles and the steps)")
    print(f"  {args.prompt!r} -> {text!r}")
    result = {"tokens": tokens, "text": text, "seconds": seconds, "prompt": prompt}
    try:
        result["ort_tokens"] = greedy_onnx_runtime(decoder, prompt, args.tokens)
    except ImportError:
        print("  (onnxruntime is not installed: no comparison)")
    else:
        same = np.array_equal(result["ort_tokens"], tokens)
        print(f"  ONNX Runtime's greedy tokens: {'the same' if same else 'DIFFERENT: ' + str(result['ort_tokens'])}")
    genai = greedy_genai(args.model, prompt, args.tokens)
    if genai is not None:
        result["genai_tokens"] = genai
        print(f"  onnxruntime-genai's tokens: {'the same' if np.array_equal(genai, tokens) else 'DIFFERENT'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
