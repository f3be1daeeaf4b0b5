"""``python -m optkit.onnx`` / ``optkit-onnx``: ``check`` and ``summary`` on the committed exports and on files
optkit cannot run."""

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from optkit.onnx._cli import main, summary  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

MODELS = ONNX_TESTS / "models"
EXPORTED = sorted(MODELS.glob("*.onnx"))


@pytest.mark.parametrize("path", EXPORTED[::4], ids=lambda p: p.stem)
def test_check_and_summary_on_exported_models(path, capsys):
    """Every fourth committed export (the rest load in tests/onnx/files/test_models.py): check exits 0, and the summary
    names each declared input and counts the nodes and initializers as the file has them."""
    assert main(["check", str(path)]) == 0
    assert "OK, every operator is supported" in capsys.readouterr().out
    assert main(["summary", str(path)]) == 0
    text = capsys.readouterr().out
    model = onnx.load(str(path))
    initial = {t.name for t in model.graph.initializer}
    for graph_input in model.graph.input:
        if graph_input.name not in initial:
            assert f"\n  {graph_input.name}: " in "\n" + text
    assert f"in {len(initial)} initializers" in text
    assert "nodes: " in text and "trained by default" in text


def _custom_model(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("FancyOp", ["h"], ["a"], domain="com.example", name="fancy1"),
             helper.make_node("FancyOp", ["a"], ["y"], domain="com.example", name="fancy2")]
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [info("x")], [info("y")]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    return path


def test_check_exits_1_naming_an_unsupported_operator_with_its_count_and_nodes(tmp_path):
    path = _custom_model(tmp_path)
    result = subprocess.run([sys.executable, "-m", "optkit.onnx", "check", str(path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "com.example::FancyOp (opset 1), 2 nodes 'fancy1', 'fancy2'" in result.stdout
    assert main(["summary", str(path)]) == 1  # nothing to summarize that optkit cannot load


def test_check_exits_1_on_a_file_that_is_not_a_model(tmp_path, capsys):
    path = tmp_path / "not_a_model.onnx"
    path.write_bytes(b"\x00\x01 this is not a protobuf")
    assert main(["check", str(path)]) == 1
    assert "cannot be loaded" in capsys.readouterr().out


def test_the_summary_counts_what_the_file_holds():
    """Against the numbers written into the file: the histogram, parameters by dtype, the trainable set and a
    weight read by two nodes (tied when trained), an int8 weight a DequantizeLinear reads."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    q = np.array([[1, -2], [3, 4]], np.int8)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("MatMul", ["x", "W"], ["h2"]),
             helper.make_node("Add", ["h", "h2"], ["y"]),
             helper.make_node("DequantizeLinear", ["Q", "s"], ["d"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(q, "Q"),
         numpy_helper.from_array(np.float32(0.5), "s")])
    text = summary(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    lines = text.splitlines()
    assert "  x: float (batch, 3)" in lines and "  y: float (batch, 4)" in lines
    assert "nodes: 4 (3 operator types)" in lines and "  MatMul: 2" in lines
    assert "parameters: 17 in 3 initializers" in lines  # 12 + 4 + 1
    assert "  float32: 13 (52 B)" in lines and "  int8: 4 (4 B)" in lines
    assert "trained by default (to_jax, make_training_model): 1 initializers, 12 values" in lines
    assert "  W: 2 nodes" in lines
    assert "quantized weights: 1 integer initializers read by quantized operators" in lines


def test_the_public_names_are_listed_and_errors_carry_their_public_path(tmp_path):
    import traceback

    import optkit.onnx

    assert {"OnnxModule", "UnsupportedOpError", "TensorTooLargeError", "to_jax"} <= set(dir(optkit.onnx))
    try:
        optkit.onnx.prepare(str(_custom_model(tmp_path)))
    except optkit.onnx.UnsupportedOpError as err:
        shown = "".join(traceback.format_exception_only(type(err), err))
    assert shown.startswith("optkit.onnx.UnsupportedOpError: ")
    assert optkit.onnx.TensorTooLargeError.__module__ == "optkit.onnx"


RUN = ["jax2onnx_transformer_block", "torch_dynamo_bert", "torch_dynamo_gru", "torch_torchscript_cnn",
       "torch_torchscript_window_attention"]


@pytest.mark.parametrize("path", [MODELS / f"{name}.onnx" for name in RUN], ids=lambda p: p.stem)
def test_run_compares_with_onnx_runtime_and_checks_the_gradient(path, capsys):
    """Five exports of five families (jax2onnx, int64 token ids, a recurrent net, a CNN, window attention; each
    export runs against ONNX Runtime and float64 gradients in tests/onnx/files/test_models.py and test_jax.py, and every
    one passed this command when it was written): random inputs within the declared shapes, ONNX Runtime's
    outputs within float32 rounding, jax.grad against central differences."""
    pytest.importorskip("onnxruntime")
    assert main(["run", str(path), "--compare-ort", "--grad", "--repeat", "1"]) == 0, capsys.readouterr().out
    text = capsys.readouterr().out
    assert "first call" in text and "steady" in text and "ONNX Runtime" in text
    assert "MISMATCH" not in text and "gradient: " in text


def test_run_takes_inputs_from_npz_and_symbolic_sizes(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    path = MODELS / "torch_dynamo_bert.onnx"
    data = np.load(MODELS / "torch_dynamo_bert.npz")
    np.savez(tmp_path / "inputs.npz", input=data["input"])
    assert main(["run", str(path), "--inputs", str(tmp_path / "inputs.npz"), "--compare-ort", "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    assert f"input input: int64{list(data['input'].shape)}" in text
    symbolic = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "E")]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(symbolic, str(tmp_path / "symbolic.onnx"))
    argv = ["run", str(tmp_path / "symbolic.onnx"), "--dim", "batch=3", "--int-high", "5", "--compare-ort"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "input ids: int64[3, 2]" in text and "output y: float32[3, 2, 4]" in text, text
    assert main(["run", str(path), "--dim", "batch"]) == 2
    assert "--dim takes NAME=SIZE" in capsys.readouterr().err


def _console(*args):
    """``optkit-onnx ARGS`` as a user types it (the console script pip installs)."""
    import shutil

    script = shutil.which("optkit-onnx") or pytest.skip("the optkit-onnx console script is not on PATH")
    return subprocess.run([script, *map(str, args)], capture_output=True, text=True, timeout=300)


def _one_line(result, code):
    """The command exited ``code`` with one line on standard error and no traceback."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr
    return lines[0]


def test_run_names_a_bad_inputs_file_and_exits_2(tmp_path):
    """A missing --inputs file and one that is not an .npz of arrays (a pickle, a lone .npy): one line naming
    the file, exit 2; no traceback."""
    import pickle

    path = MODELS / "torch_dynamo_mlp.onnx"
    missing = tmp_path / "missing.npz"
    assert str(missing) in _one_line(_console("run", path, "--inputs", missing), 2)
    pickled = tmp_path / "inputs.pkl"
    pickled.write_bytes(pickle.dumps({"x": [1, 2]}))
    line = _one_line(_console("run", path, "--inputs", pickled), 2)
    assert str(pickled) in line and "not a .npz file" in line
    lone = tmp_path / "lone.npy"
    np.save(lone, np.zeros(3, np.float32))
    assert "not a .npz file" in _one_line(_console("run", path, "--inputs", lone), 2)


def test_run_says_when_onnx_runtime_refuses_the_model_and_exits_3(tmp_path):
    """A training graph with a Gradient node, which ONNX Runtime's CPU build cannot load (docs "Training ONNX
    models"): optkit runs it, and --compare-ort says in one line that there is nothing to compare with."""
    pytest.importorskip("onnxruntime")
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dx"], xs=["x"], y="y", domain="ai.onnx.preview.training")]
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [info("x")], [info("y"), info("dx")]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("ai.onnx.preview.training", 1)])
    path = tmp_path / "gradient.onnx"
    onnx.save(model, str(path))
    result = _console("run", path, "--compare-ort", "--repeat", "1")
    line = _one_line(result, 3)
    assert line.startswith("--compare-ort: ONNX Runtime") and "cannot load" in line
    assert "output dx: float32[2]" in result.stdout


def test_run_refuses_a_dim_the_model_does_not_declare(capsys):
    path = MODELS / "torch_dynamo_bert.onnx"
    assert main(["run", str(path), "--dim", "no_such_dim=4", "--repeat", "0"]) == 2
    err = capsys.readouterr().err
    assert "--dim no_such_dim: the model declares no dimension 'no_such_dim'" in err


def test_random_inputs_fit_a_language_models_usual_inputs():
    """GenAI's builder: the KV cache's head size from genai_config.json, the total length the past plus the new
    tokens, a mask of ones; Optimum: a declared ``past_sequence_length + sequence_length``, position ids after
    the past."""
    from optkit.onnx._cli_run import random_inputs

    folder = MODELS / "genai" / "llama_int4"
    rep_inputs = optkit_inputs(folder / "model.onnx")
    feeds = random_inputs(rep_inputs, {"sequence_length": 3}, 0, 5, str(folder))
    assert feeds["past_key_values.0.key"].shape == (1, 1, 2, 16)
    assert feeds["attention_mask"].shape == (1, 5) and (feeds["attention_mask"] == 1).all()
    feeds = random_inputs(optkit_inputs(MODELS / "optimum" / "gpt2.onnx"), {"past_sequence_length": 4}, 0, 5)
    assert feeds["attention_mask"].shape == (2, 6) and (feeds["attention_mask"] == 1).all()
    np.testing.assert_array_equal(feeds["position_ids"], [[4, 5], [4, 5]])


def optkit_inputs(path):
    import optkit.onnx

    return optkit.onnx.prepare(str(path)).inputs


@pytest.mark.parametrize("path", [MODELS / "genai" / "llama_int4" / "model.onnx",
                                  MODELS / "genai" / "phi3_fp32" / "model.onnx",
                                  MODELS / "optimum" / "gpt2.onnx", MODELS / "optimum" / "t5_decoder_merged.onnx"],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_run_compares_language_model_files_on_random_inputs(path, capsys):
    """The GenAI builder's and Optimum's files with past key/values: random inputs that the model's shapes and
    input names make valid, ONNX Runtime's outputs matched, no NaN (a row of zeros in a mask would give one)."""
    pytest.importorskip("onnxruntime")
    assert main(["run", str(path), "--compare-ort", "--repeat", "1"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "NaN or infinite" not in out


def test_run_flags_a_non_finite_output_and_fails_under_compare_ort(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    nodes = [helper.make_node("Log", ["x"], ["y"])]
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [info("x")], [info("y")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "log.onnx"))
    assert main(["run", str(tmp_path / "log.onnx"), "--compare-ort", "--repeat", "1"]) == 1
    negative = int((np.random.default_rng(0).standard_normal(4) < 0).sum())  # (the command's inputs, seed 0)
    assert negative and f"output y: {negative} of 4 values are NaN or infinite" in capsys.readouterr().out


def test_run_exits_1_on_a_wrong_gradient_and_on_outputs_that_differ(tmp_path, capsys):
    """A registered operator whose custom VJP doubles the gradient: --grad sees it. An output that differs from
    ONNX Runtime's beyond float32 rounding: the comparison reports it."""
    import jax
    import jax.numpy as jnp

    import optkit.onnx
    from optkit.onnx._cli_run import _compare

    @jax.custom_vjp
    def wrong(x):
        return jnp.sin(x)

    wrong.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (2 * g * jnp.cos(x),))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("WrongSin", ["h"], ["y"], domain="com.example.cli")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                          [numpy_helper.from_array(np.full((3, 2), 0.3, np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.cli", 1)])
    path = tmp_path / "wrong.onnx"
    onnx.save(model, str(path))
    optkit.onnx.register_op("com.example.cli", "WrongSin", lambda x: wrong(x))
    try:
        assert main(["run", str(path), "--grad", "--repeat", "1"]) == 1
        assert "MISMATCH" in capsys.readouterr().out
        optkit.onnx.register_op("com.example.cli", "WrongSin", jnp.sin, replace=True)
        assert main(["run", str(path), "--grad", "--repeat", "1"]) == 0
    finally:
        optkit.onnx.unregister_op("com.example.cli", "WrongSin")
    capsys.readouterr()
    want = np.array([1.0, 2.0, 3.0], np.float32)
    assert _compare(["y"], (want * (1 + 1e-6),), [want], 1e-4, 1e-5)
    assert not _compare(["y"], (want * (1 + 1e-3),), [want], 1e-4, 1e-5)
    assert not _compare(["k"], (np.array([1, 2]),), [np.array([1, 3])], 1e-4, 1e-5)
    assert capsys.readouterr().out.count("MISMATCH") == 2
    many = np.ones(20000, np.float32)
    edge = many.copy()
    edge[7] = 0.0  # one pixel across an edge
    assert not _compare(["m"], (edge,), [many], 1e-4, 1e-5)
    assert _compare(["m"], (edge,), [many], 1e-4, 1e-5, outliers=1e-4)
    assert "1 of 20000 elements beyond the tolerance" in capsys.readouterr().out
    half = np.array([4.0, 5.5], np.float16)  # one float16 step at 5.5 is 0.0039: within 4 units of float16
    assert _compare(["h"], (half + np.array([0, 0.0039], np.float16),), [half], 1e-4, 1e-5)
