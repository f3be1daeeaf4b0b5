"""Warm starts (optkit.onnx._run.warm): ``apply_fn`` inside a caller's ``jax.jit`` runs from its exported forward
and backward, written once and read by the next process, with the values and gradients of the graph traced as
before; everything the exported pair cannot be (forward mode, ``vmap``, second derivatives, eager calls) traces
the graph as before. In-process here (a new process is the memory emptied; the fresh-process case is in
test_compilation_cache.py)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from onnx import TensorProto, helper, numpy_helper

import optkit
import optkit.onnx
from optkit.onnx._load.files import model_identity
from optkit.onnx._run import warm

RNG = np.random.default_rng(7)


def _model():
    """ids (int) -> Gather -> + x -> MatMul -> Tanh (float output) and its ArgMax (an int output); a 3x3
    depthwise convolution of the product, summed (a second float output)."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Add", ["e", "x"], ["h"]),
             helper.make_node("MatMul", ["h", "W"], ["m"]),
             helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("ArgMax", ["t"], ["idx"], axis=-1),
             helper.make_node("Unsqueeze", ["t", "axis"], ["t4"]),
             helper.make_node("Conv", ["t4", "K"], ["c"], group=2, pads=[1, 1, 1, 1]),
             helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0)]
    inits = [numpy_helper.from_array(RNG.normal(size=(5, 8)).astype(np.float32), "table"),
             numpy_helper.from_array(RNG.normal(size=(8, 8)).astype(np.float32) / 3, "W"),
             numpy_helper.from_array(RNG.normal(size=(2, 1, 3, 3)).astype(np.float32), "K"),
             numpy_helper.from_array(np.array([0], np.int64), "axis")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 6]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8])],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 6, 8]),
                               helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 6, 1]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODEL = _model()
IDS = RNG.integers(0, 5, size=(2, 6)).astype(np.int32)
X = RNG.normal(size=(2, 6, 8)).astype(np.float32)


def _loss(apply_fn):
    def loss(p, x):
        t, idx, s = apply_fn(p, IDS, x)
        return jnp.sum(t ** 3) + s * 0.1 + jnp.sum(idx) * 0.0
    return loss


def _step(apply_fn, tx):
    @jax.jit
    def step(p, state, x):
        value, grads = jax.value_and_grad(_loss(apply_fn))(p, x)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value, grads
    return step


@pytest.fixture
def warm_dir(tmp_path, monkeypatch):
    """Warm starts on in ``tmp_path`` (the suite runs with ``OPTKIT_COMPILATION_CACHE=off``), with an empty
    memory; :func:`_off` turns them off again."""
    monkeypatch.setenv("OPTKIT_COMPILATION_CACHE", str(tmp_path))
    monkeypatch.setattr(warm, "compilation_cache", lambda: str(tmp_path))
    monkeypatch.setattr(warm, "_memory", {})
    return tmp_path / "optkit-warm"


def _off(monkeypatch):
    monkeypatch.setenv("OPTKIT_COMPILATION_CACHE", "off")


def _on(monkeypatch, warm_dir):
    monkeypatch.setenv("OPTKIT_COMPILATION_CACHE", str(warm_dir.parent))


def _reference():
    """The training step traced from the graph (no warm start): values, gradients, updated params."""
    apply_fn, params = optkit.onnx.to_jax(MODEL)
    tx = optkit.adam(1e-2)
    return _step(apply_fn, tx)(params, tx.init(params), X)


def _assert_same(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "x64"])
def test_a_jitted_training_step_runs_from_the_exported_pair_with_the_graphs_values(warm_dir, monkeypatch, x64,
                                                                                    caplog):
    with jax.enable_x64(x64):
        _off(monkeypatch)
        want = _reference()
        assert not warm_dir.exists()
        _on(monkeypatch, warm_dir)
        apply_fn, params = optkit.onnx.to_jax(MODEL)
        tx = optkit.adam(1e-2)
        step = _step(apply_fn, tx)
        state = tx.init(params)
        with caplog.at_level(logging.INFO, "optkit.onnx"):
            got = step(params, state, X)
        assert "exported apply_fn's forward and backward" in caplog.text
        assert len(list(warm_dir.glob("*.npz"))) == 1
        _assert_same(got, want, 1e-12 if x64 else 1e-6)
        # the caller's program holds the exported calls, not the graph's operations
        text = str(jax.make_jaxpr(step)(params, state, X))
        assert "call_exported" in text and "tanh" not in text and "argmax" not in text

        # The next process: the memory empty, the pair read from the file; the graph is not traced.
        monkeypatch.setattr(warm, "_memory", {})
        caplog.clear()
        apply_fn, params = optkit.onnx.to_jax(MODEL)
        with caplog.at_level(logging.INFO, "optkit.onnx"):
            again = _step(apply_fn, tx)(params, state, X)
        assert "read from" in caplog.text and "traced inside a caller's transformation" not in caplog.text
        _assert_same(again, want, 1e-12 if x64 else 1e-6)


def test_what_the_exported_pair_cannot_be_traces_the_graph(warm_dir, monkeypatch):
    """jax.jvp, jax.vmap, second derivatives and eager calls: the graph's own values, no exported program."""
    apply_fn, params = optkit.onnx.to_jax(MODEL)
    loss = _loss(apply_fn)
    direction = jax.tree.map(jnp.ones_like, params)
    cases = {
        "jvp": lambda: jax.jit(lambda p: jax.jvp(lambda q: loss(q, X), (p,), (direction,)))(params),
        "vmap": lambda: jax.jit(jax.vmap(lambda x: apply_fn(params, IDS, x)[0]))(jnp.stack([X, 2 * X])),
        "grad of grad": lambda: jax.jit(jax.grad(lambda p: jnp.sum(jax.grad(loss)(p, X)["W"] ** 2)))(params),
        "eager grad": lambda: jax.grad(loss)(params, X),
    }
    got = {name: case() for name, case in cases.items()}
    assert not warm_dir.exists() and not warm._memory
    _off(monkeypatch)
    for name, case in cases.items():
        _assert_same(got[name], case(), 1e-6)


def test_new_values_of_the_same_types_reuse_the_program_and_a_damaged_file_is_exported_again(warm_dir, monkeypatch,
                                                                                              caplog):
    apply_fn, params = optkit.onnx.to_jax(MODEL)
    loss = jax.jit(jax.value_and_grad(_loss(apply_fn)))
    loss(params, X)
    loss(params, X.astype(np.float16).astype(np.float32) + 1)  # (the same types: the same program)
    assert len(list(warm_dir.glob("*.npz"))) == 1
    [path] = warm_dir.glob("*.npz")
    path.write_bytes(b"not a program")
    monkeypatch.setattr(warm, "_memory", {})
    _off(monkeypatch)
    want = jax.jit(jax.value_and_grad(_loss(optkit.onnx.to_jax(MODEL)[0])))(params, X)
    _on(monkeypatch, warm_dir)
    with caplog.at_level(logging.INFO, "optkit.onnx"):
        got = jax.jit(jax.value_and_grad(_loss(apply_fn)))(params, X)
    assert "unreadable" in caplog.text and "exported apply_fn's forward and backward" in caplog.text
    _assert_same(got, want, 1e-6)
    assert path.stat().st_size > 1000


def test_onnx_module_in_nnx_optimizer_runs_warm(warm_dir, monkeypatch):
    from flax import nnx

    def train():
        module = optkit.onnx.OnnxModule(MODEL)
        optimizer = nnx.Optimizer(module, optkit.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def step(module, optimizer, x):
            value, grads = nnx.value_and_grad(lambda m: jnp.sum(m(IDS, x)[0] ** 3))(module)
            optimizer.update(module, grads)
            return value

        return [step(module, optimizer, X) for _ in range(2)], nnx.state(module, nnx.Param)

    got = train()
    assert len(list(warm_dir.glob("*.npz"))) == 1
    _off(monkeypatch)
    _assert_same(got, train(), 1e-6)


def test_a_model_with_external_data_is_not_exported(tmp_path, warm_dir):
    """Its weights are not in the ModelProto's bytes, so the bytes' digest cannot key a program."""
    path = tmp_path / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(MODEL)  # (onnx.save_model moves the tensors of the proto it saves to the file)
    onnx.save_model(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)
    apply_fn, params = optkit.onnx.to_jax(str(path))
    jax.jit(jax.grad(_loss(apply_fn)))(params, X)
    assert model_identity(apply_fn.model) is None and not warm_dir.exists()


def test_a_model_with_a_registered_operator_is_not_exported(warm_dir):
    """A user's operator is code the model's bytes do not show: registered again, the model loaded again runs the
    new code."""
    node = helper.make_node("Twice", ["x"], ["y"], domain="com.example.warm")
    info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    model = helper.make_model(helper.make_graph([node], "g", [info], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [3])]), opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid("com.example.warm", 1)])
    optkit.onnx.register_op("com.example.warm", "Twice", lambda x: 2 * x)
    try:
        apply_fn, params = optkit.onnx.to_jax(model)
        x = jnp.arange(3.0, dtype=jnp.float32)
        assert np.asarray(jax.jit(lambda x: apply_fn(params, x))(x)).tolist() == [0.0, 2.0, 4.0]
        optkit.onnx.register_op("com.example.warm", "Twice", lambda x: 3 * x, replace=True)
        apply_fn, params = optkit.onnx.to_jax(model)  # (a model's node functions are made when it is loaded)
        assert np.asarray(jax.jit(lambda x: apply_fn(params, x))(x)).tolist() == [0.0, 3.0, 6.0]
    finally:
        optkit.onnx.unregister_op("com.example.warm", "Twice")
    assert not warm_dir.exists()


def test_the_opt_out_turns_warm_starts_off_even_with_a_cache_directory(warm_dir, monkeypatch):
    """``OPTKIT_COMPILATION_CACHE=off`` with JAX's cache directory set (the suite's own, a user's): no export."""
    _off(monkeypatch)
    apply_fn, params = optkit.onnx.to_jax(MODEL)
    jax.jit(jax.grad(_loss(apply_fn)))(params, X)
    assert not warm_dir.exists() and not warm._memory


def test_the_inputs_gradients_come_from_the_exported_backward_too(warm_dir, monkeypatch):
    """``argnums=(0, 1)``: the float input's cotangent as well as the parameters', equal to the graph's."""
    apply_fn, params = optkit.onnx.to_jax(MODEL)
    got = jax.jit(jax.grad(_loss(apply_fn), argnums=(0, 1)))(params, X)
    assert len(list(warm_dir.glob("*.npz"))) == 1
    _off(monkeypatch)
    want = jax.jit(jax.grad(_loss(optkit.onnx.to_jax(MODEL)[0]), argnums=(0, 1)))(params, X)
    _assert_same(got, want, 1e-6)
    assert float(jnp.max(jnp.abs(got[1]))) > 0
