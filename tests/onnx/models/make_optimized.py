"""Graphs that ONNX Runtime's transformer optimizer writes, for tests/onnx/files/test_optimized.py.

A tiny BERT (transformers' ``BertModel``: hidden 32, 4 heads, 2 layers, random weights) exported by torch.onnx's
TorchScript exporter at opset 17 with ``input_ids``, ``attention_mask`` and ``token_type_ids``, then fused by
``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`` into ``EmbedLayerNormalization``,
``Attention``, ``SkipLayerNormalization`` and ``BiasGelu`` (``optimized/ort_optimized_bert.onnx``), and that
model converted to float16 by the optimizer's ``convert_float_to_float16(keep_io_types=True)``
(``optimized/ort_optimized_bert_fp16.onnx``). ``<name>.npz`` holds a padded batch and ONNX Runtime's output on
it; ``versions.json`` the versions. The converter alone, ``onnxruntime.transformers.float16``'s
``convert_float_to_float16(keep_io_types=True)``, turns the torch.onnx (dynamo) MLP export into
``optimized/ort_fp16_mlp.onnx``: it appends the Casts of the float32 input at the end of the graph, an order
that ``onnx.checker`` refuses and ONNX Runtime sorts. The optimizer imports torch, which optkit does not depend
on: make the files in an environment with torch, transformers and onnxruntime::

    python tests/onnx/models/make_optimized.py
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "optimized"


def main() -> None:
    import onnx
    import onnxruntime
    import torch
    import transformers
    from onnxruntime.transformers import optimizer

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # random weights everywhere, norms and biases too (not the initializer's ones and zeros)
        for p in bert.parameters():
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.5))

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          return_dict=False)[0]

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (2, 8)).astype(np.int64)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    segments = np.zeros((2, 8), np.int64)
    segments[:, 4:] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}
    OUT.mkdir(exist_ok=True)
    made = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "bert.onnx"
        torch.onnx.export(Bert(), tuple(torch.from_numpy(v) for v in feeds.values()), str(source),
                          input_names=list(feeds), output_names=["last_hidden_state"],
                          dynamic_axes={k: {0: "batch", 1: "sequence"} for k in feeds}, opset_version=17,
                          dynamo=False)
        optimized = optimizer.optimize_model(str(source), model_type="bert", num_heads=4, hidden_size=32)
        onnx.save(optimized.model, str(OUT / "ort_optimized_bert.onnx"))
        optimized.convert_float_to_float16(keep_io_types=True)
        onnx.save(optimized.model, str(OUT / "ort_optimized_bert_fp16.onnx"))
    from onnxruntime.transformers.float16 import convert_float_to_float16

    mlp = convert_float_to_float16(onnx.load(str(HERE / "torch_dynamo_mlp.onnx")), keep_io_types=True)
    onnx.save(mlp, str(OUT / "ort_fp16_mlp.onnx"))
    x = rng.normal(size=(4, 64)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(OUT / "ort_fp16_mlp.onnx"), providers=["CPUExecutionProvider"])
    np.savez(OUT / "ort_fp16_mlp.npz", input=x, output=session.run(None, {mlp.graph.input[0].name: x})[0])
    made["ort_fp16_mlp"] = [n.op_type for n in mlp.graph.node]
    for name in ("ort_optimized_bert", "ort_optimized_bert_fp16"):
        path = OUT / f"{name}.onnx"
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (out,) = session.run(None, feeds)
        np.savez(OUT / f"{name}.npz", **feeds, output=out)
        model = onnx.load(str(path))
        made[name] = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node})
    (OUT / "versions.json").write_text(json.dumps(
        {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "torch": torch.__version__,
         "transformers": transformers.__version__, "ops": made}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(made, indent=1))


if __name__ == "__main__":
    main()
