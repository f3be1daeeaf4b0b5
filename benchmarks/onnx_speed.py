"""optkit.onnx against ONNX Runtime (inference) and torch eager (training), on CPU, one model at a time.

Each model is built with random weights (torchvision / transformers), exported at run time by torch.onnx
(TorchScript exporter, opset 17; GPT-2 by the dynamo exporter, opset 20), and timed:

- **inference**: ONNX Runtime's ``InferenceSession.run`` against ``optkit.onnx.prepare(model).run`` (jitted);
- **training step**: ``torch`` eager (``loss.backward()``, ``torch.optim.Adam``) against the same step on
  ``optkit.onnx.to_jax``'s ``apply_fn`` (``jax.value_and_grad``, ``optkit.adam``, ``optax.apply_updates``,
  ``jax.jit`` with the parameters and state donated);
- **first training step**: the same, from nothing compiled (optkit's includes tracing and XLA's compile);
  with ``--cache``, also optkit's first step in a second fresh process that finds the first one's programs in
  JAX's persistent compilation cache, as optkit turns it on by default (a new directory per model, its size
  reported; the stages of that step: ``to_jax``, the optimizer's init, trace, lower, cache read, run; docs:
  "Compile once"). Other first steps run with the cache off (``OPTKIT_COMPILATION_CACHE=off``).

Times are medians over ``--repeats`` runs after one warm-up; the ratios are optkit's time over the other's.
Threads: ONNX Runtime ``intra_op_num_threads`` and ``torch.set_num_threads`` are ``--threads``; XLA:CPU uses
the machine's cores. Needs torch, torchvision and transformers (not optkit dependencies)::

    python -m benchmarks.onnx_speed                         # every model (several minutes on 2 cores)
    python -m benchmarks.onnx_speed --models mobilenet_v3_small --repeats 3
    python -m benchmarks.onnx_speed --overhead              # BackendRep.run's per-call overhead (no torch)
    python -m benchmarks.onnx_speed --cache                 # and the first step of a second process (cache)
    python -m benchmarks.onnx_speed --hugepages             # rerun under GLIBC_TUNABLES=glibc.malloc.hugetlb=1
    python -m benchmarks.onnx_speed --small                 # inference at 1 x 32 x 32 and 2 x 64 x 64, 1 and 2 threads
    python -m benchmarks.onnx_speed --depth                 # transformers at 2-24 layers, scan_layers on and off

``--small`` times the three convolutional models' inference where on-device users run them (batch 1 at 32 x 32,
batch 2 at 64 x 64), each thread count in a child process pinned to that many cores, XLA:CPU limited to as many
threads (``XLA_FLAGS``) and ONNX Runtime's ``intra_op_num_threads`` the same.

``--hugepages`` starts the benchmark again in a process whose glibc backs large allocations with transparent huge
pages (glibc 2.35+, THP in ``madvise`` or ``always`` mode): XLA:CPU allocates each call's intermediates afresh and
the kernel otherwise faults and zeroes them 4 KB at a time (docs: "Speed on CPU"). It applies to ONNX Runtime and
torch in that process as well; the header line says which allocator setting a table was measured under.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import warnings

import numpy as np

MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "bert", "gpt2")
HUGEPAGES = "glibc.malloc.hugetlb=1"


def _build(name: str, batch: int):
    """``(module, example input, loss of (output, target))`` with random weights."""
    import torch

    torchvision = _torchvision()  # before transformers, which imports it
    torch.manual_seed(0)
    if name in ("bert", "gpt2"):
        import transformers

        if name == "bert":
            model = transformers.BertModel(transformers.BertConfig(
                vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=1024, max_position_embeddings=128), add_pooling_layer=False)
        else:
            model = transformers.GPT2Model(transformers.GPT2Config(
                vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=4))

        class First(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, ids):
                return self.inner(ids, use_cache=False, return_dict=False)[0] if name == "gpt2" else self.inner(
                    ids, return_dict=False)[0]

        return First(model), torch.randint(0, 1000, (batch, 128))
    constructor = getattr(torchvision.models, name)
    return constructor(weights=None, num_classes=10), torch.randn(batch, 3, 224, 224)


def _torchvision():
    try:
        import torchvision
    except RuntimeError:  # a PyPI torchvision built for another torch: its C++ operators stubbed (unused here)
        from tests.onnx.models.make_models import _import_torchvision

        torchvision = _import_torchvision()
    return torchvision


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_steps(module, x, repeats: int) -> tuple:
    """torch eager's training step on ``module`` at ``x`` (MSE against a random target, ``torch.optim.Adam``):
    the target, the first step's seconds and the median of ``repeats`` steps' seconds."""
    import torch

    with torch.no_grad():
        target = torch.randn_like(module(x))
    module.train()
    opt = torch.optim.Adam(module.parameters(), lr=1e-4)

    def torch_step():
        opt.zero_grad()
        loss = torch.mean((module(x) - target) ** 2)
        loss.backward()
        opt.step()

    start = time.perf_counter()
    torch_step()
    first = time.perf_counter() - start
    return target, first, _median_time(torch_step, repeats)


def measure(name: str, batch: int, repeats: int, threads: int, cache: bool = False) -> dict:
    import jax
    import jax.numpy as jnp
    import onnx
    import onnxruntime
    import optax
    import torch

    import optkit
    import optkit.onnx

    torch.set_num_threads(threads)
    module, x = _build(name, batch)
    module.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # GPT-2 of transformers 5 uses aten::diff, which the TorchScript exporter cannot write: dynamo, opset 20.
        dynamo = name == "gpt2"
        torch.onnx.export(module, (x,), buffer, input_names=["input"], output_names=["output"],
                          opset_version=20 if dynamo else 17, dynamo=dynamo, external_data=False)
    model = onnx.load_from_string(buffer.getvalue())
    feed = x.numpy()
    row = {"model": name}

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    rep = optkit.onnx.prepare(model)
    row["ort_inference_s"] = _median_time(lambda: session.run(None, {"input": feed}), repeats)
    row["optkit_inference_s"] = _median_time(lambda: rep.run([feed]), repeats)

    # Training: torch eager.
    target, row["torch_first_step_s"], row["torch_step_s"] = torch_steps(module, x, repeats)

    # Training: optkit (the exported model as a JAX function).
    start = time.perf_counter()
    apply_fn, params = optkit.onnx.to_jax(model)
    tx = optkit.adam(1e-4)
    y = jnp.asarray(target.detach().numpy())

    def step(p, state, inputs):
        loss, grads = jax.value_and_grad(lambda q: jnp.mean((apply_fn(q, inputs) - y) ** 2))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    state = tx.init(params)
    carry = [params, state]

    def jax_step():
        carry[0], carry[1], loss = step(carry[0], carry[1], feed)
        jax.block_until_ready(loss)

    jax_step()
    row["optkit_first_step_s"] = time.perf_counter() - start
    row["optkit_step_s"] = _median_time(jax_step, repeats)
    row["inference_ratio"] = row["optkit_inference_s"] / row["ort_inference_s"]
    row["step_ratio"] = row["optkit_step_s"] / row["torch_step_s"]
    row["first_step_ratio"] = row["optkit_first_step_s"] / row["torch_first_step_s"]
    if cache:
        del carry, step
        row["cold_process"], row["cached_process"], row["cache_bytes"] = cached_first_step(
            buffer.getvalue(), feed, target.detach().numpy())
        row["cached_ratio"] = row["cached_process"]["total_s"] / row["torch_first_step_s"]
    return row


# A fresh process's first training step (load, to_jax, the optimizer's init under jax.jit, trace, compile or read
# the cache, run) with optkit's default compilation cache (optkit.onnx.compilation_cache) in argv[1]/cache, where
# the model, its input and target are saved; prints one JSON line of seconds. (An eager tx.init compiles one fill per
# parameter shape: 1.8 s for mobilenet_v3_small's 71 tensors of 59 shapes, with optax.adam as with optkit.adam;
# 0.5 s under jax.jit.)
_CACHED_STEP = """
import json, sys, time
start = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np, onnx, optax, optkit, optkit.onnx
from optkit.onnx._run.program import stages
imported = time.perf_counter()
data = np.load(sys.argv[1] + "/data.npz")
apply_fn, params = optkit.onnx.to_jax(onnx.load(sys.argv[1] + "/model.onnx"))
loaded = time.perf_counter()
tx, y = optkit.adam(1e-4), jnp.asarray(data["target"])

def step(p, state, inputs):
    loss, grads = jax.value_and_grad(lambda q: jnp.mean((apply_fn(q, inputs) - y) ** 2))(p)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

state = jax.jit(tx.init)(params)
jax.block_until_ready(state)
initialized = time.perf_counter()
with stages() as record:
    _, _, loss = jax.jit(step, donate_argnums=(0, 1))(params, state, data["input"])
    jax.block_until_ready(loss)
print(json.dumps({"imports_s": imported - start, "load_s": loaded - imported, "init_s": initialized - loaded,
                  "total_s": time.perf_counter() - imported, **{k + "_s": v for k, v in record.items()}}))
"""


def cached_first_step(model_bytes: bytes, feed: np.ndarray, target: np.ndarray) -> tuple[dict, dict, int]:
    """The first and the second fresh Python process's first training steps (:data:`_CACHED_STEP`'s seconds: the
    imports, ``to_jax``, the optimizer's init, the step's stages and the total after the imports, as the torch
    column imports nothing) sharing optkit's default compilation cache in a new directory, and the cache's bytes
    on disk after both."""
    import json
    import pathlib
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        pathlib.Path(folder, "model.onnx").write_bytes(model_bytes)
        np.savez(pathlib.Path(folder, "data.npz"), input=feed, target=target)
        env = {**os.environ, "OPTKIT_COMPILATION_CACHE": str(pathlib.Path(folder, "cache"))}
        rows = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", _CACHED_STEP, folder], capture_output=True, text=True,
                                 check=True, env=env)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        size = sum(f.stat().st_size for f in pathlib.Path(folder, "cache").rglob("*") if f.is_file())
    return rows[0], rows[1], size


def overhead(calls: int = 3000) -> dict:
    """Microseconds per call of ``BackendRep.run`` on a warm path (the exported MLP of tests/onnx/models, batch 4)
    against calling its compiled function directly; needs only optkit's test extra."""
    import pathlib

    import jax
    import onnx

    import optkit.onnx

    stem = pathlib.Path(__file__).resolve().parent.parent / "tests" / "onnx" / "models" / "torch_torchscript_mlp"
    rep = optkit.onnx.prepare(onnx.load(f"{stem}.onnx"))
    x = np.load(f"{stem}.npz")["input"]
    rep.run([x])
    (compiled,) = rep._functions.values()

    def per_call(fn):
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6

    with jax.enable_x64(True):
        direct = per_call(lambda: jax.block_until_ready(compiled(x)))
    return {"run_us": per_call(lambda: rep.run([x])),
            "run_device_us": per_call(lambda: jax.block_until_ready(rep.run([x], as_numpy=False))),
            "direct_us": direct}


SMALL = ((1, 32), (2, 64))
_ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def small_inference(threads: int, repeats: int) -> list[dict]:
    """In this process (pinned to ``threads`` cores by the caller): each CNN exported at each size of ``SMALL``,
    the medians of ONNX Runtime's and ``prepare(model).run``'s inference."""
    import onnxruntime
    import torch

    import optkit.onnx

    torch.set_num_threads(threads)
    rows = []
    for name in MODELS[:3]:
        for batch, pixels in SMALL:
            torch.manual_seed(0)
            module = getattr(_torchvision().models, name)(weights=None, num_classes=10).eval()
            x = torch.randn(batch, 3, pixels, pixels)
            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, (x,), buffer, input_names=["input"], output_names=["output"],
                                  opset_version=17, dynamo=False, external_data=False)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
            session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
            feed = x.numpy()
            rep = optkit.onnx.prepare(buffer.getvalue())
            np.testing.assert_allclose(rep.run([feed])[0], session.run(None, {"input": feed})[0], rtol=1e-3,
                                       atol=1e-4)
            rows.append({"model": name, "batch": batch, "pixels": pixels, "threads": threads,
                         "ort_s": _median_time(lambda s=session, f=feed: s.run(None, {"input": f}), repeats),
                         "optkit_s": _median_time(lambda r=rep, f=feed: r.run([f]), repeats)})
    return rows


def _small(repeats: int) -> None:
    import json
    import subprocess

    print(f"inference, medians of {repeats} runs; each thread count in its own process pinned to that many cores")
    print("| model | input | threads | optkit / ORT |")
    print("|---|---|---:|---|")
    for threads in (1, 2):
        env = dict(os.environ)
        if threads == 1:
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {_ONE_THREAD_XLA}".strip()
        out = subprocess.run([sys.executable, "-m", "benchmarks.onnx_speed", "--small-worker", str(threads),
                              "--repeats", str(repeats)], env=env, capture_output=True, text=True, check=True)
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            print(f"| {r['model']} | {r['batch']} x 3 x {r['pixels']} x {r['pixels']} | {threads} | "
                  f"{r['optkit_s'] / r['ort_s']:.2f}x ({r['optkit_s'] * 1e3:.2f} ms vs {r['ort_s'] * 1e3:.2f} ms) |",
                  flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime and torch threads (default 2)")
    parser.add_argument("--overhead", action="store_true", help="only BackendRep.run's per-call overhead")
    parser.add_argument("--cache", action="store_true",
                        help="also the first step of a second process that reads JAX's persistent compilation cache")
    parser.add_argument("--hugepages", action="store_true",
                        help=f"rerun in a process started with GLIBC_TUNABLES={HUGEPAGES} (large allocations on "
                             "transparent huge pages)")
    parser.add_argument("--small", action="store_true",
                        help="only inference at 1 x 32 x 32 and 2 x 64 x 64, on 1 and 2 threads (CNNs)")
    parser.add_argument("--small-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--depth", action="store_true",
                        help="only the depth table: transformers at 2-24 layers with and without scan_layers "
                             "(benchmarks.onnx_depth)")
    args = parser.parse_args(argv)
    if args.depth:
        from benchmarks import onnx_depth

        onnx_depth.main(["--repeats", str(args.repeats)])
        return
    if args.small_worker:
        import json

        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.small_worker]))
        print(json.dumps(small_inference(args.small_worker, max(args.repeats, 20))))
        return
    if args.small:
        _small(max(args.repeats, 20))
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if args.hugepages and HUGEPAGES not in tunables.split(":"):
        env = {**os.environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, HUGEPAGES) if t)}
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--hugepages"]
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.onnx_speed", *rest], env)
    if args.overhead:
        r = overhead()
        print(f"BackendRep.run: {r['run_us']:.1f} us a call (NumPy outputs), {r['run_device_us']:.1f} us "
              f"(as_numpy=False); the compiled function called directly: {r['direct_us']:.1f} us")
        return
    os.environ.setdefault("OPTKIT_COMPILATION_CACHE", "off")  # (cold first steps: no cache but the --cache one's)
    print(f"batch {args.batch}, {args.threads} threads for ONNX Runtime and torch, medians of {args.repeats} runs, "
          f"GLIBC_TUNABLES={tunables or '(unset)'}")
    cached = " second process's first step (cache) / torch's first step |" if args.cache else ""
    print("| model | inference optkit / ORT | training step optkit / torch (Adam) | "
          "first training step optkit / torch |" + cached)
    print("|---|---|---|---|" + ("---|" if args.cache else ""))
    for name in args.models:
        r = measure(name, args.batch, args.repeats, args.threads, args.cache)
        extra = ""
        if args.cache:
            c = r["cached_process"]
            extra = (f" {r['cached_ratio']:.1f}x ({c['total_s']:.2f} s vs {r['torch_first_step_s']:.2f} s: to_jax "
                     f"{c['load_s']:.2f}, init {c['init_s']:.2f}, trace {c.get('trace_s', 0):.2f}, lower "
                     f"{c.get('lower_s', 0):.2f}, cache read {c.get('cache_read_s', 0):.2f}, compile "
                     f"{c.get('compile_s', 0):.2f}, run {c['run_s']:.2f} s; first process "
                     f"{r['cold_process']['total_s']:.1f} s; imports {c['imports_s']:.1f} s; cache "
                     f"{r['cache_bytes'] / 2**20:.1f} MiB) |")
        print(f"| {name} | {r['inference_ratio']:.2f}x ({r['optkit_inference_s'] * 1e3:.0f} ms vs "
              f"{r['ort_inference_s'] * 1e3:.0f} ms) | {r['step_ratio']:.2f}x ({r['optkit_step_s']:.2f} s vs "
              f"{r['torch_step_s']:.2f} s) | {r['first_step_ratio']:.1f}x ({r['optkit_first_step_s']:.1f} s vs "
              f"{r['torch_first_step_s']:.2f} s) |" + extra, flush=True)


if __name__ == "__main__":
    main()
