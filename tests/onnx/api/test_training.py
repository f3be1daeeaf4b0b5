"""optkit.onnx on training graphs: what ONNX's own cases do not cover (SPEC 1, 3, 4, 6).

ONNX's optimizer cases all feed T = 0 and one or two tensors; here the
optimizer nodes run with T > 0, several tensors, each Momentum mode, absent
attributes (schema defaults), float64 and float32, compiled and not, against
``onnx.reference.ReferenceEvaluator``. Gradient nodes (which the reference
evaluator does not run) are checked against analytic derivatives: at an
intermediate tensor, of a non-scalar y, and of second order. Then the errors
of the issue's point 5, each raised before anything runs.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")

import onnx  # noqa: E402
import onnx.reference  # noqa: E402
from onnx import helper  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from optkit.onnx._ops import TABLE, _registry  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402
from tests.onnx.helpers import onnx_model  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

TRAINING = "ai.onnx.preview.training"
JIT = [pytest.param(True, id="jit"), pytest.param(False, id="nojit")]
SHAPES = [(3,), (2, 2), ()]


def _model(nodes, inputs, outputs, opset=17, initializers=()):
    return onnx_model(nodes, inputs, outputs, initializers, opsets=(("", opset), (TRAINING, 1)))


# ---------------------------------------------------------------------------
# optimizer nodes against the reference evaluator
#
# The attribute values are chosen so that the reference's own float32
# arithmetic on them (it reads FLOAT attributes as np.float32) is exact, e.g.
# 1 - norm_coefficient_post; float64 runs then agree to rounding.

KINDS = {"Adagrad": (["X", "G", "H"], ["X_new", "H_new"]),
         "Adam": (["X", "G", "V", "H"], ["X_new", "V_new", "H_new"]),
         "Momentum": (["X", "G", "V"], ["X_new", "V_new"])}
ATTRS = {
    "Adagrad": {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01},
    "Adam": {"alpha": 0.85, "beta": 0.95, "epsilon": 1e-4, "norm_coefficient": 0.02,
             "norm_coefficient_post": 0.25},
    "Momentum-standard": {"alpha": 0.9, "beta": 0.3, "norm_coefficient": 0.01, "mode": "standard"},
    "Momentum-nesterov": {"alpha": 0.9, "beta": 0.3, "norm_coefficient": 0.01, "mode": "nesterov"},
}


def _optimizer_model(op, attrs, shapes, dtype):
    kinds, results = KINDS[op]
    names = [f"{k}{i}" for k in kinds for i in range(len(shapes))]
    inputs = [_info("R", dtype, []), _info("T", np.int64, [])]
    inputs += [_info(f"{k}{i}", dtype, s) for k in kinds for i, s in enumerate(shapes)]
    outputs = [_info(f"{r}{i}", dtype, s) for r in results for i, s in enumerate(shapes)]
    out_names = [o.name for o in outputs]
    node = helper.make_node(op, ["R", "T", *names], out_names, domain=TRAINING, **attrs)
    return _model([node], inputs, outputs)


def _optimizer_feeds(op, shapes, dtype, step, seed=0):
    rng = np.random.default_rng(seed)
    kinds, _ = KINDS[op]
    feeds = {"R": np.asarray(0.05, dtype), "T": np.asarray(step, np.int64)}
    for k in kinds:
        for i, s in enumerate(shapes):
            value = rng.normal(size=s)
            feeds[f"{k}{i}"] = np.asarray(np.abs(value) if k == "H" else value, dtype)
    return feeds


def _reference(op, attrs, shapes, dtype, feeds):
    """ReferenceEvaluator's outputs. Its multi-tensor Adam casts to float32, so Adam
    is evaluated one tensor at a time (the formula is element-wise, SPEC 3)."""
    if op != "Adam" or len(shapes) == 1:
        return onnx.reference.ReferenceEvaluator(_optimizer_model(op, attrs, shapes, dtype)).run(None, feeds)
    kinds, results = KINDS[op]
    per_tensor = []
    for i, s in enumerate(shapes):
        single = {"R": feeds["R"], "T": feeds["T"], **{f"{k}0": feeds[f"{k}{i}"] for k in kinds}}
        per_tensor.append(onnx.reference.ReferenceEvaluator(
            _optimizer_model(op, attrs, [s], dtype)).run(None, single))
    return [per_tensor[i][r] for r in range(len(results)) for i in range(len(shapes))]


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("step", [0, 3])
@pytest.mark.parametrize("name", list(ATTRS))
def test_optimizer_nodes_match_reference_float64(name, step, jit):
    """SPEC 1, 3, 4: three tensors at once, T = 0 and T > 0, every attribute set, float64."""
    op = name.split("-")[0]
    attrs = ATTRS[name]
    feeds = _optimizer_feeds(op, SHAPES, np.float64, step)
    rep = optkit.onnx.prepare(_optimizer_model(op, attrs, SHAPES, np.float64), jit=jit)
    got = rep.run(feeds)
    want = _reference(op, attrs, SHAPES, np.float64, feeds)
    assert len(got) == len(want) == len(KINDS[op][1]) * len(SHAPES)
    for g, w in zip(got, want):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op", ["Adagrad", "Adam"])
def test_absent_attributes_use_schema_defaults(op):
    """SPEC 1, Decision (epsilon default): an absent epsilon is the schema's 1e-6, not the seed's 0."""
    shapes = [(4,)]
    feeds = _optimizer_feeds(op, shapes, np.float64, step=2)
    feeds["G0"][0] = 0.0  # H + G^2 stays small: epsilon matters
    feeds["H0"][0] = 1e-10
    got = optkit.onnx.run_model(_optimizer_model(op, {}, shapes, np.float64), feeds)
    want = _reference(op, {}, shapes, np.float64, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", list(ATTRS))
def test_optimizer_nodes_float32_keep_dtype(name):
    op = name.split("-")[0]
    feeds = _optimizer_feeds(op, SHAPES[:2], np.float32, step=5, seed=1)
    got = optkit.onnx.run_model(_optimizer_model(op, ATTRS[name], SHAPES[:2], np.float32), feeds)
    want = _reference(op, ATTRS[name], SHAPES[:2], np.float32, feeds)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)


def test_optimizer_node_calls_spec_op():
    """The handler is optkit.ops.onnx_momentum on ONNX's variadic layout (no second formula)."""
    feeds = _optimizer_feeds("Momentum", SHAPES, np.float64, step=1)
    with jax.enable_x64(True):
        X, G, V = ([jnp.asarray(feeds[f"{k}{i}"]) for i in range(3)] for k in "XGV")
        # ONNX stores FLOAT attributes in float32
        attrs = {k: v if isinstance(v, str) else float(np.float32(v)) for k, v in ATTRS["Momentum-nesterov"].items()}
        want = optkit.ops.onnx_momentum(feeds["R"], feeds["T"], X, G, V, **attrs)
    got = optkit.onnx.run_model(_optimizer_model("Momentum", ATTRS["Momentum-nesterov"], SHAPES, np.float64),
                                feeds)
    for g, w in zip(got, [*want.X_new, *want.V_new]):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-15, atol=1e-17)  # XLA may fuse differently


_SIXTY_FOURTHS = st.integers(0, 63).map(lambda k: k / 64)  # exact in float32, and so is 1 - x


@settings(max_examples=15)
@given(
    name=st.sampled_from(list(ATTRS)),
    shapes=st.lists(st.lists(st.integers(1, 3), max_size=2).map(tuple), min_size=1, max_size=3),
    step=st.integers(0, 20),
    attrs=st.fixed_dictionaries({"a": _SIXTY_FOURTHS, "b": _SIXTY_FOURTHS, "c": _SIXTY_FOURTHS}),
    seed=st.integers(0, 2**16),
)
def test_optimizer_nodes_property(name, shapes, step, attrs, seed):
    """Any number of tensors, shapes, steps and attribute values: equal to the reference (float64)."""
    op = name.split("-")[0]
    a, b, c = attrs["a"], attrs["b"], attrs["c"]
    chosen = {"Adagrad": {"decay_factor": a, "epsilon": 1e-3 + b, "norm_coefficient": c},
              "Adam": {"alpha": a, "beta": b, "epsilon": 1e-3, "norm_coefficient": c, "norm_coefficient_post": a},
              "Momentum": {"alpha": a, "beta": b, "norm_coefficient": c, "mode": ATTRS[name].get("mode")}}[op]
    feeds = _optimizer_feeds(op, shapes, np.float64, step, seed)
    got = optkit.onnx.prepare(_optimizer_model(op, chosen, shapes, np.float64), jit=False).run(feeds)
    for g, w in zip(got, _reference(op, chosen, shapes, np.float64, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------
# Gradient nodes against analytic derivatives (SPEC 6)


@pytest.mark.parametrize("jit", JIT)
def test_gradient_at_intermediate_tensor(jit):
    """xs = [H, Z] with H = X @ W an intermediate: the graph is cut at H, and the gradient is
    taken at the value fed for H (here not X @ W). Y = sum(tanh(H) * Z)."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["H"]),
        helper.make_node("Tanh", ["H"], ["A"]),
        helper.make_node("Mul", ["A", "Z"], ["B"]),
        helper.make_node("ReduceSum", ["B"], ["Y"], keepdims=0),
        helper.make_node("Gradient", ["H_at", "Z"], ["dY_dH", "dY_dZ"], domain=TRAINING,
                         xs=["H", "Z"], y="Y"),
    ]
    f64 = np.float64
    inputs = [_info("X", f64, [2, 3]), _info("W", f64, [3]), _info("Z", f64, [2]), _info("H_at", f64, [2])]
    outputs = [_info("Y", f64, []), _info("dY_dH", f64, [2]), _info("dY_dZ", f64, [2])]
    rng = np.random.default_rng(0)
    X, W, Z, H_at = rng.normal(size=(2, 3)), rng.normal(size=3), rng.normal(size=2), rng.normal(size=2)
    Y, dH, dZ = optkit.onnx.prepare(_model(nodes, inputs, outputs), jit=jit).run([X, W, Z, H_at])
    np.testing.assert_allclose(Y, np.sum(np.tanh(X @ W) * Z), rtol=1e-12)
    np.testing.assert_allclose(dH, (1 - np.tanh(H_at) ** 2) * Z, rtol=1e-12)
    np.testing.assert_allclose(dZ, np.tanh(H_at), rtol=1e-12)


@pytest.mark.parametrize("jit", JIT)
def test_second_order_gradient(jit):
    """y = sum(w * x^3): a Gradient node gives 3 w x^2, a second one on its output 6 w x."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["x2"]),
        helper.make_node("Mul", ["x2", "x"], ["x3"]),
        helper.make_node("Mul", ["w", "x3"], ["wx3"]),
        helper.make_node("ReduceSum", ["wx3"], ["y"], keepdims=0),
        helper.make_node("Gradient", ["x", "w"], ["dy_dx"], domain=TRAINING, xs=["x"], zs=["w"], y="y"),
        helper.make_node("Gradient", ["x", "w"], ["d2y_dx2"], domain=TRAINING, xs=["x"], zs=["w"],
                         y="dy_dx"),
    ]
    f64 = np.float64
    model = _model(nodes, [_info("x", f64, [3]), _info("w", f64, [3])],
                   [_info("dy_dx", f64, [3]), _info("d2y_dx2", f64, [3])])
    x, w = np.array([1.0, -2.0, 0.5]), np.array([0.3, 2.0, -1.0])
    first, second = optkit.onnx.prepare(model, jit=jit).run({"x": x, "w": w})
    np.testing.assert_allclose(first, 3 * w * x ** 2, rtol=1e-12)
    np.testing.assert_allclose(second, 6 * w * x, rtol=1e-12)


def test_gradient_of_non_scalar_y_is_gradient_of_sum():
    """SPEC 6, Decision (non-scalar y): d sum(x * x) / dx = 2 x; float32 stays float32."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dy_dx"], domain=TRAINING, xs=["x"], y="y")]
    model = _model(nodes, [_info("x", np.float32, [2, 2])], [_info("dy_dx", np.float32, [2, 2])])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    (grad,) = optkit.onnx.run_model(model, [x])
    assert grad.dtype == np.float32
    np.testing.assert_array_equal(grad, 2 * x)


def _logistic_step_model():
    """One training step of logistic regression: Gemm, SoftmaxCrossEntropyLoss, Gradient, Adam."""
    f32 = np.float32
    nodes = [
        helper.make_node("Gemm", ["X", "W", "B"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
        helper.make_node("Gradient", ["W", "B", "X", "labels"], ["dW", "dB"], domain=TRAINING,
                         xs=["W", "B"], zs=["X", "labels"], y="loss"),
        helper.make_node("Adam", ["R", "T", "W", "B", "dW", "dB", "VW", "VB", "HW", "HB"],
                         ["W_new", "B_new", "VW_new", "VB_new", "HW_new", "HB_new"], domain=TRAINING,
                         alpha=0.9, beta=0.999, epsilon=1e-6),
    ]
    inputs = [_info("X", f32, ["N", 4]), _info("labels", np.int64, ["N"]), _info("R", f32, []),
              _info("T", np.int64, []), _info("W", f32, [4, 3]), _info("B", f32, [3]),
              _info("VW", f32, [4, 3]), _info("VB", f32, [3]), _info("HW", f32, [4, 3]), _info("HB", f32, [3])]
    outputs = [_info("loss", f32, []), _info("W_new", f32, [4, 3]), _info("B_new", f32, [3]),
               _info("VW_new", f32, [4, 3]), _info("VB_new", f32, [3]), _info("HW_new", f32, [4, 3]),
               _info("HB_new", f32, [3])]
    return _model(nodes, inputs, outputs)


def test_training_step_equals_jax_grad_and_optkit_adam():
    """A whole ONNX training step = jax.grad of the same loss + optkit.ops.onnx_adam."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8, 4)).astype(np.float32)
    labels = rng.integers(0, 3, size=8).astype(np.int64)
    W, B = (0.1 * rng.normal(size=(4, 3))).astype(np.float32), np.zeros(3, np.float32)
    zeros = [np.zeros_like(W), np.zeros_like(B)]
    R, T = np.float32(0.01), np.int64(4)
    got = optkit.onnx.run_model(_logistic_step_model(), [X, labels, R, T, W, B, *zeros, *zeros])

    def loss(params):
        logp = jax.nn.log_softmax(X @ params[0] + params[1], axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None].astype(np.int32), axis=1))

    grads = jax.grad(loss)([W, B])
    want = optkit.ops.onnx_adam(R, 4, [W, B], grads, zeros, zeros, alpha=0.9, beta=0.999, epsilon=1e-6)
    np.testing.assert_allclose(got[0], loss([W, B]), rtol=1e-6)
    for g, w in zip(got[1:], [*want.X_new, *want.V_new, *want.H_new]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad", "momentum"])
def test_a_donated_training_step_reuses_the_weights_and_state_and_equals_the_plain_step(optimizer):
    """run(..., donate=True) donates exactly the inputs the optimizer node updates (weights, state): they are
    deleted, the data, labels, R and T are not, no donation goes unused (no warning), the outputs are bitwise
    the undonated ones; donate= a list donates those names; jit=False donates nothing."""
    rng = np.random.default_rng(0)
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["logits"], transB=1)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [3, 4], rng.normal(size=12).astype(np.float32))
    b = helper.make_tensor("b", onnx.TensorProto.FLOAT, [3], np.zeros(3, np.float32))
    graph = helper.make_graph([gemm], "g", [_info("x", np.float32, ["N", 4])], [_info("logits", np.float32, ["N", 3])],
                              [w, b])
    step = optkit.onnx.make_training_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                           optimizer=optimizer)
    names = [o.name.removesuffix(".new") for o in step.graph.output[1:]]
    rep = optkit.onnx.prepare(step)
    assert rep.updated_inputs == tuple(names) and names[:2] == ["w", "b"]
    data = {"x": rng.normal(size=(8, 4)).astype(np.float32), "labels": rng.integers(0, 3, size=8).astype(np.int64),
            "R": np.float32(0.1), "T": np.int64(0)}
    state = dict(zip(names, rep.run(data, as_numpy=False)[1:]))
    plain = rep.run({**data, **{k: np.asarray(v) for k, v in state.items()}})
    with jax.enable_x64(True):  # the int64 labels and T stay int64
        data = {k: jnp.asarray(v) for k, v in data.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Some donated buffers were not usable" would fail here
        donated = rep.run({**data, **state}, donate=True)
    assert all(v.is_deleted() for v in state.values()) and not any(v.is_deleted() for v in data.values())
    for got, want in zip(donated, plain):
        np.testing.assert_array_equal(got, want)
    state = {k: jnp.asarray(v) for k, v in zip(names, plain[1:])}
    rep.run({**data, **state}, donate=["w"])
    assert [k for k, v in state.items() if v.is_deleted()] == ["w"]
    state = {k: jnp.asarray(v) for k, v in zip(names, plain[1:])}
    optkit.onnx.prepare(step, jit=False).run({**data, **state}, donate=True)
    assert not any(v.is_deleted() for v in state.values())
    with pytest.raises(ValueError, match="donate must be True, False or a list of graph input names"):
        rep.run({**data, **state}, donate=["not_an_input"])


# ---------------------------------------------------------------------------
# errors (issue point 5): each clear, each before anything runs


def _relu_model(shape=("N", 3), dtype=np.float32):
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", dtype, shape)],
                  [_info("y", dtype, shape)])


@pytest.mark.parametrize("data", [b"garbage bytes", b"\x08\x07", b""])
def test_malformed_model_bytes(data):
    with pytest.raises(ValueError, match="malformed ONNX model bytes"):
        optkit.onnx.prepare(data)
    with pytest.raises(ValueError, match="malformed"):
        optkit.onnx.to_graph(data)


def test_model_from_file_bytes_and_object(tmp_path):
    model = _relu_model()
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    x = np.array([[-1.0, 0.0, 2.0]], np.float32)
    for source in (model, model.SerializeToString(), path, str(path), open(path, "rb")):
        np.testing.assert_array_equal(optkit.onnx.run_model(source, [x])[0], np.maximum(x, 0))
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="malformed ONNX model file"):
        optkit.onnx.load_model(tmp_path / "bad.onnx")
    with pytest.raises(FileNotFoundError):
        optkit.onnx.load_model(tmp_path / "missing.onnx")
    with pytest.raises(TypeError, match="ModelProto, bytes, a path"):
        optkit.onnx.load_model(42)


def test_checker_runs_first():
    model = _relu_model()
    model.graph.node[0].input[0] = "undefined"
    with pytest.raises(ValueError, match="onnx.checker rejects"):
        optkit.onnx.prepare(model)


@pytest.mark.parametrize("op, domain, opset", [("FlexAttention", "", 17), ("Foo", "com.example", 1)])
def test_unsupported_op_names_type_domain_and_opset(op, domain, opset):
    node = helper.make_node(op, ["x"], ["y"], domain=domain)
    model = helper.make_model(
        helper.make_graph([node], "g", [_info("x", np.float32, [2])], [_info("y", np.float32, [2])]),
        opset_imports=[helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, opset)] if domain else []))
    with pytest.raises(optkit.onnx.UnsupportedOpError) as err:
        optkit.onnx.prepare(model)
    message = str(err.value)
    assert op in message and (domain or "ai.onnx") in message and f"opset {opset}" in message


def test_unsupported_operator_version():
    """Add-1 (consumed_inputs) is not implemented; opset 5 must not run Add-6 or Add-7."""
    node = helper.make_node("Add", ["x", "x"], ["y"])
    model = helper.make_model(
        helper.make_graph([node], "g", [_info("x", np.float32, [2])], [_info("y", np.float32, [2])]),
        opset_imports=[helper.make_opsetid("", 5)])
    with pytest.raises(optkit.onnx.UnsupportedOpError, match=r"Add \(domain 'ai.onnx', opset 5\)"):
        optkit.onnx.prepare(model)


@pytest.mark.parametrize("op, count", [("Adagrad", 6), ("Adagrad", 4), ("Adam", 8), ("Momentum", 7)])
def test_variadic_optimizer_input_count(op, count):
    k = len(KINDS[op][0])
    inputs = [_info("R", np.float32, []), _info("T", np.int64, [])]
    inputs += [_info(f"I{i}", np.float32, [2]) for i in range(count - 2)]
    node = helper.make_node(op, [i.name for i in inputs], ["o0", "o1"], domain=TRAINING,
                            **({"alpha": 0.9, "beta": 1.0, "mode": "standard", "norm_coefficient": 0.0}
                               if op == "Momentum" else {}))
    model = _model([node], inputs, [_info("o0", np.float32, [2]), _info("o1", np.float32, [2])])
    with pytest.raises(ValueError, match=rf"expects 2 \+ {k}\*n inputs .* got {count} inputs"):
        optkit.onnx.prepare(model)


def test_optimizer_output_count():
    model = _optimizer_model("Adagrad", {}, [(2,)], np.float32)
    del model.graph.node[0].output[1]
    del model.graph.output[1]
    with pytest.raises(ValueError, match=r"must have 2\*1 = 2 outputs"):
        optkit.onnx.prepare(model)


@pytest.mark.parametrize("missing", ["alpha", "beta", "mode", "norm_coefficient"])
def test_momentum_requires_its_attributes(missing):
    attrs = dict(ATTRS["Momentum-standard"])
    del attrs[missing]
    model = _optimizer_model("Momentum", attrs, [(2,)], np.float32)
    with pytest.raises(ValueError, match=rf"[Rr]equired attribute '{missing}' is missing"):
        optkit.onnx.prepare(model)


def test_momentum_mode_and_attribute_ranges():
    model = _optimizer_model("Momentum", {**ATTRS["Momentum-standard"], "mode": "fast"}, [(2,)], np.float32)
    with pytest.raises(ValueError, match="mode must be 'standard' or 'nesterov', got 'fast'"):
        optkit.onnx.prepare(model)
    model = _optimizer_model("Adam", {"beta": 1.5}, [(2,)], np.float32)
    with pytest.raises(ValueError, match=r"Adam.*beta must be in \[0, 1\)"):
        optkit.onnx.prepare(model)


def test_feeds_are_checked_before_running():
    rep = optkit.onnx.prepare(_optimizer_model("Adagrad", {}, [(2,)], np.float32))
    good = _optimizer_feeds("Adagrad", [(2,)], np.float32, step=0)
    with pytest.raises(TypeError, match="'X0' is declared float32, fed float64"):
        rep.run({**good, "X0": good["X0"].astype(np.float64)})
    with pytest.raises(TypeError, match="'T' is declared int64, fed float32"):
        rep.run({**good, "T": np.float32(0)})
    with pytest.raises(ValueError, match=r"'T' is declared int64, whose range .*; the value 9223372036854775808"):
        rep.run({**good, "T": np.uint64(2**63)})
    with pytest.raises(ValueError, match=r"'G0' is declared with shape \(2\), fed shape \(3,\)"):
        rep.run({**good, "G0": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"graph inputs \['H0'\] are not fed"):
        rep.run({k: v for k, v in good.items() if k != "H0"})
    with pytest.raises(ValueError, match="'nope' is not a graph input"):
        rep.run({**good, "nope": good["R"]})
    with pytest.raises(ValueError, match="got 6 values but the model has 5 inputs"):
        rep.run([*good.values(), good["R"]])
    assert not rep._functions  # nothing was traced, compiled or run
    assert len(rep.run(good)) == 2


def test_symbolic_dimensions_must_agree():
    f32 = np.float32
    model = _model([helper.make_node("Add", ["a", "b"], ["c"])],
                   [_info("a", f32, ["N", 2]), _info("b", f32, ["N", 2])], [_info("c", f32, ["N", 2])])
    rep = optkit.onnx.prepare(model)
    with pytest.raises(ValueError, match="dimension 'N' is 3 in axis 0 of graph input 'a' but 1"):
        rep.run([np.zeros((3, 2), f32), np.zeros((1, 2), f32)])


@pytest.fixture
def counting_op(monkeypatch):
    """A test-only operator ``test.optkit::Count`` that counts its runs on concrete values."""
    runs = []

    def build(ctx):
        def count(x):
            if not isinstance(x, jax.core.Tracer):
                runs.append(x)
            return x

        return count

    domain = "test.optkit"
    monkeypatch.setitem(TABLE._rows, (domain, "Count", 1), _registry.OpSpec("Count", (1,), build, domain))
    monkeypatch.setitem(TABLE._versions, (domain, "Count"), [1])
    return runs


@pytest.mark.parametrize("jit", JIT)
def test_trace_errors_happen_before_any_op_runs(counting_op, jit):
    """A shape error in the second node is raised before the first node runs, jitted or not."""
    f32 = np.float32
    nodes = [helper.make_node("Count", ["a"], ["b"], domain="test.optkit"),
             helper.make_node("MatMul", ["b", "w"], ["c"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [_info("a", f32, ["N", "K"]), _info("w", f32, ["M", 2])],
                          [_info("c", f32, ["N", 2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.optkit", 1)])
    rep = optkit.onnx.prepare(model, jit=jit)
    with pytest.raises(TypeError, match="dot_general|matmul|incompatible"):
        rep.run([np.ones((2, 3), f32), np.ones((4, 2), f32)])
    assert counting_op == []
    rep.run([np.ones((2, 3), f32), np.ones((3, 2), f32)])
    assert len(counting_op) == (0 if jit else 1)


def test_optkit_does_not_import_onnx():
    import subprocess
    import sys

    code = "import sys, optkit; assert 'onnx' not in sys.modules, sorted(m for m in sys.modules if 'onnx' in m)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_example_trains_from_a_saved_file(tmp_path):
    """examples/onnx_training.py end to end, briefly: the saved file loads, the first step matches
    ReferenceEvaluator, and the loss falls (the full run reaches > 90% test accuracy)."""
    from examples import onnx_training

    result = onnx_training.main(["--steps", "60", "--out", str(tmp_path)])
    assert (tmp_path / "mlp_adam_training.onnx").stat().st_size > 0
    assert result["reference_check"] is not None and result["reference_check"] < 1e-6
    assert np.mean(result["losses"][-5:]) < 0.5 * result["losses"][0]
    assert result["test_accuracy"] > 0.6


@pytest.fixture
def apply_body_op(monkeypatch):
    """A test-only operator ``test.optkit::ApplyBody`` that runs its ``body`` sub-graph on its input, through
    the converter's own sub-graph conversion (``ctx.convert_subgraph``), as If, Loop and Scan will."""

    def build(ctx):
        body = ctx.convert_subgraph("body")

        def apply(x, captured=None):
            feeds = {body.inputs[0].name: x, **(captured or {})}
            return body.graph.evaluate(feeds, body.outputs, check_feeds=False)[body.outputs[0]]

        return apply

    domain = "test.optkit"
    monkeypatch.setitem(TABLE._rows, (domain, "ApplyBody", 1), _registry.OpSpec("ApplyBody", (1,), build, domain))
    monkeypatch.setitem(TABLE._versions, (domain, "ApplyBody"), [1])
    return domain


def _body_model(domain, body_nodes):
    body = helper.make_graph(body_nodes, "body", [_info("xb", onnx.TensorProto.FLOAT, [2])],
                             [_info("yb", onnx.TensorProto.FLOAT, [2])])
    node = helper.make_node("ApplyBody", ["x"], ["y"], domain=domain, body=body)
    graph = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["w"]), node], "g",
                              [_info("x", onnx.TensorProto.FLOAT, [2]), _info("a", onnx.TensorProto.FLOAT, [2])],
                              [_info("y", onnx.TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


@pytest.mark.parametrize("jit", JIT)
def test_a_sub_graph_is_converted_by_the_same_pipeline_and_reads_enclosing_names(apply_body_op, jit):
    """The body reads ``w``, computed in the enclosing graph: it is captured, fed by the node, and the result
    is the body's arithmetic on the fed values (y = (x + w) * w with w = a * a)."""
    model = _body_model(apply_body_op, [helper.make_node("Add", ["xb", "w"], ["s"]),
                                        helper.make_node("Mul", ["s", "w"], ["yb"])])
    x, a = np.array([1.0, -2.0], np.float32), np.array([3.0, 0.5], np.float32)
    y = optkit.onnx.prepare(model, jit=jit).run({"x": x, "a": a}).y
    np.testing.assert_allclose(y, (x + a * a) * (a * a), rtol=1e-6)
    graph = optkit.onnx.to_graph(model)
    dx = jax.grad(lambda x: jnp.sum(graph.as_function(["x", "a"], "y")(x, jnp.asarray(a))))(jnp.asarray(x))
    np.testing.assert_allclose(dx, a * a, rtol=1e-6)  # d/dx of (x + w) * w is w


def test_operators_inside_sub_graphs_are_checked_with_the_model(apply_body_op):
    model = _body_model(apply_body_op, [helper.make_node("FlexAttention", ["xb"], ["yb"])])
    with pytest.raises(optkit.onnx.UnsupportedOpError,
                       match=r"ai.onnx::FlexAttention \(opset 17\), 1 node 'FlexAttention#0'"):
        optkit.onnx.prepare(model)
