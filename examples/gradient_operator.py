"""The three figures of the ONNX Gradient operator, with real numbers (SPEC section 6).

The ONNX page for ``ai.onnx.preview.training::Gradient`` (Gradient-1; SPEC.md section 6) draws three
graphs. This script builds each as an ``optkit.Graph``, evaluates it with
``jax.jit`` and prints the gradients next to the same numbers worked out by hand
in NumPy:

1. ``X, W -> Conv -> H -> Gemm(., Z) -> Y`` with ``Gradient(xs=["W", "Z"], zs=["X"], y="Y")``;
2. the same graph with ``Gradient(xs=["H", "Z"], y="Y")``: the gradient at the
   intermediate tensor H, first at the forward value of H, then at a fed H_1;
3. ``W, X -> Gemm -> Y -> Loss(., L) -> O`` with a second Gradient node whose
   ``y`` is the first one's output ``dO/dW``: the second derivative.

Run: ``python examples/gradient_operator.py`` (CPU, a second or two).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import optkit

jax.config.update("jax_enable_x64", True)
np.set_printoptions(precision=4, suppress=True, linewidth=100)


def conv(x, w):
    """ONNX Conv, NCHW, stride 1, no padding, no bias."""
    return jax.lax.conv(x, w, (1, 1), "VALID")


def gemm(h, z):
    """ONNX Gemm after Flatten: (N, C*H*W) @ (C*H*W, K)."""
    return h.reshape(h.shape[0], -1) @ z


def show(name, value, expected):
    value = np.asarray(value)
    ok = np.allclose(value, expected, rtol=1e-12, atol=1e-12)
    print(f"{name} {value.shape} {'= by hand' if ok else '!= by hand'}:\n{value.squeeze()}")
    assert ok, (name, value, expected)


def figure_1_and_2():
    X = np.round(np.sin(np.arange(16.0)), 2).reshape(1, 1, 4, 4)
    W = np.array([[1.0, -1.0], [0.5, 2.0]]).reshape(1, 1, 2, 2)
    Z = np.linspace(-1.0, 2.0, 18).reshape(9, 2)
    H_1 = np.arange(9.0).reshape(1, 1, 3, 3)
    Z_1 = np.linspace(0.0, 0.85, 18).reshape(9, 2)

    g = optkit.Graph(inputs=["X", "W", "Z", "H_1", "Z_1"])
    g.add(conv, ["X", "W"], ["H"], name="Conv")
    g.add(gemm, ["H", "Z"], ["Y"], name="Gemm")
    g.add_gradient(xs=["W", "Z"], zs=["X"], y="Y", outputs=["dY/dW", "dY/dZ"])
    g.add_gradient(xs=["H", "Z"], y="Y", outputs=["dY/dH", "dY/dZ at H"])
    g.add_gradient(xs=["H", "Z"], y="Y", inputs=["H_1", "Z_1"],
                   outputs=["dY/dH at H_1", "dY/dZ at H_1"])
    names = ["H", "Y", "dY/dW", "dY/dZ", "dY/dH", "dY/dZ at H", "dY/dH at H_1", "dY/dZ at H_1"]
    out = dict(zip(names, jax.jit(g.as_function(g.inputs, names))(X, W, Z, H_1, Z_1),
                   strict=True))

    # By hand: H_ij = sum_ab X_{i+a,j+b} W_ab; Y = vec(H) Z; the gradient of sum(Y) (Y is
    # not a scalar, so ONNX's Gradient differentiates its sum) w.r.t. H is r = Z 1, w.r.t.
    # Z it is vec(H) 1^T, and w.r.t. W it is sum_ij r_ij X_{i+a,j+b}.
    H = np.array([[np.sum(X[0, 0, i:i + 2, j:j + 2] * W[0, 0]) for j in range(3)]
                  for i in range(3)])
    r = Z.sum(1).reshape(3, 3)
    print("Figure 1: X, W -> Conv -> H -> Gemm(., Z) -> Y;  Gradient(xs=[W, Z], zs=[X], y=Y)")
    show("H", out["H"], H)
    show("Y", out["Y"], H.reshape(1, 9) @ Z)
    show("dY/dW", out["dY/dW"], [[np.sum(r * X[0, 0, a:a + 3, b:b + 3]) for b in range(2)]
                                 for a in range(2)])
    show("dY/dZ", out["dY/dZ"], np.outer(H.reshape(9), np.ones(2)))
    print("\nFigure 2: the gradient at the intermediate H;  Gradient(xs=[H, Z], y=Y)")
    show("dY/dH", out["dY/dH"], r)
    show("dY/dZ", out["dY/dZ at H"], np.outer(H.reshape(9), np.ones(2)))
    print("... at fed values H_1, Z_1 instead of the forward H and Z (inputs=[H_1, Z_1])")
    show("dY/dH at H_1", out["dY/dH at H_1"], Z_1.sum(1).reshape(3, 3))
    show("dY/dZ at H_1", out["dY/dZ at H_1"], np.outer(H_1.reshape(9), np.ones(2)))


def figure_3():
    X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    W = np.array([[0.5], [-0.25]])
    L = np.array([[1.0], [0.0], [-1.0]])

    g = optkit.Graph(inputs=["X", "W", "L"])
    g.add(jnp.matmul, ["X", "W"], ["Y"], name="Gemm")
    g.add(lambda y, l: jnp.sum((y - l) ** 2), ["Y", "L"], ["O"], name="Loss")
    g.add_gradient(xs=["X", "W"], zs=["L"], y="O", outputs=["dO/dX", "dO/dW"])
    g.add_gradient(xs=["X", "W"], zs=["L"], y="dO/dW", outputs=["d(dO/dW)/dX", "d2O/dW2"])
    names = ["O", "dO/dX", "dO/dW", "d(dO/dW)/dX", "d2O/dW2"]
    out = dict(zip(names, jax.jit(g.as_function(g.inputs, names))(X, W, L), strict=True))

    # By hand, with R = X W - L: O = sum(R^2), dO/dX = 2 R W^T, dO/dW = 2 X^T R, and
    # differentiating sum(dO/dW): d/dW = 2 X^T X 1, d/dX = 2 (R 1 1^T + X 1 (W 1)^T).
    R = X @ W - L
    print("\nFigure 3: W, X -> Gemm -> Y -> Loss(., L) -> O;  O = sum((X W - L)^2)")
    print("Gradient(xs=[X, W], zs=[L], y=O), then Gradient(xs=[X, W], zs=[L], y=dO/dW)")
    show("O", out["O"], np.sum(R ** 2))
    show("dO/dX", out["dO/dX"], 2 * R @ W.T)
    show("dO/dW", out["dO/dW"], 2 * X.T @ R)
    show("d(dO/dW)/dX", out["d(dO/dW)/dX"],
         2 * (R @ np.ones((1, 2)) + X @ np.ones((2, 1)) @ W.T))
    show("d2O/dW2", out["d2O/dW2"], 2 * X.T @ X @ np.ones((2, 1)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="It prints each figure's gradients beside NumPy's by-hand numbers; "
                                            "it trains nothing, so it takes no --steps and draws no picture.")
    parser.parse_args(argv)
    figure_1_and_2()
    figure_3()


if __name__ == "__main__":
    main()
