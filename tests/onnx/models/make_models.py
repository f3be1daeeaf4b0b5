"""Export the real-exporter model set that tests/onnx/files/test_models.py runs (issue 23).

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
    /tmp/export/bin/python tests/onnx/models/make_models.py            # about 2 minutes
    /tmp/export/bin/python tests/onnx/models/make_models.py families   # only the families of issue 32
    /tmp/export/bin/python tests/onnx/models/make_models.py bags       # only the EmbeddingBag exports (bags/)

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
        _randomize(module, g)
    return models


def _randomize(module, g):
    """Eval mode; every parameter moved by 0.05 N(0, 1) so that no two are equal (exporters merge equal
    initializers: LayerNorm's ones), BatchNorm statistics drawn."""
    import torch
    from torch import nn

    module.eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)


def export_torch(out: pathlib.Path, models=None) -> dict:
    """Each model by each of its ``(exporter, opset)`` (default: TorchScript at 17 and dynamo at 20)."""
    import onnx
    import onnxruntime
    import torch

    records = {}
    models = {name: (*value, (("torchscript", 17), ("dynamo", 20))) for name, value in torch_models().items()} \
        if models is None else models
    for name, (module, x, params, exporters) in models.items():
        module_64 = _double(module)
        for exporter, opset in exporters:
            stem = f"torch_{exporter}_{name}" + (f"_opset{opset}" if opset not in (17, 20) else "")
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


def export_bags(out: pathlib.Path) -> dict:
    """A DLRM-style ``nn.EmbeddingBag`` (sum of each bag's rows, then a Linear) by both exporters, into ``bags/``:
    TorchScript writes a ``Loop`` whose ``Slice`` ends are read from the offsets, dynamo a ``Loop`` that grows a
    sequence (``SequenceEmpty``, ``ConcatFromSequence``). Inputs ``idx`` (int64 token ids) and ``off`` (int64
    bag starts); the ``.npz`` holds them, ONNX Runtime's output and torch's."""
    import onnx
    import onnxruntime
    import torch

    class Bags(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bag, self.head = torch.nn.EmbeddingBag(20, 4, mode="sum"), torch.nn.Linear(4, 2)

        def forward(self, idx, off):
            return self.head(self.bag(idx, off))

    torch.manual_seed(SEED)
    module = Bags().eval()
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 19, 0]), torch.tensor([0, 3, 5, 9])
    (out / "bags").mkdir(exist_ok=True)
    records = {}
    for exporter in ("torchscript", "dynamo"):
        stem = f"torch_{exporter}_embedding_bag"
        path = out / "bags" / f"{stem}.onnx"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            kwargs = {"dynamic_axes": {"idx": [0], "off": [0]}} if exporter == "torchscript" else {}
            torch.onnx.export(module, (idx, off), str(path), input_names=["idx", "off"], output_names=["output"],
                              opset_version=17 if exporter == "torchscript" else 20, dynamo=exporter == "dynamo",
                              external_data=False, **kwargs)
        model = onnx.load(str(path))
        _strip_doc(model, path)
        feeds = {"idx": idx.numpy(), "off": off.numpy()}
        y = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.savez_compressed(out / "bags" / f"{stem}.npz", **feeds, output=y,
                            torch_output=module(idx, off).detach().numpy())
        records[f"bags/{stem}"] = {"exporter": f"torch.onnx ({exporter})", "framework": "torch",
                                   "ops": sorted({n.op_type for n in model.graph.node})}
        print(stem, path.stat().st_size, "bytes")
    return records


def family_models():
    """The families users fine-tune after classifiers (issue 32), small with random weights: name -> (module,
    example input, names of parameters whose gradients are saved, ((exporter, opset), ...))."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    _import_torchvision()  # transformers imports torchvision: its C++ operators stubbed first
    import transformers

    torch.manual_seed(SEED + 1)
    g = torch.Generator().manual_seed(SEED + 1)

    class Segmenter(nn.Module):
        """LR-ASPP's layout, small: a strided encoder, a squeeze-and-excitation gate on the deep features, a
        1x1 head, bilinear upsampling to the shallow features' size plus their 1x1 projection, and bilinear
        upsampling to the input's size (Resize)."""

        def __init__(self):
            super().__init__()
            self.stage1 = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.stage2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.Hardswish())
            self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 16, 1), nn.Sigmoid())
            self.head, self.low = nn.Conv2d(16, 4, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            f1 = self.stage1(x)
            f2 = self.stage2(f1)
            y = F.interpolate(self.head(f2 * self.gate(f2)), size=f1.shape[-2:], mode="bilinear", align_corners=False)
            return F.interpolate(y + self.low(f1), size=x.shape[-2:], mode="bilinear", align_corners=False)

    class Detector(nn.Module):
        """An SSD head with its post-processing: box regression and class scores per anchor, SSD's center-size
        decoding (variances 0.1 and 0.2), the best foreground class, and the 10 highest-scoring boxes (TopK,
        GatherElements). torchvision's NMS is not in it: the PyPI torchvision's C++ operators do not load with
        this torch (the NonMaxSuppression operator is checked by ONNX's node cases)."""

        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                          nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            self.loc, self.cls = nn.Conv2d(16, 2 * 4, 3, padding=1), nn.Conv2d(16, 2 * 3, 3, padding=1)
            centers = (torch.arange(4, dtype=torch.float32) + 0.5) / 4
            cy, cx = torch.meshgrid(centers, centers, indexing="ij")
            anchors = [torch.stack([cx, cy, torch.full_like(cx, s), torch.full_like(cx, s)], -1) for s in (0.3, 0.6)]
            self.register_buffer("anchors", torch.stack(anchors, 2).reshape(-1, 4))

        def forward(self, x):
            f = self.backbone(x)
            n = x.shape[0]
            loc = self.loc(f).permute(0, 2, 3, 1).reshape(n, -1, 4)
            scores = self.cls(f).permute(0, 2, 3, 1).reshape(n, -1, 3).softmax(-1)
            centre = self.anchors[:, :2] + 0.1 * loc[..., :2] * self.anchors[:, 2:]
            size = self.anchors[:, 2:] * torch.exp(0.2 * loc[..., 2:])
            boxes = torch.cat([centre - size / 2, centre + size / 2], -1)
            best = scores[..., 1:].max(-1).values
            top, index = best.topk(10, dim=1)
            picked = torch.gather(boxes, 1, index.unsqueeze(-1).expand(-1, -1, 4))
            return torch.cat([picked, top.unsqueeze(-1)], -1)

    class Gated(nn.Module):
        """``torch.cond`` on a computed condition (the dynamo exporter writes an If)."""

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(12, 16), nn.Linear(16, 4), nn.Linear(16, 4)

        def forward(self, x):
            h = self.fc1(x)
            return torch.cond(h.mean() > 0, lambda h: torch.relu(self.fc2(h)), lambda h: torch.tanh(self.fc3(h)),
                              (h,))

    class WindowAttention(nn.Module):
        """Swin's window attention, small: 2x2 patches, 4x4 windows partitioned and merged back by
        reshape and transpose, multi-head attention inside each window with a learned relative bias."""

        def __init__(self, heads=2, window=4):
            super().__init__()
            self.heads, self.window = heads, window
            self.embed, self.norm = nn.Conv2d(3, 16, 2, stride=2), nn.LayerNorm(16)
            self.qkv, self.proj, self.head = nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(16, 10)
            self.bias = nn.Parameter(torch.zeros(heads, window * window, window * window))

        def forward(self, x):
            h = self.embed(x).permute(0, 2, 3, 1)
            n, rows, cols, c = h.shape
            w = self.window
            win = h.reshape(n, rows // w, w, cols // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
            qkv = self.qkv(self.norm(win)).reshape(win.shape[0], w * w, 3, self.heads, c // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5 + self.bias
            out = self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(win.shape[0], w * w, c)) + win
            out = out.reshape(n, rows // w, cols // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(n, rows, cols, c)
            return self.head(out.mean((1, 2)))

    class SuperResolution(nn.Module):
        """ESPCN: convolutions, then PixelShuffle (DepthToSpace) to twice the resolution."""

        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.Tanh(), nn.Conv2d(16, 8, 3, padding=1),
                                      nn.Tanh(), nn.Conv2d(8, 4, 3, padding=1), nn.PixelShuffle(2))

        def forward(self, x):
            return self.body(x)

    class Hidden(nn.Module):
        """A transformers model's first output (logits, or the decoder's last hidden state for a fixed prompt)."""

        def __init__(self, model, decoder_ids=None):
            super().__init__()
            self.model = model
            if decoder_ids is not None:
                self.register_buffer("decoder_ids", decoder_ids)

        def forward(self, x):
            if hasattr(self, "decoder_ids"):
                return self.model(input_features=x, decoder_input_ids=self.decoder_ids.expand(x.shape[0], -1),
                                  use_cache=False, return_dict=False)[0]
            return self.model(x, use_cache=False, return_dict=False)[0]

    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32))
    whisper = transformers.WhisperModel(transformers.WhisperConfig(
        vocab_size=100, num_mel_bins=8, encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))
    torchscript, dynamo = ("torchscript", 17), ("dynamo", 20)
    models = {
        "segmentation": (Segmenter(), torch.randn(2, 3, 16, 16, generator=g), ["head.weight", "low.bias"],
                         (torchscript, dynamo)),
        "detection": (Detector(), torch.randn(2, 3, 16, 16, generator=g), ["loc.weight", "cls.bias"],
                      (torchscript,)),
        "llama": (Hidden(llama), torch.randint(0, 100, (2, 8), generator=g), ["model.model.norm.weight"],
                  (dynamo, ("dynamo", 23))),
        "whisper": (Hidden(whisper, torch.tensor([[1, 5, 7, 3]])), torch.randn(2, 8, 32, generator=g),
                    ["model.encoder.conv1.weight"], (dynamo,)),
        "cond": (Gated(), torch.randn(3, 12, generator=g), ["fc1.weight", "fc2.bias"], (dynamo,)),
        "window_attention": (WindowAttention(), torch.randn(2, 3, 16, 16, generator=g), ["bias", "qkv.weight"],
                             (torchscript,)),
        "super_resolution": (SuperResolution(), torch.randn(1, 1, 8, 8, generator=g), ["body.0.weight"],
                             (torchscript, dynamo)),
    }
    for module, _, _, _ in models.values():
        _randomize(module, g)
    return models


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
    records, versions = {}, {}
    versions_file = out / "versions.json"
    if versions_file.exists():
        records = json.loads(versions_file.read_text()).get("models", {})
        versions = json.loads(versions_file.read_text()).get("packages", {})
    if not only or "torch" in only:
        records.update(export_torch(out))
    if not only or "jax" in only:
        records.update(export_jax(out))
    if not only or "light" in only:
        records.update(export_light(out))
    if not only or "families" in only:
        records.update(export_torch(out, family_models()))
    if not only or "bags" in only:
        records.update(export_bags(out))
    packages = ["torch", "torchvision", "transformers", "onnxscript", "jax2onnx", "jax", "flax", "onnx",
                "onnxruntime", "numpy"]
    for p in packages:  # a package this run did not need keeps the version recorded before
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    versions_file.write_text(json.dumps({"packages": versions, "seed": SEED, "models": records}, indent=1,
                                        sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
