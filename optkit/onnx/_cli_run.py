"""``optkit-onnx run``: a model run on given or random inputs, timed, compared with ONNX Runtime, its gradient
checked against finite differences.

- Inputs: a ``.npz`` file (``--inputs``; its keys are the graph input names) or random values within the
  declared shapes (:func:`random_inputs`: each symbolic dimension ``--dim NAME=SIZE``, default 2; floats standard
  normal, integers uniform in ``[0, --int-high)``, booleans fair coins; seeded by ``--seed``), made valid for a
  language model's usual inputs: an ``attention_mask`` of ones, ``position_ids`` counting on from the past, a
  total length the past plus the new tokens (``past_sequence_length + sequence_length``, GenAI's
  ``total_sequence_length``), and the KV cache's head size from the ``genai_config.json`` beside the model.
- Times: the load, the first call stage by stage (tracing, lowering, XLA's compile or the read from JAX's
  persistent compilation cache, running; from ``jax.monitoring``'s events) and the steady call (median of
  ``--repeat`` calls), through :func:`optkit.onnx.prepare` (one compiled program); and the cache's directory
  (:func:`optkit.onnx.compilation_cache`), so that a second run shows what the cache saved.
- ``--compare-ort``: ONNX Runtime's CPU provider on the same inputs; a floating-point output differing by
  more than float32 rounding through a network (``|got - want| <= rtol |want| + atol max|want|`` with the
  defaults of ``--rtol 1e-4 --atol 1e-5``, each at least 4 units of a float16 or bfloat16 output's precision)
  in more than ``--outliers`` of its elements (default 1e-4: a pasted mask's pixel that a box coordinate's
  float32 rounding moves across its edge; every element beyond is counted in the report), or an integer or
  boolean output that differs at all, exits 1.
- ``--grad``: ``jax.grad`` of ``loss = sum_k sum(output_k * C_k)`` (random ``C_k``, every floating-point
  output) with respect to the initializers :func:`optkit.onnx.to_jax` trains by default, against central
  differences of the loss along the gradient's direction and along a random unit direction; for each, the
  best of step sizes ``1e-2, 1e-3, 1e-4`` (float32 arithmetic) must agree with ``g . d`` to ``--grad-rtol``
  (default 1e-2) times ``|g|``, or it exits 1.

- Every floating-point output with NaN or infinite values is named with their count; under ``--compare-ort``
  that fails the run.

The command runs in JAX's 64-bit mode (``jax.enable_x64``), so ONNX's INT64 and DOUBLE run as ONNX Runtime
runs them. Exit status (:data:`EXIT_CODES`): 0 the model ran (and matched, with ``--compare-ort`` or
``--grad``); 1 it cannot be loaded, its run failed, or it did not match (a different or non-finite output, a
gradient off); 2 a usage error (an ``--inputs`` file missing or not a ``.npz`` of arrays, a ``--dim`` the model
does not declare, an input whose values cannot be drawn); 3 ONNX Runtime refused the model or its inputs
(``--compare-ort``: nothing to compare with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zipfile
from typing import Any

import numpy as np

__all__ = ["EXIT_CODES", "add_parser", "random_inputs", "run"]

EXIT_CODES = {0: "the model ran (and matched)", 1: "load error, run error or mismatch", 2: "usage error",
              3: "ONNX Runtime refused the model (--compare-ort)"}


class _UsageError(Exception):
    """A command-line mistake: one line on standard error, exit status 2."""


def add_parser(commands: Any) -> None:
    """The ``run`` subcommand's arguments."""
    parser = commands.add_parser("run", help="run a model on given or random inputs; time it; compare with ONNX "
                                             "Runtime (--compare-ort); check its gradient (--grad)",
                                 epilog="exit status: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
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
    parser.add_argument("--outliers", type=float, default=1e-4,
                        help="fraction of a float output's elements that may differ beyond the tolerance (default "
                             "1e-4: a pixel that a box coordinate's rounding moves across an edge)")
    parser.add_argument("--grad", action="store_true", help="check jax.grad against finite differences")
    parser.add_argument("--grad-rtol", type=float, default=1e-2, help="relative tolerance of --grad")


def _dims(specs: list[str]) -> dict[str, int]:
    sizes = {}
    for spec in specs:
        name, sep, size = spec.partition("=")
        if not sep or not size.strip().isdigit():
            raise _UsageError(f"--dim takes NAME=SIZE (a non-negative integer), got {spec!r}")
        sizes[name.strip()] = int(size)
    return sizes


_PAST, _NEW, _TOTAL = "past_sequence_length", "sequence_length", "total_sequence_length"


def _symbols(infos: Any) -> set[str]:
    """The symbolic dimensions the inputs declare, an expression's names among them (``past + sequence``)."""
    names = set()
    for info in infos:
        for d in info.shape or ():
            if isinstance(d, str):
                names |= {term.strip() for term in d.split("+") if term.strip() and not term.strip().isdigit()}
    return names


def _sizes(infos: Any, given: dict[str, int], folder: str | None) -> dict[str, int]:
    """Each symbolic dimension's size: ``given`` (``--dim``), else the KV cache's head size from GenAI's
    ``genai_config.json`` in ``folder`` (``kv_cache_dim``) and a batch of 1 for GenAI's files (ONNX Runtime's
    GroupQueryAttention takes a past and several new tokens for one sequence only), else 2; a total length is the
    past plus the new."""
    declared = _symbols(infos)
    unknown = sorted(set(given) - declared)
    if unknown:
        raise _UsageError(f"--dim {unknown[0]}: the model declares no dimension {unknown[0]!r} (its symbolic "
                          f"dimensions: {', '.join(sorted(declared)) or 'none'})")
    sizes = {name: 2 for name in declared}
    config = os.path.join(folder, "genai_config.json") if folder else None
    if "kv_cache_dim" in declared and config and os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            decoder = json.load(f).get("model", {}).get("decoder", {})
        if isinstance(decoder.get("head_size"), int):
            sizes["kv_cache_dim"] = decoder["head_size"]
    if _TOTAL in declared and "batch_size" in declared:
        # GenAI's files run GroupQueryAttention, which ONNX Runtime runs with a past and several new tokens
        # only for one sequence at a time
        sizes["batch_size"] = 1
    sizes.update(given)
    if _TOTAL in declared and _TOTAL not in given:
        sizes[_TOTAL] = sizes.get(_PAST, 0) + sizes.get(_NEW, 0) if _PAST in declared and _NEW in declared else 2
    return sizes


def _size(dim: Any, sizes: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    return sum(int(term) if term.strip().isdigit() else sizes.get(term.strip(), 2) for term in str(dim).split("+"))


def random_inputs(infos: Any, dims: dict[str, int], seed: int, int_high: int,
                  folder: str | None = None) -> dict[str, np.ndarray]:
    """Random values of the declared dtypes and shapes, valid for a language model's usual inputs.

    Args:
      infos: the graph inputs (:class:`optkit.onnx.InputInfo`); those with an initializer default are left out.
      dims: symbolic dimension sizes (``--dim``); the others 2, a KV cache's ``kv_cache_dim`` read from the
        ``genai_config.json`` in ``folder`` (GenAI's builder), a total length (``total_sequence_length``, or a
        declared ``past_sequence_length + sequence_length``) the sum of its parts.
      seed: NumPy's generator seed. int_high: integers are drawn from ``[0, int_high)``.
      folder: the model's directory, or None.

    Returns:
      ``{input name: array}``: floats standard normal, integers uniform, booleans fair coins; an
      ``attention_mask`` all ones (a row of zeros makes attention's softmax 0/0), ``position_ids`` the positions
      after the past (``past + 0, 1, ...``).

    Raises:
      _UsageError: (exit 2) an input whose rank or dtype is not declared, a ``dims`` name the model lacks.

    Example:
      >>> random_inputs(prepare("model.onnx").inputs, {"sequence_length": 8}, 0, 100)  # doctest: +SKIP
    """
    rng = np.random.default_rng(seed)
    sizes = _sizes(infos, dims, folder)
    feeds = {}
    for info in infos:
        if info.has_default:
            continue
        if info.shape is None or info.dtype is None:
            missing = "rank" if info.shape is None else "dtype"
            raise _UsageError(f"input {info.name!r} declares no {missing}; give its values with --inputs")
        shape = tuple(_size(d, sizes) for d in info.shape)
        dtype = np.dtype(info.dtype)
        lowered = info.name.lower()
        if "attention_mask" in lowered and dtype.kind in "iub":
            value = np.ones(shape, dtype)
        elif lowered.endswith("position_ids") and dtype.kind in "iu" and shape:
            value = np.broadcast_to(sizes.get(_PAST, 0) + np.arange(shape[-1]), shape)
            value = np.ascontiguousarray(value).astype(dtype)
        elif dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "c":
            value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, max(int_high, 1), size=shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            raise _UsageError(f"input {info.name!r} is {dtype}; give its values with --inputs")
        feeds[info.name] = value
    return feeds


def _read_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (``--inputs``), or a usage error naming the file."""
    if not os.path.isfile(path):
        raise _UsageError(f"--inputs {path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
        if not hasattr(data, "files"):
            raise ValueError("it holds one array (a .npy), not arrays by input name")
        with data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _UsageError(f"--inputs {path}: not a .npz file of arrays by input name (numpy.savez): "
                          f"{reason}") from None


def _non_finite(names: list[str], outputs: tuple[Any, ...]) -> int:
    """Print a line for each floating-point output with NaN or infinite values; how many such outputs."""
    count = 0
    for name, value in zip(names, outputs):
        value = np.asarray(value)
        if value.dtype.kind in "fc":
            bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
            if bad:
                print(f"  output {name}: {bad} of {value.size} values are NaN or infinite")
                count += 1
    return count


def _timed(fn: Any, repeat: int) -> tuple[Any, dict[str, float], float]:
    """``(the first call's outputs, its stages (:func:`~optkit.onnx._run.program.stages`), the median of
    ``repeat`` more calls' seconds)``."""
    from optkit.onnx._run.program import stages

    with stages() as record:
        out = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return out, record, statistics.median(times) if times else float("nan")


def _compare(names: list[str], got: tuple[Any, ...], want: list[Any], rtol: float, atol: float,
             outliers: float = 0.0) -> bool:
    """Each output against ONNX Runtime's: a float output within ``rtol |want| + atol max|want|`` (both at least 4
    units of a 16-bit output's precision) but for at most ``outliers`` of its elements, an integer one equal."""
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
            unit = 4 * float(np.finfo(w.dtype).eps) if w.dtype.kind == "f" and w.dtype.itemsize < 4 else 0.0
            bound = max(rtol, unit) * np.abs(w) + max(atol, unit) * scale
            beyond = int(np.count_nonzero(~((diff <= bound) | (np.isnan(g) & np.isnan(w)))))
            good = beyond <= outliers * w.size
            largest = float(np.nanmax(diff)) if diff.size else 0.0
            note = f"; {beyond} of {w.size} elements beyond the tolerance" if beyond else ""
            print(f"  {name}: {w.dtype}{list(w.shape)} largest difference {largest:.3g} (largest |value| "
                  f"{scale:.3g}){note}{'' if good else '  MISMATCH'}")
        else:
            good = bool(np.array_equal(g, w))
            print(f"  {name}: {w.dtype}{list(w.shape)} {'equal' if good else 'DIFFERENT  MISMATCH'}")
        ok &= good
    return ok


def _ort_outputs(path: str, names: list[str], feeds: dict[str, np.ndarray]) -> tuple[str, list[Any]] | None:
    """``(ONNX Runtime's version, its outputs)``, or None after one line saying why it gave none."""
    try:
        import onnxruntime
    except ImportError:
        print("--compare-ort: onnxruntime is not installed (pip install onnxruntime)", file=sys.stderr)
        return None
    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnxruntime's own exception types (Fail, InvalidGraph...)
        print(f"--compare-ort: ONNX Runtime {onnxruntime.__version__} cannot load {path}: "
              f"{_first_line(err)}", file=sys.stderr)
        return None
    try:
        return onnxruntime.__version__, session.run(names, feeds)
    except Exception as err:  # noqa: BLE001
        print(f"--compare-ort: ONNX Runtime {onnxruntime.__version__} refused the inputs: {_first_line(err)}",
              file=sys.stderr)
        return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:500]


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
    """The ``run`` subcommand; returns the exit status (:data:`EXIT_CODES`)."""
    import jax

    try:
        with jax.enable_x64(True):  # ONNX's own types, as ONNX Runtime runs them
            return _run(args)
    except _UsageError as err:
        print(f"optkit-onnx run: {err}", file=sys.stderr)
        return 2


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
        feeds = _read_inputs(args.inputs)
    else:
        feeds = random_inputs(rep.inputs, _dims(args.dim), args.seed, args.int_high,
                              os.path.dirname(os.path.abspath(args.model)))
    print(f"{args.model}: loaded in {loaded:.2f} s")
    for name, value in feeds.items():
        print(f"  input {name}: {value.dtype}{list(value.shape)}")
    try:
        outputs, first, steady = _timed(lambda: rep.run(feeds), args.repeat)
        from optkit.onnx._run.cache import compilation_cache
        from optkit.onnx._run.program import describe_stages
    except (ValueError, TypeError, NotImplementedError) as err:
        print(f"{args.model}: the run failed: {type(err).__name__}: {err}")
        return 1
    names = list(rep.outputs)
    cache = compilation_cache()
    print(f"first call {first['total']:.3f} s: {describe_stages(first)}; steady {steady * 1e3:.3f} ms "
          f"(median of {args.repeat})")
    print(f"JAX's compilation cache: {cache or 'off'}")
    for name, value in zip(names, outputs):
        value = np.asarray(value)
        print(f"  output {name}: {value.dtype}{list(value.shape)}")
    non_finite = _non_finite(names, outputs)
    ok = True
    if args.compare_ort:
        want = _ort_outputs(args.model, names, feeds)
        if want is None:
            return 3
        print("ONNX Runtime " + want[0] + ":")
        ok &= _compare(names, outputs, want[1], args.rtol, args.atol, args.outliers)
        ok &= not non_finite
    if args.grad:
        ok &= _gradient_check(args.model, feeds, args.grad_rtol, args.seed)
    return 0 if ok else 1
