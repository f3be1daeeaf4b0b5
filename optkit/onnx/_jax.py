"""An ONNX model as a pure JAX function and a parameter dict: :func:`to_jax`.

The model goes through the one load pipeline (:mod:`optkit.onnx._load`); its
trainable initializers become the parameters, every other initializer stays a
constant, and :class:`OnnxFunction` runs the converted graph on
``(params, *inputs)`` inside JAX's 64-bit mode (ONNX's INT64 and DOUBLE), so
that it composes with ``jax.jit``, ``jax.grad``, ``jax.vmap``, Optax and Flax
as any JAX function does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from optkit._src.graph.names import check_feed
from optkit.onnx._backend import graph_function
from optkit.onnx._convert import Converted
from optkit.onnx._files import ModelSource
from optkit.onnx._limits import Limits
from optkit.onnx._load import load
from optkit.onnx._operators import nodes_of
from optkit.onnx._protos import InputInfo
from optkit.onnx._training_model import looks_trainable, select_trainable

__all__ = ["OnnxFunction", "to_jax"]


class OnnxFunction:
    """A loaded ONNX model as ``apply_fn(params, *inputs)``; made by :func:`to_jax`.

    Call it with the parameter dict (:func:`to_jax`'s ``params``, or a dict of
    the same names, shapes and dtypes: trained values, tracers) and the model's
    inputs, positionally in ``graph.input`` order (inputs an initializer
    defaults may be left off the end) or as one mapping by name. It returns
    the model's output (one array) or outputs (a tuple), as :func:`to_jax`'s
    ``outputs`` chose. Pure: ``jax.jit``, ``jax.grad``, ``jax.vjp`` and
    ``jax.vmap`` apply; called outside a trace, it runs compiled (one
    compilation per input signature), every node's output checked against
    ``max_tensor_bytes`` before anything runs.

    Inputs: a float or bool input must have its declared dtype (ONNX converts
    nothing implicitly); an integer input may have any integer dtype and is
    converted to the declared one (``jax.jit`` with 64-bit mode off gives int32
    for an exporter's INT64 input; a concrete value that does not fit a
    narrower declared type is refused). Fixed dimensions are checked.

    Attributes:
      inputs: the graph inputs (:class:`~optkit.onnx.InputInfo`), in ``graph.input`` order.
      outputs: the output names returned, in order.
      param_names: the trainable initializers' names (the keys ``params`` must have).
      model: the checked ``onnx.ModelProto``.

    Raises:
      TypeError: (at call, while tracing) ``params`` not a mapping, a
        parameter or input of another dtype (integer inputs aside).
      ValueError: a parameter missing, unknown or of another shape; an input
        missing, unknown or of another shape; a value needed before running (a
        ``Reshape`` shape fed as a graph input) that is traced.
      TensorTooLargeError: a node output above ``max_tensor_bytes``.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph(
      ...     [helper.make_node("Gather", ["table", "ids"], ["rows"])], "embedding",
      ...     [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
      ...     [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 2])],
      ...     [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "table")])
      >>> apply_fn, params = optkit.onnx.to_jax(helper.make_model(graph))
      >>> apply_fn
      OnnxFunction(inputs=['ids'], outputs=['rows'], params=1)
      >>> apply_fn(params, {"ids": np.array([2, 0], np.int32)})  # int32 into the INT64 input
      Array([[4., 5.],
             [0., 1.]], dtype=float32)
    """

    def __init__(self, loaded: Converted, param_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
                 outputs: tuple[str, ...], single: bool, reverse_mode_only: bool = False) -> None:
        self.model: onnx.ModelProto | None = loaded.model
        self.inputs: tuple[InputInfo, ...] = loaded.inputs
        self.outputs: tuple[str, ...] = outputs
        self.param_names: tuple[str, ...] = tuple(param_specs)
        self._graph = loaded.graph
        self._specs = dict(param_specs)
        self._single = single
        self._static = loaded.static_inputs
        self._by_name = {info.name: info for info in self.inputs}
        self._functions: dict[Any, Any] = {}
        self._reverse_only = reverse_mode_only

    def __call__(self, params: Mapping[str, Any], *inputs: Any) -> Any:
        feeds = self._named(inputs)
        params = self._checked_params(params)
        with jax.enable_x64(True):
            feeds = {name: self._input(self._by_name[name], value) for name, value in feeds.items()}
            static = {name: np.asarray(value) for name, value in feeds.items()
                      if name in self._static and not isinstance(value, jax.core.Tracer)}
            dynamic = tuple(name for name in feeds if name not in static)
            run = graph_function(self._functions, self._graph, self.outputs, static, (*params, *dynamic),
                                 reverse_only=self._reverse_only)
            result = run(*params.values(), *(feeds[name] for name in dynamic))
        return result[0] if self._single else result

    def __repr__(self) -> str:
        return (f"OnnxFunction(inputs={[info.name for info in self.inputs]}, outputs={list(self.outputs)}, "
                f"params={len(self.param_names)})")

    def _named(self, inputs: tuple[Any, ...]) -> dict[str, Any]:
        if len(inputs) == 1 and isinstance(inputs[0], Mapping):
            feeds = dict(inputs[0])
            unknown = [name for name in feeds if name not in self._by_name]
            if unknown:
                raise ValueError(f"input {unknown[0]!r} is not a graph input; the inputs are "
                                 f"{[info.name for info in self.inputs]}")
        else:
            if len(inputs) > len(self.inputs):
                raise ValueError(f"got {len(inputs)} inputs but the model has {len(self.inputs)}: "
                                 f"{[info.name for info in self.inputs]}")
            feeds = {info.name: value for info, value in zip(self.inputs, inputs)}
        missing = [info.name for info in self.inputs if not info.has_default and info.name not in feeds]
        if missing:
            raise ValueError(f"graph inputs {missing} are not given; pass the inputs in graph.input order "
                             f"{[info.name for info in self.inputs]} or one mapping by name")
        return feeds

    def _checked_params(self, params: Any) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a mapping from initializer names to arrays (to_jax's params), got "
                            f"{type(params).__name__}")
        missing = [name for name in self._specs if name not in params]
        unknown = [name for name in params if name not in self._specs]
        if missing or unknown:
            raise ValueError(f"params {'lacks ' + str(missing) if missing else ''}"
                             f"{' and ' if missing and unknown else ''}"
                             f"{'has names that are not trainable initializers: ' + str(unknown) if unknown else ''}"
                             f"; the parameters are {list(self._specs)}")
        out = {}
        for name, (shape, dtype) in self._specs.items():
            value = params[name]
            if not hasattr(value, "dtype"):
                value = jnp.asarray(value, dtype)
            if tuple(value.shape) != shape:
                raise ValueError(f"params[{name!r}] has shape {tuple(value.shape)}, the initializer {shape}")
            if jnp.dtype(value.dtype) != dtype:
                raise TypeError(f"params[{name!r}] is {jnp.dtype(value.dtype)}, the initializer {dtype}; cast it")
            out[name] = value
        return out

    def _input(self, info: InputInfo, value: Any) -> Any:
        if not hasattr(value, "dtype"):
            converted = np.asarray(value)
            if converted.dtype.kind not in "biuf" or (converted.dtype.kind == "f" and info.dtype.kind != "f"):
                raise TypeError(f"graph input {info.name!r} is declared {info.dtype}; cannot take {value!r}")
            value = converted
        kind = jnp.dtype(value.dtype).kind
        if kind in "iu" and info.dtype.kind in "iu" and jnp.dtype(value.dtype) != info.dtype:
            if not isinstance(value, jax.core.Tracer) and np.size(value):
                bounds, concrete = np.iinfo(info.dtype), np.asarray(value)
                if concrete.min() < bounds.min or concrete.max() > bounds.max:
                    raise ValueError(f"graph input {info.name!r} is declared {info.dtype}; the value "
                                     f"{concrete.min() if concrete.min() < bounds.min else concrete.max()} "
                                     f"does not fit")
            value = value.astype(info.dtype)
        check_feed(info.name, value, info.shape, info.dtype, exact=True)
        return value

def to_jax(
    model: ModelSource,
    *,
    trainable: Sequence[str] | None = None,
    frozen: Sequence[str] = (),
    outputs: str | Sequence[str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    max_tensor_bytes: int | None = None,
    max_gradient_depth: int | None = None,
    max_gradient_passes: int | None = None,
    reverse_mode_only: bool = False,
) -> tuple[OnnxFunction, dict[str, jax.Array]]:
    """An ONNX model as a pure JAX function and its trainable parameters: ``apply_fn, params``.

    ``apply_fn(params, *inputs)`` (an :class:`OnnxFunction`) runs the model
    with the initializers named in ``params`` taken from ``params`` and every
    other initializer a constant; ``params`` is a dict ``{initializer name:
    jax.Array}`` of the trainable initializers' values, in their dtypes. Train
    it with any Optax or optkit optimizer, in ``nnx`` through
    :class:`OnnxModule`, and write the result back with
    :func:`with_initializers` for ONNX Runtime. Gradient and training nodes in
    the model still run. The model is loaded as :func:`prepare` loads it (the
    same bounds and refusals).

    Args:
      model: a ``ModelProto``, its bytes, a path or a binary file object.
      trainable: the initializer names to train; default what
        :func:`make_training_model` trains (floating-point initializers of
        rank >= 1 that a node reads and that look like weights, not masks),
        less those read where a value must be known before running (a
        ``Resize``'s scales).
      frozen: initializer names left out of ``trainable`` (ONNX Runtime's ``frozen_params``).
      outputs: the output names ``apply_fn`` returns: one name (the array),
        a sequence (a tuple); default the model's outputs (the array itself
        for a model with one output).
      base_dir, max_tensor_bytes, max_gradient_depth, max_gradient_passes: as :func:`prepare`.
      reverse_mode_only: True to differentiate ``apply_fn`` in reverse mode
        only (``jax.grad``, ``jax.value_and_grad``, ``jax.vjp``): on CPU its large depthwise convolutions then take a
        derivative whose weight gradient is one fused reduction over the
        kernel's taps (MobileNetV3-Small's training step 194 -> 122 ms,
        EfficientNet-B0's 1088 -> 794 ms, batch 8 on 2 cores; docs "Speed on
        CPU"). Forward mode through those convolutions (``jax.jvp``,
        ``jax.jacfwd``, ``jax.hessian``) then raises JAX's TypeError; reverse
        over reverse (``jax.grad`` of ``jax.grad``) still works. Default
        False: every JAX transformation works.

    Returns:
      ``(apply_fn, params)``.

    Raises:
      ValueError, TypeError, TensorTooLargeError, UnsupportedOpError: as
        :func:`prepare`; a ``trainable``, ``frozen`` or ``outputs`` name the
        model does not have, a non-float initializer to train. (A model with
        nothing to train gives an empty ``params``: inference.)

    Source: the ONNX IR (initializers, graph inputs); ``jaxonnxruntime``'s
    ``call_onnx_model`` and ``onnx2torch`` give the same shape of result for
    inference and torch.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np, optax, optkit, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph(
      ...     [helper.make_node("Gemm", ["x", "W", "b"], ["y"])], "linear",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
      ...     [numpy_helper.from_array(np.ones((3, 2), np.float32), "W"),
      ...      numpy_helper.from_array(np.zeros(2, np.float32), "b")])
      >>> apply_fn, params = optkit.onnx.to_jax(helper.make_model(graph))
      >>> sorted(params)
      ['W', 'b']
      >>> loss = lambda p, x: jnp.mean(apply_fn(p, x) ** 2)
      >>> tx = optkit.adafactor(1e-2)
      >>> grads = jax.jit(jax.grad(loss))(params, jnp.ones((4, 3)))
      >>> updates, _ = tx.update(grads, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["W"].shape
      (3, 2)
    """
    limits = Limits.make(max_tensor_bytes, max_gradient_depth, max_gradient_passes=max_gradient_passes)
    loaded = load(model, limits, base_dir)
    values = dict(loaded.graph.initializers)
    floating = {name: bool(jnp.issubdtype(np.asarray(v).dtype, jnp.floating)) for name, v in values.items()}
    read = {name for _, node in nodes_of(loaded.model.graph) for name in node.input}
    default = [name for name, v in values.items() if floating[name] and name in read and np.ndim(v)
               and name not in loaded.static_initializers and looks_trainable(v)]
    names = select_trainable(floating, default, trainable, frozen, allow_empty=True)
    if outputs is None:
        chosen, single = loaded.outputs, len(loaded.outputs) == 1
    else:
        single = isinstance(outputs, str)
        chosen = (outputs,) if single else tuple(outputs)
        unknown = [name for name in chosen if name not in loaded.outputs]
        if unknown or not chosen:
            raise ValueError(f"outputs {unknown or list(chosen)} are not graph outputs; the outputs are "
                             f"{list(loaded.outputs)}")
    specs = {name: (tuple(np.shape(values[name])), np.asarray(values[name]).dtype) for name in names}
    with jax.enable_x64(True):  # a DOUBLE initializer stays float64
        params = {name: jnp.asarray(values[name]) for name in names}
    return OnnxFunction(loaded, specs, tuple(chosen), single, reverse_mode_only), params
