"""ONNX Runtime's ``com.microsoft`` fused operators (optkit/onnx/_ops/contrib.py) against ONNX Runtime's CPU
kernels, every output and the attribute defaults; and their gradients against float64 central differences."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 3, 8)).astype(np.float32)
SKIP = RNG.normal(size=(2, 3, 8)).astype(np.float32)
GAMMA = RNG.normal(size=(8,)).astype(np.float32)
BETA = RNG.normal(size=(8,)).astype(np.float32)
BIAS = RNG.normal(size=(8,)).astype(np.float32)
CASES = {  # name: (op, inputs, attributes, outputs)
    "Gelu": ("Gelu", {"x": X}, {}, 1),
    "BiasGelu": ("BiasGelu", {"x": X, "bias": BIAS}, {}, 1),
    "FastGelu": ("FastGelu", {"x": X}, {}, 1),
    "FastGelu+bias": ("FastGelu", {"x": X, "bias": BIAS}, {}, 1),
    "QuickGelu": ("QuickGelu", {"x": X}, {}, 1),
    "QuickGelu alpha": ("QuickGelu", {"x": X}, {"alpha": 1.2}, 1),
    "SkipLayerNormalization": ("SkipLayerNormalization", {"x": X, "skip": SKIP, "gamma": GAMMA}, {}, 4),
    "SkipLayerNormalization beta bias eps": ("SkipLayerNormalization", {"x": X, "skip": SKIP, "gamma": GAMMA,
                                             "beta": BETA, "bias": BIAS}, {"epsilon": 1e-3}, 4),
    "SkipSimplifiedLayerNormalization": ("SkipSimplifiedLayerNormalization", {"x": X, "skip": SKIP, "gamma": GAMMA},
                                         {}, 4),
    "SkipSimplifiedLayerNormalization bias eps": ("SkipSimplifiedLayerNormalization", {
        "x": X, "skip": SKIP, "gamma": GAMMA, "bias": BIAS}, {"epsilon": 1e-2}, 4),
}
# ONNX Runtime's CPU SkipSimplifiedLayerNormalization leaves its mean output unwritten (it has none): not compared.
SKIP_OUTPUTS = {"SkipSimplifiedLayerNormalization": {1}}


def _model(op, inputs, attrs, outputs, elem=TensorProto.FLOAT):
    names = list(inputs)
    if op == "SkipLayerNormalization" and "bias" in inputs and "beta" not in inputs:
        names.insert(3, "")
    outs = ["y", "mean", "inv_std", "sum"][:outputs]
    node = helper.make_node(op, names, outs, domain="com.microsoft", **attrs)
    shapes = {"y": list(X.shape), "mean": [2, 3, 1], "inv_std": [2, 3, 1], "sum": list(X.shape)}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, elem, list(v.shape))
                                            for n, v in inputs.items()],
                              [helper.make_tensor_value_info(o, elem, shapes[o]) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_contrib_operator_gives_onnx_runtimes_outputs(name):
    op, inputs, attrs, outputs = CASES[name]
    model = _model(op, inputs, attrs, outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)
    got = optkit.onnx.prepare(model).run(inputs)
    skipped = SKIP_OUTPUTS.get(op, set())
    for k, (g, w) in enumerate(zip(got, want)):
        if k in skipped:
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (name, k)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"{name} output {k}")


@pytest.mark.parametrize("name", ["FastGelu+bias", "SkipLayerNormalization beta bias eps",
                                  "SkipSimplifiedLayerNormalization bias eps", "QuickGelu alpha"])
def test_gradients_match_float64_central_differences(name):
    op, inputs, attrs, outputs = CASES[name]
    model = _model(op, inputs, attrs, 1, TensorProto.DOUBLE)
    with jax.enable_x64(True):
        graph = optkit.onnx.to_graph(model)
        fn = graph.as_function(list(inputs), "y")
        args = [jnp.asarray(v, jnp.float64) for v in inputs.values()]
        weights = jnp.asarray(RNG.normal(size=X.shape))
        loss = lambda *a: jnp.sum(fn(*a) * weights)  # noqa: E731
        grads = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
        for i, g in enumerate(grads):
            d = jnp.asarray(RNG.normal(size=args[i].shape))
            h = 1e-6
            plus = [a + h * d if j == i else a for j, a in enumerate(args)]
            minus = [a - h * d if j == i else a for j, a in enumerate(args)]
            numeric = (loss(*plus) - loss(*minus)) / (2 * h)
            np.testing.assert_allclose(float(jnp.sum(g * d)), float(numeric), rtol=1e-6, err_msg=f"{name} input {i}")


@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-2, "axis": -1}, {"axis": 1}], ids=["defaults", "eps", "axis1"])
def test_simplified_layer_normalization_in_the_default_domain_as_onnx_runtime_runs_it(attrs):
    """ONNX Runtime registers SimplifiedLayerNormalization in the default domain (onnxruntime-genai's builder writes
    it there); onnx.checker knows no schema for it, and the loader checks the rest of the model around it."""
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y", "inv_std"], **attrs)
    scale = RNG.normal(size=X.shape[attrs.get("axis", -1):]).astype(np.float32)
    stats = [2, 3, 1] if attrs.get("axis", -1) == -1 else [2, 1, 1]
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape)),
                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, list(scale.shape))],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, list(X.shape)),
                               helper.make_tensor_value_info("inv_std", TensorProto.FLOAT, stats)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": X, "scale": scale})
    got = optkit.onnx.prepare(model).run([X, scale])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
    assert model.graph.node[0].domain == ""  # the caller's model is not changed by the check


def test_bias_add_is_its_documented_formula():
    """BiasAdd has no CPU kernel in ONNX Runtime (CUDA only): X + bias + skip, from its documentation."""
    node = helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
                                            for n, v in (("x", X), ("bias", BIAS), ("skip", SKIP))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(X.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])
    (got,) = optkit.onnx.prepare(model).run([X, BIAS, SKIP])
    np.testing.assert_array_equal(got, X + BIAS + SKIP)


def _int8_blocks(a, block):
    """NumPy: ``a`` quantized to int8 per row and per block of ``block`` along K (``round(a / s)``, halves to even,
    ``s = max|a| / 127``) and dequantized, as ONNX Runtime's CPU MatMulNBits computes at accuracy_level 4."""
    k = a.shape[-1]
    padded = np.pad(a, [(0, 0), (0, -k % block)]).reshape(a.shape[0], -1, block)
    s = (np.abs(padded).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inverse = np.where(s != 0, np.float32(1) / np.where(s != 0, s, 1), 0).astype(np.float32)
    q = np.clip(np.round(padded * inverse), -128, 127)
    return (q * s).reshape(a.shape[0], -1)[:, :k].astype(np.float64)


@pytest.mark.parametrize("bits, zero_points, bias, k, level", [
    (4, False, False, 64, 0), (4, True, True, 40, 0), (8, True, False, 32, 0), (8, False, True, 48, 0),
    (4, True, False, 64, 4), (4, False, True, 40, 4), (8, True, False, 48, 4)])
def test_matmul_nbits_gives_onnx_runtimes_output_and_a_gradient_for_a(bits, zero_points, bias, k, level):
    """MatMulNBits (4- and 8-bit blockwise weights, as MatMulNBitsQuantizer and onnxruntime-genai write): random
    packed weights, scales and zero points against ONNX Runtime's CPU kernel; K not a multiple of the block.
    At ``accuracy_level`` 4 (onnxruntime-genai's CPU files) the activations are quantized to int8 per block
    first, and the gradient is the float product's (straight-through)."""
    n, block = 24, 16
    blocks = -(-k // block)
    rng = np.random.default_rng(bits + k)
    b = rng.integers(0, 256, size=(n, blocks, block * bits // 8), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(n * blocks,)).astype(np.float32)
    inputs = ["a", "B", "scales"]
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    if zero_points:
        per_row = blocks if bits == 8 else -(-blocks // 2)
        inits.append(numpy_helper.from_array(rng.integers(0, 256, size=(n * per_row,), dtype=np.uint8), "zp"))
        inputs.append("zp")
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=(n,)).astype(np.float32), "bias"))
        inputs += ["", "bias"] if zero_points else ["", "", "bias"]
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])
    a = rng.normal(size=(3, k)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    (got,) = optkit.onnx.prepare(model).run([a])
    apply_fn, params = optkit.onnx.to_jax(model)
    assert "B" not in params  # packed integer weights are never parameters (the float scales and bias are)
    grad = jax.grad(lambda x: jnp.sum(apply_fn(params, x) ** 2))(jnp.asarray(a))
    # The weights dequantized in NumPy (the documented layout: low nibble first), checked against ONNX Runtime's
    # output, give the gradient: d sum(y^2) / d a = 2 y W.
    q = np.stack([b & 0x0F, b >> 4], -1).reshape(n, blocks, block) if bits == 4 else b.reshape(n, blocks, block)
    if zero_points:
        zp = numpy_helper.to_array(inits[2]).reshape(n, -1)
        zp = (np.stack([zp & 0x0F, zp >> 4], -1).reshape(n, -1) if bits == 4 else zp)[:, :blocks, None]
    else:
        zp = 2 ** (bits - 1)
    w = ((q.astype(np.float64) - zp) * scales.reshape(n, blocks, 1)).reshape(n, -1)[:, :k]
    used = _int8_blocks(a, block) if level == 4 else a.astype(np.float64)
    y = used @ w.T + (numpy_helper.to_array(inits[-1]) if bias else 0)
    assert level != 4 or np.abs(used - a).max() > 1e-3  # the int8 rounding is visible
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-5 * np.max(np.abs(y)))
    np.testing.assert_allclose(want, y, rtol=1e-5, atol=1e-5 * np.max(np.abs(y)))
    np.testing.assert_allclose(grad, 2 * y @ w, rtol=1e-4, atol=1e-4 * np.max(np.abs(grad)))


def test_simplified_layer_normalization_gradient_matches_float64_central_differences():
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], epsilon=1e-3)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(X.shape)),
                                            helper.make_tensor_value_info("scale", TensorProto.DOUBLE, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(X.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with jax.enable_x64(True):
        fn = optkit.onnx.to_graph(model).as_function(["x", "scale"], "y")
        args = [jnp.asarray(X, jnp.float64), jnp.asarray(GAMMA, jnp.float64)]
        weights = jnp.asarray(RNG.normal(size=X.shape))
        loss = lambda *a: jnp.sum(fn(*a) * weights)  # noqa: E731
        for i, g in enumerate(jax.grad(loss, argnums=(0, 1))(*args)):
            d = jnp.asarray(RNG.normal(size=args[i].shape))
            plus = [a + 1e-6 * d if j == i else a for j, a in enumerate(args)]
            minus = [a - 1e-6 * d if j == i else a for j, a in enumerate(args)]
            np.testing.assert_allclose(float(jnp.sum(g * d)), float((loss(*plus) - loss(*minus)) / 2e-6), rtol=1e-6)


def _gather_block_quantized(data, scales, zero_points, attrs, data_type=TensorProto.UINT8):
    inputs = ["data", "indices", "scales"] + (["zero_points"] if zero_points is not None else [])
    inits = [numpy_helper.from_array(scales, "scales")]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zero_points"))
    inits.append(numpy_helper.from_array(data, "data") if data_type == TensorProto.UINT8
                 else helper.make_tensor("data", data_type, data.shape, data.flatten().tolist()))
    node = helper.make_node("GatherBlockQuantized", inputs, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    graph.output[0].type.tensor_type.shape.SetInParent()
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("form", ["uint8 4-bit", "uint8 4-bit zero points", "uint8 8-bit", "int4",
                                  "int4 quantize_axis 0 gather_axis 1"])
def test_gather_block_quantized_gives_onnx_runtimes_rows_and_its_documented_dequantization(form):
    """GatherBlockQuantized (the 4-bit embedding tables of onnxruntime-genai's releases) against ONNX Runtime's
    CPU kernel and against the dequantization written out in NumPy (low nibble first; default zero point
    2^(bits-1) for uint8 tables, 0 for int4)."""
    rng = np.random.default_rng(7)
    rows, width, block = 6, 32, 16
    indices = np.array([[1, 4], [0, 5]], np.int64)
    scales = rng.uniform(0.1, 1.1, (rows, width // block)).astype(np.float32)
    spread = np.repeat(scales, block, axis=1)
    if form.startswith("uint8 4-bit"):
        q = rng.integers(0, 16, (rows, width)).astype(np.uint8)
        zero = rng.integers(0, 16, (rows, width // block)).astype(np.uint8) if "zero" in form else None
        packed_zero = None if zero is None else (zero[:, 0::2] | (zero[:, 1::2] << 4)).astype(np.uint8)
        model = _gather_block_quantized((q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), scales, packed_zero,
                                        {"block_size": block, "bits": 4})
        table = (q - np.asarray(8 if zero is None else np.repeat(zero, block, axis=1), np.float64)) * spread
    elif form == "uint8 8-bit":
        q = rng.integers(0, 256, (rows, width)).astype(np.uint8)
        model = _gather_block_quantized(q, scales, None, {"block_size": block, "bits": 8})
        table = (q - 128.0) * spread
    elif form == "int4":
        q = rng.integers(-8, 8, (rows, width)).astype(np.int8)
        model = _gather_block_quantized(q, scales, None, {"block_size": block}, TensorProto.INT4)
        table = q * spread.astype(np.float64)
    else:
        q = rng.integers(-8, 8, (width, rows)).astype(np.int8)
        scales = rng.uniform(0.1, 1.1, (width // block, rows)).astype(np.float32)
        model = _gather_block_quantized(q, scales, None, {"block_size": block, "quantize_axis": 0, "gather_axis": 1},
                                        TensorProto.INT4)
        table = (q * np.repeat(scales, block, axis=0).astype(np.float64)).T
    want = np.moveaxis(table[indices], -1, 0) if form.endswith("gather_axis 1") else table[indices]
    (ort_out,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"indices": indices})
    (got,) = optkit.onnx.prepare(model).run([indices])
    np.testing.assert_allclose(ort_out, want, rtol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)
