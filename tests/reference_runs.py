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
