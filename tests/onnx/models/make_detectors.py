"""Export the detector family that tests/onnx/files/test_detectors.py runs: whole detectors with their post-processing.

Small models with random weights (nothing downloaded), written by torch.onnx's TorchScript exporter (opset 17), the
exporter torchvision documents for its detection models:

- ``ssdlite``: torchvision's ``SSD`` with its ``SSDLiteHead``, ``DefaultBoxGenerator`` and transform (resize and
  normalize), on a MobileNetV3-Large backbone at ``width_mult=0.25`` cut to two feature maps plus one extra block;
- ``retinanet``: torchvision's ``RetinaNet`` (its head, ``AnchorGenerator``, per-level top-k and ``batched_nms``) on
  a small convolutional backbone with torchvision's ``FeaturePyramidNetwork``;
- ``maskrcnn``: torchvision's ``MaskRCNN`` (region proposals, ``MultiScaleRoIAlign`` box and mask heads, masks
  pasted into the image by a ``Loop``) on the same kind of backbone;
- ``yolo``: a YOLO-style single-stage detector written here: a grid of (box, objectness, classes) predictions,
  decoded to corners, scored, and filtered by ``torchvision.ops.batched_nms`` (ONNX ``NonMaxSuppression``).

Each takes one image (3, H, W) with values in [0, 1]. For each ``<name>.onnx`` the script saves ``<name>.npz``
with the image, ONNX Runtime's outputs (``output:<i>``) and ONNX Runtime's values of the named head outputs that
sit before the post-processing (``head:<value name>``; the differentiable part that ``to_jax(model,
outputs=[...])`` cuts out), and ``versions.json`` records the versions. The head weights are drawn wider than
torchvision's initialization so that scores differ between boxes (no ties for top-k and NMS to order).

Run by hand (it needs torch, torchvision and onnxruntime, none of which optkit depends on); the files are
committed::

    python -m venv /tmp/export && /tmp/export/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxruntime
    /tmp/export/bin/python tests/onnx/models/make_detectors.py        # about a minute
"""

from __future__ import annotations

import collections
import importlib.metadata
import io
import json
import pathlib
import warnings
from functools import partial

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent / "detectors"
SEED = 46


def _randomize(model, g, head_scale):
    """Eval mode; every parameter moved by 0.05 N(0, 1), the head's by ``head_scale`` N(0, 1) more, BatchNorm
    statistics drawn."""
    import torch
    from torch import nn

    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((0.05 + (head_scale if "head" in name else 0.0)) * torch.randn(p.shape, generator=g))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
    return model


def _small_backbone(out_channels):
    """Three stride-2 convolution stages and torchvision's FPN on them: ``OrderedDict`` of two feature maps."""
    from torch import nn
    from torchvision.ops import FeaturePyramidNetwork

    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU())
            self.c3 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
            self.c4 = nn.Sequential(nn.Conv2d(16, 24, 3, 2, 1), nn.BatchNorm2d(24), nn.ReLU())
            self.fpn = FeaturePyramidNetwork([16, 24], out_channels)
            self.out_channels = out_channels

        def forward(self, x):
            c3 = self.c3(self.stem(x))
            return self.fpn(collections.OrderedDict([("0", c3), ("1", self.c4(c3))]))

    return Backbone()


def ssdlite():
    from torch import nn
    from torchvision.models import mobilenet_v3_large
    from torchvision.models.detection import _utils as det_utils
    from torchvision.models.detection import ssdlite as lite
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
    from torchvision.models.detection.ssd import SSD

    norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            f = mobilenet_v3_large(weights=None, norm_layer=norm, reduced_tail=True, width_mult=0.25).features
            self.a, self.b = f[:7], f[7:13]
            self.c = nn.Sequential(nn.Conv2d(f[12].out_channels, 32, 3, 2, 1), nn.ReLU6())

        def forward(self, x):
            a = self.a(x)
            b = self.b(a)
            return collections.OrderedDict([("0", a), ("1", b), ("2", self.c(b))])

    backbone = Tiny()
    anchors = DefaultBoxGenerator([[2, 3] for _ in range(3)], min_ratio=0.2, max_ratio=0.95)
    channels = det_utils.retrieve_out_channels(backbone, (96, 96))
    head = lite.SSDLiteHead(channels, anchors.num_anchors_per_location(), 3, norm)
    model = SSD(backbone, anchors, (96, 96), 3, head=head, score_thresh=0.001, nms_thresh=0.55,
                detections_per_img=20, topk_candidates=50, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    heads = ["/head/regression_head/Concat_6_output_0", "/head/classification_head/Concat_6_output_0"]
    return model, (3, 80, 96), 0.3, heads


def retinanet():
    from torchvision.models.detection import RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    anchors = AnchorGenerator(((16,), (32,)), ((0.5, 1.0, 2.0),) * 2)
    model = RetinaNet(_small_backbone(16), 3, min_size=64, max_size=96, anchor_generator=anchors,
                      score_thresh=0.05, detections_per_img=20, topk_candidates=40)
    return model, (3, 64, 80), 0.1, None


def maskrcnn():
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    from torchvision.ops import MultiScaleRoIAlign

    anchors = AnchorGenerator(((16,), (32,)), ((0.5, 1.0, 2.0),) * 2)
    model = MaskRCNN(_small_backbone(16), None, min_size=64, max_size=96, rpn_anchor_generator=anchors,
                     box_roi_pool=MultiScaleRoIAlign(["0", "1"], 7, 2),
                     mask_roi_pool=MultiScaleRoIAlign(["0", "1"], 14, 2),
                     mask_head=MaskRCNNHeads(16, [16, 16], 1), mask_predictor=MaskRCNNPredictor(16, 16, 3),
                     rpn_pre_nms_top_n_test=60, rpn_post_nms_top_n_test=30, box_detections_per_img=10,
                     box_score_thresh=0.05, box_head=TwoMLPHead(16 * 7 * 7, 32), box_predictor=FastRCNNPredictor(32, 3))
    return model, (3, 64, 80), 0.1, None


def yolo():
    import torch
    import torchvision
    from torch import nn

    class Yolo(nn.Module):
        """A stride-8 grid of 2 anchors x (x, y, w, h, objectness, 3 classes), decoded as YOLOv3 does, scored
        objectness x class, filtered at 0.25 and by class-wise NMS at IoU 0.45."""

        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.SiLU(),
                                      nn.Conv2d(8, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(),
                                      nn.Conv2d(16, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU())
            self.head = nn.Conv2d(16, 2 * 8, 1)
            self.register_buffer("anchors", torch.tensor([[10.0, 14.0], [23.0, 27.0]]))

        def forward(self, image):
            p = self.head(self.body(image[None]))
            n, _, h, w = p.shape
            p = p.view(n, 2, 8, h, w).permute(0, 1, 3, 4, 2)  # (1, anchors, h, w, 8)
            ys, xs = torch.meshgrid(torch.arange(h, dtype=p.dtype), torch.arange(w, dtype=p.dtype), indexing="ij")
            cx = (torch.sigmoid(p[..., 0]) + xs) * 8.0
            cy = (torch.sigmoid(p[..., 1]) + ys) * 8.0
            bw = torch.exp(p[..., 2]) * self.anchors[:, 0].view(1, 2, 1, 1)
            bh = torch.exp(p[..., 3]) * self.anchors[:, 1].view(1, 2, 1, 1)
            boxes = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1).reshape(-1, 4)
            scores = (torch.sigmoid(p[..., 4:5]) * torch.sigmoid(p[..., 5:])).reshape(-1, 3)
            best, labels = scores.max(-1)
            keep = best > 0.25
            boxes, best, labels = boxes[keep], best[keep], labels[keep]
            kept = torchvision.ops.batched_nms(boxes, best, labels, 0.45)
            return boxes[kept], best[kept], labels[kept]

    return Yolo(), (3, 64, 64), 0.5, ["/head/Conv_output_0"]


MODELS = {"ssdlite": ssdlite, "retinanet": retinanet, "maskrcnn": maskrcnn, "yolo": yolo}


def _with_outputs(model_bytes: bytes, names) -> bytes:
    """The model with ``names`` added as graph outputs (ONNX Runtime returns a value only if it is one)."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    return model.SerializeToString()


def export(name: str, g) -> dict:
    import onnx
    import onnxruntime
    import torch

    model, shape, head_scale, heads = MODELS[name]()
    _randomize(model, g, head_scale)
    image = torch.rand(shape, generator=g)
    with torch.no_grad():
        model([image]) if name != "yolo" else model(image)  # noqa: B018 (the eager run checks the model runs)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([image],) if name != "yolo" else (image,), buffer, opset_version=17,
                          dynamo=False, input_names=["image"])
    data = buffer.getvalue()
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {"image": image.numpy()}
    saved = {"image": image.numpy()}
    saved.update({f"output:{i}": v for i, v in enumerate(session.run(None, feeds))})
    if heads:
        extended = onnxruntime.InferenceSession(_with_outputs(data, heads), providers=["CPUExecutionProvider"])
        values = dict(zip([o.name for o in extended.get_outputs()], extended.run(None, feeds)))
        saved.update({f"head:{h}": values[h] for h in heads})
    (HERE / f"{name}.onnx").write_bytes(data)
    np.savez(HERE / f"{name}.npz", **saved)
    ops = sorted({n.op_type for n in onnx.load_from_string(data).graph.node})
    print(name, len(data), "bytes;", [np.shape(v) for k, v in saved.items() if k.startswith("output:")])
    return {"exporter": "torch.onnx (TorchScript, dynamo=False)", "opset": 17, "ops": ops}


def main() -> None:
    import torch

    HERE.mkdir(exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    records = {name: export(name, g) for name in MODELS}
    packages = {p: importlib.metadata.version(p) for p in ("torch", "torchvision", "onnx", "onnxruntime", "numpy")}
    (HERE / "versions.json").write_text(json.dumps({"packages": packages, "seed": SEED, "models": records},
                                                   indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
