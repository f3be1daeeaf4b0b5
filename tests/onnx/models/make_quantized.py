"""Quantize an exported model to QDQ with ONNX Runtime's own tool, for tests/onnx/test_quantized.py.

``onnxruntime.quantization.quantize_static`` (QDQ format, its defaults: uint8 activations with zero
points, int8 weights, per tensor; calibrated on 16 random batches) turns
``tests/onnx/models/torch_torchscript_cnn.onnx`` (torch.onnx, TorchScript exporter) into
``quantized/ort_qdq_cnn.onnx``; ``quantized/ort_qdq_cnn.npz`` holds an input and ONNX Runtime's output
on it, and ``quantized/versions.json`` the versions. Needs onnxruntime (optkit's test extra); the files
are committed:

    python tests/onnx/models/make_quantized.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "quantized"


def main() -> None:
    import onnx
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    source = HERE / "torch_torchscript_cnn.onnx"
    model = onnx.load(str(source))
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(5)

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.left = [rng.normal(size=shape).astype(np.float32) for _ in range(16)]

        def get_next(self):
            return {name: self.left.pop()} if self.left else None

    OUT.mkdir(exist_ok=True)
    target = OUT / "ort_qdq_cnn.onnx"
    quantize_static(str(source), str(target), Batches(), quant_format=QuantFormat.QDQ)
    x = rng.normal(size=shape).astype(np.float32)
    session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    np.savez(OUT / "ort_qdq_cnn.npz", input=x, output=session.run(None, {name: x})[0])
    ops = sorted({n.op_type for n in onnx.load(str(target)).graph.node})
    (OUT / "versions.json").write_text(json.dumps(
        {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "source": source.name, "ops": ops},
        indent=1, sort_keys=True) + "\n")
    print(target, ops)


if __name__ == "__main__":
    main()
