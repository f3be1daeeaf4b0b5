"""Images: ONNX's ``ImageDecoder`` (opset 20), decoding an encoded image (JPEG, PNG, BMP, TIFF, WebP, JPEG 2000,
PNM) into a (height, width, 3) RGB or BGR, or (height, width, 1) grayscale, uint8 tensor.

Decoded on the host by Pillow, the library ONNX's reference implementation decodes with: the encoded bytes are
known before running (a graph input feeding it is static: one compile per image; computed from values, the node
runs between ``prepare``'s compiled segments). The decoded size is bounded by ``max_tensor_bytes`` before Pillow
decodes the pixels (Pillow reads the size from the header). Checked against ONNX's node cases
(tests/onnx/ops/test_backend.py; their expected images are Pillow's, through ONNX's reference implementation) and PNGs
of known pixels (tests/onnx/ops/test_image.py); ONNX Runtime 1.32 does not implement ``ImageDecoder``.
"""

from __future__ import annotations

import io

import numpy as np

from optkit.onnx._ops._registry import Family

OPS = Family("image")


@OPS.op("ImageDecoder", 20, static_inputs=(0,))
def _image_decoder(ctx):
    pixel_format = ctx.attrs.get("pixel_format", "RGB")
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise ctx.error(f"pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}")

    def image_decoder(encoded_stream):
        try:
            import PIL.Image
        except ImportError:
            raise ctx.unsupported("decoding images needs Pillow (pip install pillow)") from None
        data = np.asarray(encoded_stream)
        if data.dtype != np.uint8 or data.ndim != 1:
            raise ctx.error(f"encoded_stream must be 1-D uint8 bytes, got {data.dtype}{list(data.shape)}")
        failures = (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError)
        try:
            image = PIL.Image.open(io.BytesIO(data.tobytes()))
            width, height = image.size
        except failures as err:
            raise ctx.error(f"cannot decode the image ({len(data)} bytes): {err}") from None
        ctx.check_size((height, width, 1 if pixel_format == "Grayscale" else 3), np.uint8, "the decoded image")
        try:
            image.load()
            pixels = np.asarray(image.convert("L" if pixel_format == "Grayscale" else "RGB"))
        except failures as err:
            raise ctx.error(f"cannot decode the image ({len(data)} bytes): {err}") from None
        if pixel_format == "Grayscale":
            return np.ascontiguousarray(pixels[:, :, None])
        return np.ascontiguousarray(pixels[:, :, ::-1] if pixel_format == "BGR" else pixels)

    return image_decoder
