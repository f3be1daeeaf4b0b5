"""ImageDecoder (optkit/onnx/_ops/image.py): the pixels of PNG bytes, on the host, feeding a compiled graph.
"""


import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64



def _image_model(pixel_format="RGB", then=()):
    nodes = [helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=pixel_format), *then]
    outputs = [_info("image", np.uint8, ["h", "w", "c"])] + [_info(n.output[0], np.float32, []) for n in then[-1:]]
    return helper.make_model(helper.make_graph(nodes, "g", [_info("data", np.uint8, ["n"])], outputs),
                             opset_imports=[helper.make_opsetid("", 20)])


def _png(pixels):
    import io

    import PIL.Image

    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="PNG")
    return np.frombuffer(out.getvalue(), np.uint8)


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder_gives_the_pixels_and_feeds_a_compiled_graph(pixel_format):
    """A PNG of known pixels decoded (the pixels back, in each format; grayscale by ITU-R 601-2 luma, as Pillow and
    ONNX's reference do), then cast and averaged in the compiled part; one compile per image."""
    pytest.importorskip("PIL")
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    then = [helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["f"], ["mean"], keepdims=0)]
    rep = optkit.onnx.prepare(_image_model(pixel_format, then))
    image, mean = rep.run([_png(pixels)])
    want = {"RGB": pixels, "BGR": pixels[:, :, ::-1],
            "Grayscale": ((pixels.astype(np.int64) @ [19595, 38470, 7471] + 32768) >> 16).astype(np.uint8)[..., None]}
    np.testing.assert_array_equal(image, want[pixel_format])
    np.testing.assert_allclose(mean, want[pixel_format].mean(), rtol=1e-6)
    rep.run([_png(pixels[:3])])
    assert len(rep._functions) == 2


def test_image_decoder_refuses_bad_bytes_and_oversized_images_by_name():
    pytest.importorskip("PIL")
    with pytest.raises(ValueError, match=r"ImageDecoder.*cannot decode the image \(4 bytes\)"):
        optkit.onnx.prepare(_image_model()).run([np.array([1, 2, 3, 4], np.uint8)])
    big = _png(np.zeros((300, 400, 3), np.uint8))
    with pytest.raises(optkit.onnx.TensorTooLargeError, match="the decoded image"):
        optkit.onnx.prepare(_image_model(), max_tensor_bytes=100_000).run([big])
