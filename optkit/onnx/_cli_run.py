"""``optkit-onnx run``: a model run on given or random inputs, timed, compared with ONNX Runtime, its gradient
checked against finite differences.

- Inputs: a ``.npz`` file (``--inputs``; its keys are the graph input names) or random values within the
  declared shapes (each symbolic dimension ``--dim NAME=SIZE``, default 2; floats standard normal, integers
  uniform in ``[0, --int-high)``, booleans fair coins; seeded by ``--seed``).
- Times: the first call (load excluded: tracing, compiling and running) and the steady call (median of
  ``--repeat`` calls), through :func:`optkit.onnx.prepare` (one compiled program).
- ``--compare-ort``: ONNX Runtime's CPU provider on the same inputs; a floating-point output differing by
  more than float32 rounding through a network (``|got - want| <= rtol |want| + atol max|want|`` with the
  defaults of ``--rtol 1e-4 --atol 1e-5``) or an integer or boolean output that differs at all exits 1.
- ``--grad``: ``jax.grad`` of ``loss = sum_k sum(output_k * C_k)`` (random ``C_k``, every floating-point
  output) with respect to the initializers :func:`optkit.onnx.to_jax` trains by default, against central
  differences of the loss along the gradient's direction and along a random unit direction; for each, the
  best of step sizes ``1e-2, 1e-3, 1e-4`` (float32 arithmetic) must agree with ``g . d`` to ``--grad-rtol``
  (default 1e-2) times ``|g|``, or it exits 1.

The command runs in JAX's 64-bit mode (``jax.enable_x64``), so ONNX's INT64 and DOUBLE run as ONNX Runtime
runs them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """The ``run`` subcommand's arguments."""
    parser = commands.add_parser("run", help="run a model on given or random inputs; time it; compare with ONNX "
                                             "Runtime (--compare-ort); check its gradient (--grad)")
    parser.add_argument("model", help="path to a .onnx file (external data read from its directory)")
    parser.add_argument("--inputs", help=".npz file of input arrays by graph input name (default: random)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="size of a symbolic dimension for random inputs (repeatable; default 2 each)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--int-high", type=int, default=2,
                        help="random integer inputs are drawn from [0, INT_HIGH) (default 2)")
    parser.add_argument("--repeat", type=int, default=10, help="calls timed after the first (default 10)")
    parser.add_argument("--compare-ort", action="store_true", help="compare the outputs with ONNX Runtime's")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of --compare-ort")
    parser.add_argument("--atol", type=float, default=1e-5,
                        help="absolute tolerance of --compare-ort, times the output's largest magnitude")
    parser.add_argument("--grad", action="store_true", help="check jax.grad against finite differences")
    parser.add_argument("--grad-rtol", type=float, default=1e-2, help="relative tolerance of --grad")


def _dims(specs: list[str]) -> dict[str, int]:
    sizes = {}
    for spec in specs:
        name, sep, size = spec.partition("=")
        if not sep or not size.strip().isdigit():
            raise SystemExit(f"optkit-onnx run: --dim takes NAME=SIZE (a non-negative integer), got {spec!r}")
        sizes[name.strip()] = int(size)
    return sizes


def random_inputs(infos: Any, dims: dict[str, int], seed: int, int_high: int) -> dict[str, np.ndarray]:
    """Random values of the declared dtypes and shapes (symbolic and unknown dimensions sized by ``dims``,
    default 2). Raises SystemExit naming an input whose rank or dtype is not declared."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in infos:
        if info.has_default:
            continue
        if info.shape is None or info.dtype is None:
            missing = "rank" if info.shape is None else "dtype"
            raise SystemExit(f"optkit-onnx run: input {info.name!r} declares no {missing}; give its values with "
                             f"--inputs")
        shape = tuple(d if isinstance(d, int) else dims.get(str(d), 2) for d in info.shape)
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "c":
            value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, max(int_high, 1), size=shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            raise SystemExit(f"optkit-onnx run: input {info.name!r} is {dtype}; give its values with --inputs")
        feeds[info.name] = value
    return feeds


def _timed(fn: Any, repeat: int) -> tuple[Any, float, float]:
    start = time.perf_counter()
    out = fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(max(repeat, 0)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return out, first, statistics.median(times) if times else float("nan")


def _compare(names: list[str], got: tuple[Any, ...], want: list[Any], rtol: float, atol: float) -> bool:
    ok = True
    for name, g, w in zip(names, got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            print(f"  {name}: shape {g.shape} != ONNX Runtime's {w.shape}  MISMATCH")
            ok = False
            continue
        if w.dtype.kind in "fc":
            scale = float(np.max(np.abs(w))) if w.size else 0.0
            diff = np.abs(g.astype(np.complex128 if w.dtype.kind == "c" else np.float64) - w)
            bound = rtol * np.abs(w) + atol * scale
            good = bool(np.all((diff <= bound) | (np.isnan(g) & np.isnan(w))))
            largest = float(np.nanmax(diff)) if diff.size else 0.0
            print(f"  {name}: {w.dtype}{list(w.shape)} largest difference {largest:.3g} (largest |value| "
                  f"{scale:.3g}){'' if good else '  MISMATCH'}")
        else:
            good = bool(np.array_equal(g, w))
            print(f"  {name}: {w.dtype}{list(w.shape)} {'equal' if good else 'DIFFERENT  MISMATCH'}")
        ok &= good
    return ok


def _gradient_check(path: str, feeds: dict[str, np.ndarray], rtol: float, seed: int) -> bool:
    import jax
    import jax.numpy as jnp

    from optkit.onnx._jax import to_jax

    apply_fn, params = to_jax(path, outputs=None)
    if not params:
        print("gradient: nothing to check (no initializer is trained by default)")
        return True
    outputs = apply_fn(params, feeds)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    rng = np.random.default_rng(seed + 1)
    weights = [rng.standard_normal(np.shape(o)).astype(np.asarray(o).dtype)
               if jnp.issubdtype(jnp.asarray(o).dtype, jnp.floating) else None for o in outputs]
    if all(w is None for w in weights):
        print("gradient: nothing to check (no floating-point output)")
        return True

    def loss(p: Any) -> Any:
        out = apply_fn(p, feeds)
        out = out if isinstance(out, tuple) else (out,)
        return sum(jnp.sum(o.astype(jnp.float32) * w) for o, w in zip(out, weights) if w is not None)

    grads = jax.jit(jax.grad(loss))(params)
    norm = float(np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in grads.values())))
    if norm == 0.0:
        print(f"gradient: {len(params)} initializers; the gradient is zero (not compared)")
        return True
    jitted = jax.jit(loss)
    worst = 0.0
    # Along the gradient itself (the directional derivative is |g|) and along a random unit direction.
    random = {k: rng.standard_normal(np.shape(v)) for k, v in params.items()}
    random_norm = float(np.sqrt(sum(np.sum(np.square(d)) for d in random.values())))
    for direction in ({k: np.asarray(g, np.float64) / norm for k, g in grads.items()},
                      {k: d / random_norm for k, d in random.items()}):
        direction = {k: d.astype(np.asarray(params[k]).dtype) for k, d in direction.items()}
        analytic = float(sum(np.sum(np.asarray(grads[k], np.float64) * direction[k]) for k in params))
        best = float("inf")
        for h in (1e-2, 1e-3, 1e-4):
            plus = {k: params[k] + h * direction[k] for k in params}
            minus = {k: params[k] - h * direction[k] for k in params}
            numeric = (float(jitted(plus)) - float(jitted(minus))) / (2 * h)
            best = min(best, abs(numeric - analytic) / norm)
        worst = max(worst, best)
    good = worst <= rtol
    print(f"gradient: {len(params)} initializers, |g| = {norm:.6g}; central differences along g and along a random "
          f"direction agree to {worst:.2g} |g|{'' if good else '  MISMATCH'}")
    return good


def run(args: argparse.Namespace) -> int:
    """The ``run`` subcommand; returns the exit status (1 on a mismatch or a load error)."""
    import jax

    with jax.enable_x64(True):  # ONNX's own types, as ONNX Runtime runs them
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from optkit.onnx._backend import prepare

    try:
        start = time.perf_counter()
        rep = prepare(args.model)
        loaded = time.perf_counter() - start
    except (ValueError, TypeError, OSError, NotImplementedError) as err:
        print(f"{args.model}: cannot be loaded: {type(err).__name__}: {err}")
        return 1
    if args.inputs:
        with np.load(args.inputs) as data:
            feeds = {key: data[key] for key in data.files}
    else:
        feeds = random_inputs(rep.inputs, _dims(args.dim), args.seed, args.int_high)
    print(f"{args.model}: loaded in {loaded:.2f} s")
    for name, value in feeds.items():
        print(f"  input {name}: {value.dtype}{list(value.shape)}")
    try:
        outputs, first, steady = _timed(lambda: rep.run(feeds), args.repeat)
    except (ValueError, TypeError, NotImplementedError) as err:
        print(f"{args.model}: the run failed: {type(err).__name__}: {err}")
        return 1
    names = list(rep.outputs)
    print(f"first call {first:.3f} s (tracing, compiling, running); steady {steady * 1e3:.3f} ms "
          f"(median of {args.repeat})")
    for name, value in zip(names, outputs):
        value = np.asarray(value)
        print(f"  output {name}: {value.dtype}{list(value.shape)}")
    ok = True
    if args.compare_ort:
        try:
            import onnxruntime
        except ImportError:
            print("--compare-ort: onnxruntime is not installed (pip install onnxruntime)")
            return 1
        session = onnxruntime.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        want = session.run(names, feeds)
        print("ONNX Runtime " + onnxruntime.__version__ + ":")
        ok &= _compare(names, outputs, want, args.rtol, args.atol)
    if args.grad:
        ok &= _gradient_check(args.model, feeds, args.grad_rtol, args.seed)
    return 0 if ok else 1
