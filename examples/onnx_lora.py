"""Fine-tune a 4-bit language model that onnxruntime-genai's builder wrote, with LoRA adapters, on Python's own text.

The model is ``tests/onnx/models/genai/llama_int4`` (``--model`` for another builder folder): a tiny LLaMA
with random weights, its matmul weights 4-bit ``MatMulNBits`` blocks, attention ONNX Runtime's
``GroupQueryAttention`` (tests/onnx/models/make_genai.py). The text is the source of the standard
library's ``textwrap`` module, tokenised by the byte-level BPE tokenizer that make_genai.py trained on
it and the builder copied into the folder.

``optkit.onnx.to_jax(model, lora=optkit.onnx.LoRA(8, alpha=16))`` puts a rank-8 adapter on every
``MatMulNBits`` weight: ``params`` holds only the adapters, the 4-bit base stays packed constants with
no gradient and no optimizer state. ``optax.adamw`` trains them on next-token prediction of windows of
the text (a progress bar shows the loss), the held-out windows' loss falls, and
:func:`optkit.onnx.with_initializers` writes the adapters back as a float side branch of standard
operators next to the untouched 4-bit weights. The folder written (``--out``, with the builder's
``genai_config.json`` and tokenizer) is what ONNX Runtime and onnxruntime-genai load: ONNX Runtime's
logits equal ``apply_fn``'s, and both generate the same tokens greedily (onnxruntime-genai too, when it
is installed).

Run from the repository root::

    python examples/onnx_lora.py                        # about 20 s on 2 CPU cores
    python examples/onnx_lora.py --steps 300 --rank 16
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import shutil
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from examples.onnx_llm import DEFAULT_MODEL, Decoder, greedy_genai, greedy_jax  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def windows(ids: np.ndarray, length: int) -> np.ndarray:
    """The token stream cut into windows of ``length + 1`` tokens (inputs and their next tokens)."""
    count = (len(ids) - 1) // length
    return np.stack([ids[i * length:i * length + length + 1] for i in range(count)]).astype(np.int64)


def lora_parser(description: str, steps: int, out: str, out_help: str) -> argparse.ArgumentParser:
    """The options of the LoRA examples (this one and examples/onnx_adapters.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=pathlib.Path, default=DEFAULT_MODEL, help="an onnxruntime-genai builder folder")
    parser.add_argument("--rank", type=int, default=8, help="the adapters' rank")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps (per adapter)")
    parser.add_argument("--batch", type=int, default=8, help="windows per step")
    parser.add_argument("--length", type=int, default=32, help="tokens per window")
    parser.add_argument("--lr", type=float, default=1e-2, help="AdamW's learning rate")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "examples" / "out" / out, help=out_help)
    return parser


def next_token_training(apply_fn, decoder: Decoder, tx):
    """``(step, evaluate)``: a jitted ``tx`` step on a batch of windows' next-token loss (``apply_fn`` with empty
    past buffers), and that loss."""

    def loss_fn(p, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        feeds = {"input_ids": x, "attention_mask": jnp.ones_like(x), **decoder.cache(len(x), 0)}
        logits = apply_fn(p, feeds)[0]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(p, batch)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    return step, jax.jit(loss_fn)


def main(argv: list[str] | None = None) -> dict:
    parser = lora_parser(__doc__.splitlines()[0], 150, "onnx_lora", "where the fine-tuned builder folder is written")
    args = parser.parse_args(argv)

    import onnx

    import optkit.onnx

    decoder = Decoder(args.model)
    ids = np.asarray(decoder.tokenizer.encode(inspect.getsource(textwrap)).ids)
    data = windows(ids, args.length)
    held_out, train = data[::25], np.delete(data, np.s_[::25], axis=0)  # every 25th window held out
    print(f"{args.model.name}: textwrap's source is {len(ids)} tokens, {len(train)} training windows of "
          f"{args.length} and {len(held_out)} held out")

    model = onnx.load(str(decoder.path))
    lora = optkit.onnx.LoRA(args.rank, alpha=2 * args.rank)
    apply_fn, params = optkit.onnx.to_jax(model, lora=lora)
    print(f"  {len(params) // 2} adapted weights, {sum(v.size for v in params.values())} adapter parameters "
          f"(the 4-bit base stays packed and frozen)")

    tx = optax.adamw(args.lr)
    state = tx.init(params)
    step, evaluate = next_token_training(apply_fn, decoder, tx)
    before = float(evaluate(params, held_out))
    rng = np.random.default_rng(0)
    losses = []
    with tqdm(range(args.steps), desc="LoRA", unit="step") as bar:
        for _ in bar:
            params, state, loss = step(params, state, train[rng.integers(0, len(train), args.batch)])
            losses.append(float(loss))
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    after = float(evaluate(params, held_out))
    print(f"  held-out next-token loss {before:.3f} -> {after:.3f}")

    # Written back: the adapters as a float side branch beside the untouched 4-bit weights.
    tuned = optkit.onnx.with_initializers(model, params, lora=lora)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    onnx.save(tuned, str(args.out / decoder.path.name))
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.model / name, args.out / name)
    print(f"  wrote {args.out} ({len(tuned.graph.node) - len(model.graph.node)} side-branch nodes)")

    prompt = held_out[1:2, :12]
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **decoder.cache(1, 0)}
    logits = np.asarray(apply_fn(params, feeds)[0])
    tokens = greedy_jax(decoder, apply_fn, params, prompt, 12)
    result = {"losses": losses, "before": before, "after": after, "logits": logits, "tokens": tokens,
              "out": args.out, "params": params}
    try:
        import onnxruntime
    except ImportError:
        print("  (onnxruntime is not installed: no comparison)")
        return result
    from examples.onnx_llm import greedy_onnx_runtime

    session = onnxruntime.InferenceSession(str(args.out / decoder.path.name), providers=["CPUExecutionProvider"])
    result["ort_logits"] = session.run([decoder.logits], feeds)[0]
    result["ort_tokens"] = greedy_onnx_runtime(Decoder(args.out), prompt, 12)
    gap = float(np.abs(result["ort_logits"] - logits).max())
    same = np.array_equal(result["ort_tokens"], tokens)
    print(f"  ONNX Runtime on the written folder: logits within {gap:.1e} of apply_fn's, greedy tokens "
          f"{'the same' if same else 'DIFFERENT'}")
    genai = greedy_genai(args.out, prompt, 12)
    if genai is not None:
        result["genai_tokens"] = genai
        same = np.array_equal(genai, tokens)
        print(f"  onnxruntime-genai on the written folder: {'the same' if same else 'DIFFERENT'} tokens")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
