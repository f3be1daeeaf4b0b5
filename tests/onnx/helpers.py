"""Helpers the ONNX area's test modules share: small ONNX models built by hand, external-data pointers, and the
check of a node's gradient against float64 central differences."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

# tests/onnx: its models/ (the committed fixtures and the scripts that make them) and the case lists
ONNX_TESTS = pathlib.Path(__file__).parent


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


def assert_gradients_match_central_differences(fn, args, floats, seed=1, step=1e-6, rtol=1e-6):
    """``fn(*args.values())``'s weighted sum differentiated in each input named in ``floats`` (float64) equals its
    central difference along a random direction: the test of a node's gradient against float64 finite
    differences."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = jnp.asarray(rng.normal(size=np.shape(fn(*args.values()))))

    def loss(*values):
        return jnp.sum(fn(*{**args, **dict(zip(floats, values))}.values()) * weights)

    moved = [args[k] for k in floats]
    grads = jax.grad(loss, argnums=tuple(range(len(floats))))(*moved)
    for i, key in enumerate(floats):
        d = jnp.asarray(rng.normal(size=np.shape(args[key])))
        plus = [a + step * d if j == i else a for j, a in enumerate(moved)]
        minus = [a - step * d if j == i else a for j, a in enumerate(moved)]
        want = float((loss(*plus) - loss(*minus)) / (2 * step))
        np.testing.assert_allclose(float(jnp.sum(grads[i] * d)), want, rtol=rtol, atol=1e-9, err_msg=key)



JIT = [pytest.param(True, id="jit"), pytest.param(False, id="nojit")]


def node_model(op, feeds, attrs=None, opset=17, n_outputs=1, initializers=()):
    """A one-node model whose inputs are ``feeds`` (name -> array) plus ``initializers``, its outputs typed by ONNX's
    shape inference (as the checker requires)."""
    import onnx
    import onnx.shape_inference
    from onnx import helper

    inputs = [onnx_info(name, value.dtype, value.shape) for name, value in feeds.items()]
    inits = [onnx.numpy_helper.from_array(value, name) for name, value in initializers]
    names = list(feeds) + [name for name, _ in initializers]
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outputs, **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def check_against_reference(model, feeds, jit, rtol=1e-6):
    """``prepare(model, jit=jit).run(feeds)`` equals ``onnx.reference.ReferenceEvaluator``'s outputs: dtypes and shapes
    exactly, values to ``rtol``."""
    import onnx.reference

    import optkit.onnx

    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    got = optkit.onnx.prepare(model, jit=jit).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-7)
