"""If, Loop and Scan in optkit.onnx: how each runs traced (jit) and op by op, their bounds and refusals.

ONNX's own node cases (tests/onnx/onnx_backend_cases.txt) check the values op by op, and
tests/onnx/ops/test_gradients.py the gradients of If, Loop (a constant-true loop as ``lax.scan``, a loop
that stops on a computed condition as a masked scan) and Scan against finite differences. Here: a
condition computed while running (``lax.cond``, ``lax.while_loop``) under ``jax.jit``, a gradient
through a ``while_loop`` refused by name, a loop of 10**12 iterations refused, value-dependent scan
outputs run op by op and refused traced, and names read through two levels of sub-graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _if_model(else_shape=(2,)):
    """y = x * 2 if sum(x) > 0 else sin(x) (the condition computed from the input)."""
    then_b = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [_info("t", F, [2])])
    else_nodes = [helper.make_node("Sin", ["x"], ["e0"])]
    if else_shape != (2,):
        else_nodes.append(helper.make_node("Concat", ["e0", "e0"], ["e"], axis=0))
    else:
        else_nodes.append(helper.make_node("Identity", ["e0"], ["e"]))
    else_b = helper.make_graph(else_nodes, "else", [], [_info("e", F, list(else_shape))])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b, name="choose")]
    return _model(nodes, [_info("x", F, [2])], [_info("y", F, ["K"])],
                  [numpy_helper.from_array(np.float32(0), "zero")])


@pytest.mark.parametrize("jit", [True, False])
def test_if_with_a_computed_condition_runs_either_branch(jit):
    rep = optkit.onnx.prepare(_if_model(), jit=jit)
    np.testing.assert_allclose(rep.run([np.array([1.0, 2.0], np.float32)]).y, [2.0, 4.0])
    np.testing.assert_allclose(rep.run([np.array([-1.0, -2.0], np.float32)]).y, np.sin([-1.0, -2.0]), rtol=1e-6)


def test_if_gradient_goes_through_the_branch_taken():
    apply_fn, params = optkit.onnx.to_jax(_if_model())
    assert params == {}  # nothing to train: an inference function
    f = jax.jit(jax.grad(lambda x: jnp.sum(apply_fn(params, x))))
    np.testing.assert_allclose(f(jnp.array([1.0, 2.0], jnp.float32)), [2.0, 2.0])
    np.testing.assert_allclose(f(jnp.array([-1.0, -2.0], jnp.float32)), np.cos([-1.0, -2.0]), rtol=1e-6)


def test_if_branches_of_different_shapes_need_a_known_condition():
    apply_fn, params = optkit.onnx.to_jax(_if_model(else_shape=(4,)))
    with pytest.raises(ValueError, match=r"node 'choose' \(ai.onnx::If-16, opset 17\): its condition is computed"):
        jax.jit(apply_fn)(params, np.array([1.0, 2.0], np.float32))
    for jit in (False, True):  # op by op, and compiled around the If: ONNX's semantics
        rep = optkit.onnx.prepare(_if_model(else_shape=(4,)), jit=jit)
        assert rep.run([np.array([-1.0, -2.0], np.float32)]).y.shape == (4,)
        assert rep.run([np.array([1.0, 2.0], np.float32)]).y.shape == (2,)


WHILE = np.iinfo(np.int64).max  # the trip count torch.onnx writes for a while loop


def _halving_loop(trip=WHILE, scan_output=False):
    """v = v / 2 while sum(v) > 1 (torch.onnx's while-loop form: a huge trip count, a computed condition)."""
    body_nodes = [helper.make_node("Mul", ["v_in", "half"], ["v_out"]),
                  helper.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0),
                  helper.make_node("Greater", ["total", "one"], ["c_out"])]
    outputs = [_info("c_out", B, []), _info("v_out", F, [3])]
    if scan_output:
        body_nodes.append(helper.make_node("Identity", ["total"], ["seen"]))
        outputs.append(_info("seen", F, []))
    body = helper.make_graph(body_nodes, "body", [_info("i", I64, []), _info("c", B, []), _info("v_in", F, [3])],
                             outputs)
    loop = helper.make_node("Loop", ["M", "go", "v"], ["v_final", *(["trace"] if scan_output else [])],
                            body=body, name="halve")
    outs = [_info("v_final", F, [3]), *([_info("trace", F, ["K"])] if scan_output else [])]
    return _model([loop], [_info("v", F, [3])], outs,
                  [numpy_helper.from_array(np.int64(trip), "M"), numpy_helper.from_array(np.bool_(True), "go"),
                   numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.float32(1.0), "one")])


def _halved(v):
    v = np.asarray(v, np.float64)
    while True:
        v = v / 2
        if v.sum() <= 1:
            return v


@pytest.mark.parametrize("jit", [True, False])
def test_a_loop_with_a_computed_condition_runs_as_a_while_loop(jit):
    rep = optkit.onnx.prepare(_halving_loop(), jit=jit)
    for v in ([8.0, 4.0, 2.0], [0.1, 0.2, 0.3]):
        np.testing.assert_allclose(rep.run([np.array(v, np.float32)]).v_final, _halved(v), rtol=1e-6)


def test_a_gradient_through_a_while_loop_is_refused_naming_the_node():
    apply_fn, params = optkit.onnx.to_jax(_halving_loop())
    with pytest.raises(ValueError, match=r"node 'halve' \(ai.onnx::Loop-16, opset 17\): a gradient through "
                                         r"this Loop is not defined"):
        jax.grad(lambda v: jnp.sum(apply_fn(params, v)))(jnp.array([8.0, 4.0, 2.0], jnp.float32))


def test_a_small_known_trip_count_with_a_computed_condition_is_differentiable():
    apply_fn, params = optkit.onnx.to_jax(_halving_loop(trip=10))
    g = jax.jit(jax.grad(lambda v: jnp.sum(apply_fn(params, v))))(jnp.array([8.0, 4.0, 2.0], jnp.float32))
    halvings = int(np.log2(np.sum([8.0, 4.0, 2.0]) / np.sum(_halved([8.0, 4.0, 2.0]))) + 0.5)
    np.testing.assert_allclose(g, np.full(3, 0.5**halvings), rtol=1e-6)


def test_value_dependent_scan_outputs_run_compiled_around_the_loop_and_are_refused_traced():
    for jit in (False, True):  # op by op, and compiled around the Loop
        out = optkit.onnx.prepare(_halving_loop(scan_output=True), jit=jit).run([np.array([8.0, 4.0, 2.0], np.float32)])
        np.testing.assert_allclose(out.trace, [7.0, 3.5, 1.75, 0.875])
    apply_fn, params = optkit.onnx.to_jax(_halving_loop(scan_output=True))
    with pytest.raises(ValueError, match=r"node 'halve' .*scan outputs have a length that depends on values"):
        jax.jit(apply_fn)(params, np.array([8.0, 4.0, 2.0], np.float32))


def _counting_loop(trip):
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                             [_info("i", I64, []), _info("c", B, []), _info("v_in", F, [])],
                             [_info("c_out", B, []), _info("v_out", F, [])])
    return _model([helper.make_node("Loop", ["M", "", "v"], ["v_final"], body=body, name="count")],
                  [_info("v", F, [])], [_info("v_final", F, [])],
                  [numpy_helper.from_array(np.int64(trip), "M"), numpy_helper.from_array(np.float32(1), "one")])


def test_a_constant_true_loop_runs_as_a_scan_and_a_huge_one_is_refused():
    np.testing.assert_allclose(optkit.onnx.prepare(_counting_loop(1000)).run([np.float32(0)]).v_final, 1000.0)
    for jit in (True, False):
        with pytest.raises(ValueError, match=r"node 'count' .*(trip count of 1000000000000 is more|more than "
                                             r"10000000 iterations)"):
            optkit.onnx.prepare(_counting_loop(10**12), jit=jit).run([np.float32(0)])


def test_names_are_read_through_two_levels_of_sub_graphs():
    """A Loop whose body holds an If whose branch reads the model's input ``w`` and the body's ``v_in``."""
    then_b = helper.make_graph([helper.make_node("Mul", ["v_in", "w"], ["t"])], "then", [], [_info("t", F, [2])])
    else_b = helper.make_graph([helper.make_node("Add", ["v_in", "w"], ["e"])], "else", [], [_info("e", F, [2])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["v_out"], then_branch=then_b, else_branch=else_b)],
        "body", [_info("i", I64, []), _info("c", B, []), _info("v_in", F, [2])],
        [_info("c_out", B, []), _info("v_out", F, [2])],
        [numpy_helper.from_array(np.int64(2), "two"), numpy_helper.from_array(np.int64(0), "zero")])
    model = _model([helper.make_node("Loop", ["M", "", "v"], ["v_final"], body=body)],
                   [_info("v", F, [2]), _info("w", F, [2])], [_info("v_final", F, [2])],
                   [numpy_helper.from_array(np.int64(3), "M")])
    v, w = np.array([1.0, 2.0], np.float32), np.array([3.0, 0.5], np.float32)
    want = (v * w + w) * w  # i = 0: multiply, 1: add, 2: multiply
    for jit in (True, False):
        np.testing.assert_allclose(optkit.onnx.prepare(model, jit=jit).run({"v": v, "w": w}).v_final, want,
                                   rtol=1e-6)
    apply_fn, params = optkit.onnx.to_jax(model)
    dw = jax.grad(lambda w_: jnp.sum(apply_fn(params, v, w_)))(jnp.asarray(w))
    np.testing.assert_allclose(dw, 2 * v * w + w + w, rtol=1e-6)  # d/dw of v w^2 + w^2


def _nested_ifs(levels):
    """``levels`` If nodes, each the then-branch of the one above; every branch ends in Neg(x)."""
    leaf = helper.make_graph([helper.make_node("Neg", ["x"], ["y0"])], "leaf", [], [_info("y0", F, [2])])
    body = leaf
    for level in range(1, levels + 1):  # (the else-branch a leaf: the file grows linearly with the levels)
        else_b = helper.make_graph([helper.make_node("Neg", ["x"], [f"e{level}"])], "leaf", [],
                                   [_info(f"e{level}", F, [2])])
        node = helper.make_node("If", ["c"], [f"y{level}"], then_branch=body, else_branch=else_b, name=f"if{level}")
        body = helper.make_graph([node], f"level{level}", [], [_info(f"y{level}", F, [2])])
    graph = helper.make_graph(list(body.node), "g", [_info("x", F, [2]), _info("c", B, [])],
                              [_info(f"y{levels}", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sub_graphs_nested_deeper_than_the_bound_are_refused_without_recursion_errors():
    x = np.array([1.0, -2.0], np.float32)
    out = optkit.onnx.prepare(_nested_ifs(8)).run({"x": x, "c": np.array(True)})
    np.testing.assert_allclose(out[0], -x)
    with pytest.raises(ValueError, match=r"node 'if12' .*sub-graphs nest more than 8 deep"):
        optkit.onnx.prepare(_nested_ifs(20))  # (protobuf itself parses at most about 30)
    with pytest.raises(ValueError, match=r"sub-graphs nest more than 8 deep"):
        optkit.onnx.prepare(_nested_ifs(9))


def _merged_decoder():
    """The pattern of Optimum's merged decoders: ``If(use_cache_branch)`` whose branches give presents of different
    lengths (the past concatenated, or none), the condition a graph input."""
    from onnx import TensorProto, helper

    def branch(node, name):
        graph = helper.make_graph([node], name, [], [helper.make_tensor_value_info("present", TensorProto.FLOAT,
                                                                                     None)])
        graph.output[0].type.tensor_type.shape.SetInParent()
        return graph

    nodes = [helper.make_node("If", ["use_cache_branch"], ["present"],
                              then_branch=branch(helper.make_node("Concat", ["past", "x"], ["present"], axis=1),
                                                 "with_cache"),
                              else_branch=branch(helper.make_node("Identity", ["x"], ["present"]), "no_cache")),
             helper.make_node("ReduceSum", ["present"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "merged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                                helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "p"]),
                                                helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL,
                                                                              [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_if_on_a_fed_condition_with_branches_of_different_shapes_runs_in_to_jax_and_prepare():
    """A condition fed as a concrete value is chosen before running (one compile per value), so branches whose
    outputs differ in shape run under to_jax, jax.jit around it and prepare; fed a traced value, it stays a
    lax.cond, which needs equal shapes and says so."""
    x, past = np.ones((2, 3), np.float32), np.full((2, 4), 2, np.float32)
    model = _merged_decoder()
    apply_fn, params = optkit.onnx.to_jax(model)
    assert float(apply_fn(params, x, past, np.array([True]))) == 6 + 16
    assert float(apply_fn(params, x, past, np.array([False]))) == 6
    assert float(jax.jit(lambda a, b: apply_fn(params, a, b, np.array([True])))(x, past)) == 22
    assert float(optkit.onnx.prepare(model).run([x, past, np.array([False])])[0]) == 6
    with pytest.raises(ValueError, match="same shapes"):  # (a ValueDependentError)
        jax.jit(lambda c: apply_fn(params, x, past, c))(np.array([True]))
