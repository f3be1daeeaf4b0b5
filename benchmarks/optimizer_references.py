"""Muon's, schedule-free AdamW's and 8-bit Adam's reference implementations, run once to make the suite's fixtures.

``python -m benchmarks.optimizer_references --env DIR`` builds (once) a virtual environment in ``DIR`` with
``torch==2.13.0`` (a CPU build; ``torch.optim.Muon``), ``schedulefree==1.4.1`` (``AdamWScheduleFree``),
``bitsandbytes==0.50.2`` (``Adam8bit``, which runs its 8-bit optimizers on the CPU) and NumPy, and runs each
reference there on a small tree for a few steps, from the same start and with the same
gradients as optkit's tests (both made here, with NumPy, and stored beside the results):

- the gradient of each leaf at step ``t`` is ``scale * W_t + noise_t``, ``W_t`` the parameters the reference
  holds at that step (for schedule-free AdamW, its training-mode parameters ``y``), so that a wrong step changes
  every later gradient;
- ``torch.optim.Muon`` in float64 with its bfloat16 cast replaced by a copy (``grad.bfloat16()`` ->
  ``grad.clone()``: merely dropping the cast would make the iteration divide the momentum buffer in place when
  ``nesterov=False``), and in float32 as it ships (the iteration in bfloat16);
- ``schedulefree.AdamWScheduleFree`` in float64 and float32 (``foreach`` as on CPU), with its ``eval()``
  parameters after every step (taken on a deep copy, so that the ``eval()``/``train()`` round trip, which is
  not exact in floating point, does not perturb the trajectory);
- ``bitsandbytes.optim.Adam8bit`` in float32 (its CPU backend), with a parameter above ``min_8bit_size`` (8-bit
  moments, a partial last block) and one below it (float32 moments), keeping the codes and absmax of both
  moments after the last step; and bitsandbytes' own ``quantize_blockwise`` on random first and second moments
  (zeros, tiny and huge values among them), its codes and absmax kept.

The results, the inputs and the package versions are written to ``tests/optimizers/references/`` (``muon.npz``,
``schedule_free.npz``, ``adam8bit.npz``, ``versions.json``), committed; ``tests/optimizers/test_muon.py``,
``test_schedule_free.py`` and ``test_adam8bit.py`` compare optkit against them without installing torch. Nothing
is downloaded but the packages.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "optimizers" / "references"
PACKAGES = ["torch==2.13.0", "schedulefree==1.4.1", "bitsandbytes==0.50.2", "numpy"]
STEPS = 10
MUON_SHAPES = {"tall": (6, 4), "wide": (3, 5), "square": (4, 4)}
SCHEDULE_FREE_SHAPES = {"w": (4, 3), "b": (3,), "s": ()}

# (name, dtype, keyword arguments of optkit's function); the reference's own names are mapped in _torch_muon.
MUON_CASES = [
    ("f64_default", "float64", {"learning_rate": 0.02}),
    ("f64_plain_rms", "float64", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0,
                                  "adjust_lr": "match_rms_adamw", "ns_steps": 3}),
    ("f64_coefficients", "float64", {"learning_rate": 0.01, "weight_decay": 0.01, "ns_steps": 7, "eps": 1e-3,
                                     "ns_coefficients": [2.0, -1.5, 0.5]}),
    ("f32_bfloat16", "float32", {"learning_rate": 0.02}),
]
ADAM8BIT_SHAPES = {"w": (64, 70), "b": (100,)}  # 4480 elements: 8-bit, 17 blocks and a half; 100: float32
ADAM8BIT_KEPT = (1, STEPS)  # the steps whose parameters are kept (the fixture stays small)
ADAM8BIT_CASES = [
    ("default", "float32", {"learning_rate": 0.01}),
    ("decay", "float32", {"learning_rate": 0.003, "b1": 0.8, "b2": 0.99, "eps": 1e-6, "weight_decay": 0.1}),
]
SCHEDULE_FREE_CASES = [
    ("f64_default", "float64", {"learning_rate": 0.01}),
    ("f64_warmup", "float64", {"learning_rate": 0.02, "b1": 0.8, "b2": 0.99, "eps": 1e-6, "weight_decay": 0.05,
                               "warmup_steps": 4, "r": 0.5, "weight_lr_power": 1.0}),
    ("f32_warmup", "float32", {"learning_rate": 0.02, "weight_decay": 0.01, "warmup_steps": 3}),
]


def inputs(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """The start, the gradient's scale and its noise per step, float64: ``init/``, ``scale/``, ``noise/`` keys."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        out[f"init/{name}"] = rng.normal(0.0, 0.5, shape)
        out[f"scale/{name}"] = rng.uniform(0.5, 1.5, shape)
        out[f"noise/{name}"] = rng.normal(0.0, 1.0, (STEPS, *shape))
    return out


def gradient(data: dict[str, np.ndarray], name: str, w: np.ndarray, t: int) -> np.ndarray:
    """Step ``t``'s gradient of leaf ``name`` at parameters ``w``: ``scale * w + noise_t`` (in ``w``'s dtype)."""
    return (data[f"scale/{name}"].astype(w.dtype) * w + data[f"noise/{name}"][t].astype(w.dtype)).astype(w.dtype)


def _torch_run(data, names, dtype, make_optimizer, kept=None, after_step=None):
    """``STEPS`` steps of the torch optimizer ``make_optimizer(params)`` from the inputs' start with their
    gradients; the parameters after each step (``traj/<leaf>``, only the ``kept`` steps when given), and
    ``(params, optimizer)`` for the caller to read the states from. ``after_step(params, optimizer)`` runs after
    every step."""
    import torch

    params = [torch.nn.Parameter(torch.tensor(data[f"init/{n}"], dtype=getattr(torch, dtype))) for n in names]
    opt = make_optimizer(params)
    traj = {n: [p.detach().numpy().copy()] for n, p in zip(names, params)}
    for t in range(STEPS):
        for n, p in zip(names, params):
            p.grad = torch.tensor(gradient(data, n, p.detach().numpy(), t))
        opt.step()
        for n, p in zip(names, params):
            traj[n].append(p.detach().numpy().copy())
        if after_step is not None:
            after_step(params, opt)
    kept = range(STEPS + 1) if kept is None else kept
    return {f"traj/{n}": np.stack([v[t] for t in kept]) for n, v in traj.items()}, params, opt


def _torch_muon(data, dtype, kwargs):
    import torch

    names = list(MUON_SHAPES)
    mapped = {"lr": kwargs["learning_rate"], **{k: v for k, v in kwargs.items()
                                                 if k in ("momentum", "nesterov", "weight_decay", "eps",
                                                          "ns_steps")}}
    if "adjust_lr" in kwargs:
        mapped["adjust_lr_fn"] = kwargs["adjust_lr"]
    if "ns_coefficients" in kwargs:
        mapped["ns_coefficients"] = tuple(kwargs["ns_coefficients"])
    out, params, opt = _torch_run(data, names, dtype, lambda params: torch.optim.Muon(params, **mapped))
    out.update({f"mu/{n}": opt.state[p]["momentum_buffer"].numpy().copy() for n, p in zip(names, params)})
    return out


def _float64_muon():
    """torch.optim.Muon's iteration with its bfloat16 cast replaced by a copy (the float64 reference)."""
    import inspect

    import torch.optim._muon as muon_module

    source = inspect.getsource(muon_module._zeropower_via_newtonschulz)
    assert source.count("grad.bfloat16()") == 1, "torch's Muon changed: look at _zeropower_via_newtonschulz"
    namespace = dict(vars(muon_module))
    exec(source.replace("grad.bfloat16()", "grad.clone()"), namespace)  # noqa: S102 (torch's own source)
    return namespace["_zeropower_via_newtonschulz"]


def _torch_schedule_free(data, dtype, kwargs):
    import copy

    import schedulefree

    names = list(SCHEDULE_FREE_SHAPES)

    def make(params):
        opt = schedulefree.AdamWScheduleFree(
            params, lr=kwargs["learning_rate"], betas=(kwargs.get("b1", 0.9), kwargs.get("b2", 0.999)),
            eps=kwargs.get("eps", 1e-8), weight_decay=kwargs.get("weight_decay", 0.0),
            warmup_steps=kwargs.get("warmup_steps", 0), r=kwargs.get("r", 0.0),
            weight_lr_power=kwargs.get("weight_lr_power", 2.0))
        opt.train()
        return opt

    evals = {n: [data[f"init/{n}"].astype(dtype)] for n in names}

    def evaluated(params, opt):  # eval() on a deep copy: the eval/train round trip is not exact
        twin_params, twin = copy.deepcopy((params, opt))
        twin.eval()
        for n, p in zip(names, twin_params):
            evals[n].append(p.detach().numpy().copy())

    out, params, opt = _torch_run(data, names, dtype, make, after_step=evaluated)
    out.update({f"eval/{n}": np.stack(v) for n, v in evals.items()})
    out.update({f"z/{n}": opt.state[p]["z"].numpy().copy() for n, p in zip(names, params)})
    out.update({f"nu/{n}": opt.state[p]["exp_avg_sq"].numpy().copy() for n, p in zip(names, params)})
    return out


def _bitsandbytes_adam8bit(data, dtype, kwargs):
    import bitsandbytes
    import torch

    names = list(ADAM8BIT_SHAPES)
    out, params, opt = _torch_run(data, names, dtype, lambda params: bitsandbytes.optim.Adam8bit(
        params, lr=kwargs["learning_rate"], betas=(kwargs.get("b1", 0.9), kwargs.get("b2", 0.999)),
        eps=kwargs.get("eps", 1e-8), weight_decay=kwargs.get("weight_decay", 0.0)), kept=ADAM8BIT_KEPT)
    for n, p in zip(names, params):
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor) and key not in ("qmap1", "qmap2"):
                out[f"state/{n}/{key}"] = value.numpy().copy()
    return out


def _bitsandbytes_codes(seed: int) -> dict[str, np.ndarray]:
    """bitsandbytes' CPU quantize_blockwise (blocks of 256) on random moments: signed (normal, with zeros and a
    huge value) and unsigned (squares, with zeros and tiny values); the inputs, codes and absmax."""
    import bitsandbytes.functional as F
    import torch

    rng = np.random.default_rng(seed)
    signed = rng.normal(0.0, 1.0, 256 * 20 + 77).astype(np.float32)
    signed[:256] = 0.0  # a block of zeros
    signed[300:310] = 0.0
    signed[600] = 1e30
    signed[900:1000] *= 1e-6
    unsigned = (rng.normal(0.0, 1.0, 256 * 20 + 77) ** 2).astype(np.float32)
    unsigned[300:310] = 0.0
    unsigned[900:1000] *= 1e-9
    out = {}
    for name, values, is_signed in (("signed", signed, True), ("unsigned", unsigned, False)):
        code = F.create_dynamic_map(signed=is_signed)
        codes, absmax = torch.ops.bitsandbytes.quantize_blockwise(torch.tensor(values), code, 256)
        out[f"codes/{name}/input"] = values
        out[f"codes/{name}/codes"] = codes.numpy().copy()
        out[f"codes/{name}/absmax"] = absmax.numpy().copy()
        out[f"codes/{name}/map"] = code.numpy().copy()
    return out


def _child(out_dir: str) -> None:
    import importlib.metadata

    import schedulefree  # noqa: F401
    import torch
    import torch.optim._muon as muon_module

    out = pathlib.Path(out_dir)
    cases = {}
    data = inputs(MUON_SHAPES, seed=0)
    results = dict(data)
    shipped, exact = muon_module._zeropower_via_newtonschulz, _float64_muon()
    for name, dtype, kwargs in MUON_CASES:
        muon_module._zeropower_via_newtonschulz = exact if dtype == "float64" else shipped
        results.update({f"{name}/{k}": v for k, v in _torch_muon(data, dtype, kwargs).items()})
        cases[f"muon/{name}"] = {"dtype": dtype, "kwargs": kwargs}
    muon_module._zeropower_via_newtonschulz = shipped
    np.savez_compressed(out / "muon.npz", **results)

    data = inputs(SCHEDULE_FREE_SHAPES, seed=1)
    results = dict(data)
    for name, dtype, kwargs in SCHEDULE_FREE_CASES:
        results.update({f"{name}/{k}": v for k, v in _torch_schedule_free(data, dtype, kwargs).items()})
        cases[f"schedule_free/{name}"] = {"dtype": dtype, "kwargs": kwargs}
    np.savez_compressed(out / "schedule_free.npz", **results)

    data = {k: v.astype(np.float32) for k, v in inputs(ADAM8BIT_SHAPES, seed=2).items()}  # float32 runs
    results = {**data, **_bitsandbytes_codes(seed=3)}
    for name, dtype, kwargs in ADAM8BIT_CASES:
        results.update({f"{name}/{k}": v for k, v in _bitsandbytes_adam8bit(data, dtype, kwargs).items()})
        cases[f"adam8bit/{name}"] = {"dtype": dtype, "kwargs": kwargs, "kept_steps": list(ADAM8BIT_KEPT)}
    np.savez_compressed(out / "adam8bit.npz", **results)

    versions = {p: importlib.metadata.version(p) for p in ("torch", "schedulefree", "bitsandbytes", "numpy")}
    (out / "versions.json").write_text(json.dumps({
        "made_by": "python -m benchmarks.optimizer_references --env DIR", "python": sys.version.split()[0],
        "versions": versions, "torch_build": torch.__version__, "steps": STEPS, "cases": cases,
        "float64_muon": "torch.optim._muon._zeropower_via_newtonschulz with grad.bfloat16() replaced by "
                        "grad.clone()"}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", help="the reference environment's directory (made if missing)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    if not args.env:
        parser.error("--env DIR is required")
    python = os.path.join(args.env, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", args.env], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PACKAGES], check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, os.path.abspath(__file__), "--child", str(OUT)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"wrote {', '.join(sorted(p.name for p in OUT.iterdir()))} in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
