"""The numbers optkit computes, case by case, for the bit-identity snapshot.

Every case is a function of no arguments that returns a flat dict of NumPy
arrays, computed through optkit's public API only (so the same cases run on
any revision of the code): every optimizer over a 12-step trajectory (float64
and float32, jitted and not, under ``optax.inject_hyperparams``, on
FlatParams), every spec operator, Graph cases with Gradient nodes, and every
ONNX backend test case that optkit.onnx's op table ran when the snapshot was
written. ``python -m tests.project.snapshot.make`` writes ``float64_results.npz``;
``tests/project/test_snapshot.py`` recomputes each case and compares.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optkit
from tests.helpers import mlp_graph, sin_derivatives_graph

STEPS = 12
TREE = {"w": (4, 3), "b": (3,), "s": (), "k": (2, 3, 5)}
WIDE = {"wide": (8, 6400)}  # Adafactor's CPU row-block loop takes matrices wider than 6144 columns


def _params(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def _grads(params, t):
    out = {}
    for i, (k, p) in enumerate(sorted(params.items())):
        p = np.asarray(p, np.float64)
        g = 0.5 * p + np.sin(np.arange(p.size).reshape(p.shape) * 0.7 + t * 0.31 + i)
        if p.ndim and t % 2 == 0:
            g = np.where(np.arange(p.size).reshape(p.shape) % 3 == 0, 0.0, g)
        out[k] = g
    return out


def _flatten(prefix: str, tree) -> dict[str, np.ndarray]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {f"{prefix}{jax.tree_util.keystr(path)}": np.asarray(leaf) for path, leaf in leaves}


def _trajectory(make_tx: Callable[[], optax.GradientTransformation], dtype, *, jit=True, shapes=TREE,
                flat=False) -> Callable[[], dict[str, np.ndarray]]:
    def run():
        params = jax.tree.map(jnp.asarray, _params(shapes, dtype))
        if flat:
            params = optkit.FlatParams.from_tree(params)
        tx = make_tx()
        state = tx.init(params)

        def step(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        step_fn = jax.jit(step) if jit else step
        out = {}
        for t in range(STEPS):
            tree = params.to_tree() if flat else params
            grads = jax.tree.map(lambda g, p: jnp.asarray(g, p.dtype), _grads(tree, t), tree)
            if flat:
                grads = optkit.FlatParams.from_tree(grads)
            params, state = step_fn(params, state, grads)
            if t in (0, STEPS - 1) and not (t == 0 and shapes is WIDE):
                out.update(_flatten(f"t{t}.params", params.to_tree() if flat else params))
        out.update(_flatten("state", state))
        return out

    return run


def _x64(dtype):
    return jax.enable_x64(True) if dtype == np.float64 else contextlib.nullcontext()


ADAGRAD = {
    "default": dict(),
    "decay": dict(decay_factor=0.1, norm_coefficient=0.01, eps=1e-5),
    "eps0": dict(initial_accumulator_value=0.1, eps=0.0),
}
ADAM = {
    "default": dict(),
    "b": dict(b1=0.0, b2=0.5, eps=1e-3),
    "norms": dict(norm_coefficient=0.01, norm_coefficient_post=0.001, eps=1e-6),
    "eps0": dict(eps=0.0),
}
MOMENTUM = {
    "default": dict(),
    "beta": dict(alpha=0.5, beta=0.3, norm_coefficient=0.02),
    "nesterov": dict(alpha=0.9, beta=1.0, nesterov=True),
    "nesterov_norm": dict(alpha=0.8, beta=0.2, nesterov=True, norm_coefficient=0.01),
}
ADAFACTOR = {
    "default": dict(),
    "b1": dict(b1=0.9),
    "lr": dict(learning_rate=0.01),
    "schedule": dict(learning_rate=optax.linear_schedule(0.02, 0.001, 10)),
    "noclip": dict(clipping_threshold=None, multiply_by_parameter_scale=False),
    "wd": dict(weight_decay_rate=0.1, b1=0.5),
    "largest": dict(factored_dims="largest", min_dim_size_to_factor=3),
    "unfactored": dict(factored=False, eps1=0.0),
    "clip": dict(clipping_threshold=0.5, decay_rate=0.6, eps2=1e-2),
}


def optimizer_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    schedule = optax.exponential_decay(0.05, 3, 0.5)
    families = [("adagrad", optkit.adagrad, 0.1, ADAGRAD), ("adam", optkit.adam, 0.01, ADAM),
                ("momentum", optkit.momentum, 0.05, MOMENTUM)]
    for dtype in (np.float64, np.float32):
        d = np.dtype(dtype).name
        for name, alias, lr, configs in families:
            for key, kw in configs.items():
                yield f"{name}.{key}.{d}", _trajectory(lambda a=alias, lr=lr, kw=kw: a(lr, **kw), dtype)
            yield f"{name}.schedule.{d}", _trajectory(lambda a=alias: a(schedule), dtype)
            yield f"{name}.nojit.{d}", _trajectory(lambda a=alias, lr=lr: a(lr), dtype, jit=False)
            yield f"{name}.flat.{d}", _trajectory(lambda a=alias, lr=lr: a(lr), dtype, flat=True)
            yield f"{name}.inject.{d}", _trajectory(
                lambda a=alias, lr=lr, kw=configs[list(configs)[1]]: optax.inject_hyperparams(a)(lr, **kw), dtype)
        for key, kw in ADAFACTOR.items():
            yield f"adafactor.{key}.{d}", _trajectory(lambda kw=kw: optkit.adafactor(**kw), dtype)
        yield f"adafactor.nojit.{d}", _trajectory(lambda: optkit.adafactor(b1=0.9), dtype, jit=False)
        yield f"adafactor.wide.{d}", _trajectory(lambda: optkit.adafactor(), dtype, shapes=WIDE)
        yield f"adafactor.inject.{d}", _trajectory(
            lambda: optax.inject_hyperparams(optkit.adafactor)(learning_rate=0.01, b1=0.9, eps1=1e-30), dtype)
        yield f"factored_rms.{d}", _trajectory(
            lambda: optax.chain(optkit.scale_by_factored_rms(), optax.scale(-0.01)), dtype)
        yield f"factored_rms.largest.{d}", _trajectory(
            lambda: optax.chain(optkit.scale_by_factored_rms(factored_dims="largest", eps1=0.0),
                                optax.scale(-0.01)), dtype)


def spec_op_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    shapes = [(3,), (2, 4), (), (1, 2, 3)]

    def tensors(seed, dtype, positive=()):
        rng = np.random.default_rng(seed)
        out = []
        for kind in range(5):
            out.append([(np.abs(rng.standard_normal(s)) if kind in positive else rng.standard_normal(s))
                        .astype(dtype) for s in shapes])
        return out

    def as_dict(prefix, outputs):
        return {f"{prefix}.{field}.{i}": np.asarray(v) for field, vs in zip(outputs._fields, outputs)
                for i, v in enumerate(vs)}

    def call(jit, op, *args, **kw):
        fn = lambda *a: op(*a, **kw)  # noqa: E731
        return (jax.jit(fn) if jit else fn)(*args)

    for dtype in (np.float64, np.float32):
        d = np.dtype(dtype).name
        for T in (0, 1, 5):
            def adagrad(jit, T=T, dtype=dtype):
                X, G, H, _, _ = tensors(1, dtype, positive=(2,))
                out = {}
                for key, kw in {"a": dict(), "b": dict(decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01),
                                "eps0": dict(epsilon=0.0)}.items():
                    out.update(as_dict(key, call(jit, optkit.ops.onnx_adagrad, dtype(0.1), T, X, G, H, **kw)))
                return out

            def adam(jit, T=T, dtype=dtype):
                X, G, V, H, _ = tensors(2, dtype, positive=(3,))
                out = {}
                for key, kw in {"a": dict(), "b": dict(alpha=0.85, beta=0.95, epsilon=1e-4, norm_coefficient=0.02,
                                                       norm_coefficient_post=0.25)}.items():
                    out.update(as_dict(key, call(jit, optkit.ops.onnx_adam, dtype(0.1), T, X, G, V, H, **kw)))
                return out

            def dml(jit, T=T, dtype=dtype):
                X, M, V, G, _ = tensors(3, dtype, positive=(2,))
                return as_dict("dml", call(jit, optkit.ops.dml_adam, X, M, V, G, T, learning_rate=1e-2, beta1=0.9,
                                           beta2=0.99, epsilon=1e-7))

            def momentum(jit, T=T, dtype=dtype):
                X, G, V, _, _ = tensors(4, dtype)
                out = {}
                for mode in ("standard", "nesterov"):
                    out.update(as_dict(mode, call(jit, optkit.ops.onnx_momentum, dtype(0.1), T, X, G, V, alpha=0.9,
                                                  beta=0.3, mode=mode, norm_coefficient=0.01)))
                return out

            for name, fn in (("onnx_adagrad", adagrad), ("onnx_adam", adam), ("dml_adam", dml),
                             ("onnx_momentum", momentum)):
                yield f"ops.{name}.T{T}.{d}", lambda fn=fn: fn(False)
                yield f"ops.{name}.T{T}.{d}.jit", lambda fn=fn: fn(True)


def graph_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    def mlp():
        rng = np.random.default_rng(7)
        W1, b1, W2, b2, X, L = (rng.standard_normal(s) for s in [(3, 8), (8,), (8, 2), (2,), (16, 3), (16, 2)])
        g = mlp_graph()
        g.add_gradient(xs=["H"], zs=["W2", "b2", "L"], y="O", outputs=["dO/dH"])
        g.add_gradient(xs=["W2"], zs=["W1", "b1", "b2", "X", "L"], y="dO/dW2", outputs=["d2O/dW2"])
        names = ["dO/dW1", "dO/db1", "dO/dW2", "dO/db2", "dO/dH", "d2O/dW2", "O"]
        feeds = dict(W1=W1, b1=b1, W2=W2, b2=b2, X=X, L=L)
        eager = g.evaluate(feeds, names)
        jitted = jax.jit(g.as_function(list(feeds), names))(*feeds.values())
        out = {f"eager.{k}": np.asarray(v) for k, v in eager.items()}
        out.update({f"jit.{k}": np.asarray(v) for k, v in zip(names, jitted)})
        return out

    def sin_orders():
        x = np.linspace(-2.0, 2.0, 7)
        return {k: np.asarray(v) for k, v in sin_derivatives_graph().evaluate({"x": x}, ["d1", "d2", "d3"]).items()}

    def gradient_fn():
        def model(W, X, L):
            Y = jnp.tanh(X @ W)
            return {"Y": Y, "O": jnp.sum((Y - L) ** 2)}

        rng = np.random.default_rng(3)
        W, X, L = rng.standard_normal((4, 2)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
        first = optkit.gradient(model, xs=["W"], zs=["X", "L"], y="O")
        second = optkit.gradient(lambda W, X, L: first(W, X, L)[0], ["W"], ["X", "L"])
        return {"first": np.asarray(first(W, X, L)[0]), "second": np.asarray(second(W, X, L)[0]),
                "jit": np.asarray(jax.jit(first)(W, X, L)[0])}

    for name, fn in (("graph.mlp", mlp), ("graph.sin_orders", sin_orders), ("gradient.fn", gradient_fn)):
        yield name, lambda fn=fn: _in_x64(fn)


def _in_x64(fn):
    with jax.enable_x64(True):
        return fn()


# ONNX's backend test cases: every node and model case, run through optkit.onnx as
# tests/onnx/ops/test_backend.py runs them (training cases compiled, the rest op by op).
_ONNX_KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")


def onnx_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    try:
        import onnx.backend.test.loader as loader

        import optkit.onnx
    except ImportError:  # pragma: no cover - the onnx extra is part of the test install
        return
    for kind in _ONNX_KINDS:
        for case in loader.load_model_tests(kind=kind):
            # As a caller with 64-bit mode on (ONNX's INT64 and DOUBLE), which the runners took for granted
            # when the snapshot was written and now leave to the caller.
            yield f"onnx.{kind}.{case.name}", lambda case=case: _in_x64(lambda: _run_onnx_case(case, optkit.onnx))


def _onnx_data(case):
    """(model, [(inputs...)]) of a loader case: inline data sets, or the model directory's .pb files."""
    import glob
    import os

    import onnx
    from onnx import numpy_helper

    if case.model is not None:
        return case.model, [inputs for inputs, _ in case.data_sets or []]
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    sets = []
    for directory in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        inputs = []
        for path in sorted(glob.glob(os.path.join(directory, "input_*.pb")),
                           key=lambda p: int(re.search(r"input_(\d+)", p).group(1))):
            tensor = onnx.TensorProto()
            with open(path, "rb") as f:
                tensor.ParseFromString(f.read())
            inputs.append(numpy_helper.to_array(tensor))
        sets.append(inputs)
    return model, sets


def _run_onnx_case(case, optkit_onnx) -> dict[str, np.ndarray]:
    model, sets = _onnx_data(case)
    training = any(op.domain == "ai.onnx.preview.training" for op in model.opset_import)
    try:
        rep = optkit_onnx.prepare(model, jit=training)
    except (optkit_onnx.UnsupportedOpError, ValueError, TypeError) as err:
        return {"refused": np.asarray(type(err).__name__)}
    out = {}
    for i, inputs in enumerate(sets):
        try:
            results = rep.run(list(inputs))
        except (ValueError, TypeError) as err:
            out[f"set{i}.error"] = np.asarray(type(err).__name__)
            continue
        for j, r in enumerate(results):
            out[f"set{i}.out{j}"] = np.asarray(r)
    return out


def all_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    """Every case: (name, function returning a flat dict of arrays)."""
    def in_dtype(name, fn):
        return _in_x64(fn) if "float64" in name else fn()

    for name, fn in (*optimizer_cases(), *spec_op_cases()):
        yield name, lambda name=name, fn=fn: in_dtype(name, fn)
    yield from graph_cases()
    yield from onnx_cases()
