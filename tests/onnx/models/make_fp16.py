"""Export float16 language models as users make them (torch ``model.half()``, then torch.onnx), into ``fp16/``.

A GPT-NeoX decoder from a tiny transformers config (hidden 64, 4 heads, 2 layers, vocabulary 256, rotary on a
quarter of each head; random weights, saved with ``save_pretrained`` and loaded back, nothing downloaded), in
float16, exported by torch.onnx's dynamo exporter (opset 20; the TorchScript exporter refuses the model's
``aten::diff``). For each
``fp16/<name>.onnx``, ``fp16/<name>.npz`` holds the token ids, ONNX Runtime's float16 logits and torch's float64
logits of the same (float16) weights: the true values that float16 arithmetic approximates. Run by hand, in the
environment of make_models.py (torch, transformers, onnxscript, onnxruntime); the files are committed:

    /tmp/export/bin/python tests/onnx/models/make_fp16.py
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import io
import json
import pathlib
import tempfile
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "fp16"
SEED = 29


def main() -> None:
    import onnx
    import onnxruntime
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=256, max_position_embeddings=64, rotary_pct=0.25,
                                        use_cache=False, initializer_range=0.2, hidden_act="gelu_new")
    with tempfile.TemporaryDirectory() as folder:
        transformers.GPTNeoXForCausalLM(config).save_pretrained(folder)
        model = transformers.GPTNeoXForCausalLM.from_pretrained(folder).eval()

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(SEED))
    half = Logits(copy.deepcopy(model)).half().eval()
    with torch.no_grad():  # the float16 weights, in float64 arithmetic
        truth = Logits(copy.deepcopy(model).half().double())(ids).numpy()
    OUT.mkdir(exist_ok=True)
    records = {}
    for exporter, opset in (("dynamo", 20),):  # (TorchScript's exporter has no aten::diff, which transformers 5's
        # GPT-NeoX mask code calls)
        stem = f"torch_{exporter}_gpt_neox_fp16"
        path = OUT / f"{stem}.onnx"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(half, (ids,), str(path), input_names=["input_ids"], output_names=["logits"],
                              opset_version=opset, dynamo=exporter == "dynamo", external_data=False)
        proto = onnx.load(str(path))
        proto.doc_string = ""
        for node in proto.graph.node:
            node.doc_string = ""
        onnx.save(proto, str(path))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (ort,) = session.run(None, {"input_ids": ids.numpy()})
        np.savez_compressed(OUT / f"{stem}.npz", input_ids=ids.numpy(), output=ort, float64=truth)
        records[stem] = {"exporter": f"torch.onnx ({exporter})", "opset": opset, "dtype": str(ort.dtype),
                         "ort_error_vs_float64": float(np.max(np.abs(ort.astype(np.float64) - truth))),
                         "ops": sorted({n.op_type for n in proto.graph.node})}
        print(stem, path.stat().st_size, "bytes", records[stem]["ort_error_vs_float64"])
    packages = {p: importlib.metadata.version(p) for p in ("torch", "transformers", "onnxscript", "onnx",
                                                           "onnxruntime", "numpy")}
    (OUT / "versions.json").write_text(json.dumps({"packages": packages, "seed": SEED, "models": records},
                                                  indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
