"""optkit.Graph: named-tensor nodes evaluated in JAX (SPEC section 6).

Gradient-node semantics (the seed's figures, higher orders) are in
test_gradient.py; this file covers building, evaluating and validating
graphs, and that a graph compiles to the same XLA program as the function
written by hand.
"""

import collections
import doctest
import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optkit
from optkit._src import graph as graph_module
from tests.helpers import mlp_graph, rng_arrays

TRANSFORMS = [pytest.param(jax.jit, id="jit"), pytest.param(lambda f: f, id="nojit")]


def mlp_loss(W1, b1, W2, b2, X, L):
    H = jnp.tanh(X @ W1 + b1)
    Y = H @ W2 + b2
    return jnp.mean((Y - L) ** 2)


def mlp_values(seed=0):
    return rng_arrays(seed, (3, 8), (8,), (8, 2), (2,), (16, 3), (16, 2))


GRADS = ["dO/dW1", "dO/db1", "dO/dW2", "dO/db2"]


def op_counts(hlo_text):
    """How many instructions of each opcode an optimized HLO module has."""
    counts = collections.Counter()
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+ = \S+(?:\{[^}]*\})? ([\w\-]+)\(", line)
        if match:
            counts[match.group(1)] += 1
    return counts


# ---------------------------------------------------------------- evaluation


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_forward_evaluation_equals_hand_written_function(transform):
    g = mlp_graph()
    values = mlp_values()
    O = transform(g.as_function(g.inputs, "O"))(*values)
    np.testing.assert_allclose(O, mlp_loss(*values), rtol=1e-6)
    out = g.evaluate(dict(zip(g.inputs, values, strict=True)), ["Y", "O"])
    assert list(out) == ["Y", "O"]
    np.testing.assert_allclose(out["O"], O, rtol=1e-6)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradient_of_mlp_equals_jax_grad(transform):
    g = mlp_graph()
    values = mlp_values(1)
    grads = transform(g.as_function(g.inputs, GRADS))(*values)
    expected = jax.grad(mlp_loss, argnums=(0, 1, 2, 3))(*values)
    chex.assert_trees_all_close(grads, expected, rtol=1e-6, atol=1e-7)


def test_jitted_graph_is_the_same_program_as_the_hand_written_function():
    g = mlp_graph()
    values = mlp_values()
    cases = [
        (g.as_function(g.inputs, "O"), mlp_loss),
        (g.as_function(g.inputs, GRADS), jax.grad(mlp_loss, argnums=(0, 1, 2, 3))),
        (g.as_function(g.inputs, ["O", *GRADS]),
         lambda *v: (lambda o, gs: (o, *gs))(*jax.value_and_grad(mlp_loss, (0, 1, 2, 3))(*v))),
    ]
    for graph_fn, hand_fn in cases[:2]:
        # Same primitives in the same order ...
        assert str(jax.make_jaxpr(graph_fn)(*values)) == str(jax.make_jaxpr(hand_fn)(*values))
    for graph_fn, hand_fn in cases:
        # ... and the same optimized XLA program, instruction for instruction (no extra
        # copies); with the loss also requested, XLA merges the forward pass the Gradient
        # node re-traces with the one that computes O.
        graph_hlo = jax.jit(graph_fn).lower(*values).compile().as_text()
        hand_hlo = jax.jit(hand_fn).lower(*values).compile().as_text()
        assert op_counts(graph_hlo) == op_counts(hand_hlo)
        assert op_counts(graph_hlo)["dot"] + op_counts(graph_hlo)["fusion"] > 0


def test_nodes_may_be_added_in_any_order_and_only_needed_nodes_run():
    calls = []

    def traced(name, fn):
        def wrapper(*args):
            calls.append(name)
            return fn(*args)
        return wrapper

    g = optkit.Graph(inputs=["a"])
    g.add(traced("c", lambda b: b * 3.0), ["b"], ["c"], name="c")
    g.add(traced("b", lambda a: a + 1.0), ["a"], ["b"], name="b")
    g.add(traced("unused", lambda a: a - 1.0), ["a"], ["unused"], name="unused")
    assert g.evaluate({"a": 1.0}, "c") == 6.0
    assert calls == ["b", "c"]
    assert g.outputs == ("c", "unused")


def test_multiple_outputs_keywords_absent_inputs_and_unproduced_outputs():
    def split(x, scale=None):
        s = 1.0 if scale is None else scale
        return x * s, x + s, x - s

    g = optkit.Graph(inputs=["x", "s"])
    g.add(split, ["x", ""], ["p", "", "m"], name="split_tuple")
    g.add(split, {"x": "x", "scale": "s"}, ["p2", "q2", "m2"], name="split_keywords")
    g.add(lambda x: {"hi": x + 10.0, "lo": x - 10.0}, ["x"], ["hi", "lo"], name="mapping")
    out = g.evaluate({"x": 2.0, "s": 3.0}, ["p", "m", "p2", "q2", "m2", "hi", "lo"])
    assert out == {"p": 2.0, "m": 1.0, "p2": 6.0, "q2": 5.0, "m2": -1.0, "hi": 12.0, "lo": -8.0}
    with pytest.raises(ValueError, match="outputs must hold non-empty strings"):
        g.evaluate({"x": 2.0}, [""])


def test_initializers_are_constants_that_a_feed_may_override():
    g = optkit.Graph(inputs=["x", "w"], initializers={"w": 2.0, "b": 1.0})
    g.add(lambda x, w, b: x * w + b, ["x", "w", "b"], ["y"])
    g.add_gradient(xs=["x"], y="y", outputs=["dy/dx"])
    assert g.evaluate({"x": 3.0}, ["y", "dy/dx"]) == {"y": 7.0, "dy/dx": 2.0}
    assert g.evaluate({"x": 3.0, "w": 5.0}, ["y", "dy/dx"]) == {"y": 16.0, "dy/dx": 5.0}
    # An initializer (here a constant b) may be differentiated, as ONNX training weights are.
    g.add_gradient(xs=["b"], zs=["x"], y="y", outputs=["dy/db"])
    assert g.evaluate({"x": 3.0}, "dy/db") == 1.0
    assert dict(g.initializers) == {"w": 2.0, "b": 1.0}


def test_as_function_defaults_and_declared_outputs():
    g = optkit.Graph(inputs=["x"], outputs=["y", "z"])
    g.add(jnp.sin, ["x"], ["y"])
    g.add(jnp.cos, ["x"], ["z"])
    y, z = jax.jit(g.as_function())(jnp.float32(0.5))
    np.testing.assert_allclose([y, z], [np.sin(0.5), np.cos(0.5)], rtol=1e-6)
    with pytest.raises(ValueError, match=r"expected 1 values, one per input \['x'\], got 2"):
        g.as_function()(1.0, 2.0)


def test_flax_module_apply_is_a_node_and_its_params_a_differentiable_tensor():
    nn = pytest.importorskip("flax.linen")  # the examples extra
    model = nn.Sequential([nn.Dense(4), nn.tanh, nn.Dense(1)])
    X, L = rng_arrays(2, (6, 3), (6, 1))
    variables = model.init(jax.random.key(0), X)
    g = optkit.Graph(inputs=["variables", "X", "L"])
    g.add(model.apply, ["variables", "X"], ["Y"], name="mlp")
    g.add(lambda y, l: jnp.mean((y - l) ** 2), ["Y", "L"], ["O"])
    g.add_gradient(xs=["variables"], zs=["X", "L"], y="O", outputs=["dO/dvariables"])
    grads = jax.jit(g.as_function(["variables", "X", "L"], "dO/dvariables"))(variables, X, L)
    expected = jax.grad(lambda v: jnp.mean((model.apply(v, X) - L) ** 2))(variables)
    chex.assert_trees_all_close(grads, expected, rtol=1e-6, atol=1e-7)


def test_deep_graph_validates_without_recursion():
    g = optkit.Graph(inputs=["t0"])
    for i in range(3000):
        g.add(jnp.negative, [f"t{i}"], [f"t{i + 1}"])
    g.validate()
    assert len(g.nodes) == 3000


# ---------------------------------------------------------------- validation


def test_duplicate_and_conflicting_names():
    g = optkit.Graph(inputs=["x"])
    g.add(jnp.sin, ["x"], ["y"], name="first")
    with pytest.raises(ValueError, match="tensor 'y' .*already the output of node 'first'"):
        g.add(jnp.cos, ["x"], ["y"])
    with pytest.raises(ValueError, match="tensor 'x' .*already a graph input"):
        g.add(jnp.cos, ["y"], ["x"])
    with pytest.raises(ValueError, match="names the output 'z' twice"):
        g.add(lambda v: (v, v), ["x"], ["z", "z"])
    with pytest.raises(ValueError, match="tensor 'x' .graph input. is already a graph input"):
        g.add_input("x")
    with pytest.raises(ValueError, match="'y' .initializer. is already the output of node"):
        g.add_initializer("y", 1.0)
    g.add_initializer("k", 1.0)
    g.add_input("k")  # an input with a default value, in either order (ONNX IR)
    with pytest.raises(ValueError, match="tensor 'k' .initializer. is already an initializer"):
        g.add_initializer("k", 2.0)
    with pytest.raises(ValueError, match="initializer name must be a non-empty string"):
        g.add_initializer("", 2.0)
    with pytest.raises(ValueError, match="inputs names the tensor 'a' twice"):
        optkit.Graph(inputs=["a", "a"])
    with pytest.raises(TypeError, match="fn must be callable"):
        g.add("sin", ["x"], ["w"])
    with pytest.raises(TypeError, match=r"write \['x'\]"):
        g.add(jnp.sin, "x", ["w"])


def test_undefined_tensors_and_missing_or_unknown_feeds():
    g = optkit.Graph(inputs=["x"])
    g.add(jnp.add, ["x", "ghost"], ["y"], name="add")
    with pytest.raises(ValueError, match="node 'add' reads the tensor 'ghost', which is not"):
        g.validate()
    g = optkit.Graph(inputs=["x", "w"], outputs=["nowhere"])
    with pytest.raises(ValueError, match="graph output 'nowhere' is not"):
        g.validate()
    g = optkit.Graph(inputs=["x", "w"])
    g.add(jnp.multiply, ["x", "w"], ["y"], name="mul")
    with pytest.raises(ValueError, match="graph input 'w' is needed .* but was not fed"):
        g.evaluate({"x": 1.0}, "y")
    with pytest.raises(ValueError, match="feed 'q' is not a graph input"):
        g.evaluate({"x": 1.0, "w": 1.0, "q": 1.0}, "y")
    with pytest.raises(ValueError, match="feed 'y' is the output of node 'mul'"):
        g.evaluate({"x": 1.0, "w": 1.0, "y": 1.0}, "y")
    with pytest.raises(ValueError, match="output 'z' is not a graph input"):
        g.evaluate({"x": 1.0, "w": 1.0}, ["z"])
    with pytest.raises(ValueError, match="feed 'y' is the output of node 'mul'"):
        g.as_function(["x", "y"], "y")


def test_declared_input_shapes_and_dtypes_are_checked():
    g = optkit.Graph(inputs={"x": ((None, 3), "float32"),
                             "w": jax.ShapeDtypeStruct((3,), jnp.float32)})
    g.add(jnp.matmul, ["x", "w"], ["y"])
    assert g.evaluate({"x": np.ones((5, 3), np.float32), "w": np.ones(3, np.float32)},
                      "y").shape == (5,)
    with pytest.raises(ValueError, match=r"graph input 'x' is declared with shape \(\?, 3\), "
                                         r"fed shape \(5, 4\)"):
        g.evaluate({"x": np.ones((5, 4), np.float32), "w": np.ones(3, np.float32)}, "y")
    with pytest.raises(ValueError, match="graph input 'w' is declared float32, fed int32"):
        g.evaluate({"x": np.ones((5, 3), np.float32), "w": np.ones(3, np.int32)}, "y")


def test_cycles_are_reported_with_their_nodes():
    g = optkit.Graph(inputs=["x"])
    g.add(jnp.add, ["x", "c"], ["a"], name="A")
    g.add(jnp.sin, ["a"], ["b"], name="B")
    g.add(jnp.cos, ["b"], ["c"], name="C")
    with pytest.raises(ValueError, match="the graph has a cycle through tensor '(a|b|c)': "
                                         "nodes '.' -> '.' -> '.' -> '.'"):
        g.validate()
    g = optkit.Graph()
    g.add(jnp.sin, ["s"], ["s2"], name="self")
    g.add(jnp.sin, ["s2"], ["s"], name="other")
    with pytest.raises(ValueError, match="cycle"):
        g.evaluate({}, "s")


def test_the_analysis_is_recomputed_when_the_graph_changes():
    g = optkit.Graph(inputs=["x"])
    g.add(jnp.sin, ["x"], ["y"])
    g.validate()
    g.add(jnp.cos, ["missing"], ["z"], name="late")
    with pytest.raises(ValueError, match="node 'late' reads the tensor 'missing'"):
        g.validate()


def test_node_returning_the_wrong_number_of_outputs():
    g = optkit.Graph(inputs=["x"])
    g.add(lambda x: (x, x, x), ["x"], ["a", "b"], name="three")
    g.add(lambda x: {"a2": x}, ["x"], ["a2", "b2"], name="partial")
    with pytest.raises(ValueError, match="node 'three' has 2 outputs .* returned 3 values"):
        g.evaluate({"x": 1.0}, "a")
    with pytest.raises(ValueError, match="node 'partial' returned the tensors .* without its "
                                         "output 'b2'"):
        g.evaluate({"x": 1.0}, "a2")


def test_repr_and_introspection():
    g = optkit.Graph(inputs=["x"])
    node = g.add(functools.partial(jnp.add, 1.0), ["x"], ["y"], name="inc")
    assert repr(node) == "GraphNode(inputs=('x',), outputs=('y',), name='inc')"
    assert g.nodes == (node,)
    assert repr(g) == "Graph(inputs=['x'], initializers=[], nodes=['inc'], outputs=['y'])"


def test_docstring_examples():
    assert doctest.testmod(graph_module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
