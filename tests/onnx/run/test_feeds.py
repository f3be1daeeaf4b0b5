"""The one feed path of both runners (optkit/onnx/_run/feeds.py): the caller's 64-bit setting decides how ONNX's
INT64 and DOUBLE run, nothing switches it inside a call, and the ordinary sequences users run give ONNX
Runtime's values with 64-bit mode off and on."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
nnx = pytest.importorskip("flax.nnx")

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

MODELS = ONNX_TESTS / "models"
MODES = [pytest.param(False, id="x64-off"), pytest.param(True, id="x64-on")]


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("x64", MODES)
def test_train_then_evaluate_with_an_int64_batch_then_an_nnx_step(x64):
    """A jitted training step closing over an int64 NumPy batch, then ``jax.jit(apply_fn)`` on that batch, then
    an ``OnnxModule`` trained under ``nnx.jit`` on it: each gives ONNX Runtime's values for its weights."""
    model = onnx.load(str(MODELS / "torch_dynamo_bert.onnx"))
    batch = np.load(MODELS / "torch_dynamo_bert.npz")["input"]
    assert batch.dtype == np.int64
    with jax.enable_x64(x64):
        apply_fn, params = optkit.onnx.to_jax(model)
        tx = optax.adam(1e-2)

        @jax.jit
        def step(p, state):
            loss, grads = jax.value_and_grad(lambda p: jnp.sum(apply_fn(p, batch) ** 2))(p)
            updates, state = tx.update(grads, state, p)
            return optax.apply_updates(p, updates), state, loss

        p, state = params, tx.init(params)
        for _ in range(2):
            p, state, _ = step(p, state)
        got = jax.jit(apply_fn)(p, batch)
        (want,) = _ort(optkit.onnx.with_initializers(model, p), {"input": batch})
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
        assert not np.allclose(want, _ort(model, {"input": batch})[0])  # the weights did change

        module = optkit.onnx.OnnxModule(model)
        optimizer = nnx.Optimizer(module, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def nnx_step(module, optimizer, x):
            loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(module)
            optimizer.update(module, grads)
            return loss

        losses = [float(nnx_step(module, optimizer, batch)) for _ in range(2)]
        trained = optkit.onnx.with_initializers(model, nnx.state(module, nnx.Param))
        np.testing.assert_allclose(np.asarray(jax.jit(lambda m, x: m(x))(module, batch)),
                                   _ort(trained, {"input": batch})[0], rtol=1e-4, atol=1e-5)
        assert losses[1] < losses[0]


def _argmax_pool():
    """CLIP's pooling: a MatMul, the ArgMax of each row, the row's value at it (GatherElements)."""
    W = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("ArgMax", ["h"], ["i"], axis=-1, keepdims=1),
             helper.make_node("GatherElements", ["h", "i"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])],
                              [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("x64", MODES)
def test_argmax_then_gather_elements_under_jit(x64):
    model = _argmax_pool()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    with jax.enable_x64(x64):
        apply_fn, params = optkit.onnx.to_jax(model)
        got = jax.jit(apply_fn)(params, x)
        grads = jax.jit(jax.grad(lambda p: jnp.sum(apply_fn(p, x))))(params)
    np.testing.assert_allclose(np.asarray(got), _ort(model, {"x": x})[0], rtol=1e-6)
    # d/dW of sum_i h[i, argmax_i] = x[i, k] summed where column k is row i's argmax.
    k = np.argmax(x @ numpy_helper.to_array(model.graph.initializer[0]), axis=1)
    want = np.zeros((4, 5), np.float32)
    for row, col in enumerate(k):
        want[:, col] += x[row]
    np.testing.assert_allclose(np.asarray(grads["W"]), want, rtol=1e-6)


def _dft_power():
    """``sum(|DFT(x * w)|^2)`` over the one-sided spectrum, as real and imaginary parts."""
    w = np.linspace(0.5, 1.5, 8).reshape(1, 8, 1).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"]), helper.make_node("DFT", ["a"], ["s"], onesided=1),
             helper.make_node("Mul", ["s", "s"], ["b"]), helper.make_node("ReduceSum", ["b"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "power", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), w


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("x64", MODES)
def test_grad_through_a_one_sided_dft(x64, jit):
    model, w = _dft_power()
    x = np.random.default_rng(2).standard_normal((1, 8, 1)).astype(np.float32)
    with jax.enable_x64(x64):
        apply_fn, params = optkit.onnx.to_jax(model)
        loss = lambda p: apply_fn(p, x)  # noqa: E731
        value = (jax.jit(loss) if jit else loss)(params)
        grads = (jax.jit(jax.grad(loss)) if jit else jax.grad(loss))(params)
    def power(w64):  # NumPy float64: the same quantity, differentiated by central differences
        return np.sum(np.abs(np.fft.rfft((x.astype(np.float64) * w64)[0, :, 0])) ** 2)

    np.testing.assert_allclose(float(value), float(_ort(model, {"x": x})[0]), rtol=1e-5)
    np.testing.assert_allclose(float(value), power(w.astype(np.float64)), rtol=1e-5)

    w64, want, h = w.astype(np.float64), np.zeros(w.shape), 1e-6
    for i in range(8):
        e = np.zeros(w.shape)
        e[0, i, 0] = h
        want[0, i, 0] = (power(w64 + e) - power(w64 - e)) / (2 * h)
    np.testing.assert_allclose(np.asarray(grads["w"], np.float64), want, rtol=1e-4)


def _gather_rows(ids_type=TensorProto.INT64):
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "embed",
                              [helper.make_tensor_value_info("ids", ids_type, ["N"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int64_runs_as_int32_with_x64_off_range_checked_in_both_runners():
    model = _gather_rows()
    apply_fn, params = optkit.onnx.to_jax(model)
    rep = optkit.onnx.prepare(model)
    ids = np.array([3, 1], np.int64)
    with jax.enable_x64(False):
        np.testing.assert_array_equal(apply_fn(params, ids), [[6, 7], [2, 3]])
        np.testing.assert_array_equal(rep.run([ids]).rows, [[6, 7], [2, 3]])
        for run in (lambda v: apply_fn(params, v), lambda v: rep.run([v])):
            with pytest.raises(ValueError, match=r"graph input 'ids' is declared int64 \(run as int32: JAX's 64-bit "
                                                 r"mode is off\), whose range is \[-2147483648, 2147483647\]; the "
                                                 r"value 1099511627776 does not fit"):
                run(np.array([0, 2**40], np.int64))
    with jax.enable_x64(True):  # the caller's int64: no narrowing, the index is just out of the table
        assert rep.run([np.array([0, 1], np.int64)]).rows.dtype == np.float32
        assert apply_fn(params, np.array([0, 2**40 - 2**40 + 3], np.int64)).shape == (2, 2)


@pytest.mark.parametrize("x64", MODES)
def test_prepare_runs_int64_in_the_callers_mode(x64):
    node = helper.make_node("Add", ["a", "b"], ["c"])
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, [2])  # noqa: E731
    model = helper.make_model(helper.make_graph([node], "g", [info("a"), info("b")], [info("c")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    a, b = np.array([2, -7], np.int64), np.array([40, 3], np.int64)
    with jax.enable_x64(x64):
        (got,) = optkit.onnx.prepare(model).run([a, b])
    assert got.dtype == (np.int64 if x64 else np.int32)
    np.testing.assert_array_equal(got, _ort(model, {"a": a, "b": b})[0])


def test_a_double_model_warns_once_with_x64_off_and_computes_in_float64_with_it_on():
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.DOUBLE, [1])  # noqa: E731
    model = helper.make_model(helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "g", [info("x")],
                                                [info("y")]), opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([1e-9], np.float64)
    rep = optkit.onnx.prepare(model)
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match="DOUBLE tensors, which run as float32 while JAX's 64-bit mode is off"):
            rep.run([x])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rep.run([x])  # once
    with jax.enable_x64(True):
        (got,) = rep.run([x])
    assert got.dtype == np.float64 and got[0] - 1.0 == pytest.approx(1e-9, rel=1e-6)


def test_a_double_beyond_float32_is_refused_with_x64_off_never_a_silent_infinity():
    """ONNX's pytorch-operator case ``test_operator_add_broadcast`` fed values beyond float32's range became inf with
    64-bit mode off; the narrowing is range-checked as an integer's is, in both runners, and runs exactly with it
    on. NaN and infinities fed stay as they are."""
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.DOUBLE, [3])  # noqa: E731
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g",
                                                [info("a"), info("b")], [info("c")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    rep = optkit.onnx.prepare(model)
    apply_fn, params = optkit.onnx.to_jax(model)
    big, ok = np.array([1.0, 3e38 * 10, -2.0]), np.array([1.0, np.inf, np.nan])
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (the DOUBLE model's warning)
        for run in (lambda a, b: rep.run([a, b]).c, lambda a, b: apply_fn(params, a, b)):
            with pytest.raises(ValueError, match=r"graph input 'a' is declared float64 \(run as float32: JAX's "
                                                 r"64-bit mode is off\), whose largest finite magnitude is "
                                                 r"3.40282e\+38; the value 3e\+39 does not fit"):
                run(big, ok)
            got = np.asarray(run(ok, ok))
            assert got.dtype == np.float32 and got[0] == 2.0 and np.isinf(got[1]) and np.isnan(got[2])
    with jax.enable_x64(True):
        np.testing.assert_array_equal(rep.run([big, big]).c, big + big)


def test_no_runner_switches_64_bit_mode_inside_a_call(monkeypatch):
    """The graph is traced in the caller's 64-bit setting by both runners, eager and under jax.jit."""
    seen = []
    evaluate = optkit.Graph.evaluate

    def spy(self, *args, **kwargs):
        seen.append(bool(jax.config.jax_enable_x64))
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(optkit.Graph, "evaluate", spy)
    model = _gather_rows()
    apply_fn, params = optkit.onnx.to_jax(model)
    rep = optkit.onnx.prepare(model)
    ids = np.array([1], np.int64)
    for x64 in (False, True):
        with jax.enable_x64(x64):
            seen.clear()
            jax.jit(apply_fn)(params, ids)
            apply_fn(params, ids)
            rep.run([ids])
            assert seen and set(seen) == {x64}, (x64, seen)


def _int64_identity():
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["N"])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [info("x")], [info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


IDENTITY = optkit.onnx.prepare(_int64_identity())
IDENTITY_FN, _ = optkit.onnx.to_jax(_int64_identity())


@settings(max_examples=40)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=6), st.sampled_from([np.int64, np.uint32, np.int16]))
def test_an_integer_feed_runs_exactly_or_is_refused_never_wrapped(values, dtype):
    """With 64-bit mode off an INT64 input runs as int32: each fed integer array either comes back with the same
    values (both runners) or is refused naming the input, as NumPy says it fits int32 or not."""
    fed = np.array(values, np.int64)
    if not np.array_equal(fed.astype(dtype).astype(np.int64), fed):
        return  # not representable in the fed dtype itself: nothing to feed
    fed = fed.astype(dtype)
    fits = bool(np.all((fed.astype(np.int64) >= -(2**31)) & (fed.astype(np.int64) < 2**31)))
    with jax.enable_x64(False):
        for run in (lambda v: IDENTITY.run([v]).y, lambda v: IDENTITY_FN({}, v)):
            if fits:
                np.testing.assert_array_equal(np.asarray(run(fed)).astype(np.int64), fed.astype(np.int64))
            else:
                with pytest.raises(ValueError, match="graph input 'x' is declared int64 .* does not fit"):
                    run(fed)
