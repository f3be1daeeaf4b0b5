"""TfIdfVectorizer (optkit/onnx/_ops/text.py) and STFT (algebra.py) against ONNX Runtime.
"""


import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64



@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("jit", [True, False])
def test_tfidf_vectorizer_matches_onnx_runtime_in_every_mode(mode, jit):
    """ONNX's node cases cover TF without weights; here IDF and TFIDF with weights, 1- to 3-grams with skips,
    int64 and int32 token ids, against ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    # unigrams 4 7 9; bigrams (4 7) (7 9) (1 4); the trigram (4 7 9); each to its own output column
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2, ngram_counts=[0, 3, 9],
                 pool_int64s=[4, 7, 9, 4, 7, 7, 9, 1, 4, 4, 7, 9], ngram_indexes=[5, 0, 1, 2, 3, 4, 6],
                 weights=[0.5, 2.0, 1.5, 0.25, 3.0, 1.0, 0.75])
    rng = np.random.default_rng(9)
    for dtype, shape in ((np.int64, (2, 17)), (np.int32, (23,))):
        x = rng.choice([1, 4, 7, 9, 11], size=shape).astype(dtype)
        model = helper.make_model(helper.make_graph(
            [helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], "g", [_info("x", dtype, list(shape))],
            [_info("y", np.float32, [*shape[:-1], 7])]), opset_imports=[helper.make_opsetid("", 17)])
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = optkit.onnx.prepare(model, jit=jit).run([x])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        assert want[0].shape[-1] == 7 and np.any(want[0])


def test_stft_of_a_2d_real_signal_matches_onnx_runtime():
    """torch's TorchScript export of torch.stft feeds STFT a (batch, length) signal, which ONNX Runtime runs as
    (batch, length, 1); so does optkit."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import numpy_helper

    x = np.random.default_rng(0).normal(size=(2, 32)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(4, np.int64), "step"),
             numpy_helper.from_array(np.hanning(8).astype(np.float32), "win")]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("STFT", ["x", "step", "win"], ["y"], onesided=1)], "g", [_info("x", np.float32, [2, 32])],
        [_info("y", np.float32, [2, 7, 5, 2])], initializer=inits), opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for jit in (True, False):
        np.testing.assert_allclose(optkit.onnx.prepare(model, jit=jit).run([x])[0], want, rtol=1e-5, atol=1e-5)
