"""Channels-last on CPU (optkit.onnx._plans.layout): a model's convolutions, pools and the element-wise nodes
between them run on (N, D1, ..., C) values, with the layout changed only where the graph reads a tensor
in ONNX's layout.

The values are checked against ONNX Runtime (an independent implementation), with the channels-last
plan on and off (off is what other backends run), compiled and not; gradients against the ONNX form
and, for a Gradient node, against JAX's own derivative of the formula written out.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._plans import layout as _layout  # noqa: E402
from tests.onnx.helpers import onnx_info, onnx_model  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

JIT = [pytest.param(True, id="jit"), pytest.param(False, id="nojit")]
RNG = np.random.default_rng(7)



def _layouts(nodes, opset):
    """Each node's layout role as its registration declares it, at ``opset`` (what the converter passes)."""
    from optkit.onnx._ops import TABLE

    return [spec.layout_at(version) for spec, version, _ in
            (TABLE.lookup(node.domain, node.op_type, opset) for node in nodes)]

def _init(name, *shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _outputs(*names):
    return [helper.make_value_info(name, onnx.TypeProto()) for name in names]


def _model(*args, **kwargs):
    """``onnx_model`` with the outputs typed by shape inference, as the checker requires."""
    return onnx.shape_inference.infer_shapes(onnx_model(*args, **kwargs))


def _image_net():
    """A 2-D network with every kind of planned node: a convolution, a depthwise one large enough for the
    shifted-slice form (multiplier 2), BatchNormalization, a strided dilated grouped one, a squeeze-excite
    block, MaxPool with ceil_mode, AveragePool with asymmetric pads, operands (C, 1, 1), (W,) and scalars,
    PRelu; an intermediate as a graph output, Flatten and Gemm reading a held tensor."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("HardSwish", ["c1"], ["a1"]),
        n("Conv", ["a1", "wd", "bd"], ["d1"], group=16, pads=[1, 1, 1, 1]),
        n("Relu", ["d1"], ["r1"]),
        n("BatchNormalization", ["r1", "gamma", "beta", "mean", "var"], ["n1"]),
        n("Conv", ["n1", "wg"], ["d2"], group=8, strides=[2, 2], dilations=[2, 2], pads=[2, 1, 2, 2]),
        n("GlobalAveragePool", ["d2"], ["s1"]),
        n("Conv", ["s1", "ws"], ["s2"]),
        n("Sigmoid", ["s2"], ["s3"]),
        n("Mul", ["d2", "s3"], ["m1"]),
        n("MaxPool", ["m1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
        n("AveragePool", ["p1"], ["p2"], kernel_shape=[2, 2], pads=[0, 1, 1, 0]),
        n("Add", ["p2", "bias"], ["e1"]),
        n("Mul", ["e1", "row"], ["e2"]),
        n("PRelu", ["e2", "slope"], ["e3"]),
        n("Clip", ["e3", "lo", "hi"], ["y"]),
        n("Flatten", ["y"], ["f"]),
        n("Gemm", ["f", "wf"], ["logits"], transB=1),
    ]
    inits = [_init("w1", 16, 4, 3, 3), _init("b1", 16), _init("wd", 32, 1, 3, 3), _init("bd", 32),
             _init("gamma", 32), _init("beta", 32), _init("mean", 32),
             numpy_helper.from_array(RNG.uniform(0.5, 2, 32).astype(np.float32), "var"),
             _init("wg", 32, 4, 3, 3), _init("ws", 32, 32, 1, 1), _init("bias", 32, 1, 1), _init("row", 13),
             _init("slope", 32, 1, 1), numpy_helper.from_array(np.float32(-0.5), "lo"),
             numpy_helper.from_array(np.float32(0.7), "hi"), _init("wf", 5, 32 * 13 * 13)]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [2, 4, 48, 48])], _outputs("y", "logits", "c1"),
                       inits)
    return model, {"x": RNG.standard_normal((2, 4, 48, 48)).astype(np.float32)}


def _sequence_net():
    """1-D convolutions (a speech front end's shape) with a (C, 1) bias between them."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], strides=[2], pads=[1, 1]),
             n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3], group=2),
             n("Add", ["c2", "bias"], ["y"])]
    inits = [_init("w1", 8, 3, 4), _init("w2", 6, 4, 3), _init("b2", 6), _init("bias", 6, 1)]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [3, 3, 50])], _outputs("y"), inits)
    return model, {"x": RNG.standard_normal((3, 3, 50)).astype(np.float32)}


def _convnext_block():
    """ConvNeXt's block as torch.onnx writes it: a 7 x 7 depthwise convolution, a Transpose to channels-last
    for LayerNormalization and the two MatMuls, a layer scale, a Transpose back, the residual Add; then a
    convolution. The Transposes are the held layout's own moves."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "dw", "db"], ["d"], group=8, pads=[3, 3, 3, 3]),
             n("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             n("LayerNormalization", ["t", "ln_g", "ln_b"], ["ln"], axis=-1),
             n("MatMul", ["ln", "w1"], ["h1"]), n("Relu", ["h1"], ["h2"]), n("MatMul", ["h2", "w2"], ["h3"]),
             n("Mul", ["h3", "gamma"], ["h4"]),
             n("Transpose", ["h4"], ["back"], perm=[0, 3, 1, 2]),
             n("Add", ["x", "back"], ["r"]),
             n("Conv", ["r", "wc"], ["y"], strides=[2, 2])]
    inits = [_init("dw", 8, 1, 7, 7), _init("db", 8), _init("ln_g", 8), _init("ln_b", 8), _init("w1", 8, 32),
             _init("w2", 32, 8), _init("gamma", 8), _init("wc", 4, 8, 2, 2)]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [2, 8, 20, 20])], _outputs("y"), inits)
    return model, {"x": RNG.standard_normal((2, 8, 20, 20)).astype(np.float32)}


def _dense_block():
    """DenseNet's and Inception's channel concatenations (axis 1 and -3) of convolutions' outputs."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             n("Concat", ["r1", "c2"], ["cat"], axis=1),
             n("Conv", ["cat", "w3"], ["c3"]),
             n("Concat", ["cat", "c3", "c2"], ["cat2"], axis=-3),
             n("MaxPool", ["cat2"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [_init("w1", 6, 3, 3, 3), _init("w2", 4, 6, 3, 3), _init("w3", 5, 10, 1, 1)]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [2, 3, 12, 10])], _outputs("y"), inits)
    return model, {"x": RNG.standard_normal((2, 3, 12, 10)).astype(np.float32)}


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
@pytest.mark.parametrize("build", [_image_net, _sequence_net, _convnext_block, _dense_block])
def test_values_match_onnxruntime_in_both_layouts(build, channels_last, jit, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    if jax.default_backend() != "cpu":
        pytest.skip("the channels-last plan runs on CPU")
    model, feeds = build()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    got = optkit.onnx.prepare(model, jit=jit).run(feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_the_plan_holds_the_runs_between_the_graphs_edges(monkeypatch):
    """Every convolution, pool and element-wise node of the image network is planned, Flatten and Gemm are
    not; the lowered program moves the channels at the edges only (the input, the two outputs read in
    ONNX's layout), and its convolutions take channels-last operands. Off the CPU, no moves."""
    model, feeds = _image_net()
    graph = optkit.onnx.to_graph(model)
    layout = _layout.plan(model.graph.node, {"x": 4, **{t.name: len(t.dims) for t in model.graph.initializer}},
                          _layouts(model.graph.node, 17), set())
    assert sorted(model.graph.node[i].op_type for i in layout.nodes) == sorted(
        node.op_type for node in model.graph.node if node.op_type not in ("Flatten", "Gemm"))
    fn = graph.as_function(["x"], ["y", "logits", "c1"])
    text = jax.jit(fn).lower(feeds["x"]).as_text()
    assert text.count("stablehlo.transpose") == 3
    assert "[b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f]" in text and "[b, f, 0, 1]" not in text
    monkeypatch.setattr(_layout, "active", lambda: False)
    text = jax.jit(graph.as_function(["x"], ["y", "logits", "c1"])).lower(feeds["x"]).as_text()
    assert "stablehlo.transpose" not in text and "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]" in text


def test_transposes_into_and_out_of_channels_last_are_the_held_values(monkeypatch):
    """ConvNeXt's Transposes around its LayerNorm cost nothing channels-last: the lowered block moves the
    input twice (for the convolution and the residual Add) and the output once, where the ONNX form has
    the model's two Transposes and none of its own."""
    model, feeds = _convnext_block()
    graph = optkit.onnx.to_graph(model)
    text = jax.jit(graph.as_function(["x"], "y")).lower(feeds["x"]).as_text()
    assert text.count("stablehlo.transpose") == 3
    monkeypatch.setattr(_layout, "active", lambda: False)
    text = jax.jit(graph.as_function(["x"], "y")).lower(feeds["x"]).as_text()
    assert text.count("stablehlo.transpose") == 2


def test_channel_concatenations_stay_channels_last():
    """Both of the dense block's Concats are planned: the lowered block moves its input and its output only."""
    model, feeds = _dense_block()
    text = jax.jit(optkit.onnx.to_graph(model).as_function(["x"], "y")).lower(feeds["x"]).as_text()
    assert text.count("stablehlo.transpose") == 2


def test_gradients_of_the_exported_function_match_the_onnx_form(monkeypatch):
    """to_jax's function differentiated through the channels-last nodes gives the ONNX form's gradients."""
    model, feeds = _image_net()
    apply_fn, params = optkit.onnx.to_jax(model)
    x = jnp.asarray(feeds["x"])

    def loss(p):
        y, logits, c1 = apply_fn(p, x)
        return jnp.sum(y ** 2) + jnp.sum(jnp.sin(logits)) + jnp.mean(c1)

    grads = jax.jit(jax.grad(loss))(params)
    monkeypatch.setattr(_layout, "active", lambda: False)
    want = jax.jit(jax.grad(loss))(params)
    assert set(grads) == set(want) == set(params)
    for name in want:
        np.testing.assert_allclose(grads[name], want[name], rtol=2e-4, atol=2e-5, err_msg=name)


def test_a_tensor_a_gradient_node_differentiates_by_stays_in_onnx_layout():
    """Gradient(xs=[t]) of y = sum(Conv(t, W2)) with t = Relu(Conv(x, W1)): t is not held channels-last (a
    gradient with respect to it must see it), and dy/dt is JAX's derivative of the formula written out."""
    n = helper.make_node
    w1, w2 = _init("w1", 6, 3, 3, 3), _init("w2", 5, 6, 3, 3)
    nodes = [n("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["t"]),
             n("Conv", ["t", "w2"], ["u"]), n("ReduceSum", ["u"], ["y"], keepdims=0),
             n("Gradient", ["t"], ["dt"], domain="ai.onnx.preview.training", xs=["t"], y="y")]
    outputs = [onnx_info("dt", TensorProto.FLOAT, [2, 6, 10, 10]), *_outputs("u")]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [2, 3, 10, 10])], outputs, [w1, w2],
                   opsets=(("", 17), ("ai.onnx.preview.training", 1)))
    layout = _layout.plan(model.graph.node, {"x": 4, "w1": 4, "w2": 4}, _layouts(nodes, 13), set())
    assert "t" not in layout.ranks and "c" in layout.ranks and "u" in layout.ranks
    x = RNG.standard_normal((2, 3, 10, 10)).astype(np.float32)
    dt, u = optkit.onnx.prepare(model).run([x])
    k1, k2 = numpy_helper.to_array(w1), numpy_helper.to_array(w2)
    t = jnp.maximum(jax.lax.conv(x, k1, (1, 1), [(1, 1), (1, 1)]), 0)
    want = jax.grad(lambda t: jnp.sum(jax.lax.conv(t, k2, (1, 1), "VALID")))(t)
    np.testing.assert_allclose(dt, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u, jax.lax.conv(t, k2, (1, 1), "VALID"), rtol=1e-4, atol=1e-4)


def test_a_convolution_input_of_the_wrong_rank_is_an_error_naming_the_node():
    """A convolution's input moved channels-last has the weight's rank, or the error names the node."""
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Conv", ["i", "w"], ["y"], name="conv0")]
    model = onnx_model(nodes, [onnx_info("x", TensorProto.FLOAT, [3, 5, 5])], [onnx_info("y", TensorProto.FLOAT, [3])],
                       [_init("w", 2, 3, 3, 3)])
    with pytest.raises(ValueError, match=r"conv0.*X must be \(N, C, D1, \.\.\.\) of rank 4.*\(3, 5, 5\)"):
        optkit.onnx.prepare(model).run([np.ones((3, 5, 5), np.float32)])


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
def test_batch_normalization_in_training_mode_against_its_formula(channels_last, monkeypatch):
    """BatchNormalization (training_mode=1) of a held tensor: the output channels-last, the running statistics
    (per-channel vectors) as ONNX defines them, from the batch statistics of the convolution's output."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y", "rm", "rv"], training_mode=1,
               momentum=0.8, epsilon=1e-3),
             n("Relu", ["y"], ["out"])]
    inits = [_init("w", 6, 3, 3, 3), _init("gamma", 6), _init("beta", 6), _init("mean", 6),
             numpy_helper.from_array(RNG.uniform(0.5, 2, 6).astype(np.float32), "var")]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [4, 3, 7, 7])], _outputs("out", "rm", "rv", "c"), inits)
    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    x = RNG.standard_normal((4, 3, 7, 7)).astype(np.float32)
    out, rm, rv, c = optkit.onnx.prepare(model).run([x])
    gamma, beta, mean, var = (numpy_helper.to_array(t) for t in inits[1:])
    c64 = c.astype(np.float64)
    batch_mean, batch_var = c64.mean(axis=(0, 2, 3)), c64.var(axis=(0, 2, 3))
    per = (1, -1, 1, 1)
    want = np.maximum(gamma.reshape(per) * (c64 - batch_mean.reshape(per)) / np.sqrt(batch_var.reshape(per) + 1e-3)
                      + beta.reshape(per), 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm, mean * 0.8 + batch_mean * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, var * 0.8 + batch_var * 0.2, rtol=1e-5, atol=1e-6)


def test_a_transpose_into_channels_first_of_the_wrong_rank_is_the_operators_error():
    """A Transpose the plan makes free still refuses an input its perm does not fit, as ONNX's does."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="to_nchw"),
             helper.make_node("Relu", ["t"], ["y"])]
    model = onnx_model(nodes, [onnx_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
                       [onnx_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])])
    with pytest.raises(ValueError, match="to_nchw"):
        optkit.onnx.prepare(model).run([np.ones((2, 3, 4), np.float32)])


def test_a_channel_concatenation_of_mismatched_tensors_is_the_operators_error():
    """Held tensors whose spatial sizes differ: the Concat's own error, naming the node."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]), n("Conv", ["x", "w"], ["b"]),
             n("Concat", ["a", "b"], ["y"], axis=1, name="cat0")]
    model = onnx_model(nodes, [onnx_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                       [onnx_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [_init("w", 2, 3, 3, 3)])
    with pytest.raises(ValueError, match="cat0"):
        optkit.onnx.prepare(model).run([np.ones((1, 3, 6, 6), np.float32)])


def test_an_initializer_fed_with_more_axes_than_declared_is_an_error_naming_the_node():
    """The plan trusts an initializer's rank; a Graph fed a value with more axes for it (to_jax and
    BackendRep refuse that earlier) is refused too, not broadcast in the wrong layout."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "bias"], ["y"], name="add0")]
    model = _model(nodes, [onnx_info("x", TensorProto.FLOAT, [1, 3, 5, 5])], _outputs("y"),
                   [_init("w", 2, 3, 3, 3), _init("bias", 2, 1, 1)])
    fn = optkit.onnx.to_graph(model).as_function(["x", "bias"], "y")
    x = np.ones((1, 3, 5, 5), np.float32)
    np.testing.assert_allclose(fn(x, np.full((2, 1, 1), 2.0, np.float32)) - fn(x, np.zeros((2, 1, 1), np.float32)), 2.0,
                               rtol=0, atol=1e-5)  # (c + 2) - c in float32: exact only where c is small
    with pytest.raises(ValueError, match=r"add0.*'bias'.*\(1, 1, 2, 1, 1\)"):
        fn(x, np.ones((1, 1, 2, 1, 1), np.float32))


# ------------------------------------------------------------------ small outputs on CPU (issue 45)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 512, 1, 1), (64, 512, 3, 3), {"pads": [1, 1, 1, 1]}),                  # windows gathered: 1 point
    ((2, 256, 4, 4), (32, 256, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # 4 points
    ((2, 300, 3, 3), (16, 300, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 2304, 1, 1), (8, 2304, 1, 1), {}),
    ((2, 672, 4, 4), (672, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 672}),   # depthwise: shifted slices
    ((1, 96, 3, 3), (192, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 96}),     # depth multiplier 2
])
def test_small_output_convolutions_match_onnx_runtime_and_xla_gradients(x_shape, w_shape, attrs):
    """The forms a small output takes on CPU (the windows as slices and one matrix product; depthwise shifted
    slices): ONNX Runtime's values, and in float64 the gradients of XLA's own convolution."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(45)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = (rng.normal(size=w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    model = onnx_model([node], [onnx_info("x", TensorProto.FLOAT, list(x_shape))],
                       [onnx_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], [numpy_helper.from_array(w, "w")])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(optkit.onnx.prepare(model).run([x])[0], want, rtol=2e-5, atol=2e-5)

    with jax.enable_x64(True):
        apply_fn, params = optkit.onnx.to_jax(_double(model))
        pads = attrs.get("pads", [0, 0, 0, 0])

        def xla(p, x):
            return jax.lax.conv_general_dilated(x, p["w"], tuple(attrs.get("strides", [1, 1])),
                                                [(pads[0], pads[2]), (pads[1], pads[3])],
                                                rhs_dilation=tuple(attrs.get("dilations", [1, 1])),
                                                feature_group_count=attrs.get("group", 1))

        x64 = jnp.asarray(x, jnp.float64)
        c = jnp.asarray(rng.normal(size=want.shape))
        ours = jax.grad(lambda p, x: jnp.sum(apply_fn(p, x) * c), argnums=(0, 1))(params, x64)
        theirs = jax.grad(lambda p, x: jnp.sum(xla(p, x) * c), argnums=(0, 1))(params, x64)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _double(model):
    """The model with its FLOAT tensors as DOUBLE (gradients compared in float64)."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for t in new.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in (*new.graph.input, *new.graph.output):
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    return new
