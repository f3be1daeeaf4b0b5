"""Loading a model: one pipeline, each stage run once, in this order, none calling back into an earlier one.

1. :func:`~optkit.onnx._load.files.read_model`: the file read (bounded), every
   tensor it brings held to the bounds, external data read from the model's
   own directory only, after steps 2 and 3 (a model over protobuf's 2 GiB is checked without its data);
2. :func:`~optkit.onnx._load.operators.check_operators`: every operator version
   looked up once in the op table; all the ones optkit does not run named
   in one error, before the checker's pass over a large model;
3. :func:`~optkit.onnx._load.files.check_model`: ``onnx.checker`` (once: not again for a ModelProto that
   :func:`~optkit.onnx.load_model` checked and returned unchanged);
   With ``untie``, the checked model's shared initializers are copied per reading node
   (:mod:`optkit.onnx._load.untie`); with ``lora``, low-rank adapters are added to its matmul nodes
   (:mod:`optkit.onnx._load.adapters`; their operators looked up as in step 2);
4. :func:`~optkit.onnx._load.functions.expand_functions`: model-local functions
   inlined, the expansion bounded;
5. :func:`~optkit.onnx._load.convert.convert`: declarations decoded
   (:mod:`optkit.onnx._load.protos`), nodes built into an :class:`optkit.Graph`
   from the rows of step 2, sub-graphs by the same code, the Gradient work
   bounded and the static inputs found (:mod:`optkit.onnx._load.analysis`);
6. :func:`~optkit.onnx._load.analysis.facts_of`: what the runners need to know of the model, found once (updated
   inputs, initializers read, grouped convolutions, the default trainable set), kept in ``Converted.facts``.

The bounds travel as one :class:`~optkit.onnx._base.limits.Limits` value. The ``optkit.onnx`` logger reports each
load's stage times at INFO.
:func:`load` is the one entry: :func:`to_graph`, :func:`optkit.onnx.prepare`
(and through it ``run_model``, ``run_node`` and the ``Backend``) call it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from optkit import Graph
from optkit.onnx._base.limits import Limits
from optkit.onnx._base.values import mapped_tensors
from optkit.onnx._load.adapters import LoRA, add_adapters
from optkit.onnx._load.analysis import facts_of
from optkit.onnx._load.convert import Converted, convert
from optkit.onnx._load.files import ModelSource, check_once, read_model
from optkit.onnx._load.functions import expand_functions
from optkit.onnx._load.operators import check_operators
from optkit.onnx._load.tensors import load_external_data
from optkit.onnx._load.untie import deduplicated
from optkit.onnx._load.untie import untie as untie_copies

__all__ = ["load", "to_graph"]

_log = logging.getLogger("optkit.onnx")


def load(model: ModelSource, limits: Limits, base_dir: str | os.PathLike[str] | None = None,
         untie: bool | Sequence[str] = False, lora: LoRA | None = None, lora_key: Any = None) -> Converted:
    """Read, check and convert ``model`` under ``limits``: the pipeline above; errors as :func:`to_graph`.
    ``untie``: after the checks, give each node its own copy of the initializers an exporter shared (True:
    those :func:`~optkit.onnx._load.untie.deduplicated` finds; or the names given),
    :func:`~optkit.onnx._load.untie.untie`.
    ``lora``: then add its adapters (:func:`~optkit.onnx._load.adapters.add_adapters`, ``A`` drawn from ``lora_key``);
    their names are ``Converted.adapters``."""
    times = [time.perf_counter()]
    proto, origin, directory = read_model(model, base_dir, limits)
    times.append(time.perf_counter())
    operators = check_operators(proto)
    check_once(proto, origin, model)  # before external data is read: the checker serializes the model
    times.append(time.perf_counter())
    # External data mapped from its files (no copy in the ModelProto): its tensors are decoded from the maps.
    mapped: dict[tuple, Any] = {}
    proto = load_external_data(proto, directory, origin, mapped)
    with mapped_tensors(mapped):
        times.append(time.perf_counter())
        if untie:
            proto = untie_copies(proto, deduplicated(proto) if untie is True else untie)
        adapters: tuple[str, ...] = ()
        if lora is not None:
            proto, adapters = add_adapters(proto, lora, lora_key)
            operators = check_operators(proto)
        expanded = expand_functions(proto) if proto.functions else proto
        converted = convert(expanded, operators, limits)
        facts = facts_of(proto, converted.inputs, converted.graph.initializers, converted.static_initializers,
                         converted.table_initializers)
    times.append(time.perf_counter())
    read, check, external, build = (b - a for a, b in zip(times, times[1:]))
    _log.info("loaded %s: read %.2f s, operators and onnx.checker %.2f s, external data %.2f s, converted %d nodes "
              "%.2f s", origin, read, check, external, len(converted.graph.nodes), build)
    return dataclasses.replace(converted, model=proto, facts=facts, adapters=adapters, limits=limits)


def to_graph(
    model: ModelSource,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    max_tensor_bytes: int | None = None,
    max_gradient_depth: int | None = None,
    max_gradient_passes: int | None = None,
) -> Graph:
    """Load an ONNX model into an :class:`optkit.Graph`.

    The model is read and checked (:func:`load_model`), each node is mapped
    through the op table (standard ``ai.onnx`` operators and
    ``ai.onnx.preview.training`` Adagrad, Adam and Momentum, SPEC 1, 3, 4);
    each Gradient node becomes a Graph Gradient node (SPEC 6). Graph inputs
    are declared with their ONNX dtype and shape, initializers are constants
    (NumPy arrays) that a feed of a graph input of the same name overrides.
    A node whose inputs are all NumPy values (initializers, constants, shapes)
    is computed once, eagerly, even under ``jax.jit`` (constant folding), and
    gives a NumPy value: that is how a ``Reshape`` reads a shape computed by
    other nodes. Feed JAX arrays to compute everything else in XLA.

    Convolutions, pools, ``BatchNormalization`` and the element-wise nodes
    between them are also built in a channels-last form, which they run when
    the graph is traced on the CPU; the graph then holds the tensors they pass
    along as (N, D1, ..., C) under names of their own and has nodes that move
    the channels where a tensor is read under its ONNX name (the docs page
    "The ONNX backend", "Speed on CPU"). The values are ONNX's either way.

    The graph is pure JAX: ``jax.jit(graph.as_function(...))`` compiles it.
    ONNX's 64-bit types (INT64 step counts and indices, DOUBLE) are int64
    and float64 in JAX's 64-bit mode (``with jax.enable_x64(True):``); with it
    off they run as int32 and float32, as the runners document.

    Returns:
      The :class:`optkit.Graph`; its ``outputs`` are the model's ``graph.output``.

    Source: SPEC sections 1, 3, 4, 6; the ONNX IR (graph inputs, initializers,
    nodes) and each operator version's ONNX documentation.

    Args:
      model: a ``ModelProto``, its bytes, a path or a binary file object.
      base_dir: the directory of the external data of a model given without
        a path (see :func:`load_model`); None refuses such data.
      max_tensor_bytes: the largest tensor the graph may declare or compute,
        in bytes; default :func:`default_max_tensor_bytes` (half the memory
        available now).
      max_gradient_depth: how deep Gradient nodes may nest, 1 to 16; default 8.
      max_gradient_passes: the reverse passes the Gradient nodes may need in
        all (see the docs page "The ONNX backend", "Loading ONNX files from strangers"); default 4096.

    Raises:
      ValueError: malformed bytes (text that is not UTF-8 included), a model
        ``onnx.checker`` rejects, external data outside the model's directory
        or without one (see :func:`load_model`), a node with invalid
        attributes or arity (e.g. an optimizer whose input count is not
        ``2 + k*n``, a Momentum without its required attributes), a declared
        shape with a negative dimension, Gradient nodes nested deeper than
        ``max_gradient_depth`` (naming the node).
      TensorTooLargeError: (a ``ValueError`` and a ``MemoryError``) a declared
        shape above ``max_tensor_bytes``; when the graph is traced (jit,
        ``jax.eval_shape``, :class:`BackendRep`), a node whose output would
        exceed it, before anything is computed (a node computed from
        constants alone is checked abstractly before it is folded).
      UnsupportedOpError: an operator, operator version, opset version or
        element type that optkit does not run; the message names op type,
        domain and opset.

    Example:
      >>> import jax, jax.numpy as jnp, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> node = helper.make_node("Add", ["a", "b"], ["c"])
      >>> info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
      >>> model = helper.make_model(helper.make_graph([node], "g", [info("a"), info("b")], [info("c")]))
      >>> graph = optkit.onnx.to_graph(model)
      >>> jax.jit(graph.as_function(["a", "b"], "c"))(jnp.ones(2), jnp.ones(2))
      Array([2., 2.], dtype=float32)
    """
    limits = Limits.make(max_tensor_bytes, max_gradient_depth, max_gradient_passes=max_gradient_passes)
    return load(model, limits, base_dir).graph
