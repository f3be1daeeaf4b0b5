"""optkit.onnx on models real exporters wrote (tests/onnx/models, made by tests/onnx/models/make_models.py).

Each exported model (torch.onnx TorchScript at opset 17 and dynamo at opset 20, jax2onnx at
opset 23; versions in tests/onnx/models/versions.json) is loaded, run and compared with ONNX
Runtime's output saved at export; differentiated through a Gradient node and compared with the
framework's float64 gradients saved at export; and trained for 3 Adam steps with
:func:`optkit.onnx.make_training_model` (the loss falls at every step). The onnx package's
``light_*`` model-zoo graphs (weights made by their ConstantOfShape nodes) are run against
ONNX Runtime's outputs. None of this needs torch, jax2onnx or onnxruntime.
"""

import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

MODELS = ONNX_TESTS / "models"
VERSIONS = json.loads((MODELS / "versions.json").read_text())
EXPORTED = sorted(p.stem for p in MODELS.glob("*.onnx"))
LIGHT = sorted(name for name in VERSIONS["models"] if name.startswith("light_"))
TRAINING = "ai.onnx.preview.training"


def _load(name):
    return onnx.load(str(MODELS / f"{name}.onnx")), np.load(MODELS / f"{name}.npz")


def test_the_model_set_is_complete():
    """Every model the issue lists is exported and committed, or recorded as one its exporter cannot write."""
    names = {"mlp", "cnn", "resnet18", "mobilenet_v3_small", "transformer_encoder", "lstm", "gru", "vit", "bert",
             "gpt2"}
    records = VERSIONS["models"]
    for exporter in ("torchscript", "dynamo"):
        for name in names:
            stem = f"torch_{exporter}_{name}"
            assert stem in EXPORTED or "not exported" in records[stem], stem
    assert {"jax2onnx_mlp", "jax2onnx_cnn", "jax2onnx_transformer_block"} <= set(EXPORTED)
    assert len(LIGHT) == 9
    assert len(EXPORTED) + len(LIGHT) >= 31
    assert {"torch", "onnxruntime", "jax2onnx", "transformers"} <= set(VERSIONS["packages"])
    # The families of issue 32: segmentation, detection, LLaMA (dynamo, opsets 20 and 23), a Whisper-style
    # encoder-decoder, torch.cond, window attention, pixel shuffle.
    families = {"torchscript_segmentation", "dynamo_segmentation", "torchscript_detection", "dynamo_llama",
                "dynamo_llama_opset23", "dynamo_whisper", "dynamo_cond", "torchscript_window_attention",
                "torchscript_super_resolution", "dynamo_super_resolution"}
    assert {f"torch_{f}" for f in families} <= set(EXPORTED)
    assert {"Attention", "RMSNormalization"} <= set(records["torch_dynamo_llama_opset23"]["ops"])
    assert "If" in records["torch_dynamo_cond"]["ops"] and "TopK" in records["torch_torchscript_detection"]["ops"]
    assert "Resize" in records["torch_torchscript_segmentation"]["ops"]


@pytest.mark.parametrize("name", EXPORTED)
def test_inference_matches_onnx_runtime(name):
    model, data = _load(name)
    (got,) = optkit.onnx.prepare(model).run([data["input"]])
    want = data["output"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.max(np.abs(want)))


def _gradient_model(model, data):
    """The model with loss = sum(output * C) and a Gradient node for the input and saved parameters."""
    graph = model.graph
    output = graph.output[0].name
    wanted = [key.split(":", 1)[1] for key in data.files if key.startswith("grad:")]
    xs = [graph.input[0].name if w == "input" else w for w in wanted]
    c = numpy_helper.from_array(data["C"].astype(np.float32), "C.weights")
    data_input = graph.input[0].name
    zs = [] if data_input in xs else [data_input]
    gradient = helper.make_node("Gradient", xs + zs, [f"{x}.grad" for x in xs], domain=TRAINING, xs=xs, y="C.loss")
    if zs:
        gradient.attribute.append(helper.make_attribute("zs", zs))
    nodes = list(graph.node) + [
        helper.make_node("Mul", [output, "C.weights"], ["C.product"]),
        helper.make_node("ReduceSum", ["C.product"], ["C.loss"], keepdims=0),
        gradient,
    ]
    outputs = [helper.make_tensor_value_info(f"{x}.grad", onnx.TensorProto.FLOAT, list(data[f"grad:{w}"].shape))
               for x, w in zip(xs, wanted)]
    new = helper.make_graph(nodes, graph.name, list(graph.input), outputs,
                            initializer=list(graph.initializer) + [c], value_info=list(graph.value_info))
    opsets = [o for o in model.opset_import] + [helper.make_opsetid(TRAINING, 1)]
    result = helper.make_model(new, opset_imports=opsets, ir_version=model.ir_version)
    result.functions.extend(model.functions)
    return result, wanted


@pytest.mark.parametrize("name", EXPORTED)
def test_gradient_matches_the_framework_float64_gradient(name):
    model, data = _load(name)
    grad_model, wanted = _gradient_model(model, data)
    assert wanted, "the export saved no gradient"
    got = optkit.onnx.prepare(grad_model).run([data["input"]])
    for key, g in zip(wanted, got):
        want = data[f"grad:{key}"]
        assert g.shape == want.shape, key
        scale = np.max(np.abs(want))
        np.testing.assert_allclose(g, want, rtol=2e-3, atol=2e-4 * scale, err_msg=f"{name}: d loss / d {key}")


# Adam's first steps move every weight by about the learning rate: 1e-3 overshoots the Whisper-style model's
# minimum along its LayerNorm-heavy path (the loss rises at the second step); 3e-4 descends.
LEARNING_RATE = {"torch_dynamo_whisper": 3e-4}
# The detector's output is its 10 best boxes sorted by score (TopK): a step reorders near-equal scores, so a loss on
# the sorted output jumps, whatever the step size. Its gradient is checked above and it trains as a JAX function
# (tests/onnx/api/test_jax.py); here it must load, run and step without error.
NOT_MONOTONE = {"torch_torchscript_detection"}


@pytest.mark.parametrize("name", EXPORTED)
def test_three_adam_steps_lower_the_loss(name):
    model, data = _load(name)
    train = optkit.onnx.make_training_model(model, loss="mean_squared_error", optimizer="adam")
    step = optkit.onnx.prepare(train)
    rng = np.random.default_rng(0)
    feeds = {model.graph.input[0].name: data["input"],
             "target": (data["output"] + rng.normal(size=data["output"].shape)).astype(np.float32),
             "R": np.float32(LEARNING_RATE.get(name, 1e-3)), "T": np.int64(0)}
    # The weights and moments fed from the first step, as the later steps feed them: one compiled program
    # (a graph input left to its initializer is a constant of another program).
    inputs = {i.name for i in train.graph.input}
    feeds.update({i.name: numpy_helper.to_array(i) for i in train.graph.initializer if i.name in inputs})
    names = [o.name for o in train.graph.output]
    losses = []
    for t in range(4):
        out = step.run(feeds)
        losses.append(float(out[0]))
        feeds.update({n.removesuffix(".new"): v for n, v in zip(names[1:], out[1:])})
        feeds["T"] = np.int64(t + 1)
    assert all(np.isfinite(losses)), losses
    if name not in NOT_MONOTONE:
        assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.parametrize("name", LIGHT)
def test_model_zoo_light_graph_matches_onnx_runtime(name):
    """The onnx package's light_* graphs, weights made by ConstantOfShape, against ONNX Runtime."""
    folder = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    model = onnx.load(str(folder / f"{name}.onnx"))
    data = np.load(MODELS / f"{name}.npz")
    rng = np.random.default_rng(VERSIONS["seed"])  # the input make_models.py gave ONNX Runtime
    inits = {i.name for i in model.graph.initializer}
    feeds = {vi.name: rng.uniform(0, 1, size=[d.dim_value or 1 for d in vi.type.tensor_type.shape.dim])
             .astype(np.float32) for vi in model.graph.input if vi.name not in inits}
    got = optkit.onnx.prepare(model).run(feeds)
    for i, g in enumerate(got):
        want = data[f"output:{i}"]
        np.testing.assert_allclose(g, want, rtol=1e-3, atol=1e-4 * max(np.max(np.abs(want)), 1e-6))


@pytest.mark.parametrize("kwargs, message", [
    ({"loss": "hinge"}, "loss must be one of"),
    ({"optimizer": "sgd"}, "optimizer must be one of"),
    ({"trainable": ["no.such.weight"]}, "'no.such.weight' is not an initializer"),
    ({"output": "nope"}, "output 'nope' is not a graph output"),
])
def test_make_training_model_names_the_bad_argument(kwargs, message):
    model, _ = _load("torch_torchscript_mlp")
    before = model.SerializeToString()
    with pytest.raises(ValueError, match=message):
        optkit.onnx.make_training_model(model, **kwargs)
    assert model.SerializeToString() == before  # nothing the user passed is changed


def test_make_training_model_momentum_and_with_initializers_round_trip():
    model, data = _load("torch_torchscript_mlp")
    train = optkit.onnx.make_training_model(model, loss="mean_squared_error", optimizer="momentum",
                                            optimizer_attributes={"alpha": 0.5})
    out = optkit.onnx.prepare(train).run({"input": data["input"], "target": np.zeros_like(data["output"]),
                                          "R": np.float32(0.1), "T": np.int64(0)})
    names = [o.name for o in train.graph.output]
    new = {n.removesuffix(".new"): v for n, v in zip(names[1:], out[1:]) if not n.endswith("momentum_v.new")}
    tuned = optkit.onnx.with_initializers(model, new)
    loss_after = float(np.mean(optkit.onnx.prepare(tuned).run([data["input"]])[0] ** 2))
    assert loss_after < float(out[0])
    with pytest.raises(ValueError, match="has shape"):
        optkit.onnx.with_initializers(model, {next(iter(new)): np.zeros(3)})
