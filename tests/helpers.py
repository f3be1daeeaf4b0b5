"""Helpers the test modules share: float64 mode, random arrays and gradients, a child process, small graphs.

One place for each, so that a test module holds its own expectations only. The
per-algorithm modules' trajectories (a gradient sequence, the optimizer and
its oracle run over it) are in ``tests/trajectories.py``; the independent
expectations themselves in ``tests/oracles.py``; the ONNX area's helpers in ``tests/onnx/helpers.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def x64():
    """Every test of the module that imports this fixture runs with ``jax.enable_x64``."""
    with jax.enable_x64(True):
        yield


def rng_arrays(seed, *shapes, dtype=np.float32):
    """Standard-normal NumPy arrays of ``shapes``, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def random_grads(params, seed, dtype=None):
    """Standard-normal gradients shaped like ``params`` (each leaf's dtype, or ``dtype``)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(np.shape(p)), dtype or p.dtype), params)


def sin_grads(tree, t):
    """Smooth, step-dependent gradients ``sin(3 p + t) + 0.1 t``, in each leaf's dtype (computed in float32)."""
    return jax.tree.map(lambda p: (jnp.sin(p.astype(jnp.float32) * 3.0 + t) + 0.1 * t).astype(p.dtype), tree)


def run_in_child(code: str, *, timeout: float = 300, memory_gib: float | None = None) -> str:
    """Run ``code`` (dedented) in a fresh Python from the repository root and return its stdout.

    For inputs that might crash the process (hostile ONNX files, native code): a crash (a signal) or a
    non-zero exit fails the calling test with the child's output. ``memory_gib`` caps the child's address
    space (``RLIMIT_AS``), so an allocation a bound should have refused fails instead of swapping.
    """
    import os
    import subprocess
    import sys
    import textwrap

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prelude = f"import sys; sys.path.insert(0, {root!r})\n"
    if memory_gib is not None:
        limit = int(memory_gib * 2**30)
        prelude += f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=root, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (f"the child exited with {result.returncode}"
                                    f"{' (killed by a signal)' if result.returncode < 0 else ''}:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result.stdout


def mlp_graph():
    """A two-layer MLP's mean squared error ``O`` as an :class:`optkit.Graph` over inputs W1, b1, W2, b2,
    X, L (nodes Gemm1, Tanh, Gemm2, Loss), with a Gradient node giving ``dO/dW1 ... dO/db2``."""
    import optkit

    g = optkit.Graph(inputs=["W1", "b1", "W2", "b2", "X", "L"])
    g.add(lambda x, w, b: x @ w + b, ["X", "W1", "b1"], ["A"], name="Gemm1")
    g.add(jnp.tanh, ["A"], ["H"], name="Tanh")
    g.add(lambda h, w, b: h @ w + b, ["H", "W2", "b2"], ["Y"], name="Gemm2")
    g.add(lambda y, l: jnp.mean((y - l) ** 2), ["Y", "L"], ["O"], name="Loss")
    g.add_gradient(xs=["W1", "b1", "W2", "b2"], zs=["X", "L"], y="O")
    return g


def sin_derivatives_graph():
    """``sin(x)`` and its first three derivatives ``d1``, ``d2``, ``d3`` by three nested Gradient nodes."""
    import optkit

    g = optkit.Graph(inputs=["x"])
    g.add(jnp.sin, ["x"], ["y"])
    g.add_gradient(xs=["x"], y="y", outputs=["d1"])
    g.add_gradient(xs=["x"], y="d1", outputs=["d2"])
    g.add_gradient(xs=["x"], y="d2", outputs=["d3"])
    return g
