"""First and steady training steps of exported transformers at several depths, with and without ``scan_layers``.

``python -m benchmarks.onnx_speed --depth`` (or ``python -m benchmarks.onnx_depth``): BERT and GPT-2 layouts
at 2, 6, 12 and 24 layers and a LLaMA-style model at 2 and 16 (hidden 128, 4 heads, batch 4 x 64, random
weights from ``transformers`` configs built here), each exported by torch.onnx (TorchScript, opset 17, and
dynamo, opset 20; GPT-2 of transformers 5 only by dynamo: the TorchScript exporter cannot write its
``aten::diff``). For each: torch eager's first and steady training step (MSE against a fixed target, Adam),
and the same step on ``optkit.onnx.to_jax``'s ``apply_fn`` under ``jax.jit`` (``jax.value_and_grad``,
``optkit.adam``, parameters and state donated) with ``scan_layers=True, stacked_params=False`` (the repeated
layers as one ``jax.lax.scan``, their weights stacked at every call; ``benchmarks.onnx_native`` times them held
stacked, the default) and ``scan_layers=False`` (unrolled), each in a fresh process. The first step (after the
imports and ``to_jax``) is the trace, XLA's compile and the run; the steady step is a median over ``--repeats``
runs. Outputs of both forms are checked against ONNX Runtime's. Under each scanned row: what stacking the trained
per-layer weights (and one more pass over the stacked bytes, the gradients' way back) costs, timed apart, as a
share of the scanned step. Needs torch, transformers and onnxruntime (not optkit dependencies); about two minutes
a row on 2 cores.
"""

from __future__ import annotations

import argparse
import io
import os
import warnings

import numpy as np

DEPTHS = {"bert": (2, 6, 12, 24), "gpt2": (2, 6, 12, 24), "llama": (2, 16)}
HIDDEN, HEADS, BATCH, LENGTH, VOCAB = 128, 4, 4, 64, 1000


def _module(family: str, layers: int):
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "bert":
        inner = transformers.BertModel(transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS,
            intermediate_size=4 * HIDDEN, max_position_embeddings=LENGTH), add_pooling_layer=False)
    elif family == "gpt2":
        inner = transformers.GPT2Model(transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=LENGTH, n_embd=HIDDEN, n_layer=layers, n_head=HEADS))
    else:
        inner = transformers.LlamaModel(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=layers,
            num_attention_heads=HEADS, num_key_value_heads=HEADS // 2, max_position_embeddings=LENGTH))

    with torch.no_grad():  # each weight its own values, as a trained model's (transformers' initial zero biases and
        for p in inner.parameters():  # unit norms are equal tensors, which the TorchScript exporter writes once)
            p.add_(torch.randn_like(p) * 0.02)

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            kwargs = {} if family == "bert" else {"use_cache": False}
            return self.inner(ids, return_dict=False, **kwargs)[0]

    return First()


def measure(family: str, layers: int, exporter: str, repeats: int) -> dict:
    """One row: torch eager's steps here, optkit's in a fresh process per form (nothing compiled or warmed up
    before its first step, as a new user's)."""
    import json
    import subprocess
    import sys
    import tempfile

    import onnxruntime
    import torch

    from benchmarks.onnx_speed import torch_steps

    module = _module(family, layers).eval()
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids,), buffer, input_names=["input"], output_names=["output"],
                          opset_version=20 if exporter == "dynamo" else 17, dynamo=exporter == "dynamo",
                          external_data=False)
    feed = ids.numpy()
    expected = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(
        None, {"input": feed})[0]
    target, first, steady = torch_steps(module, ids, repeats)
    row = {"family": family, "layers": layers, "exporter": exporter, "torch_first_s": first, "torch_step_s": steady}
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/model.onnx", "wb") as f:
            f.write(buffer.getvalue())
        np.savez(f"{tmp}/data.npz", feed=feed, target=target.numpy(), expected=expected)
        for scan in (True, False):
            out = subprocess.run([sys.executable, "-c", _CHILD, tmp, str(int(scan)), str(repeats)],
                                 capture_output=True, text=True, check=True,
                                 env={**os.environ, "OPTKIT_COMPILATION_CACHE": "off"})  # (a cold start)
            row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return row


# One form's first and steady training steps in a fresh process: argv = directory, scan (0/1), repeats.
_CHILD = """
import json, statistics, sys, time, warnings
import numpy as np
start = time.perf_counter()
import jax, jax.numpy as jnp, optax, optkit, optkit.onnx
directory, scan, repeats = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
data = np.load(directory + "/data.npz")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (the dynamo exporter's shared constants: tied, as in torch)
    apply_fn, params = optkit.onnx.to_jax(directory + "/model.onnx", scan_layers=scan,
                                          stacked_params=False if scan else None)
loaded = time.perf_counter()
tx, y, feed = optkit.adam(1e-4), jnp.asarray(data["target"]), data["feed"]
initial = {name: np.array(value) for name, value in params.items()}  # (params are donated to the step)

def step(p, state, inputs):
    loss, grads = jax.value_and_grad(lambda q: jnp.mean((apply_fn(q, inputs) - y) ** 2))(p)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

step = jax.jit(step, donate_argnums=(0, 1))
carry = [params, jax.jit(tx.init)(params)]

def run():
    carry[0], carry[1], loss = step(carry[0], carry[1], feed)
    jax.block_until_ready(loss)

first = time.perf_counter()
run()
done = time.perf_counter()
times = []
for _ in range(repeats):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
np.testing.assert_allclose(np.asarray(apply_fn(initial, feed)), data["expected"], rtol=1e-4, atol=1e-4)
name = "scan" if scan else "unrolled"
row = {name + "_first_s": done - first, name + "_load_s": loaded - start, name + "_step_s": statistics.median(times),
       name + "_runs": [r.describe() for r in apply_fn._layers.runs] if apply_fn._layers else []}
if scan and apply_fn._layers:
    # What stacking the trained per-layer weights costs inside a step: the stack, and one more pass over the
    # stacked bytes for the gradients' way back (a jitted function of its own, timed as the step).
    groups = [names for run in apply_fn._layers.runs for names in run.layer_names
              if all(n in carry[0] for n in names)]
    weights = {n: carry[0][n] for names in groups for n in names}
    restack = jax.jit(lambda w: [jnp.stack([w[n] for n in names]) * 1.0 for names in groups])
    jax.block_until_ready(restack(weights))
    stack_times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(restack(weights))
        stack_times.append(time.perf_counter() - t)
    row.update(scan_stack_s=statistics.median(stack_times),
               scan_stacked_bytes=int(sum(v.size * v.dtype.itemsize for v in weights.values())))
print(json.dumps(row))
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(DEPTHS), choices=list(DEPTHS))
    parser.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"],
                        choices=["torchscript", "dynamo"])
    parser.add_argument("--depths", nargs="+", type=int, help="layer counts (default: each family's)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"hidden {HIDDEN}, batch {BATCH} x {LENGTH}; first step (trace, compile, run) and steady step (median "
          f"of {args.repeats}); ratios to torch eager's")
    print("| model | exporter | layers | first step: scan / unrolled / torch | scan first / torch first | "
          "steady: scan / unrolled / torch | scan steady / unrolled steady |")
    print("|---|---|---:|---|---:|---|---:|")
    for family in args.families:
        for exporter in args.exporters:
            if family == "gpt2" and exporter == "torchscript":
                continue
            for layers in args.depths or DEPTHS[family]:
                r = measure(family, layers, exporter, args.repeats)
                print(f"| {family} | {exporter} | {layers} | {r['scan_first_s']:.2f} / {r['unrolled_first_s']:.2f}"
                      f" / {r['torch_first_s']:.2f} s | {r['scan_first_s'] / r['torch_first_s']:.1f}x | "
                      f"{r['scan_step_s'] * 1e3:.1f} / {r['unrolled_step_s'] * 1e3:.1f} / "
                      f"{r['torch_step_s'] * 1e3:.1f} ms | {r['scan_step_s'] / r['unrolled_step_s']:.2f}x |",
                      flush=True)
                if not r["scan_runs"]:
                    print(f"  (no repeated layers found in {family}/{exporter}/{layers})", flush=True)
                else:
                    print(f"  (stacking the scanned runs' trained weights, {r['scan_stacked_bytes'] / 2**20:.1f} MiB, "
                          f"and one more pass over them: {r['scan_stack_s'] * 1e3:.2f} ms, "
                          f"{r['scan_stack_s'] / r['scan_step_s']:.1%} of the scanned step)", flush=True)


if __name__ == "__main__":
    main()
