"""Initializers that an exporter shared between unrelated nodes, found and (on request) untied.

torch.onnx's dynamo exporter writes one initializer for equal constants: in a small BERT every zero
64-wide bias is ``bert.embeddings.LayerNorm.bias``, read by 15 nodes, and every LayerNorm's weight of ones
one initializer read by 5. Trained, such a parameter ties what the original model trained apart. A weight
tied on purpose (GPT-2's token embedding, read by a ``Gather`` and the output ``MatMul``) is read by
different operators; a deduplicated constant is read by several nodes of one operator at one input slot.
That is the rule here: a floating-point initializer of rank >= 1 read, in the model's own graph, by two or
more nodes of the same operator at the same input position.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from optkit.onnx._base.values import node_name

__all__ = ["deduplicated", "untie"]

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def deduplicated(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """``{initializer: the nodes reading it}`` for each initializer the rule above calls shared by
    deduplication, in graph order."""
    graph = model.graph
    floats = {t.name for t in graph.initializer if t.data_type in _FLOATS and len(t.dims) >= 1}
    readers: dict[str, list[tuple[str, str, int]]] = {}
    for index, node in enumerate(graph.node):
        for position, name in enumerate(node.input):
            if name in floats:
                readers.setdefault(name, []).append((node_name(node.name, node.op_type, index), node.op_type,
                                                     position))
    return {name: tuple(n for n, _, _ in reads) for name, reads in readers.items()
            if len({n for n, _, _ in reads}) > 1 and len({(op, pos) for _, op, pos in reads}) == 1}


def untie(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` in which each node after the first that reads one of ``names`` reads its own copy of
    it, ``<name>.untied.<k>`` (k = 1, 2, ...); the first reader keeps ``<name>``. ``model`` is not modified.

    Raises:
      ValueError: a name that is not an initializer of the model's graph.
    """
    wanted = list(dict.fromkeys(names))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    tensors = {t.name: t for t in graph.initializer}
    unknown = [name for name in wanted if name not in tensors]
    if unknown:
        raise ValueError(f"untie: {unknown} are not initializers of the model's graph")
    taken = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {
        o for node in graph.node for o in node.output}
    seen = dict.fromkeys(wanted, 0)
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name not in seen:
                continue
            seen[name] += 1
            if seen[name] == 1:
                continue
            new = f"{name}.untied.{seen[name] - 1}"
            while new in taken:
                new += "_"
            taken.add(new)
            tensor = graph.initializer.add()
            tensor.CopyFrom(tensors[name])
            tensor.name = new
            node.input[position] = new
    return copy
