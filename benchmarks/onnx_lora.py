"""LoRA against full fine-tuning of an ONNX language model through ``to_jax``: peak memory and step time (issue 44).

A GPT-style decoder is written with ONNX's helper (random weights, pre-LayerNorm blocks: q, k, v, o and a 4x MLP
as MatMul weights, causal softmax attention, a tied-free LM head), saved with external data, and its 4-bit twin
made by ONNX Runtime's ``MatMulNBitsQuantizer`` (block size 32). Each configuration runs in a fresh process and
reports its peak resident memory (``VmHWM``), its first step (trace, compile, run) and the median of its next
steps, on next-token cross-entropy of random token ids:

- ``full``: every float initializer trained with ``optax.adamw`` (``to_jax(model)``);
- ``lora``: rank 8 on the attention and MLP weights (``to_jax(model, lora=LoRA(8, targets=...))``), adamw on the
  adapters; the float32 base is a constant of the program;
- ``lora-int4``: the same on the 4-bit twin (``MatMulNBits`` weights stay packed);
- ``... +hoisted``: the same with ``jax_use_simplified_jaxpr_constants`` on, which passes the program's large
  constants (the frozen base) to XLA as arguments instead of embedding them in the compiled program;
- ``... +remat``: the same with ``to_jax(..., remat_layers=True)``: the scanned layer's body under
  ``jax.checkpoint``, so the backward pass computes each layer's values again (a 4-bit weight's dequantized
  float32 copy included) instead of keeping them from the forward pass.

Ratios are peak RSS over the float32 weights' bytes. Needs onnxruntime and ``onnx_ir`` (for the quantizer)::

    python -m benchmarks.onnx_lora                 # --size small: d 256, 4 layers (about a minute)
    python -m benchmarks.onnx_lora --size 350m     # d 1024, 24 layers, 368M parameters (several minutes)
    python -m benchmarks.onnx_lora --size 350m --only none --infer   # prepare(path).run of both files only
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

SIZES = {"small": dict(d=256, layers=4, vocab=1000), "350m": dict(d=1024, layers=24, vocab=32000)}
BATCH, TOKENS, RANK = 2, 128, 8
TARGETS = ("*.attn.*", "*.mlp.*")


def build(path: pathlib.Path, d: int, layers: int, vocab: int, seed: int = 0) -> int:
    """Write the decoder to ``path`` (external data beside it); returns its float32 weights' bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    heads, nodes, inits, weights = d // 64, [], [], []

    def weight(name, *shape, scale=None):
        scale = scale or 1 / np.sqrt(shape[0])
        value = (rng.standard_normal(shape, np.float32) * np.float32(scale)).astype(np.float32)
        inits.append(numpy_helper.from_array(value, name))
        weights.append(value.nbytes)
        return name

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    causal = np.triu(np.full((TOKENS, TOKENS), -1e9, np.float32), 1)
    const("mask", causal)
    const("heads_shape", np.array([BATCH, TOKENS, heads, 64], np.int64))
    const("merged_shape", np.array([BATCH, TOKENS, d], np.int64))
    const("scale", np.float32(1 / 8))
    ones, zeros = const("ln.ones", np.ones(d, np.float32)), const("ln.zeros", np.zeros(d, np.float32))
    x = node("Gather", [weight("wte", vocab, d, scale=0.02), "ids"], "embed")
    x = node("Add", [x, weight("wpe", TOKENS, d, scale=0.02)], "embed_pos")
    for i in range(layers):
        p = f"h{i}"
        h = node("LayerNormalization", [x, ones, zeros], f"{p}.ln1", axis=-1)
        q, k, v = (node("Transpose", [node("Reshape", [node("MatMul", [h, weight(f"{p}.attn.{n}.weight", d, d)],
                                                                  f"{p}.{n}"), "heads_shape"], f"{p}.{n}_heads")],
                        f"{p}.{n}_t", perm=[0, 2, 1, 3]) for n in ("q", "k", "v"))
        kt = node("Transpose", [k], f"{p}.kT", perm=[0, 1, 3, 2])
        scores = node("Add", [node("Mul", [node("MatMul", [q, kt], f"{p}.qk"), "scale"], f"{p}.scaled"), "mask"],
                      f"{p}.masked")
        attn = node("MatMul", [node("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.attn_v")
        merged = node("Reshape", [node("Transpose", [attn], f"{p}.attn_t", perm=[0, 2, 1, 3]), "merged_shape"],
                      f"{p}.merged")
        x = node("Add", [x, node("MatMul", [merged, weight(f"{p}.attn.o.weight", d, d)], f"{p}.o")], f"{p}.res1")
        h = node("LayerNormalization", [x, ones, zeros], f"{p}.ln2", axis=-1)
        up = node("Relu", [node("MatMul", [h, weight(f"{p}.mlp.up.weight", d, 4 * d)], f"{p}.up")], f"{p}.act")
        x = node("Add", [x, node("MatMul", [up, weight(f"{p}.mlp.down.weight", 4 * d, d)], f"{p}.down")],
                 f"{p}.res2")
    h = node("LayerNormalization", [x, ones, zeros], "ln_f", axis=-1)
    node("MatMul", [h, weight("lm_head.weight", d, vocab)], "logits")
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                                [BATCH, TOKENS])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, TOKENS, vocab])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (path.parent / (path.name + ".data")).unlink(missing_ok=True)  # onnx appends to a data file already there
    onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data",
                    size_threshold=1024)
    return sum(weights)


def quantize(source: pathlib.Path, target: pathlib.Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), block_size=32, is_symmetric=False)
    quantizer.process()
    (target.parent / (target.name + ".data")).unlink(missing_ok=True)
    onnx.save_model(quantizer.model.model, str(target), save_as_external_data=True, location=target.name + ".data",
                    size_threshold=1024)


def infer_run(path: str) -> dict:
    """In this process: ``prepare(path)`` and its first run on a batch; times and peak RSS (``VmHWM``)."""
    import time

    import optkit.onnx
    from benchmarks.memory import peak_rss

    start = time.perf_counter()
    rep = optkit.onnx.prepare(path)
    loaded, load_peak = time.perf_counter() - start, peak_rss()
    ids = np.random.default_rng(1).integers(0, 1000, (BATCH, TOKENS)).astype(np.int64)
    start = time.perf_counter()
    rep.run([ids])
    return {"load_s": loaded, "load_peak_bytes": load_peak, "first_run_s": time.perf_counter() - start,
            "peak_rss_bytes": peak_rss()}


def step_run(path: str, mode: str, steps: int) -> dict:
    """In this process: ``steps`` training steps of ``mode``; times and peak RSS."""
    import time

    import jax
    import jax.numpy as jnp
    import optax

    import optkit.onnx
    from benchmarks.memory import peak_rss

    start = time.perf_counter()
    if mode.startswith("lora"):
        apply_fn, params = optkit.onnx.to_jax(path, lora=optkit.onnx.LoRA(RANK, targets=TARGETS),
                                              remat_layers=mode.endswith("+remat"))
    else:
        apply_fn, params = optkit.onnx.to_jax(path)
    loaded = time.perf_counter() - start
    tx = optax.adamw(1e-4)
    state = jax.jit(tx.init)(params)
    ids = np.random.default_rng(1).integers(0, 1000, (BATCH, TOKENS))  # both sizes have 1000+ tokens

    def loss(p, ids):
        logits = apply_fn(p, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # the old parameters and moments reused, as users do
    def step(p, state, ids):
        value, grads = jax.value_and_grad(loss)(p, ids)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    times, losses = [], []
    for _ in range(steps):
        t = time.perf_counter()
        params, state, value = step(params, state, jnp.asarray(ids, jnp.int32))
        losses.append(float(value))
        times.append(time.perf_counter() - t)
    return {"mode": mode, "load_s": loaded, "first_step_s": times[0], "step_s": float(np.median(times[1:])),
            "losses": losses, "trained_bytes": int(sum(v.nbytes for v in params.values())),
            # VmHWM, which starts again at exec: ru_maxrss of a child started by subprocess would begin at its
            # parent's size when it forked (the parent holds the models it wrote: 4.5 GiB at 350M).
            "peak_rss_bytes": peak_rss()}



def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=3, help="steps per configuration (the first compiles)")
    parser.add_argument("--dir", help="where to write the models (default: a temporary directory)")
    parser.add_argument("--only", nargs="+", help="configurations to run (default all), e.g. full 'lora +hoisted'")
    parser.add_argument("--infer", action="store_true",
                        help="also load and run the float32 and int4 files with prepare (peak memory, times)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = infer_run(args.worker[0]) if args.worker[1] == "infer" else step_run(*args.worker, args.steps)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        where = pathlib.Path(args.dir or tmp)
        where.mkdir(parents=True, exist_ok=True)
        f32, int4 = where / "decoder.onnx", where / "decoder_int4.onnx"
        weights = build(f32, **SIZES[args.size])
        if not args.only or args.infer or any("int4" in o for o in args.only):
            quantize(f32, int4)
        config = SIZES[args.size]
        print(f"decoder d={config['d']}, {config['layers']} layers, vocab {config['vocab']}: float32 weights "
              f"{weights / 2**20:.0f} MiB; batch {BATCH} x {TOKENS} tokens, LoRA rank {RANK} on {list(TARGETS)}, "
              f"optax.adamw, {args.steps} steps")
        print("| configuration | peak RSS | / float32 weights | first step | step | trained bytes | "
              "loss first -> last |")
        print("|---|---:|---:|---:|---:|---:|---|")
        runs = [("full", f32, False), ("lora", f32, False), ("lora", f32, True), ("lora +remat", f32, True),
                ("lora-int4", int4, False), ("lora-int4", int4, True), ("lora-int4 +remat", int4, True)]
        for mode, path, hoisted in runs:
            label = mode.replace(" +remat", " +hoisted +remat") if hoisted and "remat" in mode else (
                f"{mode}{' +hoisted' if hoisted else ''}")
            if args.only and label not in args.only:
                continue
            env = {**os.environ, "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": "1" if hoisted else "0"}
            out = subprocess.run([sys.executable, "-m", "benchmarks.onnx_lora", "--steps", str(args.steps),
                                  "--worker", str(path), mode], env=env, capture_output=True, text=True)
            if out.returncode:
                why = out.stderr.strip().splitlines()[-1][:120]
                print(f"| {label} | failed: {why} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {label} | {r['peak_rss_bytes'] / 2**30:.2f} GiB | "
                  f"{r['peak_rss_bytes'] / weights:.2f}x | {r['first_step_s']:.1f} s | {r['step_s']:.2f} s | "
                  f"{r['trained_bytes'] / 2**20:.1f} MiB | {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} |",
                  flush=True)
        if args.infer:
            print("\n| inference (`prepare(path).run`) | load | peak after load | first run | peak |")
            print("|---|---:|---:|---:|---:|")
            for name, path in (("float32", f32), ("int4", int4)):
                out = subprocess.run([sys.executable, "-m", "benchmarks.onnx_lora", "--worker", str(path), "infer"],
                                     capture_output=True, text=True)
                if out.returncode:
                    print(f"| {name} | failed: {out.stderr.strip().splitlines()[-1][:120]} |")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"| {name} | {r['load_s']:.1f} s | {r['load_peak_bytes'] / 2**30:.2f} GiB | "
                      f"{r['first_run_s']:.1f} s | {r['peak_rss_bytes'] / 2**30:.2f} GiB |", flush=True)


if __name__ == "__main__":
    main()
