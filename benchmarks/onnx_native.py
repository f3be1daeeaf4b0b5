"""The floor of a first training step: the same transformers written directly in JAX, beside ``to_jax`` of their
torch.onnx exports and torch eager, stage by stage, each form in a fresh process.

``python -m benchmarks.onnx_native``: the BERT, GPT-2 and LLaMA layouts of :mod:`benchmarks.onnx_depth` (hidden 128,
4 heads, batch 4 x 64, vocabulary 1000; LLaMA with 2 key-value heads) at 2, 12 and 24 layers. Each training step is
MSE against a fixed target and ``optkit.adam(1e-4)``, jitted, parameters and state donated. Forms:

- ``jax``: a functional model written here with the same operations (BERT: post-norm, GELU, learned positions;
  GPT-2: pre-norm, causal, GELU (tanh); LLaMA: RMS norm, rotary positions, grouped-query attention, SwiGLU), its
  layers unrolled (a Python loop over per-layer dicts), and ``jax-scan``: the same over stacked weights with
  ``jax.lax.scan``;
- ``nnx``: the same layers as Flax NNX modules (an ``nnx.List`` of blocks), trained by ``nnx.Optimizer`` under
  ``nnx.jit`` (first call only: NNX's own trace);
- ``optkit``: ``optkit.onnx.to_jax`` of the torch.onnx export (BERT by the TorchScript exporter, opset 17; GPT-2
  and LLaMA by the dynamo exporter, opset 20: the TorchScript one cannot write transformers 5's ``aten::diff``)
  with ``scan_layers=False``; ``optkit-scan``: ``scan_layers=True, stacked_params=False`` (the weights stacked
  inside each call); ``optkit-stacked``: ``scan_layers=True, stacked_params=True`` (what ``scan_layers=True``
  gives by default). The torch models' weights are made distinct (:func:`benchmarks.onnx_depth._module`).

Stages, each timed apart with JAX's ahead-of-time API (``jax.jit(step).trace(...)``, ``.lower()``, ``.compile()``,
then the first call): for optkit, ``to_jax`` (load) before them. The steady step is the median of ``--repeats``
calls. JAX's persistent compilation cache is off in these processes (``OPTKIT_COMPILATION_CACHE=off``): a cold
start. ``--rounds N`` runs every form N times, in turn, and keeps each form's shortest first step (on a shared
machine, single runs move by 20% or more). Needs torch and transformers (not optkit dependencies); about 15
minutes on 2 cores for every row, once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

DEPTHS = (2, 12, 24)
FAMILIES = ("bert", "gpt2", "llama")
FORMS = ("jax", "jax-scan", "nnx", "optkit", "optkit-scan", "optkit-stacked")


def measure(family: str, layers: int, forms: tuple[str, ...], repeats: int, rounds: int = 1) -> dict:
    """One row: torch eager's first and steady steps here; each form's stages in a fresh process, ``rounds`` times
    in turn (form after form), the round of the shortest first step kept: a busy machine's slow rounds left out."""
    import io
    import warnings

    import torch

    from benchmarks.onnx_depth import BATCH, LENGTH, VOCAB, _module
    from benchmarks.onnx_speed import torch_steps

    module = _module(family, layers).eval()
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH))
    row: dict = {"family": family, "layers": layers}
    with tempfile.TemporaryDirectory() as tmp:
        if any(form.startswith("optkit") for form in forms):
            buffer = io.BytesIO()
            dynamo = family != "bert"  # (the TorchScript exporter cannot write transformers 5's aten::diff)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, (ids,), buffer, input_names=["input"], output_names=["output"],
                                  opset_version=20 if dynamo else 17, dynamo=dynamo, external_data=False)
            with open(f"{tmp}/model.onnx", "wb") as f:
                f.write(buffer.getvalue())
        target, row["torch_first_s"], row["torch_step_s"] = torch_steps(module, ids, repeats)
        np.savez(f"{tmp}/data.npz", feed=ids.numpy(), target=target.detach().numpy())
        environ = {**os.environ, "OPTKIT_COMPILATION_CACHE": "off"}
        for _ in range(rounds):
            for form in forms:
                out = subprocess.run([sys.executable, "-m", "benchmarks.onnx_native", "--child", tmp, form, family,
                                      str(layers), str(repeats)], capture_output=True, text=True, env=environ)
                if out.returncode:
                    raise RuntimeError(f"{family} {layers} {form}: {out.stderr[-2000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])
                if form not in row or got["first_s"] < row[form]["first_s"]:
                    row[form] = got
    return row


# ------------------------------------------------------------------ the models written in JAX

def _init(family: str, layers: int, seed: int = 0) -> dict:
    """Random weights of the layout's shapes (float32): embeddings, a list of per-layer dicts, the final norm."""
    from benchmarks.onnx_depth import HEADS, HIDDEN, LENGTH, VOCAB

    rng = np.random.default_rng(seed)
    h, kv = HIDDEN, HIDDEN // 2 if family == "llama" else HIDDEN  # (LLaMA: 2 of 4 heads for keys and values)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def layer():
        p = {"q": w(h, h), "k": w(h, kv), "v": w(h, kv), "o": w(h, h), "n1": np.ones(h, np.float32),
             "n2": np.ones(h, np.float32)}
        if family == "llama":
            p.update(gate=w(h, 4 * h), up=w(h, 4 * h), down=w(4 * h, h))
        else:
            p.update(up=w(h, 4 * h), down=w(4 * h, h), bq=w(h), bk=w(kv), bv=w(kv), bo=w(h), bup=w(4 * h),
                     bdown=w(h), b1=w(h), b2=w(h))
        return p

    params = {"embed": w(VOCAB, h), "layers": [layer() for _ in range(layers)], "norm": np.ones(h, np.float32)}
    if family != "llama":
        params.update(pos=w(LENGTH, h), norm_b=w(h))
    del HEADS
    return params


def _block(family: str, p: dict, x, rope):
    """One layer of the layout on ``x`` (batch, length, hidden)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.onnx_depth import HEADS

    def norm(v, scale, bias=None):
        if family == "llama":
            return v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + 1e-6) * scale
        mean = jnp.mean(v, -1, keepdims=True)
        var = jnp.mean((v - mean) ** 2, -1, keepdims=True)
        return (v - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias

    def attention(v):
        b, t, hidden = v.shape
        d = hidden // HEADS
        q, k, w = v @ p["q"], v @ p["k"], v @ p["v"]
        if family != "llama":
            q, k, w = q + p["bq"], k + p["bk"], w + p["bv"]
        q = q.reshape(b, t, HEADS, d)
        k = k.reshape(b, t, -1, d)
        w = w.reshape(b, t, -1, d)
        if family == "llama":
            cos, sin = rope
            turn = lambda z: jnp.concatenate([-z[..., d // 2:], z[..., :d // 2]], -1)  # noqa: E731
            q, k = q * cos + turn(q) * sin, k * cos + turn(k) * sin
            k, w = jnp.repeat(k, HEADS // k.shape[2], 2), jnp.repeat(w, HEADS // w.shape[2], 2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        if family != "bert":
            scores = jnp.where(np.tril(np.ones((t, t), bool)), scores, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), w).reshape(b, t, hidden) @ p["o"]
        return out if family == "llama" else out + p["bo"]

    def mlp(v):
        if family == "llama":
            return (jax.nn.silu(v @ p["gate"]) * (v @ p["up"])) @ p["down"]
        return jax.nn.gelu(v @ p["up"] + p["bup"], approximate=family == "gpt2") @ p["down"] + p["bdown"]

    if family == "bert":
        x = norm(x + attention(x), p["n1"], p["b1"])
        return norm(x + mlp(x), p["n2"], p["b2"])
    x = x + attention(norm(x, p["n1"], p.get("b1")))
    return x + mlp(norm(x, p["n2"], p.get("b2")))


def _forward(family: str, params: dict, ids, scan: bool):
    """The functional model: per-layer dicts in ``params["layers"]`` unrolled, or stacked ones scanned."""
    import jax

    def layers(x, rope):
        if scan:
            return jax.lax.scan(lambda h, p: (_block(family, p, h, rope), None), x, params["layers"])[0]
        for p in params["layers"]:
            x = _block(family, p, x, rope)
        return x

    return _around(family, params, ids, layers)


def _around(family: str, params: dict, ids, layers):
    """The embeddings (and learned positions), ``layers(x, rope)``, and the final norm (GPT-2, LLaMA)."""
    import jax
    import jax.numpy as jnp

    t = ids.shape[1]
    rope = _rope(family, t)
    x = params["embed"][ids]
    if family != "llama":
        x = x + params["pos"][:t]
    x = layers(x, rope)
    if family == "bert":
        return x
    if family == "llama":
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * params["norm"]
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * params["norm"] + params["norm_b"]


def _nnx_model(family: str, layers: int):
    """The same model as Flax NNX modules holding the same weights."""
    from flax import nnx

    values = _init(family, layers)

    class Block(nnx.Module):
        def __init__(self, p):
            self.p = nnx.Dict({k: nnx.Param(v) for k, v in p.items()})

        def __call__(self, x, rope):
            return _block(family, {k: v[...] for k, v in self.p.items()}, x, rope)

    class Model(nnx.Module):
        def __init__(self):
            self.top = nnx.Dict({k: nnx.Param(v) for k, v in values.items() if k != "layers"})
            self.blocks = nnx.List([Block(p) for p in values["layers"]])

        def __call__(self, ids):
            def layers(x, rope):
                for block in self.blocks:
                    x = block(x, rope)
                return x

            return _around(family, {k: v[...] for k, v in self.top.items()}, ids, layers)

    return Model()


def _rope(family: str, t: int):
    import jax.numpy as jnp

    from benchmarks.onnx_depth import HEADS, HIDDEN

    if family != "llama":
        return None
    d = HIDDEN // HEADS
    angles = np.arange(t)[:, None] * (10000.0 ** (-np.arange(0, d, 2) / d))[None]
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


# ------------------------------------------------------------------ one form in a fresh process

def child(directory: str, form: str, family: str, layers: int, repeats: int) -> dict:
    """The stages of one form's first training step and its steady step (seconds)."""
    import statistics
    import time
    import warnings

    start = time.perf_counter()
    import jax
    import jax.numpy as jnp
    import optax

    import optkit

    imported = time.perf_counter()
    data = np.load(directory + "/data.npz")
    feed, y = data["feed"], jnp.asarray(data["target"])
    tx = optkit.adam(1e-4)
    row: dict = {"imports_s": imported - start}
    if form == "nnx":
        from flax import nnx

        model = _nnx_model(family, layers)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        ids = jnp.asarray(feed.astype(np.int32))

        @nnx.jit
        def nnx_step(model, optimizer):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(ids) - y) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        row["load_s"] = time.perf_counter() - imported
        t = time.perf_counter()
        jax.block_until_ready(nnx_step(model, optimizer))
        row["first_s"] = time.perf_counter() - t
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(nnx_step(model, optimizer))
            times.append(time.perf_counter() - t)
        row["step_s"] = statistics.median(times)
        return row
    if form.startswith("jax"):
        values = _init(family, layers)
        if form == "jax-scan":
            values["layers"] = jax.tree.map(lambda *v: np.stack(v), *values["layers"])
        params = jax.tree.map(jnp.asarray, values)
        ids = feed.astype(np.int32)

        def apply(p, x):
            return _forward(family, p, x, scan=form == "jax-scan")
    else:
        import optkit.onnx

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the dynamo exporter's shared constants: tied, as in torch)
            apply, params = optkit.onnx.to_jax(directory + "/model.onnx", scan_layers=form != "optkit",
                                               stacked_params=form == "optkit-stacked" if form != "optkit" else None)
        ids = feed
    row["load_s"] = time.perf_counter() - imported

    def step(p, state, x):
        loss, grads = jax.value_and_grad(lambda q: jnp.mean((apply(q, x) - y) ** 2))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    state = jax.jit(tx.init)(params)
    jax.block_until_ready(state)
    marks = [time.perf_counter()]
    traced = jitted.trace(params, state, ids)
    marks.append(time.perf_counter())
    lowered = traced.lower()
    marks.append(time.perf_counter())
    compiled = lowered.compile()
    marks.append(time.perf_counter())
    params, state, loss = compiled(params, state, ids)
    jax.block_until_ready(loss)
    marks.append(time.perf_counter())
    row.update(zip(("trace_s", "lower_s", "compile_s", "run_s"), np.diff(marks).tolist()))
    row["first_s"] = marks[-1] - marks[0]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        params, state, loss = compiled(params, state, ids)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t)
    row["step_s"] = statistics.median(times)
    return row


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        directory, form, family, layers, repeats = argv[1:]
        print(json.dumps(child(directory, form, family, int(layers), int(repeats))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--depths", nargs="+", type=int, default=list(DEPTHS))
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh processes per form, in turn; the shortest first step's is reported")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    print("first training step (trace + lower + compile + first run; load apart), s; steady step, ms; "
          "fresh process each, no compilation cache")
    print("| model | layers | form | load | trace | lower | compile | run | first | x same JAX form | steady ms | "
          "x unrolled steady |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for family in args.families:
        for layers in args.depths:
            row = measure(family, layers, tuple(args.forms), args.repeats, args.rounds)
            rows.append(row)
            for form in args.forms:
                r = row[form]
                floor = row.get("jax-scan" if "scan" in form or "stacked" in form else "jax", {}).get("first_s")
                base = row.get("optkit" if form.startswith("optkit") else "jax", {}).get("step_s")
                stages = " | ".join(f"{r[k]:.2f}" if k in r else "" for k in
                                    ("load_s", "trace_s", "lower_s", "compile_s", "run_s", "first_s"))
                print(f"| {family} | {layers} | {form} | {stages} | "
                      f"{r['first_s'] / floor:.2f}x | " if floor else f"| {family} | {layers} | {form} | {stages} | | ",
                      end="")
                print(f"{r['step_s'] * 1e3:.1f} | {r['step_s'] / base:.2f}x |" if base else
                      f"{r['step_s'] * 1e3:.1f} | |", flush=True)
            print(f"| {family} | {layers} | torch eager | | | | | | {row['torch_first_s']:.2f} | | "
                  f"{row['torch_step_s'] * 1e3:.1f} | |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
