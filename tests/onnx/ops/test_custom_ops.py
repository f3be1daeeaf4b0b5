"""``optkit.onnx.register_op``: a user's own operator runs, differentiates and trains in every runner.

Expected values are NumPy transcriptions of the registered formula; the gradient is checked against central
differences in float64 and the closed form.
"""

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402

DOMAIN = "com.example.tests"


@pytest.fixture
def registered():
    """Registrations made by a test are removed after it (registrations are process-wide)."""
    made = []

    def register(op_type, fn, **kwargs):
        optkit.onnx.register_op(DOMAIN, op_type, fn, **kwargs)
        made.append(op_type)

    yield register
    for op_type in made:
        optkit.onnx.unregister_op(DOMAIN, op_type)


def _model(nodes, inputs, outputs, initializers=(), version=1):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(DOMAIN, version)])


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _scaled_tanh_model():
    """y = ScaledTanh(x @ W, alpha=1.5): a trainable weight read by a custom operator's input."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("ScaledTanh", ["h"], ["y"], domain=DOMAIN, name="act", alpha=1.5)]
    return _model(nodes, [_info("x", ["N", 3])], [_info("y", ["N", 2])], [numpy_helper.from_array(w, "W")]), w


def test_a_registered_operator_runs_differentiates_and_trains(registered):
    registered("ScaledTanh", lambda x, *, alpha: alpha * jnp.tanh(x))
    model, w = _scaled_tanh_model()
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    (got,) = optkit.onnx.prepare(model).run([x])
    np.testing.assert_allclose(got, 1.5 * np.tanh(x @ w), rtol=1e-6, atol=1e-6)

    apply_fn, params = optkit.onnx.to_jax(model)
    assert set(params) == {"W"}
    target = np.zeros((4, 2), np.float32)

    def loss(p):
        return jnp.mean((apply_fn(p, x) - target) ** 2)

    grad = jax.jit(jax.grad(loss))(params)["W"]
    h = x.astype(np.float64) @ w.astype(np.float64)
    y = 1.5 * np.tanh(h)
    want = x.T.astype(np.float64) @ (2 * y / y.size * 1.5 * (1 - np.tanh(h) ** 2))
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)
    # and central differences of the float64 formula, one entry
    eps, e = 1e-6, np.zeros_like(w, dtype=np.float64)
    e[1, 0] = eps
    f = lambda ww: np.mean((1.5 * np.tanh(x.astype(np.float64) @ ww)) ** 2)  # noqa: E731
    np.testing.assert_allclose(grad[1, 0], (f(w + e) - f(w - e)) / (2 * eps), rtol=1e-4)

    tx = optax.sgd(0.2)
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        value, g = jax.value_and_grad(loss)(p)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    losses = []
    for _ in range(5):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_attributes_statics_several_outputs_and_the_decorator_form(registered):
    def split_scale(x, shape, *, scale=1.0, names=()):
        assert isinstance(shape, np.ndarray) and list(names) == ["a", "b"]  # a static input is NumPy
        y = jnp.reshape(x * scale, tuple(int(d) for d in shape))
        return y[0], y[1]

    registered("SplitScale", split_scale, static_inputs=(1,))
    nodes = [helper.make_node("SplitScale", ["x", "shape"], ["a", "b"], domain=DOMAIN, scale=3.0,
                              names=["a", "b"])]
    model = _model(nodes, [_info("x", [6])], [_info("a", [3]), _info("b", [3])],
                   [numpy_helper.from_array(np.array([2, 3], np.int64), "shape")])
    x = np.arange(6, dtype=np.float32)
    a, b = optkit.onnx.prepare(model).run([x])
    np.testing.assert_array_equal(a, 3 * x[:3])
    np.testing.assert_array_equal(b, 3 * x[3:])

    @optkit.onnx.register_op(DOMAIN, "Twice")
    def twice(x):
        return 2 * x

    try:
        twice_model = _model([helper.make_node("Twice", ["x"], ["y"], domain=DOMAIN)], [_info("x", [2])],
                             [_info("y", [2])])
        (got,) = optkit.onnx.prepare(twice_model).run([np.ones(2, np.float32)])
        np.testing.assert_array_equal(got, [2, 2])
        assert twice(1) == 2  # the decorator gives the function back
        assert (DOMAIN, "Twice", 1) in optkit.onnx.supported_ops()
    finally:
        assert optkit.onnx.unregister_op(DOMAIN, "Twice")
    assert (DOMAIN, "Twice", 1) not in optkit.onnx.supported_ops()


def test_an_onnx_module_trains_through_a_registered_operator(registered):
    nnx = pytest.importorskip("flax.nnx")
    registered("ScaledTanh", lambda x, *, alpha: alpha * jnp.tanh(x))
    model, _ = _scaled_tanh_model()
    module = optkit.onnx.OnnxModule(model)
    optimizer = nnx.Optimizer(module, optax.sgd(0.1), wrt=nnx.Param)
    x = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)

    @nnx.jit
    def step(m, opt):
        value, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(m)
        opt.update(m, grads)
        return value

    losses = [float(step(module, optimizer)) for _ in range(3)]
    assert losses[2] < losses[0], losses


def test_unregistered_operators_point_to_register_op_and_bad_registrations_are_refused(registered):
    model, _ = _scaled_tanh_model()
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"register_op\(domain, op_type, fn\)") as info:
        optkit.onnx.to_jax(model)
    assert type(info.value).__module__ == "optkit.onnx"
    assert f"{DOMAIN}::ScaledTanh (opset 1), 1 node 'act'" in str(info.value)

    with pytest.raises(ValueError, match="one of optkit's own operators"):
        optkit.onnx.register_op("", "Relu", jnp.tanh)
    with pytest.raises(ValueError, match="since_version must be an integer >= 1"):
        optkit.onnx.register_op(DOMAIN, "X", jnp.tanh, since_version=0)
    with pytest.raises(TypeError, match="fn must be callable"):
        optkit.onnx.register_op(DOMAIN, "X", 3)
    registered("ScaledTanh", lambda x, *, alpha: x)
    with pytest.raises(ValueError, match="registered already; pass replace=True"):
        optkit.onnx.register_op(DOMAIN, "ScaledTanh", jnp.tanh)
    optkit.onnx.register_op(DOMAIN, "ScaledTanh", lambda x, *, alpha: -x, replace=True)
    (got,) = optkit.onnx.prepare(model).run([np.ones((1, 3), np.float32)])
    assert np.all(got == -(np.ones((1, 3), np.float32) @ numpy_helper.to_array(model.graph.initializer[0])))

    # A model importing an older version of the domain than the registration is refused, naming the versions.
    old = onnx.ModelProto()
    old.CopyFrom(model)
    optkit.onnx.unregister_op(DOMAIN, "ScaledTanh")
    optkit.onnx.register_op(DOMAIN, "ScaledTanh", lambda x, *, alpha: x, since_version=2)
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"implements ScaledTanh versions \[2\]"):
        optkit.onnx.prepare(old)


def test_the_users_error_names_the_node(registered):
    def broken(x, *, alpha):
        raise RuntimeError("not today")

    registered("ScaledTanh", broken)
    model, _ = _scaled_tanh_model()
    with pytest.raises(RuntimeError, match="not today") as info:
        optkit.onnx.prepare(model).run([np.ones((1, 3), np.float32)])
    assert any("'act'" in note and "broken" in note for note in getattr(info.value, "__notes__", []))
