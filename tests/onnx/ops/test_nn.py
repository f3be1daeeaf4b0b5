"""Convolutions, pools and softmaxes (optkit/onnx/_ops/nn.py, pool.py, _depthwise.py) beyond ONNX's node cases:
max-pool indices against ONNX Runtime, depthwise convolutions and their gradients in every mode, DeformConv
against its float64 formula, a float16 softmax as ONNX Runtime rounds it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.defs  # noqa: E402
import onnx.reference  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import node_model  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(0)



@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "storage_order": 1},
    {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "storage_order": 1, "pads": [0, 1, 1, 0]},
])
def test_max_pool_indices_equal_onnx_runtime(attrs):
    """ONNX Runtime is the oracle: onnx.reference's indices are wrong with pads (negative) and storage_order=1."""
    onnxruntime = pytest.importorskip("onnxruntime")
    x = np.round(RNG.normal(size=(2, 3, 5, 6)), 1).astype(np.float32)  # rounded: ties inside windows
    model = node_model("MaxPool", {"x": x}, attrs, opset=12, n_outputs=2)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    for jit in (True, False):
        got = optkit.onnx.prepare(model, jit=jit).run([x])
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int64


@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 2, 2, 2], "kernel_shape": [5, 5]}, 1),
    ({"dilations": [2, 2], "pads": [2, 1, 2, 1]}, 2),
])
def test_a_large_depthwise_convolution_equals_xla_grouped_convolution_with_its_gradients(attrs, multiplier):
    """Above 2**16 output elements on CPU a depthwise Conv is a sum of shifted slices (nn._depthwise): its value
    and its gradients equal XLA's grouped convolution in float64."""
    c, k = 16, attrs.get("kernel_shape", [3, 3])[0]
    x = RNG.normal(size=(2, c, 96, 96))
    w = RNG.normal(size=(c * multiplier, 1, k, k))
    model = node_model("Conv", {"x": x, "w": w}, {"group": c, **attrs})
    rep = optkit.onnx.prepare(model)
    assert np.prod(rep.run([x, w])[0].shape) >= 2**16  # the shifted-slices path

    def xla(x, w):
        pads = attrs.get("pads", [0, 0, 0, 0])
        return jax.lax.conv_general_dilated(x, w, attrs.get("strides", [1, 1]),
                                            [(pads[0], pads[2]), (pads[1], pads[3])],
                                            rhs_dilation=attrs.get("dilations", [1, 1]), feature_group_count=c)

    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        np.testing.assert_allclose(rep.run([x, w])[0], np.asarray(xla(x, w)), rtol=1e-12, atol=1e-12)
        cot = RNG.normal(size=np.shape(xla(x, w)))
        got = jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1))(x, w)
        want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


def _depthwise_case(attrs, multiplier, c, size):
    """A float64 depthwise Conv node model of ``c`` channels on (2, c, size, size), its inputs and XLA's grouped
    convolution of the same attributes (the independent expectation)."""
    k = attrs.get("kernel_shape", [3, 3])[0]
    x = RNG.normal(size=(2, c, size, size))
    w = RNG.normal(size=(c * multiplier, 1, k, k))
    pads = attrs.get("pads", [0, 0, 0, 0])

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, attrs.get("strides", [1, 1]),
                                            [(pads[0], pads[2]), (pads[1], pads[3])],
                                            rhs_dilation=attrs.get("dilations", [1, 1]), feature_group_count=c)

    return x, w, node_model("Conv", {"x": x, "w": w}, {"group": c, **attrs}), xla


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}, 1),
    ({"dilations": [2, 2], "pads": [2, 1, 2, 1]}, 2),
])
def test_a_large_depthwise_gradient_equals_the_analytic_one_in_both_modes(attrs, multiplier, channels_last,
                                                                          monkeypatch):
    """The shifted-slices depthwise Conv's own derivative (one variadic reduction over the taps for W, one
    convolution of the spread-out cotangent for X) gives XLA's grouped convolution's gradients in float64, in
    both layouts, jitted and not; forward mode (``jax.jvp``) gives its tangent."""
    from optkit.onnx._plans import layout as _layout

    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    x, w, model, xla = _depthwise_case(attrs, multiplier, 16, 96)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))
        assert np.prod(cot.shape) >= 2**16  # a large output, where speed matters
        for jit in (True, False):
            grad = jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1))
            got = (jax.jit(grad) if jit else grad)(x, w)
            want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
            for g, h in zip(got, want):
                np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(fn(params, x, w)), np.asarray(xla(x, w)), rtol=1e-12, atol=1e-12)
        _, tangent = jax.jvp(lambda w: fn(params, x, w), (w,), (w,))
        np.testing.assert_allclose(np.asarray(tangent), np.asarray(xla(x, w)), rtol=1e-10, atol=1e-10)  # linear in w


@pytest.mark.parametrize("attrs, multiplier", [
    ({"pads": [1, 1, 1, 1]}, 1),
    ({"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}, 2),
])
def test_a_small_depthwise_convolution_differentiates_as_xlas_grouped_one_in_every_mode(attrs, multiplier):
    """``to_jax``'s depthwise Conv (shifted slices and their compact derivative) at a small size: gradients, forward
    mode, the Hessian and ``jax.vmap`` of the gradient over the weights or over the input equal XLA's grouped
    convolution's in float64."""
    x, w, model, xla = _depthwise_case(attrs, multiplier, 4, 9)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))

        def derivatives(f):
            loss = functools.partial(lambda f, x, w: jnp.sum(f(x, w) ** 3 * cot), f)
            return (jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w), jax.jvp(lambda w: f(x, w), (w,), (w,))[1],
                    jax.hessian(lambda w: loss(x, w))(w),
                    jax.vmap(jax.grad(loss, argnums=1), (None, 0))(x, jnp.stack([w, 2 * w])),
                    jax.vmap(jax.grad(loss, argnums=(0, 1)), (0, None))(jnp.stack([x, 2 * x]), w))

        got, want = derivatives(lambda x, w: fn(params, x, w)), derivatives(xla)
    for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "onnx_layout"])
def test_the_depthwise_gradient_is_one_reduction_and_one_convolution_not_one_per_tap(channels_last, monkeypatch):
    """The reverse-mode gradient of a 5x5 depthwise Conv is built from the compact gradients (the weight's as one
    variadic reduction over the taps, the input's as one convolution of the spread-out cotangent), not JAX's own
    derivative of the 25 taps (25 reductions, which XLA:CPU compiles slowly
    and runs one after another): counted in the lowered program, with the gradients equal to XLA's grouped
    convolution's in float64."""
    from optkit.onnx._plans import layout as _layout

    if not channels_last:
        monkeypatch.setattr(_layout, "active", lambda: False)
    attrs = {"strides": [2, 2], "pads": [2, 1, 2, 3], "kernel_shape": [5, 5]}
    x, w, model, xla = _depthwise_case(attrs, 2, 4, 11)
    fn, params = optkit.onnx.to_jax(model, trainable=[])
    with jax.enable_x64(True):
        cot = RNG.normal(size=np.shape(xla(x, w)))
        grad = jax.jit(jax.grad(lambda x, w: jnp.sum(fn(params, x, w) * cot), argnums=(0, 1)))
        text = grad.lower(x, w).as_text()
        # pads that grow an array (the taps' transposes read back as negative pads, which XLA makes slices): X's
        # own padding, and the cotangent's spread and border; JAX's own derivative pads once per tap
        growing = [line for line in text.splitlines() if "stablehlo.pad" in line and "-" not in line.split("low")[1]]
        assert len(growing) <= 3 and text.count("stablehlo.reduce") <= 2, (len(growing), text.count("stablehlo.reduce"))
        got = grad(x, w)
        want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * cot), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-10, atol=1e-10)


def test_reverse_over_reverse_through_the_depthwise_gradient():
    """``jax.grad`` of ``jax.grad`` through the depthwise Conv's own derivative (JAX differentiates its variadic
    reduction) equals XLA's grouped convolution's, in float64; so does the gradient through ``OnnxModule`` in
    ``nnx``."""
    from flax import nnx

    x = RNG.normal(size=(4, 8, 96, 96))
    w = RNG.normal(size=(8, 1, 3, 3))
    model = node_model("Conv", {"x": x}, {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]},
                        initializers=[("w", w)])

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)], feature_group_count=8)

    with jax.enable_x64(True):
        fn, params = optkit.onnx.to_jax(model)
        assert np.prod(np.shape(fn(params, x))) >= 2**16  # a large output
        inner = jax.grad(lambda p: jnp.sum(jnp.tanh(fn(p, x)) ** 2))
        got = jax.grad(lambda p: jnp.sum(inner(p)["w"] ** 2))(params)["w"]
        inner_xla = jax.grad(lambda w: jnp.sum(jnp.tanh(xla(x, w)) ** 2))
        want = jax.grad(lambda w: jnp.sum(inner_xla(w) ** 2))(w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
        module = optkit.onnx.OnnxModule(model)
        got = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(module)["params"]["w"][...]
        want = jax.grad(lambda w: jnp.mean(xla(x, w) ** 2))(w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


@pytest.mark.xla_structure
def test_convolutions_compile_to_xlas_own_kernel_on_cpu_unless_a_grouped_one_is_differentiated():
    """On CPU a model's graph is compiled with YNNPACK's convolutions off (XLA's own are faster here,
    benchmarks/RESULTS.md), except where a grouped convolution may be differentiated (a training graph, or
    to_jax's function), where YNNPACK's are 4x faster; the values are the same either way."""
    from optkit.onnx._backend import _option_accepted

    if jax.default_backend() != "cpu" or not _option_accepted():
        pytest.skip("XLA:CPU's YNNPACK option is not in this jaxlib")
    eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
    x = RNG.normal(size=(2, 32, 32, 32)).astype(np.float32)  # large enough for YNNPACK by default
    w = RNG.normal(size=(32, 32, 3, 3)).astype(np.float32)
    plain = node_model("Conv", {"x": x, "w": w}, {"pads": [1] * 4})
    grouped = node_model("Conv", {"x": x}, {"group": 32, "pads": [1] * 4},
                          initializers=[("w", RNG.normal(size=(32, 1, 3, 3)).astype(np.float32))])
    training = optkit.onnx.make_training_model(grouped, loss="mean_squared_error")
    assert optkit.onnx.prepare(plain)._options == eigen
    assert optkit.onnx.prepare(grouped)._options == eigen  # inference only
    assert optkit.onnx.prepare(training)._options is None

    rep = optkit.onnx.prepare(plain)
    got = rep.run([x, w])[0]
    (compiled,) = rep._functions.values()
    with jax.enable_x64(True):
        text = compiled.jitted.lower(x, w).compile().as_text()
    assert "__ynn_fusion" not in text and " convolution(" in text
    default = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)]))
    assert "__ynn_fusion" in default.lower(x, w).compile().as_text()  # what the option changes
    np.testing.assert_allclose(got, np.asarray(default(x, w)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_float16_softmax_is_computed_in_float32_and_rounded_once_as_onnx_runtime_does(op):
    """Over 4096 float16 values a row, ONNX Runtime's kernel (float32 inside) and optkit give the same float16
    results, within one float16 step of the float64 formula."""
    ort = pytest.importorskip("onnxruntime")
    x = (np.random.default_rng(0).normal(size=(8, 4096)) * 2 + 0.5).astype(np.float16)
    node = helper.make_node(op, ["x"], ["y"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = optkit.onnx.prepare(model).run([x])
    assert got.dtype == np.float16
    wide = x.astype(np.float64)
    exact = wide - wide.max(1, keepdims=True) - np.log(np.exp(wide - wide.max(1, keepdims=True)).sum(1, keepdims=True))
    exact = np.exp(exact) if op == "Softmax" else exact
    mismatched = np.mean(got != want)
    assert mismatched < 0.001, mismatched  # the same float16 values (float16 arithmetic: 20-48% differ)
    assert np.abs(got.astype(np.float64) - exact).max() <= np.spacing(np.abs(exact).max().astype(np.float16))
def _deform_conv_float64(x, w, offset, b, mask, kernel_shape, strides, dilations, pads, group, offset_group):
    """ONNX's DeformConv written out loop by loop in float64: each tap sampled bilinearly (0 outside the image)."""
    n, c, h, wd = x.shape
    oc, kh, kw = w.shape[0], *kernel_shape
    oh, ow = offset.shape[2:]
    off = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
    msk = mask.reshape(n, offset_group, kh, kw, oh, ow)

    def sample(img, y, xx):
        y0, x0, total = np.floor(y), np.floor(xx), 0.0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xc, wx in ((x0, 1 - (xx - x0)), (x0 + 1, xx - x0)):
                if 0 <= yy <= h - 1 and 0 <= xc <= wd - 1:
                    total += img[int(yy), int(xc)] * wy * wx
        return total

    out = np.zeros((n, oc, oh, ow)) + b[None, :, None, None]
    per_group, per_offset = c // group, c // offset_group
    for bi, o, i, j in np.ndindex(n, oc, oh, ow):
        g = o // (oc // group)
        for ci in range(g * per_group, (g + 1) * per_group):
            q = ci // per_offset
            for a, e in np.ndindex(kh, kw):
                y = i * strides[0] - pads[0] + a * dilations[0] + off[bi, q, a, e, 0, i, j]
                xx = j * strides[1] - pads[1] + e * dilations[1] + off[bi, q, a, e, 1, i, j]
                out[bi, o, i, j] += w[o, ci - g * per_group, a, e] * msk[bi, q, a, e, i, j] * sample(x[bi, ci], y, xx)
    return out


@pytest.mark.parametrize("jit", [True, False])
def test_deform_conv_matches_the_float64_formula_and_differentiates(jit):
    """DeformConv with groups, offset groups, strides, dilations, asymmetric pads, a mask and a bias against its
    formula in float64 loop by loop (and ONNX's reference evaluator, within its float32 sampling), and its gradients
    in X, W, offset and mask against float64 central differences."""
    from tests.onnx.helpers import assert_gradients_match_central_differences

    rng = np.random.default_rng(5)
    n, c, oc, h, w, group, og = 2, 4, 6, 7, 6, 2, 2
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1], group=group,
                 offset_group=og)
    oh, ow = (h + 3 - 2 - 1) // 2 + 1, (w + 1 - 2 - 1) // 1 + 1
    feeds = {"x": rng.normal(size=(n, c, h, w)), "w": rng.normal(size=(oc, c // group, 3, 2)),
             "offset": 1.5 * rng.normal(size=(n, og * 6 * 2, oh, ow)), "b": rng.normal(size=oc),
             "mask": rng.uniform(size=(n, og * 6, oh, ow))}
    node = helper.make_node("DeformConv", list(feeds), ["y"], **attrs)
    model = helper.make_model(helper.make_graph([node], "g", [_info(k, np.float64, v.shape) for k, v in feeds.items()],
                                                [_info("y", np.float64, [n, oc, oh, ow])]),
                              opset_imports=[helper.make_opsetid("", 22)])
    want = _deform_conv_float64(**feeds, **attrs)
    # ONNX's reference evaluator samples through its GridSample, which rounds to float32 (3e-7 off the float64 formula)
    np.testing.assert_allclose(onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    with jax.enable_x64(True):
        np.testing.assert_allclose(optkit.onnx.prepare(model, jit=jit).run(feeds)[0], want, rtol=1e-12, atol=1e-12)
        if jit:
            apply_fn, _ = optkit.onnx.to_jax(model, trainable=())
            args = {k: jnp.asarray(v) for k, v in feeds.items()}
            assert_gradients_match_central_differences(lambda *v: apply_fn({}, *v), args, ["x", "w", "offset", "mask"])
