"""Helpers the test modules share: float64 mode, random arrays and gradients, small ONNX models.

One place for each, so that a test module holds its own expectations only. The
per-algorithm modules' trajectories (a gradient sequence, the optimizer and
its oracle run over it) are in ``tests/trajectories.py``; the independent
expectations themselves in ``tests/oracles.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def x64():
    """Every test of the module that imports this fixture runs with ``jax.enable_x64``."""
    with jax.enable_x64(True):
        yield


def rng_arrays(seed, *shapes, dtype=np.float32):
    """Standard-normal NumPy arrays of ``shapes``, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def random_grads(params, seed, dtype=None):
    """Standard-normal gradients shaped like ``params`` (each leaf's dtype, or ``dtype``)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(np.shape(p)), dtype or p.dtype), params)


def sin_grads(tree, t):
    """Smooth, step-dependent gradients ``sin(3 p + t) + 0.1 t``, in each leaf's dtype (computed in float32)."""
    return jax.tree.map(lambda p: (jnp.sin(p.astype(jnp.float32) * 3.0 + t) + 0.1 * t).astype(p.dtype), tree)


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
