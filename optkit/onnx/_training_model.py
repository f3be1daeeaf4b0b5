"""Inference graph -> training graph: a loss, a Gradient node and an optimizer node over its initializers.

Built with ``onnx.helper`` only; the result is an ordinary ONNX model (opset
``ai.onnx.preview.training`` 1 added), which :func:`optkit.onnx.prepare` runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optkit.onnx._base.limits import Limits
from optkit.onnx._base.values import TRAINING_DOMAIN, normalize_domain
from optkit.onnx._load.adapters import ADAPTER_DOMAIN, LoRA, write_adapters
from optkit.onnx._load.files import ModelSource, model_proto
from optkit.onnx._load.pipeline import load

__all__ = ["make_training_model", "next_feeds", "select_trainable", "with_initializers"]

_LOSSES = ("softmax_cross_entropy", "mean_squared_error", "binary_cross_entropy_with_logits", "l1")
# optimizer -> (state slots per parameter, the node's defaults for its attributes)
_OPTIMIZERS = {"adam": (("adam_v", "adam_h"), {}), "adagrad": (("adagrad_h",), {}),
               "momentum": (("momentum_v",), {"alpha": 0.9, "beta": 1.0, "mode": "standard",
                                              "norm_coefficient": 0.0})}


def make_training_model(
    model: ModelSource | Any,
    *,
    loss: str = "softmax_cross_entropy",
    optimizer: str = "adam",
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] = (),
    output: str | None = None,
    optimizer_attributes: Mapping[str, Any] | None = None,
) -> onnx.ModelProto:
    """A training step of ``model``: its loss, a Gradient node over its parameters and an optimizer node.

    The inference model is kept as it is, and nodes are added after it (SPEC 6, SPEC 1-4):
    ``loss`` of the output ``output`` (``SoftmaxCrossEntropyLoss`` against int64 ``labels`` of
    shape ``[N]`` for an ``[N, C]`` output, or the mean of squared differences from a ``target``
    of the output's shape), ``Gradient`` of the loss with respect to each trainable initializer,
    and an ``Adam``, ``Adagrad`` or ``Momentum`` node (``ai.onnx.preview.training``) that updates
    them. The new model's inputs are the model's own, then ``labels`` or ``target``, the learning
    rate ``R`` (float scalar), the step count ``T`` (int64 scalar; feed ``t + 1`` at step ``t``
    counted from 0, as ONNX Runtime's AdamW and ``optkit.adam`` count: ONNX Adam applies no bias
    correction at ``T = 0``), then each parameter and its optimizer state
    (``<name>.adam_v``, ``<name>.adam_h``; ``.adagrad_h``; ``.momentum_v``), which stay
    initializers (their current values; zeros for the state) so that a run may leave them out.
    Its outputs are ``loss``, then ``<name>.new`` for each parameter, then the new state
    (``<name>.adam_v.new``...) in the order the inputs list them: feed each back for the next
    step (:func:`next_feeds` does), or write the parameters into the inference model with
    :func:`with_initializers`.

    Args:
      model: the inference model (not modified): a ``ModelProto``, a path, bytes or ``to_jax``'s ``apply_fn``.
      loss: ``"softmax_cross_entropy"``, ``"mean_squared_error"``, ``"l1"`` (mean absolute difference) or
        ``"binary_cross_entropy_with_logits"`` (the mean over elements of the cross-entropy of
        ``sigmoid(output)`` against a ``target`` in [0, 1] of the output's shape), ONNX Runtime's
        ``CrossEntropyLoss``, ``MSELoss``, ``L1Loss`` and ``BCEWithLogitsLoss``.
      optimizer: ``"adam"``, ``"adagrad"`` or ``"momentum"``.
      trainable: the initializer names to train; default every floating-point initializer of
        rank >= 1 that a node reads and that looks like weights: finite, no magnitude whose square
        overflows the dtype (exporters' scalar constants and attention masks of -inf or of the
        dtype's lowest value stay fixed), read by a node of the graph or of its sub-graphs, and not
        read where a value must be known before running (a ``Resize``'s scales): what
        :func:`to_jax` trains, found by loading the model as :func:`prepare` does. Integer
        initializers are never trainable.
      frozen: initializer names left out of ``trainable`` (ONNX Runtime's ``frozen_params``).
      output: the graph output the loss is taken of; default the first.
      optimizer_attributes: the optimizer node's attributes (``alpha``, ``beta``, ``epsilon``,
        ``norm_coefficient``, ``decay_factor``... as ONNX names them); ONNX's defaults otherwise
        (Momentum: ``alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0``, which ONNX
        requires to be given).

    Returns:
      A new ``onnx.ModelProto`` that passes ``onnx.checker``.

    Raises:
      ValueError: an unknown ``loss`` or ``optimizer``, an ``output`` or ``trainable`` name the
        model does not have, a non-float trainable initializer, no trainable initializer, or a
        name the added tensors would take (``labels``, ``loss``...) already used in the model;
        without ``trainable``, whatever :func:`prepare` refuses in loading the model (external data
        not loaded, an unsupported operator: ``UnsupportedOpError``).

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> weights = [numpy_helper.from_array(np.zeros((3, 2), np.float32), "W"),
      ...            numpy_helper.from_array(np.zeros(2, np.float32), "b")]
      >>> nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"])]
      >>> x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
      >>> logits_info = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2])
      >>> graph = helper.make_graph(nodes, "linear", [x_info], [logits_info], weights)
      >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
      >>> train = optkit.onnx.make_training_model(model)
      >>> step = optkit.onnx.prepare(train)
      >>> out = step.run({"x": np.ones((4, 3), np.float32), "labels": np.zeros(4, np.int64),
      ...                 "R": np.float32(0.1), "T": np.int64(1)})
      >>> round(float(out.loss), 4), out[1].shape
      (0.6931, (3, 2))

    Source: ONNX ``ai.onnx.preview.training`` Gradient, Adam, Adagrad and Momentum (SPEC 1-6).
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {_LOSSES}, got {loss!r}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {optimizer!r}")
    model = model_proto(model)
    graph = model.graph
    outputs = [o.name for o in graph.output]
    if output is None:
        if not outputs:
            raise ValueError("the model has no output to take the loss of")
        output = outputs[0]
    elif output not in outputs:
        raise ValueError(f"output {output!r} is not a graph output; the outputs are {outputs}")
    initializers = {i.name: i for i in graph.initializer}
    floats = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    floating = {n: i.data_type in floats for n, i in initializers.items()}
    default = () if trainable is not None else load(model, Limits.make(None, None)).facts.default_trainable
    trainable = select_trainable(floating, default, trainable, frozen)
    slots, defaults = _OPTIMIZERS[optimizer]
    target = "labels" if loss == "softmax_cross_entropy" else "target"
    out_info = next(o for o in graph.output if o.name == output)
    elem = out_info.type.tensor_type.elem_type or TensorProto.FLOAT
    out_dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) or None
                for d in out_info.type.tensor_type.shape.dim]
    target_info, loss_nodes = _loss(loss, output, target, elem, out_dims)
    added = [target, "R", "T", *(name for n in loss_nodes for name in n.output)]
    added += [f"{p}.{s}" for p in trainable for s in slots] + [f"{p}.new" for p in trainable]
    added += [f"{p}.{s}.new" for p in trainable for s in slots] + [f"{p}.grad" for p in trainable]
    used = {name for node in graph.node for name in [*node.input, *node.output]}
    used |= {i.name for i in graph.input} | set(initializers)
    clash = sorted(set(added) & used)
    if clash:
        raise ValueError(f"the model already uses the names {clash}, which the training graph adds")

    nodes = list(graph.node) + loss_nodes
    inputs_of_model = [i for i in graph.input if i.name not in initializers]
    data_inputs = [i.name for i in inputs_of_model] + [target]
    grads = [f"{p}.grad" for p in trainable]
    nodes.append(helper.make_node("Gradient", trainable + data_inputs, grads, domain=TRAINING_DOMAIN,
                                  xs=trainable, zs=data_inputs, y="loss", name="gradient"))
    states = [[f"{p}.{s}" for p in trainable] for s in slots]
    attrs = {**defaults, **dict(optimizer_attributes or {})}
    node_inputs = ["R", "T", *trainable, *grads, *[name for group in states for name in group]]
    node_outputs = [f"{name}.new" for name in [*trainable, *[n for group in states for n in group]]]
    nodes.append(helper.make_node(optimizer.capitalize(), node_inputs, node_outputs, domain=TRAINING_DOMAIN,
                                  name=optimizer, **attrs))

    def info(name, tensor):
        return helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))

    new_inputs = list(inputs_of_model) + [
        target_info,
        helper.make_tensor_value_info("R", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("T", TensorProto.INT64, []),
    ]
    new_inputs += [info(p, initializers[p]) for p in trainable]
    state_inits = []
    for group in states:
        for name, p in zip(group, trainable):
            new_inputs.append(info(name, initializers[p]))
            state_inits.append(_zeros_like(initializers[p], name))
    new_outputs = [helper.make_tensor_value_info("loss", elem, [])]
    new_outputs += [info(f"{p}.new", initializers[p]) for p in trainable]
    new_outputs += [info(f"{name}.new", initializers[p]) for group in states for name, p in zip(group, trainable)]
    # Initializers that are now graph inputs keep their values as defaults (IR version >= 4).
    new_graph = helper.make_graph(nodes, f"{graph.name}_training", new_inputs, new_outputs,
                                  initializer=list(graph.initializer) + state_inits,
                                  value_info=list(graph.value_info))
    opsets = [o for o in model.opset_import if normalize_domain(o.domain) != TRAINING_DOMAIN]
    default = [o for o in opsets if normalize_domain(o.domain) == ""]
    if not default or default[0].version < 13:
        raise ValueError("the model must import ai.onnx opset 13 or later (SoftmaxCrossEntropyLoss-13, "
                         "ReduceMean with keepdims)")
    training = helper.make_model(new_graph, opset_imports=[*opsets, helper.make_opsetid(TRAINING_DOMAIN, 1)],
                                 ir_version=max(model.ir_version, 7), producer_name="optkit.onnx.make_training_model")
    for function in model.functions:
        training.functions.append(function)
    onnx.checker.check_model(training)
    return training


def _loss(loss: str, output: str, target: str, elem: int, out_dims: list) -> tuple[Any, list[onnx.NodeProto]]:
    """The target's ValueInfo and the nodes computing ``loss`` from ``output`` and ``target`` (names ``loss.*``)."""
    if loss == "softmax_cross_entropy":
        target_info = helper.make_tensor_value_info(target, TensorProto.INT64, out_dims[:1] or ["N"])
        return target_info, [helper.make_node("SoftmaxCrossEntropyLoss", [output, target], ["loss"], name="loss")]
    target_info = helper.make_tensor_value_info(target, elem, out_dims)
    node = helper.make_node
    if loss == "mean_squared_error":
        terms = [node("Sub", [output, target], ["loss.difference"], name="loss.difference"),
                 node("Mul", ["loss.difference", "loss.difference"], ["loss.terms"], name="loss.squared")]
    elif loss == "l1":
        terms = [node("Sub", [output, target], ["loss.difference"], name="loss.difference"),
                 node("Abs", ["loss.difference"], ["loss.terms"], name="loss.absolute")]
    else:  # binary cross-entropy of sigmoid(output): max(x, 0) - x t + log(1 + exp(-|x|)), stable for any x
        terms = [node("Relu", [output], ["loss.relu"], name="loss.relu"),
                 node("Mul", [output, target], ["loss.product"], name="loss.product"),
                 node("Sub", ["loss.relu", "loss.product"], ["loss.difference"], name="loss.difference"),
                 node("Abs", [output], ["loss.absolute"], name="loss.absolute"),
                 node("Neg", ["loss.absolute"], ["loss.negative"], name="loss.negative"),
                 node("Softplus", ["loss.negative"], ["loss.softplus"], name="loss.softplus"),
                 node("Add", ["loss.difference", "loss.softplus"], ["loss.terms"], name="loss.terms")]
    return target_info, [*terms, node("ReduceMean", ["loss.terms"], ["loss"], keepdims=0, name="loss")]


def select_trainable(floating: Mapping[str, bool], default: Sequence[str], trainable: Sequence[str] | None,
                     frozen: Sequence[str] = (), allow_empty: bool = False) -> list[str]:
    """The initializers to train: those named in ``trainable`` (each checked), or ``default``; less ``frozen``.

    Args:
      floating: every initializer's name -> whether it is floating-point.
      default: the caller's default choice (see :func:`make_training_model`'s ``trainable``).

    Raises:
      TypeError: ``trainable`` or ``frozen`` not a sequence of names.
      ValueError: a name that is not an initializer, a non-float one to train, or nothing left to train
        (unless ``allow_empty``).
    """
    for what, names in (("trainable", trainable), ("frozen", frozen)):
        if isinstance(names, (str, bytes)) or (names is not None and not isinstance(names, Sequence | set)):
            raise TypeError(f"{what} must be a sequence of initializer names, got {names!r}")
        for name in names or ():
            if name not in floating:
                close = difflib.get_close_matches(str(name), list(floating), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ValueError(f"{what} name {name!r} is not an initializer of the model{hint}")
    chosen = [name for name in (default if trainable is None else trainable) if name not in set(frozen)]
    for name in chosen:
        if not floating[name]:
            raise ValueError(f"initializer {name!r} is not floating-point and cannot be trained")
    if not chosen and not allow_empty:
        raise ValueError("the model has no floating-point initializer to train")
    return chosen


def _zeros_like(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(tuple(tensor.dims), helper.tensor_dtype_to_np_dtype(tensor.data_type)),
                                   name)


def with_initializers(model: ModelSource | Any, values: Mapping[str, Any], *, lora: LoRA | None = None,
                      merge: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` with the initializers named in ``values`` replaced (trained weights saved).

    Args:
      model: an ONNX model (not modified): a ``ModelProto``, a path (its external data read from its directory),
        bytes, or ``to_jax``'s ``apply_fn`` (its ``model``: the file it was made from, without LoRA; with
        ``lora=`` pass the original model or its path).
      values: initializer name -> array of the initializer's shape (its dtype is kept), as
        :func:`to_jax`'s ``params`` (stacked parameters of ``stacked_params=True`` are written layer by layer
        when ``model`` is ``apply_fn`` or ``values`` an :class:`OnnxModule`); or the ``nnx.State`` of an
        :class:`OnnxModule`'s parameters
        (``nnx.state(module, nnx.Param)``), or the module itself. Adapters of ``to_jax(..., lora=...)``
        (``<W>.lora_A``, ``<W>.lora_B``) are written as ``merge`` says.
      lora: the :class:`~optkit.onnx.LoRA` the adapters in ``values`` were trained with (an
        :class:`OnnxModule` given as ``values`` brings its own).
      merge: True (default): a float weight's adapter is merged into it, ``W + (alpha / rank) * A @ B``
        computed in float64 and stored in ``W``'s dtype, so the file has its original nodes. False, and
        always for 4- and 8-bit ``MatMulNBits`` weights: the adapter is kept as a float side branch after
        each adapted node, ``y + MatMul(MatMul(x, A), B) * (alpha / rank)`` in standard operators (the
        quantized base stays bit for bit as it was: re-quantizing the merged weight would round away an
        update far smaller than one quantization step).

    Returns:
      A new ``onnx.ModelProto``.

    Raises:
      TypeError: ``values`` is not a mapping, a state or a module.
      ValueError: a name that is not an initializer, or an array of another shape; adapters without
        ``lora``, or given with the model that holds optkit's LoRA nodes (``apply_fn.model``) instead of the
        original.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
      ...     [numpy_helper.from_array(np.zeros(2, np.float32), "b")])
      >>> model = helper.make_model(graph)
      >>> new = optkit.onnx.with_initializers(model, {"b": np.array([1.0, 2.0])})
      >>> numpy_helper.to_array(new.graph.initializer[0])
      array([1., 2.], dtype=float32)
    """
    lora = lora if lora is not None else getattr(getattr(values, "apply_fn", None), "lora", None)
    runner = model if hasattr(model, "unstacked") else getattr(values, "apply_fn", None)
    model = model_proto(model)
    values = by_initializer_name(values)
    if getattr(runner, "stacked", None):  # to_jax(..., stacked_params=True): one initializer per layer again
        values = runner.unstacked(values)
    adapters = {name: v for name, v in values.items() if name.endswith((".lora_A", ".lora_B"))}
    if adapters:
        if any(node.domain == ADAPTER_DOMAIN for node in model.graph.node):
            raise ValueError("model holds optkit's LoRA nodes (apply_fn.model), which ONNX Runtime cannot run: pass "
                             "the model you gave to_jax")
        if lora is None:
            raise ValueError(f"values holds LoRA adapters ({sorted(adapters)[:2]}...): pass lora=, the LoRA they "
                             f"were trained with")
        model, merged = write_adapters(model, adapters, lora, merge)
        values = {**{k: v for k, v in values.items() if k not in adapters}, **merged}
    new = onnx.ModelProto()
    new.CopyFrom(model)
    index = {init.name: i for i, init in enumerate(new.graph.initializer)}
    for name, value in values.items():
        if name not in index:
            raise ValueError(f"{name!r} is not an initializer of the model"
                             + (" (a stacked parameter of to_jax(..., stacked_params=True)? pass apply_fn as model, or "
                                "apply_fn.unstacked(values))" if "..." in name else ""))
        old = new.graph.initializer[index[name]]
        array = np.asarray(value)
        if tuple(array.shape) != tuple(old.dims):
            raise ValueError(f"initializer {name!r} has shape {list(old.dims)}, got {array.shape}")
        dtype = helper.tensor_dtype_to_np_dtype(old.data_type)
        new.graph.initializer[index[name]].CopyFrom(numpy_helper.from_array(array.astype(dtype), name))
    return new


def by_initializer_name(values: Any, argument: str = "values") -> dict[str, Any]:
    """``{initializer name: array}`` from a dict of arrays, an OnnxModule or its ``nnx.State``."""
    params = getattr(values, "params", None)
    if params is not None and hasattr(values, "apply_fn"):  # an OnnxModule
        values = params
    if isinstance(values, Mapping) and all(isinstance(k, str) and hasattr(v, "shape") for k, v in values.items()):
        return dict(values)
    if not isinstance(values, Mapping):
        raise TypeError(f"{argument} must map initializer names to arrays, got {type(values).__name__} (or be an "
                        f"OnnxModule or its nnx.State)")
    is_variable = lambda x: hasattr(x, "get_metadata")  # noqa: E731 (an nnx.Variable, such as nnx.Param)
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(values, is_leaf=is_variable)[0]:
        if is_variable(leaf):
            name, leaf = leaf.get_metadata().get("onnx_name"), leaf[...]
        else:
            name = None
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        keys = [k for k in keys if k != "value"]
        out[name if name is not None else str(keys[-1])] = leaf
    return out


def next_feeds(training_model: onnx.ModelProto, outputs: Any) -> dict[str, Any]:
    """The feeds that carry a training step's results into the next step: each output ``<name>.new`` of a
    :func:`make_training_model` graph fed as its input ``<name>`` (every parameter and optimizer state).

    A step whose new weights and moments are not fed back runs again from the initializers' values and trains
    nothing, without an error; this helper is the one way to get the carry right. Add the batch, ``R`` and
    ``T`` to the dict it returns.

    Args:
      training_model: the training graph (its outputs and inputs are read; not modified).
      outputs: what ``prepare(training_model).run(...)`` returned (in ``graph.output`` order), or a mapping
        from output names to values (``out["net.0.weight.new"]`` reads one result by name; the result's
        attribute names are ONNX's namedtuple fields, ``_1, _2, ...`` for names that are not identifiers).

    Returns:
      ``{input name: value}`` for every ``*.new`` output whose name without ``.new`` is a graph input.

    Raises:
      ValueError: ``outputs`` does not have one value per graph output (or lacks a name), or the graph has no
        ``*.new`` output that updates an input (not a training graph).

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
      ...     [numpy_helper.from_array(np.ones((2, 1), np.float32), "W")])
      >>> train = optkit.onnx.make_training_model(helper.make_model(graph), loss="mean_squared_error")
      >>> rep = optkit.onnx.prepare(train)
      >>> feeds = {}
      >>> for t in range(3):
      ...     feeds.update(x=np.ones((4, 2), np.float32), target=np.zeros((4, 1), np.float32),
      ...                  R=np.float32(0.1), T=np.int64(t + 1))
      ...     out = rep.run(feeds)
      ...     feeds = optkit.onnx.next_feeds(train, out)
      >>> sorted(feeds)
      ['W', 'W.adam_h', 'W.adam_v']
    """
    names = [o.name for o in training_model.graph.output]
    if isinstance(outputs, Mapping) and not hasattr(outputs, "_fields"):
        missing = [n for n in names if n not in outputs]
        if missing:
            raise ValueError(f"outputs lacks the graph outputs {missing}")
        values = [outputs[n] for n in names]
    else:
        values = list(outputs)
        if len(values) != len(names):
            raise ValueError(f"outputs has {len(values)} values; the training graph has {len(names)} outputs "
                             f"({names})")
    inputs = {i.name for i in training_model.graph.input}
    carried = {n.removesuffix(".new"): v for n, v in zip(names, values) if n.endswith(".new")
               and n.removesuffix(".new") in inputs}
    if not carried:
        raise ValueError("the graph has no output '<input>.new' that updates one of its inputs: not a training "
                         "graph of make_training_model")
    return carried
