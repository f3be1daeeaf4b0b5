"""What is in an ONNX model, as text: ``optkit-onnx summary`` and the ``repr`` of
:class:`~optkit.onnx.OnnxFunction` and :class:`~optkit.onnx.OnnxModule`."""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import onnx

from optkit.onnx._base.limits import Limits
from optkit.onnx._base.walk import nodes_of
from optkit.onnx._load.pipeline import load

__all__ = ["describe", "summary"]

# Operators that read quantized (integer) weights: their integer initializers are reported as such.
_QUANTIZED_READERS = ("DequantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
                      "MatMulNBits", "GatherBlockQuantized", "DynamicQuantizeLinear")


def _dims(value_info: onnx.ValueInfoProto) -> str:
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return "(any shape)"
    dims = [d.dim_param if d.dim_param else (str(d.dim_value) if d.HasField("dim_value") else "?")
            for d in tensor.shape.dim]
    return "(" + ", ".join(dims) + ")"


def _elem(value_info: onnx.ValueInfoProto) -> str:
    elem = value_info.type.tensor_type.elem_type
    return onnx.TensorProto.DataType.Name(elem).lower() if elem else "?"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def summary(model: Any, *, base_dir: str | os.PathLike[str] | None = None) -> str:
    """A text summary of an ONNX model: what ``optkit-onnx summary`` prints.

    Args:
      model: a path to a ``.onnx`` file, its bytes, a ``ModelProto`` or a binary file object.
      base_dir: the external data's directory for a model given without a path.

    Returns:
      The summary, one item a line: inputs and outputs (dtype, shape with symbolic dimensions), opsets,
      external data, operator histogram, parameters (count and bytes by dtype), the initializers trained by
      default, initializers read by several nodes, sub-graphs, quantized weights.

    Raises:
      ValueError, UnsupportedOpError, TensorTooLargeError: as :func:`optkit.onnx.prepare` loading the model.

    Example:
      >>> import numpy as np
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> from optkit.onnx._cli import summary
      >>> g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
      ...     [numpy_helper.from_array(np.zeros((3, 2), np.float32), "W")])
      >>> print(summary(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).splitlines()[1])
        x: float (N, 3)
    """
    loaded = load(model, Limits.make(None, None), base_dir)
    external = []
    if isinstance(model, (str, os.PathLike)):  # the file as written (loading reads the external data in)
        raw = onnx.load(os.fspath(model), load_external_data=False)
        external = [t.name for t in raw.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    return "\n".join(describe(loaded, len(external)))


def describe(loaded: Any, external: int | None = None) -> list[str]:
    """The lines of :func:`summary` for a loaded model (``_load.load``'s result); ``external``: the number of
    tensors the file keeps in external data, None where unknown (the line is then left out)."""
    proto = loaded.model
    graph = proto.graph
    initial = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initial]
    lines = ["inputs:"] + [f"  {i.name}: {_elem(i)} {_dims(i)}" for i in inputs]
    lines += ["outputs:"] + [f"  {o.name}: {_elem(o)} {_dims(o)}" for o in graph.output]
    lines.append("opsets: " + ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import))
    if external is not None:
        lines.append(f"external data: {external} tensors" if external else "external data: none")
    nodes = [node for _, node in nodes_of(graph)]
    histogram = collections.Counter((f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                                    for n in nodes)
    lines.append(f"nodes: {len(nodes)} ({len(histogram)} operator types)")
    lines += [f"  {op}: {count}" for op, count in sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))]
    values = loaded.graph.initializers
    by_dtype: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for name in initial:
        array = np.asarray(values[name])
        by_dtype[str(array.dtype)][0] += int(array.size)
        by_dtype[str(array.dtype)][1] += int(array.nbytes)
    total = sum(count for count, _ in by_dtype.values())
    lines.append(f"parameters: {total:,} in {len(initial)} initializers")
    lines += [f"  {dtype}: {count:,} ({_bytes(nbytes)})" for dtype, (count, nbytes) in sorted(by_dtype.items())]
    trainable = loaded.facts.default_trainable
    size = sum(int(np.size(values[name])) for name in trainable)
    lines.append(f"trained by default (to_jax, make_training_model): {len(trainable)} initializers, {size:,} "
                 f"values")
    readers = collections.Counter(name for n in nodes for name in set(n.input) if name in initial)
    shared = sorted((name, count) for name, count in readers.items() if count > 1 and name in trainable)
    lines.append(f"trainable initializers read by several nodes (tied when trained): {len(shared)}")
    lines += [f"  {name}: {count} nodes" for name, count in shared]
    lines.append(f"sub-graphs: {sum(1 for n in nodes for a in n.attribute if a.HasField('g') or len(a.graphs))}")
    quantized = sorted({name for n in nodes if n.op_type in _QUANTIZED_READERS for name in n.input
                        if name in initial and np.issubdtype(np.asarray(values[name]).dtype, np.integer)
                        and np.ndim(values[name]) >= 1})
    lines.append(f"quantized weights: {len(quantized)} integer initializers read by quantized operators")
    return lines
