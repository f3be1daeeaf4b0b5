"""ONNX's attention operators (optkit/onnx/_ops/attention.py) beyond ONNX's node cases: FlexAttention's
sub-graphs.
"""


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
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64



@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_flex_attention_with_a_score_mod_reading_the_outer_graph_is_the_formula_and_differentiates(jit):
    """``FlexAttention`` (``ai.onnx.preview`` 1): grouped-query heads, a ``score_mod`` adding a bias that the outer
    graph feeds (a captured value) and a ``prob_mod`` scaling, in float64: NumPy's formula, and ``jax.grad`` through
    ``to_jax`` equals central differences."""
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(1, 4, 3, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 5, 6))
    bias = rng.normal(size=(3, 5))
    f64 = TensorProto.DOUBLE
    score_mod = helper.make_graph([helper.make_node("Add", ["s", "bias"], ["t"])], "score_mod",
                                  [helper.make_tensor_value_info("s", f64, None)],
                                  [helper.make_tensor_value_info("t", f64, None)])
    prob_mod = helper.make_graph([helper.make_node("Mul", ["p", "half"], ["r"])], "prob_mod",
                                 [helper.make_tensor_value_info("p", f64, None)],
                                 [helper.make_tensor_value_info("r", f64, None)],
                                 [onnx.numpy_helper.from_array(np.array(0.5), "half")])
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", scale=0.3,
                            score_mod=score_mod, prob_mod=prob_mod)
    graph = helper.make_graph([node], "g", [_info(n, np.float64, a.shape) for n, a in
                                            (("Q", q), ("K", k), ("V", v), ("bias", bias))],
                              [_info("Y", np.float64, (1, 4, 3, 6))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26),
                                                    helper.make_opsetid("ai.onnx.preview", 1)])
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    scores = (q * np.sqrt(np.float32(0.3))) @ np.swapaxes(kk * np.sqrt(np.float32(0.3)), -1, -2) + bias
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want = 0.5 * e / e.sum(-1, keepdims=True) @ vv
    got = optkit.onnx.prepare(model, jit=jit).run([q, k, v, bias])[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    fn, params = optkit.onnx.to_jax(model)
    cot = rng.normal(size=want.shape)

    def loss(q, bias):
        return jnp.sum(fn(params, q, k, v, bias) * cot)

    grads = (jax.jit(jax.grad(loss, (0, 1))) if jit else jax.grad(loss, (0, 1)))(q, bias)
    for i, (arg, g) in enumerate(zip((q, bias), grads)):
        d = rng.normal(size=arg.shape) * 1e-6
        plus = [q, bias]
        minus = [q, bias]
        plus[i], minus[i] = arg + d, arg - d
        np.testing.assert_allclose(float(jnp.sum(g * d)), (float(loss(*plus)) - float(loss(*minus))) / 2,
                                   rtol=1e-6, atol=1e-12)
