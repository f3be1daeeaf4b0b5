"""Quantize an exported model to QDQ with ONNX Runtime's own tool, for tests/onnx/files/test_quantized.py.

``onnxruntime.quantization.quantize_static`` (QDQ format, its defaults: uint8 activations with zero
points, int8 weights, per tensor; calibrated on 16 random batches) turns
``tests/onnx/models/torch_torchscript_cnn.onnx`` (torch.onnx, TorchScript exporter) into
``quantized/ort_qdq_cnn.onnx``; ``quantized/ort_qdq_cnn.npz`` holds an input and ONNX Runtime's output
on it, and ``quantized/versions.json`` the versions. ``MatMulNBitsQuantizer`` (4-bit, block size 16,
asymmetric: uint8 zero points) turns the torch.onnx LLaMA (dynamo), BERT (TorchScript) and GPT-2 (dynamo)
exports into ``quantized/ort_int4_{llama,bert,gpt2}.onnx`` (every MatMul with a weight initializer becomes a
com.microsoft ``MatMulNBits``; GPT-2's ``Gemm`` layers stay float, only its head is 4-bit), with ONNX Runtime's
outputs in the ``.npz`` of the same name. ``quantize_dynamic`` (its defaults: int8 weights per tensor, each
MatMul's activation through ``DynamicQuantizeLinear`` into ``MatMulInteger``) turns the LLaMA (dynamo), GPT-2
(dynamo) and BERT (TorchScript) exports, and onnxruntime-genai's builder's Phi-3 (``genai/phi3_fp32``), into
``quantized/ort_int8_{llama,gpt2,bert,phi3}.onnx``, likewise with ONNX Runtime's outputs; ``quantize_static``
in the QDQ format turns the LLaMA export into ``quantized/ort_qdq_llama.onnx``.
Needs onnxruntime (optkit's test extra) and, for the int4 files, ``onnx_ir``; the files are committed:

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
    int4 = {name: _int4(name, source) for name, source in (("llama", "torch_dynamo_llama"),
                                                           ("bert", "torch_torchscript_bert"),
                                                           ("gpt2", "torch_dynamo_gpt2"))}
    int8 = {name: _int8(name, source) for name, source in (("llama", "torch_dynamo_llama"),
                                                           ("gpt2", "torch_dynamo_gpt2"),
                                                           ("bert", "torch_torchscript_bert"))}
    int8["phi3"] = _int8_genai("phi3", "phi3_fp32")
    qdq = {"llama": _qdq_llama()}
    (OUT / "versions.json").write_text(json.dumps(
        {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "source": source.name, "ops": ops,
         "int4": int4, "int8": int8, "qdq": qdq}, indent=1, sort_keys=True) + "\n")
    print(target, ops, int4, int8)


def _save_outputs(target: pathlib.Path, source: str):
    """ONNX Runtime's outputs of ``target`` on ``<source>.npz``'s saved input, written to ``target``'s ``.npz``
    with that input; returns the ``onnx.ModelProto`` of ``target``."""
    import onnx
    import onnxruntime

    model = onnx.load(str(target))
    saved = np.load(HERE / f"{source}.npz")
    feeds = {i.name: saved[i.name] for i in model.graph.input if i.name in saved}
    if not feeds:  # one-input exports save it as "input"
        feeds = {model.graph.input[0].name: saved["input"]}
    session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    np.savez(target.with_suffix(".npz"), **feeds, **{f"output:{o.name}": v
                                                     for o, v in zip(model.graph.output, outputs)})
    return model


def _int8(name: str, source: str) -> dict:
    """``quantized/ort_int8_<name>.onnx`` from ``<source>.onnx`` by ``quantize_dynamic`` (its defaults), and
    ONNX Runtime's outputs on the source's saved input."""
    from onnxruntime.quantization import quantize_dynamic

    target = OUT / f"ort_int8_{name}.onnx"
    quantize_dynamic(str(HERE / f"{source}.onnx"), str(target))
    model = _save_outputs(target, source)
    return {"source": f"{source}.onnx", "weight_type": "QInt8", "per_channel": False,
            "MatMulInteger": sum(n.op_type == "MatMulInteger" for n in model.graph.node)}


def _qdq_llama() -> dict:
    """``quantized/ort_qdq_llama.onnx``: the torch.onnx LLaMA (dynamo) by ``quantize_static`` in the QDQ format
    (its defaults; calibrated on 8 random batches of token ids), and ONNX Runtime's outputs on the source's saved
    input."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(6)

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.left = [{"input": rng.integers(0, 100, (2, 8)).astype(np.int64)} for _ in range(8)]

        def get_next(self):
            return self.left.pop() if self.left else None

    target = OUT / "ort_qdq_llama.onnx"
    quantize_static(str(HERE / "torch_dynamo_llama.onnx"), str(target), Batches(), quant_format=QuantFormat.QDQ)
    _save_outputs(target, "torch_dynamo_llama")
    model = onnx.load(str(target))
    return {"source": "torch_dynamo_llama.onnx", "format": "QDQ", "calibration": "8 random batches of (2, 8) ids",
            "DequantizeLinear": sum(n.op_type == "DequantizeLinear" for n in model.graph.node)}


def _int8_genai(name: str, folder: str) -> dict:
    """``quantized/ort_int8_<name>.onnx`` from onnxruntime-genai's builder folder ``genai/<folder>`` (its
    ``model.onnx`` and external data) by ``quantize_dynamic`` (its defaults), and ONNX Runtime's outputs (the
    prefill step) on the folder's saved feeds (``outputs.npz``'s ``feeds:*``)."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import quantize_dynamic

    target = OUT / f"ort_int8_{name}.onnx"
    quantize_dynamic(str(HERE / "genai" / folder / "model.onnx"), str(target))
    model = onnx.load(str(target))
    saved = np.load(HERE / "genai" / folder / "outputs.npz")
    feeds = {i.name: saved[f"feeds:{i.name}"] for i in model.graph.input}
    session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    np.savez(target.with_suffix(".npz"), **feeds, **{f"output:{o.name}": v
                                                     for o, v in zip(model.graph.output, session.run(None, feeds))})
    return {"source": f"genai/{folder}/model.onnx", "weight_type": "QInt8", "per_channel": False,
            "MatMulInteger": sum(n.op_type == "MatMulInteger" for n in model.graph.node)}


def _int4(name: str, source: str) -> dict:
    """``quantized/ort_int4_<name>.onnx`` from ``<source>.onnx`` by MatMulNBitsQuantizer, and ONNX Runtime's
    outputs on the source's saved input."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(HERE / f"{source}.onnx")), block_size=16, is_symmetric=False)
    quantizer.process()
    model = quantizer.model.model
    target = OUT / f"ort_int4_{name}.onnx"
    onnx.save(model, str(target))
    _save_outputs(target, source)
    return {"source": f"{source}.onnx", "block_size": 16, "bits": 4,
            "MatMulNBits": sum(n.op_type == "MatMulNBits" for n in model.graph.node)}


if __name__ == "__main__":
    main()
