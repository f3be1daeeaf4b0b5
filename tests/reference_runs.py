"""The reference implementations' runs committed in tests/optimizers/references (benchmarks/optimizer_references.py).

Each ``.npz`` holds the inputs (``init/<leaf>``, ``scale/<leaf>``, ``noise/<leaf>``: the start, and the gradient
``scale * W_t + noise_t`` at the reference's parameters ``W_t``) and each case's results under ``<case>/``;
``versions.json`` gives every case's dtype and optkit keyword arguments and the packages that made them.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import optax

HERE = pathlib.Path(__file__).resolve().parent / "optimizers" / "references"


def cases(optimizer: str) -> dict[str, dict]:
    """``{case: {"dtype": ..., "kwargs": ...}}`` of ``optimizer`` ("muon", "schedule_free")."""
    everything = json.loads((HERE / "versions.json").read_text())["cases"]
    return {key.split("/", 1)[1]: case for key, case in everything.items() if key.startswith(optimizer + "/")}


def data(optimizer: str) -> dict[str, np.ndarray]:
    with np.load(HERE / f"{optimizer}.npz") as npz:
        return dict(npz)


def leaves(values: dict[str, np.ndarray]) -> list[str]:
    return sorted(key.split("/", 1)[1] for key in values if key.startswith("init/"))


def gradient(values, name, w, t):
    """The reference's gradient of leaf ``name`` at ``w`` in step ``t`` (``w``'s dtype)."""
    return values[f"scale/{name}"].astype(w.dtype) * w + values[f"noise/{name}"][t].astype(w.dtype)


def run(tx, values, dtype, steps, step=None, params_of=None):
    """``steps`` updates of ``tx`` from the reference's start with its gradients; the parameters after each.

    ``step`` wraps ``tx.update`` (``jax.jit``, a chex variant); ``params_of(params, state)`` gives the
    parameters the gradient is taken at (default: ``params``).
    """
    names = leaves(values)
    params = {n: jax.numpy.asarray(values[f"init/{n}"], dtype) for n in names}
    state = tx.init(params)
    update = step(tx.update) if step is not None else tx.update
    trajectory = [params]
    for t in range(steps):
        at = params if params_of is None else params_of(params, state)
        grads = {n: gradient(values, n, at[n], t) for n in names}
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        trajectory.append(params)
    return trajectory, state


def nnx_optimizer_equals_functional(make_tx, n_in: int, n_out: int, *, use_bias: bool = True, steps: int = 3,
                                    seed: int = 0):
    """``steps`` of ``nnx.Optimizer(model, make_tx())`` on an ``nnx.Linear`` equal the same steps of ``make_tx()``
    on a dict of its parameters (loss ``mean((x W + b)^2)``); returns ``(model, optimizer, params, state)``."""
    import pytest

    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(n_in, n_out, use_bias=use_bias, rngs=nnx.Rngs(0))
    x = jax.numpy.asarray(np.random.default_rng(seed).normal(size=(8, n_in)), jax.numpy.float32)
    params = {k: jax.numpy.asarray(v[...]) for k, v in nnx.state(model, nnx.Param).items()}
    optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
    for _ in range(steps):
        optimizer.update(model, nnx.grad(lambda m: jax.numpy.mean(m(x) ** 2))(model))
    tx = make_tx()
    state = tx.init(params)
    for _ in range(steps):
        grads = jax.grad(lambda p: jax.numpy.mean((x @ p["kernel"] + p.get("bias", 0.0)) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.asarray(model.kernel[...]), np.asarray(params["kernel"]), rtol=1e-6, atol=1e-7)
    return model, optimizer, params, state
