"""Two LoRA fine-tunes of one 4-bit language model, shipped as ONNX Runtime adapter files and switched per request.

The model is ``tests/onnx/models/genai/llama_int4`` (``--model`` for another onnxruntime-genai builder folder):
a tiny LLaMA with random weights, its matmul weights 4-bit ``MatMulNBits`` blocks (tests/onnx/models/make_genai.py).
Two adapters are trained from the same start on two texts that ship with Python: the source of the ``textwrap``
module (code) and the help topics of ``pydoc_data`` (prose), next-token prediction with ``optax.adamw``.

Then, instead of one merged model per fine-tune:

- :func:`optkit.onnx.with_adapter_inputs_folder` writes the builder folder once more, its model taking each
  adapted weight's ``A`` and ``B`` as graph inputs (named as Olive names them, e.g.
  ``model.layers.0.attn.qkv_proj.lora_A.weight``; empty by default, so with no adapter it is the base model);
- :func:`optkit.onnx.export_adapters` writes each fine-tune as a small ``.onnx_adapter`` file;
- ONNX Runtime runs the one base with either file active (``RunOptions.add_active_adapter``), and so does
  onnxruntime-genai when it is installed (``og.Adapters``, ``generator.set_active_adapter``).

Each adapter lowers the held-out loss of its own text more than the other's; ONNX Runtime's logits with an adapter
active equal ``apply_fn``'s with that adapter's params, and the greedy tokens of ONNX Runtime, onnxruntime-genai and
JAX agree.

Run from the repository root::

    python examples/onnx_adapters.py                  # about 25 s on 2 CPU cores
    python examples/onnx_adapters.py --steps 200 --rank 16
"""

from __future__ import annotations

import inspect
import pathlib
import shutil
import sys
import textwrap

import numpy as np
import optax
from tqdm import tqdm

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from examples.onnx_llm import Decoder, greedy_genai, greedy_jax, greedy_onnx_runtime  # noqa: E402
from examples.onnx_lora import lora_parser, next_token_training, windows  # noqa: E402


def texts() -> dict[str, str]:
    """The two corpora, both part of every Python installation."""
    import pydoc_data.topics

    prose = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))[:60_000]
    return {"textwrap": inspect.getsource(textwrap), "pydoc": prose}


def main(argv: list[str] | None = None) -> dict:
    parser = lora_parser(__doc__.splitlines()[0], 200, "onnx_adapters",
                         "where the base folder and the adapter files are written")
    args = parser.parse_args(argv)

    import onnx

    import optkit.onnx

    decoder = Decoder(args.model)
    data = {}
    for name, text in texts().items():
        cut = windows(np.asarray(decoder.tokenizer.encode(text).ids), args.length)
        data[name] = (np.delete(cut, np.s_[::10], axis=0), cut[::10])  # every 10th window held out
        print(f"{name}: {len(cut)} windows of {args.length} tokens, {len(data[name][1])} held out")

    model = onnx.load(str(decoder.path))
    lora = optkit.onnx.LoRA(args.rank, alpha=2 * args.rank)
    apply_fn, start = optkit.onnx.to_jax(model, lora=lora)

    tx = optax.adamw(args.lr)
    step, evaluate = next_token_training(apply_fn, decoder, tx)
    tuned, rng = {}, np.random.default_rng(0)
    for name, (train, _) in data.items():  # each adapter from the same start, on its own text
        params, state = start, tx.init(start)
        with tqdm(range(args.steps), desc=f"LoRA on {name}", unit="step") as bar:
            for _ in bar:
                params, state, loss = step(params, state, train[rng.integers(0, len(train), args.batch)])
                bar.set_postfix(loss=f"{float(loss):.3f}", refresh=False)
        tuned[name] = params
    losses = {(a, t): float(evaluate(p, data[t][1])) for a, p in [("none", start), *tuned.items()] for t in data}
    print("held-out next-token loss (rows: adapter, columns: text)")
    print("  " + "".join(f"{t:>12}" for t in data))
    for a in ("none", *tuned):
        print(f"  {a:<8}" + "".join(f"{losses[a, t]:12.3f}" for t in data))

    # One base with adapter inputs, and one small file per fine-tune.
    shutil.rmtree(args.out, ignore_errors=True)
    base = optkit.onnx.with_adapter_inputs_folder(args.model, args.out / "base", lora)
    files = {name: optkit.onnx.export_adapters(model, p, lora, args.out / f"{name}.onnx_adapter")
             for name, p in tuned.items()}
    size = {name: path.stat().st_size for name, path in files.items()}
    print(f"wrote {base} and {', '.join(f'{p.name} ({size[n] // 1024} KiB)' for n, p in files.items())}")

    prompt = data["textwrap"][1][1:2, :12]
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **decoder.cache(1, 0)}
    result = {"losses": losses, "files": files, "base": base, "tokens": {}, "logits": {}, "ort_logits": {},
              "ort_tokens": {}, "genai_tokens": {}}
    for name, params in tuned.items():
        result["logits"][name] = np.asarray(apply_fn(params, feeds)[0])
        result["tokens"][name] = greedy_jax(decoder, apply_fn, params, prompt, 12)
    try:
        import onnxruntime
    except ImportError:
        print("  (onnxruntime is not installed: no comparison)")
        return result
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(base / decoder.path.name), options, providers=["CPUExecutionProvider"])
    served = Decoder(base)
    for name, path in files.items():
        adapter = onnxruntime.LoraAdapter()
        adapter.Load(str(path))
        run = onnxruntime.RunOptions()
        run.add_active_adapter(adapter)
        result["ort_logits"][name] = session.run([decoder.logits], feeds, run)[0]
        result["ort_tokens"][name] = greedy_onnx_runtime(served, prompt, 12, adapter=path)
        gap = float(np.abs(result["ort_logits"][name] - result["logits"][name]).max())
        same = np.array_equal(result["ort_tokens"][name], result["tokens"][name])
        line = f"  {name}: ONNX Runtime's logits within {gap:.1e} of apply_fn's, greedy tokens {_same(same)}"
        genai = greedy_genai(base, prompt, 12, adapter=path)
        if genai is not None:
            result["genai_tokens"][name] = genai
            line += f"; onnxruntime-genai's {_same(np.array_equal(genai, result['tokens'][name]))}"
        print(line)
    result["ort_base_logits"] = session.run([decoder.logits], feeds)[0]  # no adapter active
    plain = onnxruntime.InferenceSession(str(decoder.path), providers=["CPUExecutionProvider"])
    result["ort_builder_logits"] = plain.run([decoder.logits], feeds)[0]
    same = np.array_equal(result["ort_base_logits"], result["ort_builder_logits"])
    print(f"  no adapter active: {'exactly' if same else 'NOT'} the builder's model's logits")
    return result


def _same(same: bool) -> str:
    return "the same" if same else "DIFFERENT"


if __name__ == "__main__":
    main(sys.argv[1:])
