"""The ONNX Gradient operator (SPEC section 6): optkit.gradient and Gradient nodes.

Expectations are independent of the code under test: `jax.grad` written by
hand for first derivatives, and analytic derivatives computed in NumPy float64
for the seed's three figures, second and third derivatives and Hessian-vector
products.
"""

import doctest

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import optkit
from optkit._src import gradient as gradient_module
from tests.helpers import rng_arrays, sin_derivatives_graph, x64  # noqa: F401 (x64: float64 for every test here)

TRANSFORMS = [pytest.param(jax.jit, id="jit"), pytest.param(lambda f: f, id="nojit")]


# ------------------------------------------------------------ optkit.gradient


def mlp(W1, W2, X, L):
    H = jnp.tanh(X @ W1)
    Y = H @ W2
    return {"H": H, "Y": Y, "O": jnp.mean((Y - L) ** 2)}


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradient_matches_hand_written_jax_grad(transform):
    W1, W2, X, L = rng_arrays(0, (3, 4), (4, 2), (5, 3), (5, 2), dtype=np.float64)
    grad_fn = transform(optkit.gradient(mlp, xs=["W1", "W2"], zs=["X", "L"], y="O"))
    dW1, dW2 = grad_fn(W1, W2, X, L)
    expected = jax.grad(lambda a, b: mlp(a, b, X, L)["O"], argnums=(0, 1))(W1, W2)
    chex.assert_trees_all_close((dW1, dW2), expected, rtol=1e-12, atol=0)
    # xs order is the output order, whatever fun's parameter order.
    dW2b, dW1b = transform(optkit.gradient(mlp, ["W2", "W1"], ["L", "X"], "O"))(W2, W1, L, X)
    chex.assert_trees_all_close((dW1b, dW2b), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradient_of_non_scalar_y_is_gradient_of_its_sum(transform):
    W1, W2, X, L = rng_arrays(1, (3, 4), (4, 2), (5, 3), (5, 2), dtype=np.float64)
    (dH,) = transform(optkit.gradient(mlp, ["W1"], ["W2", "X", "L"], y="H"))(W1, W2, X, L)
    # d sum(tanh(X W1)) / dW1 = X^T (1 - tanh^2(X W1)), in NumPy.
    np.testing.assert_allclose(dH, X.T @ (1 - np.tanh(X @ W1) ** 2), rtol=1e-12)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradient_of_function_returning_y_itself_with_integer_zs(transform):
    def cross_entropy(logits, labels):
        logp = jax.nn.log_softmax(logits)
        return -jnp.sum(jnp.take_along_axis(logp, labels[:, None], axis=1))

    (logits,) = rng_arrays(2, (4, 3), dtype=np.float64)
    labels = np.array([0, 2, 1, 2], dtype=np.int32)
    (d,) = transform(optkit.gradient(cross_entropy, ["logits"], ["labels"]))(logits, labels)
    softmax = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(d, softmax - np.eye(3)[labels], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64])
def test_gradient_keeps_each_x_dtype(dtype):
    x = jnp.array([0.5, -1.0], dtype)
    (g,) = jax.jit(optkit.gradient(lambda x: x * x, ["x"]))(x)
    assert g.dtype == dtype
    np.testing.assert_allclose(np.asarray(g, np.float64), [1.0, -2.0])


def test_gradient_of_pytree_x():
    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(0.5)}
    (g,) = optkit.gradient(lambda p, x: jnp.sum(p["w"] * x + p["b"]), ["p"], ["x"])(
        params, jnp.array([3.0, 4.0]))
    chex.assert_trees_all_close(g, {"w": jnp.array([3.0, 4.0]), "b": jnp.array(2.0)})


def test_second_derivative_of_least_squares_is_2_XtX_1():
    # O = sum((X W - L)^2): dO/dW = 2 X^T (X W - L), d/dW sum(dO/dW) = 2 X^T X 1 1^T.
    X, W, L = rng_arrays(3, (5, 3), (3, 2), (5, 2), dtype=np.float64)

    def loss(X, W, L):
        return jnp.sum((X @ W - L) ** 2)

    dO = optkit.gradient(loss, ["X", "W"], ["L"])
    np.testing.assert_allclose(dO(X, W, L)[1], 2 * X.T @ (X @ W - L), rtol=1e-12)
    d2 = optkit.gradient(lambda X, W, L: dO(X, W, L)[1], ["X", "W"], ["L"])
    for transform in (jax.jit, lambda f: f):
        d_dX, d_dW = transform(d2)(X, W, L)
        R = X @ W - L
        np.testing.assert_allclose(d_dW, 2 * X.T @ X @ np.ones((3, 2)), rtol=1e-12)
        expected_dX = 2 * (R @ np.ones((2, 3)) + X @ np.ones((3, 2)) @ W.T)
        np.testing.assert_allclose(d_dX, expected_dX, rtol=1e-12)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_derivatives_of_sin_to_fourth_order(transform):
    x = jnp.linspace(-3.0, 3.0, 7)
    fns = [lambda x: jnp.sin(x)]
    for _ in range(4):
        fns.append(lambda x, f=fns[-1]: optkit.gradient(f, ["x"])(x)[0])
    expected = [np.sin, np.cos, lambda v: -np.sin(v), lambda v: -np.cos(v), np.sin]
    for order, (fn, exact) in enumerate(zip(fns, expected, strict=True)):
        np.testing.assert_allclose(transform(fn)(x), exact(np.asarray(x)), rtol=1e-12,
                                   atol=1e-15, err_msg=f"order {order}")


LOGISTIC_X = np.array([[1.0, 0.5, -1.0], [0.0, 2.0, 1.0], [-1.5, 1.0, 0.5], [0.3, -0.7, 2.0]])
logistic_grad = optkit.gradient(lambda w, X: jnp.sum(jnp.logaddexp(0.0, X @ w)), ["w"], ["X"])
# Forward over reverse, and reverse over reverse with v held fixed in zs; built once so
# that hypothesis's examples reuse one compiled program each.
hvp_forward = jax.jit(lambda w, X, v: jax.jvp(lambda w: logistic_grad(w, X)[0], (w,), (v,))[1])
hvp_reverse = jax.jit(optkit.gradient(lambda w, X, v: jnp.vdot(logistic_grad(w, X)[0], v),
                                      ["w"], ["X", "v"]))


@given(
    w=hnp.arrays(np.float64, 3, elements=st.floats(-2, 2)),
    v=hnp.arrays(np.float64, 3, elements=st.floats(-2, 2)),
)
def test_hessian_vector_product_of_logistic_loss(w, v):
    # O = sum(log(1 + exp(X w))): Hessian X^T diag(s (1 - s)) X with s = sigmoid(X w).
    X = LOGISTIC_X
    s = 1 / (1 + np.exp(-(X @ w)))
    expected = X.T @ ((s * (1 - s)) * (X @ v))
    with jax.enable_x64(True):
        np.testing.assert_allclose(hvp_forward(w, X, v), expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(hvp_reverse(w, X, v)[0], expected, rtol=1e-10, atol=1e-12)


def test_gradient_errors_name_the_tensor():
    def f(W, X):
        return {"Y": X @ W}

    with pytest.raises(ValueError, match="'W' is in both xs and zs"):
        optkit.gradient(f, ["W"], ["W", "X"], "Y")
    with pytest.raises(ValueError, match="xs names the tensor 'W' twice"):
        optkit.gradient(f, ["W", "W"], ["X"], "Y")
    with pytest.raises(ValueError, match="xs must name at least one tensor"):
        optkit.gradient(f, [], ["W", "X"], "Y")
    with pytest.raises(TypeError, match=r"write \['W'\]"):
        optkit.gradient(f, "W", ["X"], "Y")
    with pytest.raises(ValueError, match="'Q' .in zs. is not an input of fun"):
        optkit.gradient(f, ["W"], ["X", "Q"], "Y")
    with pytest.raises(ValueError, match="needs the input 'X', which is in neither xs nor zs"):
        optkit.gradient(f, ["W"], [], "Y")
    grad_fn = optkit.gradient(f, ["W"], ["X"], "Y")
    W, X = jnp.ones(2), jnp.ones((3, 2))
    with pytest.raises(ValueError, match=r"expected 2 values, one per tensor of xs \+ zs"):
        grad_fn(W)
    with pytest.raises(ValueError, match="xs tensor 'W'.*int32.*put integer and boolean"):
        grad_fn(jnp.ones(2, jnp.int32), X)
    with pytest.raises(ValueError, match="xs tensor 'W'.*bool"):
        grad_fn(jnp.ones(2, bool), X)
    with pytest.raises(ValueError, match="xs tensor 'W'.*complex"):
        grad_fn(jnp.ones(2, jnp.complex64), X)
    with pytest.raises(ValueError, match="y 'Z' is not computed by fun"):
        optkit.gradient(f, ["W"], ["X"], "Z")(W, X)
    with pytest.raises(ValueError, match="pass y=<name>"):
        optkit.gradient(f, ["W"], ["X"])(W, X)
    with pytest.raises(ValueError, match="fun returned y itself"):
        optkit.gradient(lambda W, X: X @ W, ["W"], ["X"], "Y")(W, X)
    with pytest.raises(ValueError, match="y tensor 'n'.*int32"):
        optkit.gradient(lambda W, X: {"n": jnp.int32(1) + 0 * X.shape[0]}, ["W"], ["X"],
                        "n")(W, X)


# ----------------------------------------------------- Gradient nodes: seed figures


def conv(x, w):
    return jax.lax.conv(x, w, (1, 1), "VALID")


def gemm(h, z):
    return h.reshape(h.shape[0], -1) @ z


def conv_gemm_graph():
    """The seed's first figure: X, W -> Conv -> H -> Gemm(., Z) -> Y."""
    g = optkit.Graph(inputs=["X", "W", "Z"])
    g.add(conv, ["X", "W"], ["H"], name="Conv")
    g.add(gemm, ["H", "Z"], ["Y"], name="Gemm")
    return g


def conv_gemm_values():
    X, W, Z = rng_arrays(4, (1, 1, 4, 4), (1, 1, 2, 2), (9, 2), dtype=np.float64)
    return X, W, Z


def numpy_conv(X, W):
    return np.array([[np.sum(X[0, 0, i:i + 2, j:j + 2] * W[0, 0]) for j in range(3)]
                     for i in range(3)])


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_seed_figure_1_gradients_of_conv_gemm_wrt_W_and_Z(transform):
    g = conv_gemm_graph()
    g.add_gradient(xs=["W", "Z"], zs=["X"], y="Y", outputs=["dY/dW", "dY/dZ"])
    X, W, Z = conv_gemm_values()
    f = transform(g.as_function(["X", "W", "Z"], ["Y", "dY/dW", "dY/dZ"]))
    Y, dW, dZ = f(X, W, Z)
    H = numpy_conv(X, W)
    np.testing.assert_allclose(Y, H.reshape(1, 9) @ Z, rtol=1e-12)
    # sum(Y) = sum_ij H_ij r_ij with r = Z 1 (row sums), H_ij = sum_ab X_{i+a,j+b} W_ab.
    r = Z.sum(1).reshape(3, 3)
    expected_dW = np.array([[np.sum(r * X[0, 0, a:a + 3, b:b + 3]) for b in range(2)]
                            for a in range(2)])
    np.testing.assert_allclose(dW, expected_dW.reshape(1, 1, 2, 2), rtol=1e-12)
    np.testing.assert_allclose(dZ, np.outer(H.reshape(9), np.ones(2)), rtol=1e-12)
    # And against jax.grad written by hand.
    hand = jax.grad(lambda W, Z: jnp.sum(gemm(conv(X, W), Z)), argnums=(0, 1))(W, Z)
    chex.assert_trees_all_close((dW, dZ), hand, rtol=1e-12)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_seed_figure_2_gradient_at_intermediate_H_and_at_fed_H_1(transform):
    g = conv_gemm_graph()
    g.add_input("H_1")
    g.add_input("Z_1")
    g.add_gradient(xs=["H", "Z"], y="Y", outputs=["dY/dH", "dY/dZ"])
    g.add_gradient(xs=["H", "Z"], y="Y", inputs=["H_1", "Z_1"],
                   outputs=["dY/dH at H_1", "dY/dZ at H_1"])
    X, W, Z = conv_gemm_values()
    H_1, Z_1 = rng_arrays(5, (1, 1, 3, 3), (9, 2), dtype=np.float64)
    f = transform(g.as_function(["X", "W", "Z", "H_1", "Z_1"],
                                ["dY/dH", "dY/dZ", "dY/dH at H_1", "dY/dZ at H_1"]))
    dH, dZ, dH_1, dZ_1 = f(X, W, Z, H_1, Z_1)
    H = numpy_conv(X, W)
    np.testing.assert_allclose(dH, Z.sum(1).reshape(1, 1, 3, 3), rtol=1e-12)
    np.testing.assert_allclose(dZ, np.outer(H.reshape(9), np.ones(2)), rtol=1e-12)
    np.testing.assert_allclose(dH_1, Z_1.sum(1).reshape(1, 1, 3, 3), rtol=1e-12)
    np.testing.assert_allclose(dZ_1, np.outer(H_1.reshape(9), np.ones(2)), rtol=1e-12)
    # The graph is cut at H: the gradient at H_1 needs neither X nor W.
    out = g.evaluate({"H_1": H_1, "Z_1": Z_1}, ["dY/dH at H_1", "dY/dZ at H_1"])
    chex.assert_trees_all_close(tuple(out.values()), (dH_1, dZ_1))


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradient_at_a_fed_point_of_a_nonlinear_sub_graph(transform):
    # With Y = tanh(Gemm(H, Z)), dY/dH depends on H: the fed H_1 must be the point used.
    g = optkit.Graph(inputs=["X", "W", "Z", "H_1"])
    g.add(conv, ["X", "W"], ["H"])
    g.add(lambda h, z: jnp.tanh(gemm(h, z)), ["H", "Z"], ["Y"])
    g.add_gradient(xs=["H"], zs=["Z"], y="Y", inputs=["H_1", "Z"], outputs=["dY/dH"])
    X, W, Z = conv_gemm_values()
    (H_1,) = rng_arrays(6, (1, 1, 3, 3), dtype=np.float64)
    dH = transform(g.as_function(["X", "W", "Z", "H_1"], "dY/dH"))(X, W, Z, H_1)
    s = 1 - np.tanh(H_1.reshape(1, 9) @ Z) ** 2
    np.testing.assert_allclose(dH, (s @ Z.T).reshape(1, 1, 3, 3), rtol=1e-12)


def least_squares_graph():
    """The seed's third figure: W, X -> Gemm -> Y -> Loss(., L) -> O, two Gradient nodes."""
    g = optkit.Graph(inputs=["X", "W", "L"])
    g.add(jnp.matmul, ["X", "W"], ["Y"], name="Gemm")
    g.add(lambda y, l: jnp.sum((y - l) ** 2), ["Y", "L"], ["O"], name="Loss")
    g.add_gradient(xs=["X", "W"], zs=["L"], y="O", outputs=["dO/dX", "dO/dW"])
    g.add_gradient(xs=["X", "W"], zs=["L"], y="dO/dW", outputs=["d(dO/dW)/dX", "d2O/dW2"])
    return g


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_seed_figure_3_second_derivative_through_nested_gradient_nodes(transform):
    g = least_squares_graph()
    X, W, L = rng_arrays(7, (5, 3), (3, 2), (5, 2), dtype=np.float64)
    names = ["O", "dO/dX", "dO/dW", "d(dO/dW)/dX", "d2O/dW2"]
    O, dX, dW, d2X, d2W = transform(g.as_function(["X", "W", "L"], names))(X, W, L)
    R = X @ W - L
    np.testing.assert_allclose(O, np.sum(R ** 2), rtol=1e-12)
    np.testing.assert_allclose(dX, 2 * R @ W.T, rtol=1e-12)
    np.testing.assert_allclose(dW, 2 * X.T @ R, rtol=1e-12)
    np.testing.assert_allclose(d2X, 2 * (R @ np.ones((2, 3)) + X @ np.ones((3, 2)) @ W.T),
                               rtol=1e-12)
    np.testing.assert_allclose(d2W, 2 * X.T @ X @ np.ones((3, 2)), rtol=1e-12)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_third_derivative_of_sin_by_three_nested_gradient_nodes(transform):
    x = np.linspace(-3.0, 3.0, 7)
    ds, d2s, d3s = transform(sin_derivatives_graph().as_function(["x"], ["d1", "d2", "d3"]))(x)
    np.testing.assert_allclose(ds, np.cos(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(d2s, -np.sin(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(d3s, -np.cos(x), rtol=1e-12, atol=1e-15)



@pytest.mark.parametrize("transform", TRANSFORMS)
def test_outer_gradient_re_traces_inner_gradient_fed_by_an_intermediate(transform):
    # Inner: dY/dH at H = Conv(X, W), Y = tanh(Gemm(H, Z)). Outer: d/dW of sum(dY/dH), so
    # the inner node's input H is a function of the outer node's W.
    g = optkit.Graph(inputs=["X", "W", "Z"])
    g.add(conv, ["X", "W"], ["H"])
    g.add(lambda h, z: jnp.tanh(gemm(h, z)), ["H", "Z"], ["Y"])
    g.add_gradient(xs=["H"], zs=["Z"], y="Y", outputs=["dY/dH"])
    g.add_gradient(xs=["W"], zs=["X", "Z"], y="dY/dH", outputs=["d(dY/dH)/dW"])
    X, W, Z = conv_gemm_values()
    got = transform(g.as_function(["X", "W", "Z"], "d(dY/dH)/dW"))(X, W, Z)

    def dY_dH(W):
        H = conv(X, W)
        return jax.grad(lambda h: jnp.sum(jnp.tanh(gemm(h, Z))))(H)

    expected = jax.grad(lambda W: jnp.sum(dY_dH(W)))(W)
    # jit and eager XLA may sum in different orders: agreement to ~1e-12 relative.
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-15)
    assert np.abs(expected).max() > 1e-4  # not trivially zero

@pytest.mark.parametrize("transform", TRANSFORMS)
def test_hessian_vector_product_with_gradient_nodes(transform):
    # H v of O = sum((X W - L)^2) w.r.t. W is 2 X^T X v.
    g = least_squares_graph()
    g.add_input("V")
    g.add(jnp.vdot, ["dO/dW", "V"], ["<dO/dW, V>"])
    g.add_gradient(xs=["W"], zs=["X", "L", "V"], y="<dO/dW, V>", outputs=["Hv"])
    X, W, L, V = rng_arrays(8, (5, 3), (3, 2), (5, 2), (3, 2), dtype=np.float64)
    Hv = transform(g.as_function(["X", "W", "L", "V"], "Hv"))(X, W, L, V)
    np.testing.assert_allclose(Hv, 2 * X.T @ X @ V, rtol=1e-12)


def test_gradient_node_outputs_named_empty_are_not_produced():
    g = least_squares_graph()
    g.add_gradient(xs=["X", "W"], zs=["L"], y="O", outputs=["", "only dW"])
    X, W, L = rng_arrays(9, (5, 3), (3, 2), (5, 2), dtype=np.float64)
    out = g.evaluate({"X": X, "W": W, "L": L}, ["only dW"])
    np.testing.assert_allclose(out["only dW"], 2 * X.T @ (X @ W - L), rtol=1e-12)
    assert "" not in g.outputs
    # An xs whose gradient is not produced is still a differentiable input (SPEC 6).
    with pytest.raises(ValueError, match="xs tensor 'X'.*int64"):
        g.evaluate({"X": X.astype(np.int64), "W": W, "L": L}, ["only dW"])
    with pytest.raises(ValueError, match="outputs must hold non-empty strings"):
        g.evaluate({"X": X, "W": W, "L": L}, [""])


def test_gradient_node_float16_and_float32_outputs_keep_dtypes():
    g = optkit.Graph(inputs=["a", "b"])
    g.add(jnp.multiply, ["a", "b"], ["c"])
    g.add_gradient(xs=["a", "b"], y="c")
    a, b = jnp.array([1.0, 2.0], jnp.float16), jnp.array([3.0, 4.0], jnp.float32)
    out = jax.jit(g.as_function(["a", "b"], ["dc/da", "dc/db"]))(a, b)
    assert [o.dtype for o in out] == [jnp.float16, jnp.float32]
    np.testing.assert_allclose(np.asarray(out[0], np.float32), [3.0, 4.0])
    np.testing.assert_allclose(out[1], [1.0, 2.0])


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_onnx_test_cases_gradient_of_add_and_of_add_and_mul(transform):
    # onnx/backend/test/case/model/gradient.py: the expected values are ONNX's own.
    g = optkit.Graph(inputs={"a": ((), "float32"), "b": ((), "float32")})
    g.add(jnp.add, ["a", "b"], ["c"], name="my_add")
    g.add(jnp.multiply, ["c", "a"], ["d"], name="my_mul")
    g.add_gradient(xs=["a", "b"], y="c", outputs=["dc_da", "dc_db"])
    g.add_gradient(xs=["a", "b"], y="d", outputs=["dd_da", "dd_db"])
    a, b = np.float32(1.0), np.float32(2.0)
    out = transform(g.as_function(["a", "b"], ["c", "dc_da", "dc_db", "d", "dd_da", "dd_db"]))(
        np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(out, [3.0, 1.0, 1.0, 3.0, 2 * a + b, a])
    assert all(o.dtype == np.float32 for o in out)


# ---------------------------------------------------------- Gradient node errors


def test_gradient_node_errors_name_the_tensor():
    def fresh():
        return conv_gemm_graph()

    X, W, Z = conv_gemm_values()
    feeds = {"X": X, "W": W, "Z": Z}
    cases = [
        (dict(xs=["W"], zs=["X", "Z"], y="Q"), "y 'Q' is never computed by the graph"),
        (dict(xs=["W", "K"], zs=["X", "Z"], y="Y"), "'K' in xs is not a graph input"),
        (dict(xs=["W"], zs=["X", "Z", "K"], y="Y"), "'K' in zs is not a graph input"),
        (dict(xs=["H", "W"], zs=["X", "Z"], y="Y"),
         r"'H' \(in xs\) is computed from '(W|X)' \(in (xs|zs)\)"),
        (dict(xs=["H", "Z"], zs=["X"], y="Y"), r"'H' \(in xs\) is computed from 'X' \(in zs\)"),
        (dict(xs=["W", "Z"], y="Y"), "depends on the graph input 'X'.*add 'X' to zs"),
    ]
    for kwargs, message in cases:
        g = fresh()
        g.add_gradient(**kwargs)
        with pytest.raises(ValueError, match=message):
            g.validate()
        with pytest.raises(ValueError, match=message):
            g.evaluate(feeds)
    g = fresh()
    with pytest.raises(ValueError, match="'W' is in both xs and zs"):
        g.add_gradient(xs=["W"], zs=["W", "X"], y="Y")
    with pytest.raises(ValueError, match=r"needs 3 inputs, got 2: \['W', 'Z'\]"):
        g.add_gradient(xs=["W", "Z"], zs=["X"], y="Y", inputs=["W", "Z"])
    with pytest.raises(ValueError, match="one output per tensor of xs"):
        g.add_gradient(xs=["W", "Z"], zs=["X"], y="Y", outputs=["dW"])
    with pytest.raises(ValueError, match="y .the name of the tensor to differentiate. is required"):
        g.add_gradient(xs=["W"], zs=["X", "Z"], y=None)
    g.add_gradient(xs=["W", "Z"], zs=["X"], y="Y")
    with pytest.raises(ValueError, match="xs tensor 'W'.*int32"):
        g.evaluate({"X": X, "W": W.astype(np.int32), "Z": Z}, ["dY/dZ"])
    with pytest.raises(ValueError, match="xs tensor 'Z'.*bool"):
        jax.jit(g.as_function(["X", "W", "Z"], ["dY/dW"]))(X, W, Z > 0)


def test_two_outputs_of_one_node_are_independent_of_each_other():
    # a and b come from the same node, but neither is computed from the other.
    g = optkit.Graph(inputs=["x"])
    g.add(lambda x: (jnp.sin(x), jnp.cos(x)), ["x"], ["a", "b"], name="split")
    g.add(jnp.multiply, ["a", "b"], ["y"])
    g.add_gradient(xs=["a", "b"], y="y")
    out = g.evaluate({"x": 0.5}, ["dy/da", "dy/db"])
    np.testing.assert_allclose([out["dy/da"], out["dy/db"]], [np.cos(0.5), np.sin(0.5)])


def test_gradient_node_differentiating_through_itself_is_a_cycle():
    g = optkit.Graph(inputs=["x"])
    g.add(jnp.sin, ["x"], ["s"])
    g.add(jnp.add, ["s", "g"], ["y"])
    g.add_gradient(xs=["x"], y="y", outputs=["g"], name="G")
    with pytest.raises(ValueError, match="cycle: Gradient node 'G' differentiates through its "
                                         "own output"):
        g.validate()


def test_docstring_examples():
    with jax.enable_x64(False):
        assert doctest.testmod(gradient_module).failed == 0
