"""Export the real-exporter model set that tests/test_onnx_models.py runs (issue 23).

Small models with random weights, written by the exporters users use:

- torch.onnx, TorchScript exporter (``dynamo=False``) at opset 17 and the dynamo exporter
  (``dynamo=True``) at opset 20: an MLP, a small CNN, a ResNet-18 layout (torchvision's
  BasicBlock x [2, 2, 2, 2], widths 8-64), torchvision's MobileNetV3-small (``width_mult=0.25``),
  ``nn.TransformerEncoder``, an LSTM and a GRU classifier, and ViT, BERT and GPT-2 from
  transformers configs (tiny sizes, random weights);
- jax2onnx at opset 23: three flax.nnx models (an MLP, a CNN, a transformer block);
- and, for the onnx package's nine ``light_*`` model-zoo graphs, ONNX Runtime's outputs
  (``light_<name>.npz``).

For each model ``<name>.onnx`` the script saves ``<name>.npz`` with the input(s), the output
that ONNX Runtime computes, the framework's own float64 gradients of
``loss = sum(output * C)`` (``C`` saved too) with respect to the input (float inputs) and to
some named parameters (``grad:<initializer name>``), and ``versions.json`` records the exporter
and framework versions. The tests need none of these packages.

This is run by hand (it needs torch, torchvision, transformers, onnxscript, jax2onnx and
onnxruntime, none of which optkit depends on); the files are committed:

    python -m venv /tmp/export && /tmp/export/bin/pip install torch==2.13.0 onnx onnxruntime \\
        onnxscript transformers jax2onnx flax pillow && /tmp/export/bin/pip install --no-deps torchvision
    /tmp/export/bin/python tests/models/make_models.py            # about 2 minutes

torchvision's PyPI wheel is built for another torch; its C++ operators (detection ops, unused
here) are stubbed before importing it (``_import_torchvision``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import pathlib
import re
import sys
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SEED = 23


def _import_torchvision():
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    source = (pathlib.Path(importlib.util.find_spec("torchvision").origin).parent
              / "_meta_registrations.py").read_text()
    names = set(re.findall(r"torchvision\.(_?\w+)\.default", source)) | set(re.findall(r'"torchvision::(\w+)"',
                                                                                      source))
    for name in sorted(names):
        lib.define(f"{name}(Tensor[] args) -> Tensor")
    import torchvision

    torchvision._optkit_lib = lib  # keep the stub library alive
    return torchvision


# ---------------------------------------------------------------------------
# torch models


def torch_models():
    """name -> (module, example inputs, names of parameters whose gradients are saved)."""
    import torch
    from torch import nn

    torchvision = _import_torchvision()
    import transformers

    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 10))

        def forward(self, x):
            return self.net(x)

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2))
            self.head = nn.Linear(16 * 2 * 2, 10)

        def forward(self, x):
            return self.head(torch.flatten(self.features(x), 1))

    class ResNet18Layout(torchvision.models.resnet.ResNet):
        """torchvision's ResNet-18 (BasicBlock x [2, 2, 2, 2]) at widths 8, 16, 32, 64."""

        def __init__(self):
            super().__init__(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2], num_classes=10)
            block = torchvision.models.resnet.BasicBlock
            self.inplanes = 8
            self.conv1 = nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.layer1 = self._make_layer(block, 8, 2)
            self.layer2 = self._make_layer(block, 16, 2, stride=2)
            self.layer3 = self._make_layer(block, 32, 2, stride=2)
            self.layer4 = self._make_layer(block, 64, 2, stride=2)
            self.fc = nn.Linear(64, 10)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(16, 32)
            layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True,
                                               activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            return self.head(self.encoder(self.embed(x)).mean(dim=1))

    class Recurrent(nn.Module):
        def __init__(self, cell):
            super().__init__()
            self.rnn = cell(12, 16, num_layers=1, batch_first=True, bidirectional=True)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    vit = transformers.ViTModel(transformers.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64), add_pooling_layer=False)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32), add_pooling_layer=False)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4))

    class Hidden(nn.Module):
        """A transformers model's first output as one tensor (last_hidden_state or logits)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            out = self.model(x, return_dict=False) if not isinstance(self.model, transformers.GPT2LMHeadModel) \
                else self.model(x, use_cache=False, return_dict=False)
            return out[0]

    ids = torch.randint(0, 100, (2, 8), generator=g)
    models = {
        "mlp": (MLP(), torch.randn(4, 64, generator=g), ["net.0.weight", "net.2.bias"]),
        "cnn": (SmallCNN(), torch.randn(2, 1, 8, 8, generator=g), ["features.0.weight", "head.weight"]),
        "resnet18": (ResNet18Layout(), torch.randn(2, 3, 32, 32, generator=g), ["conv1.weight", "fc.weight"]),
        "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small(weights=None, width_mult=0.25, num_classes=10),
                               torch.randn(2, 3, 32, 32, generator=g), ["features.0.0.weight"]),
        "transformer_encoder": (Encoder(), torch.randn(2, 6, 16, generator=g), ["embed.weight", "head.bias"]),
        "lstm": (Recurrent(nn.LSTM), torch.randn(2, 5, 12, generator=g), ["head.weight"]),
        "gru": (Recurrent(nn.GRU), torch.randn(2, 5, 12, generator=g), ["head.weight"]),
        "vit": (Hidden(vit), torch.randn(2, 3, 16, 16, generator=g), ["model.embeddings.position_embeddings"]),
        "bert": (Hidden(bert), ids, ["model.embeddings.word_embeddings.weight"]),
        "gpt2": (Hidden(gpt2), ids, ["model.transformer.h.0.ln_1.weight", "model.transformer.wpe.weight"]),
    }
    for module, _, _ in models.values():
        module.eval()
        with torch.no_grad():  # no two parameters equal (exporters merge equal initializers: LayerNorm's ones)
            for p in module.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
    return models


def export_torch(out: pathlib.Path) -> dict:
    import onnx
    import onnxruntime
    import torch

    records = {}
    for name, (module, x, params) in torch_models().items():
        module_64 = _double(module)
        for exporter, opset in (("torchscript", 17), ("dynamo", 20)):
            stem = f"torch_{exporter}_{name}"
            path = out / f"{stem}.onnx"
            try:
                with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    torch.onnx.export(module, (x,), str(path), input_names=["input"], output_names=["output"],
                                      opset_version=opset, dynamo=exporter == "dynamo", external_data=False)
            except Exception as err:  # the exporter cannot export it: recorded, not committed
                records[stem] = {"exporter": f"torch.onnx ({exporter})", "opset": opset,
                                 "not exported": f"{type(err).__name__}: {str(err).splitlines()[-1][:200]}"}
                print(stem, "NOT EXPORTED:", records[stem]["not exported"])
                path.unlink(missing_ok=True)
                continue
            model = onnx.load(str(path))
            _strip_doc(model, path)
            y = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
                None, {model.graph.input[0].name: x.numpy()})[0]
            data = {"input": x.numpy(), "output": y}
            data.update(_torch_gradients(module_64, x, params, model, y.shape))
            np.savez_compressed(out / f"{stem}.npz", **data)
            records[stem] = {"exporter": f"torch.onnx ({exporter})", "opset": opset, "framework": "torch",
                             "ops": sorted({n.op_type for n in model.graph.node})}
            print(stem, path.stat().st_size, "bytes")
    return records


def _double(module):
    import copy

    return copy.deepcopy(module).double()


def _strip_doc(model, path):
    """Drop doc strings (stack traces of the exporting machine), keep the file small."""
    import onnx

    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    model.graph.doc_string = ""
    onnx.save(model, str(path))


def _torch_gradients(module_64, x, params, model, out_shape) -> dict:
    """float64 gradients of sum(output * C) with respect to the input and the named parameters
    that appear as initializers of the ONNX model under the same name and shape."""
    import onnx.numpy_helper
    import torch

    rng = np.random.default_rng(SEED)
    c = rng.normal(size=out_shape)
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    named = dict(module_64.named_parameters())
    x64 = x.double().requires_grad_(True) if x.is_floating_point() else x
    out = module_64(x64)
    loss = (out * torch.from_numpy(c)).sum()
    values = {i.name: i for i in model.graph.initializer}
    # Only parameters the ONNX initializer of that name holds unchanged (the dynamo exporter folds
    # BatchNormalization into the convolution before it, under the convolution's name).
    wanted = [p for p in params if p in inits and inits[p] == tuple(named[p].shape)
              and np.allclose(onnx.numpy_helper.to_array(values[p]), named[p].detach().numpy(), rtol=1e-6)]
    tensors = ([x64] if x.is_floating_point() else []) + [named[p] for p in wanted]
    data = {"C": c}
    if not tensors:
        return data
    grads = torch.autograd.grad(loss, tensors)
    if x.is_floating_point():
        data["grad:input"] = grads[0].numpy()
        grads = grads[1:]
    for p, gp in zip(wanted, grads):
        data[f"grad:{p}"] = gp.numpy()
    return data


# ---------------------------------------------------------------------------
# jax2onnx models


def export_jax(out: pathlib.Path) -> dict:
    import jax
    import jax.numpy as jnp
    import onnx
    import onnxruntime
    from flax import nnx
    from jax2onnx import to_onnx

    jax.config.update("jax_enable_x64", True)
    rngs = nnx.Rngs(SEED)

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(20, 32, rngs=rngs)
            self.l2 = nnx.Linear(32, 10, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.gelu(self.l1(x)))

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
            self.ln = nnx.LayerNorm(8, rngs=rngs)
            self.c2 = nnx.Conv(8, 8, (3, 3), strides=(2, 2), rngs=rngs)
            self.head = nnx.Linear(8 * 4 * 4, 10, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.ln(self.c1(x)))
            h = nnx.relu(self.c2(h))
            return self.head(h.reshape(h.shape[0], -1))

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1 = nnx.LayerNorm(16, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(16, rngs=rngs)
            self.ff1 = nnx.Linear(16, 32, rngs=rngs)
            self.ff2 = nnx.Linear(32, 16, rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.ff2(nnx.gelu(self.ff1(self.ln2(x))))

    rng = np.random.default_rng(SEED)
    models = {"mlp": (MLP(rngs), rng.normal(size=(4, 20)).astype(np.float32)),
              "cnn": (CNN(rngs), rng.normal(size=(2, 8, 8, 1)).astype(np.float32)),
              "transformer_block": (Block(rngs), rng.normal(size=(2, 5, 16)).astype(np.float32))}
    records = {}
    for name, (module, x) in models.items():
        stem = f"jax2onnx_{name}"
        path = out / f"{stem}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = to_onnx(module, [jax.ShapeDtypeStruct(x.shape, jnp.float32)], opset=23, model_name=stem)
        onnx.save(model, str(path))
        _strip_doc(model, path)
        y = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {model.graph.input[0].name: x})[0]
        c = rng.normal(size=y.shape)
        graphdef, state = nnx.split(module)
        state64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), state)

        def loss(x64, graphdef=graphdef, state64=state64, c=c):
            return jnp.sum(nnx.merge(graphdef, state64)(x64) * c)

        grad = np.asarray(jax.grad(loss)(jnp.asarray(x, jnp.float64)))
        np.savez_compressed(out / f"{stem}.npz", input=x, output=y, C=c, **{"grad:input": grad})
        records[stem] = {"exporter": "jax2onnx", "opset": 23, "framework": "flax.nnx",
                         "ops": sorted({n.op_type for n in model.graph.node})}
        print(stem, path.stat().st_size, "bytes")
    return records


def export_light(out: pathlib.Path) -> dict:
    """ONNX Runtime's outputs for the onnx package's light_* model-zoo graphs (weights made by
    ConstantOfShape) on a fixed random input; the graphs themselves ship with onnx."""
    import onnx
    import onnxruntime

    folder = pathlib.Path(importlib.util.find_spec("onnx").origin).parent / "backend" / "test" / "data" / "light"
    records = {}
    for path in sorted(folder.glob("light_*.onnx")):
        rng = np.random.default_rng(SEED)  # the input: uniform [0, 1) from this seed, input by input
        model = onnx.load(str(path))
        inits = {i.name for i in model.graph.initializer}
        feeds = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.uniform(0, 1, size=shape).astype(np.float32)
        outputs = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        stem = path.stem
        np.savez_compressed(out / f"{stem}.npz", **{f"output:{i}": v for i, v in enumerate(outputs)})
        records[stem] = {"exporter": "onnx model zoo (light, in the onnx package)", "opset":
                         max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                         "ops": sorted({n.op_type for n in model.graph.node})}
        print(stem, "reference saved")
    return records


def main() -> None:
    out = HERE
    only = set(sys.argv[1:])
    records = {}
    versions_file = out / "versions.json"
    if versions_file.exists():
        records = json.loads(versions_file.read_text()).get("models", {})
    if not only or "torch" in only:
        records.update(export_torch(out))
    if not only or "jax" in only:
        records.update(export_jax(out))
    if not only or "light" in only:
        records.update(export_light(out))
    packages = ["torch", "torchvision", "transformers", "onnxscript", "jax2onnx", "jax", "flax", "onnx",
                "onnxruntime", "numpy"]
    versions = {p: importlib.metadata.version(p) for p in packages}
    versions_file.write_text(json.dumps({"packages": versions, "seed": SEED, "models": records}, indent=1,
                                        sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
