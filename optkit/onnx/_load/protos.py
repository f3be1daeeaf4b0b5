"""Decoding the protobufs: initializers (sparse ones densified), declared inputs and shapes, node attributes.

The second stage of loading (:mod:`optkit.onnx._load.pipeline`): it turns what a graph
declares into Python and NumPy values, each checked against the bounds
(:mod:`optkit.onnx._base.limits`) and naming the tensor, input or attribute in its
errors. It runs for the model's graph and, through the converter, for every
sub-graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx.shape_inference
from onnx import helper

from optkit._src.graph.names import shape_text
from optkit.onnx._base.errors import UnsupportedOpError
from optkit.onnx._base.limits import check_size
from optkit.onnx._base.values import DTYPES, STRING, TRAINING_DOMAIN, normalize_domain, onnx_dtype, tensor_value

__all__ = ["InputInfo", "Declared", "decode_graph", "node_model", "parse_attributes"]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """A graph input as the model declares it.

    Attributes:
      name: the tensor name.
      dtype: its NumPy dtype.
      shape: one entry per axis: an int, a symbolic name (ONNX ``dim_param``:
        the same name must have the same size in every input), or None
        (unknown); None for the whole shape when the rank is unknown.
      has_default: True if an initializer of the same name gives a default.
      container: how the tensors are held, outermost first: ``()`` for a tensor, ``("sequence",)`` for a
        sequence of tensors (fed as a Python list of arrays), ``("optional",)`` or ``("optional",
        "sequence")`` for an optional one (fed as None when it is empty); ``dtype`` and ``shape`` then
        describe each tensor (``shape`` None: unchecked).
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None
    has_default: bool
    container: tuple[str, ...] = ()

    def shape_text(self) -> str:
        """The declared shape as text, ``(N, 3)``; ``?`` for an unknown dimension."""
        return shape_text(self.shape)


@dataclasses.dataclass(frozen=True)
class Declared:
    """What a graph declares, decoded: :func:`decode_graph`'s result.

    Attributes:
      initializers: name -> read-only NumPy array (sparse initializers densified).
      inputs: the graph inputs in ``graph.input`` order.
      outputs: the graph output names in ``graph.output`` order.
    """

    initializers: dict[str, np.ndarray]
    inputs: tuple[InputInfo, ...]
    outputs: tuple[str, ...]


def decode_graph(graph: onnx.GraphProto, max_tensor_bytes: int, *, subgraph: bool = False) -> Declared:
    """The initializers, inputs and outputs ``graph`` declares, every declared shape checked.

    A sub-graph's (``subgraph``) input may leave out its type (ONNX lets a body's inputs be typed by the
    node that feeds them): its dtype and shape are then None.

    Raises:
      ValueError: a declared negative dimension; a sparse initializer whose
        indices do not fit it; tensor data that does not fit its dims.
      TensorTooLargeError: a declared shape above ``max_tensor_bytes``.
      UnsupportedOpError: an input that is not a tensor, or of an element
        type optkit does not run.
    """
    initializers: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        initializers[tensor.name] = tensor_value(tensor, f"initializer {tensor.name!r}")
    for sparse in graph.sparse_initializer:
        initializers[sparse.values.name] = _densify(sparse)
    inputs = tuple(_input_info(vi, vi.name in initializers, max_tensor_bytes, subgraph) for vi in graph.input)
    for vi in graph.output:
        _check_declared_shape(vi, "graph output", max_tensor_bytes)
    for vi in graph.value_info:
        _check_declared_shape(vi, "value_info", max_tensor_bytes)
    return Declared(initializers, inputs, tuple(vi.name for vi in graph.output))


def _check_declared_shape(value_info: onnx.ValueInfoProto, what: str, limit: int) -> None:
    """A declared (graph output or value_info) tensor shape: no negative or oversized dimensions."""
    if value_info.type.WhichOneof("value") != "tensor_type":
        return
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return
    fixed = [int(d.dim_value) for d in tensor.shape.dim if d.WhichOneof("value") == "dim_value"]
    negative = [d for d in fixed if d < 0]
    if negative:
        raise ValueError(f"{what} {value_info.name!r} declares the negative dimension {negative[0]}")
    dtype = DTYPES.get(tensor.elem_type)
    check_size(tuple(fixed), dtype, f"{what} {value_info.name!r}", limit)


def _input_info(value_info: onnx.ValueInfoProto, has_default: bool, limit: int, subgraph: bool) -> InputInfo:
    kind = value_info.type.WhichOneof("value")
    if kind is None and subgraph:  # a body's input may leave its type to the node that feeds it
        return InputInfo(value_info.name, None, None, has_default)
    container, type_proto = _container(value_info.type, f"graph input {value_info.name!r}")
    if container:  # a sequence or an optional: its tensors' element type; their shapes are not checked
        elem = type_proto.tensor_type.elem_type
        dtype = onnx_dtype(elem, f"graph input {value_info.name!r}") if elem else None
        return InputInfo(value_info.name, dtype, None, has_default, container)
    tensor = value_info.type.tensor_type
    dtype = (STRING if tensor.elem_type == onnx.TensorProto.STRING else
             onnx_dtype(tensor.elem_type, f"graph input {value_info.name!r}"))
    shape = None
    if tensor.HasField("shape"):
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            which = dim.WhichOneof("value")
            dims.append(int(dim.dim_value) if which == "dim_value" else
                        (dim.dim_param or None) if which == "dim_param" else None)
        shape = tuple(dims)
        fixed = tuple(d for d in dims if isinstance(d, int))
        if any(d < 0 for d in fixed):
            raise ValueError(f"graph input {value_info.name!r} declares the negative dimension "
                             f"{min(fixed)}")
        check_size(fixed, dtype, f"graph input {value_info.name!r}", limit)
    return InputInfo(value_info.name, dtype, shape, has_default)


def _container(type_proto: onnx.TypeProto, what: str) -> tuple[tuple[str, ...], onnx.TypeProto]:
    """``(containers outermost first, the tensor type inside)`` of an input's type: ``()`` for a tensor,
    ``("sequence",)``, ``("optional",)``, ``("optional", "sequence")``; maps, sparse tensors and deeper nesting
    are refused naming ``what``."""
    kinds: list[str] = []
    while True:
        kind = type_proto.WhichOneof("value")
        if kind == "tensor_type":
            return tuple(kinds), type_proto
        if kind == "sequence_type" and "sequence" not in kinds:
            kinds.append("sequence")
            type_proto = type_proto.sequence_type.elem_type
        elif kind == "optional_type" and not kinds:
            kinds.append("optional")
            type_proto = type_proto.optional_type.elem_type
        else:
            raise UnsupportedOpError(f"{what} has type {_type_text(type_proto, kinds)}; optkit runs tensors, "
                                     f"sequences of tensors and optional tensors or sequences (not maps, sparse "
                                     f"tensors or nested sequences)")


def _type_text(type_proto: onnx.TypeProto, outer: list[str]) -> str:
    kind = type_proto.WhichOneof("value") or "undefined"
    return "(".join([*outer, kind]) + ")" * len(outer)


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse initializer as its dense array (its dense size was bounded when the model was read).

    Raises:
      ValueError: indices that are not ``[NNZ]`` (linear) or ``[NNZ, rank]``
        integers in range, or a count of values that does not match them.
    """
    name = sparse.values.name
    what = f"sparse initializer {name!r}"
    values = tensor_value(sparse.values, what)
    indices = tensor_value(sparse.indices, f"{what} (indices)")
    dims = tuple(int(d) for d in sparse.dims)
    if values.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"{what}: values must be 1-D and indices integers, got values of shape {values.shape} and "
                         f"indices of {indices.dtype}")
    if indices.ndim == 2 and indices.shape == (values.size, len(dims)):
        if indices.size and (np.any(indices < 0) or np.any(indices >= np.asarray(dims))):
            raise ValueError(f"{what}: an index is outside its dims {list(dims)}")
        linear = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    elif indices.ndim == 1 and indices.size == values.size:
        if indices.size and (indices.min() < 0 or indices.max() >= math.prod(dims)):
            raise ValueError(f"{what}: a linear index is outside its {math.prod(dims)} elements")
        linear = indices
    else:
        raise ValueError(f"{what}: {values.size} values need indices of shape [{values.size}] or "
                         f"[{values.size}, {len(dims)}], got {list(indices.shape)}")
    dense = np.zeros(math.prod(dims), values.dtype)
    dense[linear] = values
    dense = dense.reshape(dims)
    dense.setflags(write=False)
    return dense


# ---------------------------------------------------------------------------
# Attributes


def _decode(value: bytes, name: str, where: str) -> str:
    """A STRING attribute as text; ONNX strings are UTF-8."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: attribute {name!r} is not valid UTF-8 text ({err}); the "
                         f"model is corrupt or was not written as ONNX specifies") from None


def _attribute_value(attr: onnx.AttributeProto, where: str) -> Any:
    kind = attr.type
    if kind == onnx.AttributeProto.GRAPH:
        return attr.g  # converted by the handler that reads it (NodeContext.convert_subgraph)
    if kind == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    if kind in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
        raise UnsupportedOpError(f"{where}: attribute {attr.name!r} is a sparse tensor, which "
                                 f"optkit does not run")
    if kind == onnx.AttributeProto.TYPE_PROTO:
        return attr.tp  # (Optional's type: read by its handler)
    if kind == onnx.AttributeProto.TYPE_PROTOS:
        return list(attr.type_protos)
    value = helper.get_attribute_value(attr)
    if kind == onnx.AttributeProto.STRING:
        return _decode(value, attr.name, where)
    if kind == onnx.AttributeProto.STRINGS:
        return [_decode(v, attr.name, where) for v in value]
    if kind == onnx.AttributeProto.TENSOR:
        return tensor_value(value, f"{where}: attribute {attr.name!r}")
    if kind == onnx.AttributeProto.TENSORS:
        return [tensor_value(v, f"{where}: attribute {attr.name!r}") for v in value]
    if kind == onnx.AttributeProto.INTS:
        return [int(v) for v in value]
    if kind == onnx.AttributeProto.FLOATS:
        return [float(v) for v in value]
    return value


def parse_attributes(
    node: onnx.NodeProto, schema: onnx.defs.OpSchema | None, where: str
) -> dict[str, Any]:
    """The node's attributes as Python values, with the schema's defaults for absent ones.

    STRING(S) become ``str``, TENSOR a NumPy array, INTS/FLOATS lists, GRAPH
    the ``onnx.GraphProto`` (a handler converts it, see
    :meth:`~optkit.onnx._ops._registry.NodeContext.convert_subgraph`). An
    attribute the schema requires and the node lacks is an error here, so a
    model that skipped ``onnx.checker`` still fails before running.

    Raises:
      ValueError: a required attribute is missing or one is given twice; a string
        attribute that is not UTF-8.
      UnsupportedOpError: a sparse-tensor attribute.
    """
    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.name in attrs:
            raise ValueError(f"{where}: attribute {attr.name!r} is given twice")
        if attr.ref_attr_name:
            raise UnsupportedOpError(f"{where}: attribute {attr.name!r} refers to a function "
                                     f"attribute; optkit runs graphs, not function bodies")
        attrs[attr.name] = _attribute_value(attr, where)
    if schema is not None:
        for name, spec in schema.attributes.items():
            if name in attrs:
                continue
            if spec.required:
                raise ValueError(f"{where}: the required attribute {name!r} is missing "
                                 f"(ONNX schema {schema.domain or 'ai.onnx'}::{schema.name}-"
                                 f"{schema.since_version})")
            if spec.default_value.type != onnx.AttributeProto.UNDEFINED:
                attrs[name] = _attribute_value(spec.default_value, where)
    return attrs


def node_model(node: onnx.NodeProto, inputs: Any, outputs_info: Any,
               opset_version: int) -> tuple[onnx.ModelProto, list]:
    """``Backend.run_node``'s model: ``node`` alone, its graph inputs typed by the fed values (one per non-empty
    node input, or a dict by name), its outputs by ``outputs_info`` or shape inference; importing
    ``opset_version`` and, for a training operator, ``ai.onnx.preview.training`` 1. Returns it and the values."""
    names = [name for name in node.input if name]
    if isinstance(inputs, Mapping):
        values = [inputs[name] for name in names]
    else:
        values = list(inputs)
        if len(values) != len(names):
            raise ValueError(f"node {node.op_type} has {len(names)} inputs {names}, got {len(values)} values")
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                      np.shape(v))
        for name, v in zip(names, values)
    ]
    graph_outputs = []
    for i, name in enumerate(o for o in node.output if o):
        if outputs_info is not None and i < len(outputs_info):
            dtype, shape = outputs_info[i]
            graph_outputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
        else:
            graph_outputs.append(helper.make_value_info(name, onnx.TypeProto()))
    imports = [helper.make_opsetid("", opset_version)]
    if normalize_domain(node.domain) == TRAINING_DOMAIN:
        imports.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    model = helper.make_model(
        helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
        opset_imports=imports,
    )
    return _typed_outputs(model), values


def _typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give untyped graph outputs the types ONNX shape inference finds (the checker needs
    one), else an undefined element type: outputs' declared types are not enforced."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    for output in inferred.graph.output:
        if not output.type.HasField("tensor_type"):
            output.CopyFrom(helper.make_tensor_value_info(output.name, onnx.TensorProto.UNDEFINED, []))
    return inferred
