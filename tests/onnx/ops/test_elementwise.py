"""Element-wise operators computed as ONNX Runtime's CPU kernels compute them (bit for bit where the kernel is exact
arithmetic): Pow with one exponent of 2 or 3 is ``x * x`` and ``x * x * x`` there, not ``pow``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import node_model  # noqa: E402

# float64 as ONNX runs it: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -2.0])
def test_pow_with_one_exponent_equals_onnx_runtime(exponent, dtype):
    x = np.concatenate([RNG.normal(size=40) * 10.0 ** RNG.integers(-8, 8, 40), [0.0, -0.0, 1e30, -3e-30, np.inf,
                                                                                   -np.inf, np.nan]]).astype(dtype)
    if exponent == 2.5:
        x = np.abs(x)
    # the exponent as torch.onnx's dynamo exporter writes it: a scalar initializer (a constant, not a parameter)
    model = node_model("Pow", {"x": x}, initializers=[("y", np.array(exponent, dtype))], opset=15)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    apply_fn, params = optkit.onnx.to_jax(model)
    assert "y" not in params
    for got in (apply_fn(params, x), jax.jit(apply_fn)(params, x)):
        assert got.shape == want.shape and got.dtype == want.dtype
        if exponent in (2.0, 3.0):  # the kernel's multiplications: exactly
            np.testing.assert_array_equal(got, want)
        else:  # std::pow against XLA's pow
            np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps)


@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_pow_by_two_or_three_differentiates_as_products(exponent):
    """d/dx x^2 = 2x and d/dx x^3 = 3x^2, with no pow (and its special cases at 0) in the program."""
    x = np.array([-1.5, 0.0, 2.0, 3.0], np.float32)
    derivative = 2 * x if exponent == 2.0 else 3 * x * x
    model = node_model("Pow", {"x": x}, initializers=[("y", np.array(exponent, np.float32))], opset=15)
    apply_fn, params = optkit.onnx.to_jax(model)
    grad = jax.grad(lambda v: jnp.sum(apply_fn(params, v)))
    np.testing.assert_allclose(grad(jnp.asarray(x)), derivative, rtol=1e-6)
    assert "pow" not in str(jax.make_jaxpr(grad)(jnp.asarray(x)))
