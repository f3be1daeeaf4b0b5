"""A float16 language model as users export it (a GPT-NeoX from a transformers config, ``model.half()``, torch.onnx's
dynamo exporter; ``tests/onnx/models/make_fp16.py``), against ONNX Runtime's float16 output and torch's float64
logits of the same weights; and small graphs for each rule of ONNX Runtime's float16 plan (optkit.onnx._plans.float16).

ONNX Runtime's CPU provider has no float16 kernel for most operators (Add, Mul, MatMul, Pow, Softmax...): it runs
them in float32 between inserted Casts, moves a float16 node that sits between such nodes to float32 too, and removes
the Cast pairs between neighbours, so chains keep float32 between nodes. optkit follows that plan. The comparisons are
with an ONNX Runtime session whose graph optimizations are off (``ORT_DISABLE_ALL``): the plan is applied at every
level, but its default level first fuses MatMul and Add into a Gemm between Reshapes, which have float16 kernels and
so round the Gemm's result to float16 (ONNX Runtime's default output is farther from float64 for it: 3.9e-3 against
3.7e-3 here).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper, shape_inference  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

FOLDER = ONNX_TESTS / "models" / "fp16"
NAME = "torch_dynamo_gpt_neox_fp16"
RECORD = json.loads((FOLDER / "versions.json").read_text())["models"][NAME]
ARITHMETIC = {"Add", "Mul", "MatMul", "Pow", "Tanh", "Softmax", "LayerNormalization", "Where", "IsNaN"}


def _data():
    return onnx.load(str(FOLDER / f"{NAME}.onnx")), np.load(FOLDER / f"{NAME}.npz")


def _ort(model, feeds, optimized=False):
    options = onnxruntime.SessionOptions()
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _within_one_step(got, want, share):
    """Equal to ONNX Runtime's float16 values but for float32 rounding: different in at most ``share`` of the
    elements, by a float16 step or two (4 x 2^-10 relative, for a step that an intermediate float16 rounding took
    the other way; near zero, 2^-12 of the largest value, where a float32 rounding of a sum shows as several steps of
    a small value). Rounding each node to float16 puts the model's logits up to 7e-3 from these."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == np.float16 and got.shape == want.shape
    wide = want.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), wide, rtol=2.0 ** -8, atol=2.0 ** -12 * np.abs(wide).max())
    assert (got != want).mean() <= share, (got != want).mean()


@pytest.mark.parametrize("how", ["prepare", "prepare(jit=False)", "to_jax", "to_jax(scan_layers=False)"])
def test_the_float16_model_computes_as_onnx_runtime_plans_it(how):
    """Within one float16 step of ONNX Runtime (optimizations off) in at most 5% of the logits (measured: 1.0% for
    prepare, 4.2-4.5% otherwise: float32 rounding in other orders), and nearer float64 than ONNX Runtime's default
    session (3.67e-3 against 3.90e-3; each node rounded to float16, as before, gave 8.4e-3)."""
    import jax

    model, data = _data()
    if how.startswith("prepare"):
        (got,) = optkit.onnx.prepare(model, jit=how == "prepare").run([data["input_ids"]])
    else:
        apply_fn, params = optkit.onnx.to_jax(model, scan_layers=how == "to_jax")
        got = np.asarray(jax.jit(apply_fn)(params, data["input_ids"]))
    (want,) = _ort(model, {"input_ids": data["input_ids"]})
    _within_one_step(got, want, 0.05)
    truth = data["float64"]
    theirs = np.abs(data["output"].astype(np.float64) - truth).max()
    assert theirs == pytest.approx(RECORD["ort_error_vs_float64"])
    assert np.abs(got.astype(np.float64) - truth).max() <= 0.95 * theirs


def _graph(nodes, inputs, outputs, initializers=()):
    f16 = onnx.TensorProto.FLOAT16
    info = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    out = [helper.make_tensor_value_info(n, f16 if t is None else t, []) for n, t in outputs]
    graph = helper.make_graph(nodes, "rules", info, out, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


_F16 = onnx.TensorProto.FLOAT16
_F32 = onnx.TensorProto.FLOAT
_RULES = {  # name: (nodes, outputs, whether rounding each node to float16 gives other values)
    # float32 from node to node: (a + b) * b - a, rounded once
    "chain": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["p"]),
               helper.make_node("Sub", ["p", "a"], ["y"])], [("y", None)], True),
    # a float16 node between float32 ones runs in float32 (IsIsolatedFp16NodeOnCpu)
    "isolated": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["r"]),
                  helper.make_node("Mul", ["r", "c"], ["y"])], [("y", None)], True),
    # ... unless a float16 node reads its output: rounded before the Reshape
    "not isolated": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["r"]),
                      helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
                      helper.make_node("Mul", ["t", "c"], ["y"])], [("y", None)], False),
    # a graph output is rounded, and a float32 node reading it reads the float32 value
    "graph output": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["y"])],
                     [("s", None), ("y", None)], True),
    # a Cast to float32 of a float32 node's result reads it unrounded
    "cast up": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Cast", ["s"], ["w"], to=_F32),
                 helper.make_node("Mul", ["w", "w"], ["y"])], [("y", _F32)], True),
    # a float32 node reading a Cast to float16 of a float32 value reads the float32 value
    "cast down": ([helper.make_node("Cast", ["x32"], ["h"], to=_F16), helper.make_node("Mul", ["h", "b"], ["y"])],
                  [("y", None)], True),
    # ... unless another Cast reads it too (ONNX Runtime keeps that Cast's rounding for every reader)
    "cast down, cast again": ([helper.make_node("Cast", ["x32"], ["h"], to=_F16),
                               helper.make_node("Mul", ["h", "b"], ["y"]),
                               helper.make_node("Cast", ["h"], ["z"], to=_F32)], [("y", None), ("z", _F32)], False),
    # a Cast to float16 of a float16 value between float32 nodes changes nothing (ONNX's Attention function body)
    "cast to float16 again": ([helper.make_node("Add", ["a", "b"], ["s"]),
                               helper.make_node("Cast", ["s"], ["h"], to=_F16),
                               helper.make_node("Mul", ["h", "b"], ["y"])], [("y", None)], True),
    # a Cast to another type of a float32 node's result that only Casts read is cast from the float32 value
    "cast to float64": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Cast", ["s"], ["d"], to=11)],
                        [("d", onnx.TensorProto.DOUBLE)], True),
    # ... but not when a float16 kernel reads it too (the rounding stays for every reader)
    "cast to float64, read by a float16 node": ([helper.make_node("Add", ["a", "b"], ["s"]),
                                                 helper.make_node("Cast", ["s"], ["d"], to=11),
                                                 helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0])],
                                                [("d", onnx.TensorProto.DOUBLE), ("t", None)], False),
    # a variadic Concat between float32 nodes (its first input from one) runs in float32
    "concat": ([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Concat", ["s", "c"], ["k"], axis=0),
                helper.make_node("Mul", ["k", "k"], ["y"])], [("y", None)], True),
    # a float16 kernel's result (LayerNormalization fed graph inputs: scale and bias in float32, rounded once, as
    # ONNX Runtime's kernel) is float16 for the next node
    "float16 kernel": ([helper.make_node("LayerNormalization", ["a", "g", "beta"], ["n"]),
                        helper.make_node("Mul", ["n", "b"], ["y"])], [("y", None)], False),
}


@pytest.mark.parametrize("rule", [pytest.param(name, marks=[pytest.mark.x64] if "float64" in name else [])
                                  for name in sorted(_RULES)])
def test_each_rule_of_onnx_runtimes_float16_plan_gives_its_values_bit_for_bit(rule):
    """Small graphs of exactly rounded float32 operations (Add, Mul, Sub, Reshape, Cast...), on float16 values with
    full mantissas so that every float16 rounding shows: optkit gives ONNX Runtime's values bit for bit, jitted and
    not; and rounding each node's result to float16 would not (the rule is seen)."""
    nodes, outputs, differs = _RULES[rule]
    rng = np.random.default_rng(7)
    feeds = {name: (rng.normal(size=(4, 6)) * 3).astype(np.float16) for name in "abc"}
    feeds["x32"] = (rng.normal(size=(4, 6)) * 3).astype(np.float32)
    feeds.update(g=np.ones(6, np.float16) * np.float16(1.3), beta=np.full(6, 0.1, np.float16))
    shape = numpy_helper.from_array(np.array([4, 6], np.int64), "shape")
    if rule == "not isolated":
        feeds["c"] = feeds["c"].T.copy()
    if rule == "concat":
        feeds["c"] = feeds["c"][:2]
    read = {name for node in nodes for name in node.input}
    types = {"x32": _F32}
    inputs = [(n, types.get(n, _F16), list(v.shape)) for n, v in feeds.items() if n in read]
    model = _graph(nodes, inputs, outputs, [shape] if "shape" in read else [])
    fed = {n: v for n, v in feeds.items() if n in read}
    want = _ort(model, fed)
    for jit in (True, False):
        got = optkit.onnx.prepare(model, jit=jit).run(fed)
        for name, g, w in zip([o for o, _ in outputs], got, want):
            assert g.dtype == w.dtype, name
            np.testing.assert_array_equal(g, w, err_msg=f"{rule} (jit={jit}): {name}")
    per_node = _per_node(model, fed)
    assert any(not np.array_equal(p, w) for p, w in zip(per_node, want)) == differs, "per-node rounding"


def _per_node(model, feeds):
    """Each node's result rounded to its ONNX type (float16), in NumPy: what the plan is not."""
    env = dict(feeds)
    env.update((t.name, numpy_helper.to_array(t)) for t in model.graph.initializer)
    for node in model.graph.node:
        args = [env[n].astype(np.float32) if env[n].dtype == np.float16 else env[n] for n in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kind = {n: env[n].dtype for n in node.input}[node.input[0]]
        if node.op_type == "Cast":
            out = env[node.input[0]].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
        elif node.op_type == "LayerNormalization":
            x = args[0]
            mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
            out = ((x - mean) / np.sqrt(var + 1e-5) * args[1] + args[2]).astype(kind)
        else:
            fn = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract, "Reshape": np.reshape,
                  "Transpose": np.transpose, "Concat": lambda *xs, axis: np.concatenate(xs, axis)}[node.op_type]
            out = fn(*args, **({"axes": attrs["perm"]} if "perm" in attrs else {}),
                     **({"axis": attrs["axis"]} if "axis" in attrs else {})).astype(kind)
        env[node.output[0]] = out
    return [env[o.name] for o in model.graph.output]


def test_a_scanned_float16_run_computes_as_unrolled():
    """Six identical float16 layers after an embedding (a Gather, a float16 kernel), found as three blocks of two:
    the first block runs unrolled (its LayerNormalization reads float16; the later ones read a float32 sum, moved to
    float32 as ONNX Runtime moves them), the other two scanned with the float32 sum carried; equal to the unrolled
    form, and to ONNX Runtime within one float16 step."""
    import jax

    rng = np.random.default_rng(3)
    dim, layers = 8, 6
    inits = [numpy_helper.from_array((rng.normal(size=(16, dim))).astype(np.float16), "table")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h0"])]
    for k in range(layers):
        w = numpy_helper.from_array((rng.normal(size=(dim, dim)) / 3).astype(np.float16), f"w{k}")
        g = numpy_helper.from_array((1 + rng.normal(size=dim) / 5).astype(np.float16), f"g{k}")
        inits += [w, g]
        nodes += [helper.make_node("LayerNormalization", [f"h{k}", f"g{k}"], [f"n{k}"], axis=-1),
                  helper.make_node("MatMul", [f"n{k}", f"w{k}"], [f"m{k}"]),
                  helper.make_node("Tanh", [f"m{k}"], [f"t{k}"]),
                  helper.make_node("Add", [f"t{k}", f"h{k}"], [f"h{k + 1}"])]
    model = _graph(nodes, [("ids", onnx.TensorProto.INT64, [2, 5])], [(f"h{layers}", None)], inits)
    ids = rng.integers(0, 16, size=(2, 5)).astype(np.int64)
    outs = {}
    for scan in (True, False):
        apply_fn, params = optkit.onnx.to_jax(model, scan_layers=scan)
        assert ("stablehlo.while" in jax.jit(apply_fn).lower(params, ids).as_text()) == scan
        outs[scan] = np.asarray(jax.jit(apply_fn)(params, ids))
    np.testing.assert_array_equal(outs[True], outs[False])
    (want,) = _ort(model, {"ids": ids})
    _within_one_step(outs[True], want, 0.1)


def test_each_arithmetic_node_gives_onnx_runtimes_float16_values_on_the_same_inputs():
    """Every Add, Mul, MatMul, Pow, Tanh, Softmax, LayerNormalization, Where and IsNaN of the model, alone, fed
    the values ONNX Runtime computed for its inputs: optkit's output equals ONNX Runtime's, bit for bit."""
    model, data = _data()
    inferred = shape_inference.infer_shapes(model)
    info = {v.name: v for v in inferred.graph.value_info}
    names = [o for node in inferred.graph.node for o in node.output if o in info]
    probe = onnx.ModelProto()
    probe.CopyFrom(inferred)
    del probe.graph.output[:]
    probe.graph.output.extend(info[name] for name in names)
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip(names, session.run(None, {"input_ids": data["input_ids"]})))
    values.update((t.name, numpy_helper.to_array(t)) for t in model.graph.initializer)
    checked = 0
    for node in model.graph.node:
        if node.op_type not in ARITHMETIC or not all(name in values for name in [*node.input, *node.output] if name):
            continue
        floats = [name for name in node.input if name and values[name].dtype == np.float16]
        constants = [numpy_helper.from_array(values[name], name) for name in node.input
                     if name and name not in floats]
        graph = helper.make_graph(
            [node], "one",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT16, values[n].shape) for n in floats],
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
             for n in node.output], initializer=constants)
        one = helper.make_model(graph, opset_imports=model.opset_import)
        feeds = {n: values[n] for n in floats}
        want = onnxruntime.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds)
        got = optkit.onnx.prepare(one).run(feeds)
        for name, g, w in zip(node.output, got, want):
            assert g.dtype == w.dtype, name
            np.testing.assert_array_equal(g, w, err_msg=f"{node.op_type} {node.name} -> {name}")
        checked += 1
    assert checked >= 60, checked


def test_the_float16_kernels_the_registrations_declare_are_onnx_runtime_132s():
    """Each operator's ``float16=`` (optkit.onnx._ops._registry.Float16): at every since_version optkit registers,
    ONNX Runtime's CPU provider has a float16 kernel (any type constraint allowing tensor(float16)) exactly when
    the registration declares one, as its kernel registry lists them."""
    if not onnxruntime.__version__.startswith("1.32."):
        pytest.skip(f"the declarations are ONNX Runtime 1.32's; this is {onnxruntime.__version__}")
    from onnxruntime.capi import _pybind_state

    from optkit.onnx._ops import TABLE

    registered: dict[tuple[str, str], set] = {}
    for kernel in _pybind_state.get_all_opkernel_def():
        if kernel.provider == "CPUExecutionProvider" and any(
                "tensor(float16)" in types for types in kernel.type_constraints.values()):
            registered.setdefault((kernel.domain or "", kernel.op_name), set()).add(kernel.version_range)
    checked = 0
    for (domain, op, version), spec in TABLE._rows.items():
        if domain not in ("", "com.microsoft"):
            continue
        ranges = registered.get((domain, op), ())
        assert spec.float16_native(version) == any(lo <= version <= hi for lo, hi in ranges), (domain, op, version)
        checked += spec.float16_native(version)
    assert checked >= 60, checked
