"""Sequences (Python lists of arrays) and optionals (None when empty) in optkit.onnx (optkit/onnx/_ops/sequence.py),
against ONNX Runtime's CPU provider on the same models and feeds: compiled (``prepare``), op by op, traced inside
``jax.jit`` (``to_jax``), their gradients against float64 central differences, sequences fed and returned, and a
``Loop`` that grows a sequence (its slices' ends computed per iteration) run between compiled segments. ONNX's own
node cases (``sequence_*``, ``optional_*``, ``split_to_sequence_*``, ``identity_sequence``, ``if_seq``,
``loop13_seq``...) run in tests/onnx/ops/test_backend.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS, assert_gradients_match_central_differences, onnx_model  # noqa: E402

F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
RNG = np.random.default_rng(47)


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _seq_info(name, elem, shape=("d",)):
    return helper.make_tensor_sequence_value_info(name, elem, list(shape))


def _pipeline(elem=F):
    """x (3, 4) split into a sequence of (1, 4) and (2, 4); y (1, 4) inserted in front; the last erased; each
    tensor squared plus tanh (SequenceMap); its length, its second tensor and the concatenation as outputs."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["e", "e"], ["sq"]), helper.make_node("Tanh", ["e"], ["t"]),
         helper.make_node("Add", ["sq", "t"], ["out"])],
        "body", [helper.make_tensor_value_info("e", elem, ["r", 4])],
        [helper.make_tensor_value_info("out", elem, ["r", 4])])
    nodes = [
        helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0),
        helper.make_node("SequenceInsert", ["seq", "y", "front"], ["seq2"]),
        helper.make_node("SequenceInsert", ["seq2", "y"], ["seq3"]),
        helper.make_node("SequenceErase", ["seq3"], ["seq4"]),
        helper.make_node("SequenceMap", ["seq4"], ["mapped"], body=body),
        helper.make_node("SequenceLength", ["mapped"], ["n"]),
        helper.make_node("SequenceAt", ["mapped", "one"], ["at"]),
        helper.make_node("ConcatFromSequence", ["mapped"], ["cat"], axis=0),
    ]
    inits = [numpy_helper.from_array(np.array([1, 2], np.int64), "split"),
             numpy_helper.from_array(np.array(0, np.int64), "front"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", elem, [3, 4]),
                              helper.make_tensor_value_info("y", elem, [1, 4])],
                      [helper.make_tensor_value_info("cat", elem, [4, 4]),
                       helper.make_tensor_value_info("at", elem, [2, 4]), helper.make_tensor_value_info("n", I64, [])],
                      inits, opsets=(("", 17),))


@pytest.mark.parametrize("how", ["prepare", "op_by_op", "to_jax_jit"])
def test_a_sequence_pipeline_matches_onnx_runtime(how):
    model = _pipeline()
    x, y = RNG.normal(size=(3, 4)).astype(np.float32), RNG.normal(size=(1, 4)).astype(np.float32)
    want = _ort(model, {"x": x, "y": y})
    if how == "to_jax_jit":
        apply_fn, params = optkit.onnx.to_jax(model)
        got = jax.jit(apply_fn)(params, x, y)
    else:
        got = optkit.onnx.prepare(model, jit=how == "prepare").run([x, y])
    assert want[0].shape == (4, 4) and int(want[2]) == 3
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)


def test_gradients_through_a_sequence_pipeline_match_float64_central_differences():
    apply_fn, params = optkit.onnx.to_jax(_pipeline(D))
    with jax.enable_x64(True):
        args = {"x": jnp.asarray(RNG.normal(size=(3, 4))), "y": jnp.asarray(RNG.normal(size=(1, 4)))}
        assert_gradients_match_central_differences(lambda x, y: apply_fn(params, x, y)[0], args, ["x", "y"])


def test_a_fed_sequence_and_a_returned_sequence_match_onnx_runtime_and_bad_feeds_name_the_input():
    model = onnx_model(
        [helper.make_node("SequenceInsert", ["seq", "t"], ["grown"]),
         helper.make_node("ConcatFromSequence", ["grown"], ["stacked"], axis=0, new_axis=1)],
        [_seq_info("seq", F, [2]), helper.make_tensor_value_info("t", F, [2])],
        [_seq_info("grown", F, [2]), helper.make_tensor_value_info("stacked", F, ["n", 2])])
    seq = [RNG.normal(size=2).astype(np.float32) for _ in range(3)]
    t = RNG.normal(size=2).astype(np.float32)
    want = _ort(model, {"seq": seq, "t": t})
    rep = optkit.onnx.prepare(model)
    grown, stacked = rep.run([seq, t])
    assert isinstance(grown, list) and len(grown) == 4
    for w, g in zip(want[0], grown):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(stacked, want[1])
    with pytest.raises(TypeError, match="graph input 'seq' is a sequence of tensors: feed a list"):
        rep.run([np.stack(seq), t])
    with pytest.raises(TypeError, match="graph input 'seq' is declared float32.*fed float64"):
        rep.run([[s.astype(np.float64) for s in seq], t])
    assert len(seq) == 3  # nothing fed is changed


def test_optionals_match_onnx_runtime():
    """Optional(x) has an element, an empty Optional (its type attribute) has none; OptionalGetElement's value
    and an If on the presence flag."""
    tensor_type = helper.make_tensor_type_proto(F, [2])
    nodes = [helper.make_node("Optional", ["x"], ["full"]),
             helper.make_node("Optional", [], ["empty"], type=tensor_type),
             helper.make_node("OptionalHasElement", ["full"], ["has_full"]),
             helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
             helper.make_node("OptionalGetElement", ["full"], ["value"]),
             helper.make_node("Or", ["has_full", "has_empty"], ["any"])]
    model = onnx_model(nodes, [helper.make_tensor_value_info("x", F, [2])],
                       [helper.make_tensor_value_info(n, TensorProto.BOOL, []) for n in ("has_full", "has_empty")]
                       + [helper.make_tensor_value_info("value", F, [2]),
                          helper.make_tensor_value_info("any", TensorProto.BOOL, [])], opsets=(("", 18),))
    x = np.array([1.5, -2.0], np.float32)
    want = _ort(model, {"x": x})
    for got in (optkit.onnx.prepare(model).run([x]), jax.jit(optkit.onnx.to_jax(model)[0])({}, x)):
        for w, g in zip(want, got):
            np.testing.assert_array_equal(np.asarray(g), w)
    assert [bool(w) for w in (want[0], want[1])] == [True, False]


def _growing_loop():
    """A Loop that appends x[:i+1] to a sequence at each iteration i (ONNX's loop13_seq): each slice's end is
    computed from the iteration number, so the sequence's tensors grow; then the last one summed."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["end", "axes"], ["ends"]),
         helper.make_node("Slice", ["x", "starts", "ends"], ["piece"]),
         helper.make_node("SequenceInsert", ["seq_in", "piece"], ["seq_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), _seq_info("seq_in", F)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _seq_info("seq_out", F)],
        initializer=[numpy_helper.from_array(np.array(1, np.int64), "one"),
                     numpy_helper.from_array(np.array(0, np.int64), "axes"),
                     numpy_helper.from_array(np.array([0], np.int64), "starts")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["trips", "cond", "empty"], ["seq"], body=body),
             helper.make_node("SequenceAt", ["seq", "last"], ["longest"]),
             helper.make_node("ReduceSum", ["longest"], ["total"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array(True), "cond"), numpy_helper.from_array(np.array(-1, np.int64), "last")]
    return onnx_model(nodes, [helper.make_tensor_value_info("x", F, [5]),
                              helper.make_tensor_value_info("trips", I64, [])],
                      [_seq_info("seq", F), helper.make_tensor_value_info("total", F, [])], inits)


def test_a_loop_growing_a_sequence_runs_between_compiled_segments_and_is_refused_inside_jit():
    model = _growing_loop()
    x, trips = np.arange(1, 6, dtype=np.float32), np.array(4, np.int64)
    want = _ort(model, {"x": x, "trips": trips})
    seq, total = optkit.onnx.prepare(model).run([x, trips])
    assert [s.shape for s in seq] == [(1,), (2,), (3,), (4,)] == [w.shape for w in want[0]]
    for w, g in zip(want[0], seq):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(total, want[1])
    apply_fn, params = optkit.onnx.to_jax(model)
    with pytest.raises(ValueError, match=r"Slice.*input 'ends' must be known before the graph runs.*prepare\(model\)"):
        jax.jit(apply_fn)(params, x, trips)


def test_a_slice_whose_end_is_computed_from_values_runs_in_segments_as_onnx_runtime():
    """An EmbeddingBag-style export: a bag's end read from the offsets fed at run time (refused before: the Slice's
    ends must be known before running); prepare now runs it between compiled segments."""
    nodes = [helper.make_node("Gather", ["offsets", "one"], ["end"]),
             helper.make_node("Unsqueeze", ["end", "axes"], ["ends"]),
             helper.make_node("Slice", ["table", "starts", "ends"], ["bag"]),
             helper.make_node("ReduceSum", ["bag", "axes"], ["pooled"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([0], np.int64), "starts")]
    model = onnx_model(nodes, [helper.make_tensor_value_info("table", F, [6, 3]),
                               helper.make_tensor_value_info("offsets", I64, [2])],
                       [helper.make_tensor_value_info("pooled", F, [3])], inits)
    table = RNG.normal(size=(6, 3)).astype(np.float32)
    rep = optkit.onnx.prepare(model)
    for offsets in ([0, 2], [0, 5]):
        offsets = np.array(offsets, np.int64)
        np.testing.assert_allclose(rep.run([table, offsets])[0], _ort(model, {"table": table, "offsets": offsets})[0],
                                   rtol=1e-6)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("x64", [False, True])
def test_torchs_embedding_bag_exports_run_through_prepare_as_onnx_runtime(exporter, x64):
    """A DLRM-style nn.EmbeddingBag as both torch.onnx exporters write it (tests/onnx/models/make_models.py
    ``bags``): TorchScript's Loop slices the bags with ends read from the offsets, dynamo's grows a sequence; both
    run between compiled segments and give ONNX Runtime's values; inside jax.jit they are refused by name."""

    folder = ONNX_TESTS / "models" / "bags"
    data = np.load(folder / f"torch_{exporter}_embedding_bag.npz")
    with jax.enable_x64(x64):
        got = optkit.onnx.prepare(str(folder / f"torch_{exporter}_embedding_bag.onnx")).run(
            {"idx": data["idx"], "off": data["off"]}).output
    np.testing.assert_allclose(got, data["output"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, data["torch_output"], rtol=1e-5, atol=1e-6)
    apply_fn, params = optkit.onnx.to_jax(str(folder / f"torch_{exporter}_embedding_bag.onnx"))
    with pytest.raises(ValueError, match=r"node .*prepare\(model\)\.run"):
        jax.jit(apply_fn)(params, data["idx"], data["off"])


def test_a_split_into_more_tensors_than_the_bound_is_refused_by_name():
    model = onnx_model([helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
                        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)],
                       [helper.make_tensor_value_info("x", F, [70000])],
                       [helper.make_tensor_value_info("y", F, [70000])])
    with pytest.raises(ValueError, match=r"SplitToSequence.*70000 tensors, more than optkit's limit of 65536"):
        optkit.onnx.prepare(model).run([np.zeros(70000, np.float32)])
