"""An ONNX model as a Flax NNX module: :class:`OnnxModule` (imported on first use; needs ``flax``)."""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx
from flax.core import meta
from jax.sharding import NamedSharding, PartitionSpec

from optkit.onnx._jax import OnnxFunction, to_jax
from optkit.onnx._load.adapters import LoRA
from optkit.onnx._load.files import ModelSource

__all__ = ["OnnxModule"]


class OnnxModule(nnx.Module):
    """An ONNX model as a ``flax.nnx.Module``: its trainable initializers are ``nnx.Param`` variables.

    ``module(*inputs)`` runs the model (:class:`~optkit.onnx.OnnxFunction`'s
    rules for inputs and outputs) with the current values of its parameters,
    so ``nnx.Optimizer(module, tx, wrt=nnx.Param)`` trains it with any Optax
    or optkit optimizer, under ``nnx.jit`` or eagerly, and a step equals the
    same step on :func:`to_jax`'s ``apply_fn`` and plain dict.
    ``optkit.onnx.with_initializers(model, nnx.state(module, nnx.Param))``
    writes the trained values back into the ONNX model.

    Args:
      model: a ``ModelProto``, its bytes, a path or a binary file object.
      trainable, frozen, outputs, untie: as :func:`to_jax`.
      sharding: optional ``(name, shape) -> tuple of mesh axis names or None
        per axis`` (or None for a replicated parameter): stored as the
        parameter's ``out_sharding`` metadata (what ``nnx.with_partitioning``
        sets), which ``nnx.get_partition_spec`` and optkit's Adafactor read;
        under ``jax.set_mesh(mesh)`` the values are placed so at construction
        (without a mesh the names are metadata only).
      lora: low-rank adapters (:class:`~optkit.onnx.LoRA`, as :func:`to_jax`): the module's parameters are
        then the adapters, as ``nnx.LoRAParam`` (``nnx.Optimizer(module, tx, wrt=nnx.LoRAParam)`` trains only
        them, as with Flax's ``nnx.LoRA``), plus ``nnx.Param`` for what ``trainable`` names; ``A``'s initial
        values are drawn from ``rngs.params()`` when ``rngs`` has a ``params`` stream.
      rngs: ``nnx.Rngs`` (or a stream): each call draws a key from its ``rng_collection`` stream (default
        ``"dropout"``, else the default stream) for training-mode ``Dropout`` masks, the random operators and
        LoRA's dropout (``nnx.Dropout``'s convention). None: they use their ``seed`` attributes.
      deterministic: no random draws (``module.eval()`` sets it, ``module.train()`` clears it).
      rng_collection: the stream of ``rngs`` drawn from.
      kwargs: ``base_dir``, ``max_tensor_bytes``, ``max_gradient_depth``,
        ``max_gradient_passes``, as :func:`prepare`; ``scan_layers``, ``remat_layers`` and ``stacked_params``, as
        :func:`to_jax`.

    Attributes:
      params: an ``nnx.Dict`` from initializer name to ``nnx.Param`` (shape and
        dtype of the initializer); each Param's metadata has ``onnx_name`` (a stacked parameter's: its
        initializers' names, layer by layer, a tuple).
      apply_fn: the :class:`~optkit.onnx.OnnxFunction` it calls.

    Raises:
      As :func:`to_jax` at construction, and as
      :class:`~optkit.onnx.OnnxFunction` at call; ValueError: a ``sharding``
      entry whose length is not the parameter's rank.

    Example:
      >>> import numpy as np, optax, optkit, optkit.onnx
      >>> from flax import nnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph(
      ...     [helper.make_node("MatMul", ["x", "W"], ["y"])], "linear",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
      ...     [numpy_helper.from_array(np.ones((3, 2), np.float32), "W")])
      >>> module = optkit.onnx.OnnxModule(helper.make_model(graph))
      >>> optimizer = nnx.Optimizer(module, optkit.adam(1e-3), wrt=nnx.Param)
      >>> loss, grads = nnx.value_and_grad(lambda m: (m(np.ones((4, 3), np.float32)) ** 2).mean())(module)
      >>> _ = optimizer.update(module, grads)
      >>> module.params["W"].get_metadata()["onnx_name"]
      'W'
    """

    def __init__(self, model: ModelSource, *, trainable: Sequence[str] | None = None, frozen: Sequence[str] = (),
                 outputs: str | Sequence[str] | None = None,
                 sharding: Callable[[str, tuple[int, ...]], Sequence[str | None] | None] | None = None,
                 base_dir: str | os.PathLike[str] | None = None, untie: bool | Sequence[str] = False,
                 lora: LoRA | None = None, rngs: nnx.Rngs | nnx.RngStream | None = None,
                 deterministic: bool = False, rng_collection: str = "dropout", **limits: Any) -> None:
        if lora is None:
            apply_fn, values = to_jax(model, trainable=trainable, frozen=frozen, outputs=outputs, base_dir=base_dir,
                                      untie=untie, **limits)
        else:  # the adapters' A drawn from rngs.params() when rngs has that stream, else from lora.seed
            key = rngs.params() if isinstance(rngs, nnx.Rngs) and "params" in rngs else None
            apply_fn, values = to_jax(model, trainable=trainable, frozen=frozen, outputs=outputs, base_dir=base_dir,
                                      untie=untie, lora=lora, lora_key=key, **limits)
        self.apply_fn: OnnxFunction = apply_fn
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        if isinstance(rngs, nnx.Rngs):
            self.rngs = rngs[rng_collection].fork() if rng_collection in rngs else rngs.default.fork()
        elif isinstance(rngs, nnx.RngStream):
            self.rngs = rngs.fork()
        elif rngs is None:
            self.rngs = nnx.data(None)
        else:
            raise TypeError(f"rngs must be an nnx.Rngs, an nnx.RngStream or None, got {type(rngs).__name__}")
        adapters = set(getattr(apply_fn, "adapters", ()))
        params = {}
        for name, value in values.items():
            metadata: dict[str, Any] = {"onnx_name": apply_fn.stacked.get(name, name)}
            names = None if sharding is None else sharding(name, tuple(value.shape))
            if names is not None:
                names = tuple(names)
                if len(names) != value.ndim:
                    raise ValueError(f"sharding({name!r}, {tuple(value.shape)}) gave {names}: one mesh axis name "
                                     f"or None per axis is needed")
                metadata["out_sharding"] = names
                # placed here, not by flax's eager sharding (whose constraint refuses, on Auto axes, a value
                # committed to one device); with no mesh set, the names are metadata only
                metadata["eager_sharding"] = False
                mesh = jax.sharding.get_mesh()
                if meta.get_global_mesh() is not None and mesh is not None and not mesh.empty:
                    value = jax.device_put(value, NamedSharding(mesh, PartitionSpec(*names)))
            params[name] = (nnx.LoRAParam if name in adapters else nnx.Param)(value, **metadata)
        self.params = nnx.Dict(params)

    def __call__(self, *inputs: Any, rngs: nnx.Rngs | nnx.RngStream | jax.Array | None = None,
                 deterministic: bool | None = None) -> Any:
        """Run the model on ``inputs``; random operators (training-mode ``Dropout``, ``Random*``, LoRA's dropout)
        draw a fresh key from ``rngs`` (this call's, else the module's) unless ``deterministic`` (this call's,
        else the module's, which ``module.eval()`` sets), as ``nnx.Dropout`` does; with neither, from their
        seeds."""
        deterministic = self.deterministic if deterministic is None else deterministic
        key = None
        if not deterministic:
            stream = rngs if rngs is not None else self.rngs
            if isinstance(stream, nnx.Rngs):
                stream = stream[self.rng_collection] if self.rng_collection in stream else stream.default
            key = stream() if isinstance(stream, nnx.RngStream) else stream
        params = {name: param[...] for name, param in self.params.items()}
        return self.apply_fn(params, *inputs, rng=key)

    def summary(self) -> str:
        """What is in the model and what the module trains (:meth:`OnnxFunction.summary`)."""
        return self.apply_fn.summary().replace("params (apply_fn's first argument)", "nnx.Param variables")

    def __repr__(self) -> str:
        return "OnnxModule(\n" + "\n".join(f"  {line}" for line in self.summary().splitlines()) + "\n)"

    def _repr_html_(self) -> str:
        """The summary for notebooks (Jupyter shows it in place of ``repr``)."""
        return "<pre>" + html.escape(repr(self)) + "</pre>"
