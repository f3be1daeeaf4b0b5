"""Helpers the ONNX area's test modules share: small ONNX models built by hand, external-data pointers."""

from __future__ import annotations

import numpy as np


def onnx_info(name, dtype, shape):
    """An ONNX tensor ValueInfo; ``dtype`` is an ONNX element type (``TensorProto.FLOAT``) or a NumPy dtype."""
    from onnx import helper

    elem_type = dtype if isinstance(dtype, int) else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem_type, shape)


def onnx_model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),), **kwargs):
    """An ONNX ModelProto of one graph ``g`` importing ``opsets`` (``(domain, version)`` pairs)."""
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], **kwargs)


def onnx_external(tensor, location, offset=None, length=None):
    """Point the TensorProto ``tensor`` at external data in ``location`` (its own bytes dropped); returns it."""
    from onnx import TensorProto

    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    return tensor
