"""An ONNX model as a pure JAX function and a parameter dict: :func:`to_jax`.

The model goes through the one load pipeline (:mod:`optkit.onnx._load.pipeline`); its
trainable initializers become the parameters, every other initializer stays a
constant, and :class:`OnnxFunction` runs the converted graph on
``(params, *inputs)`` in the caller's 64-bit setting (the dtype policy of
``optkit/onnx/_run/feeds.py``: INT64 as int32 with it off), so that it composes
with ``jax.jit``, ``jax.grad``, ``jax.vmap``, Optax and Flax as any JAX
function does.
"""

from __future__ import annotations

import dataclasses
import html
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from optkit.onnx._base.limits import Limits
from optkit.onnx._base.tracing import as_key
from optkit.onnx._load.adapters import LoRA
from optkit.onnx._load.convert import Converted
from optkit.onnx._load.files import ModelSource, model_identity
from optkit.onnx._load.pipeline import load
from optkit.onnx._load.protos import InputInfo
from optkit.onnx._ops import TABLE
from optkit.onnx._plans.layers import layers_of, stacked_name
from optkit.onnx._run.cache import compilation_cache
from optkit.onnx._run.feeds import Feeds, run_dtype
from optkit.onnx._run.held import gathered_where_used, held_weights, stacked_groups, stacked_specs
from optkit.onnx._run.program import Program, graph_function, program_key
from optkit.onnx._run.warm import warm_call
from optkit.onnx._summary import describe
from optkit.onnx._training_model import select_trainable

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
    converted to the one the declared type runs as (``jax.jit`` with 64-bit
    mode off gives int32 for an exporter's INT64 input; a concrete value that
    does not fit is refused). Fixed dimensions are checked.

    Types: the caller's JAX 64-bit setting decides, and nothing switches it:
    with ``jax_enable_x64`` on, INT64 and DOUBLE are int64 and float64; off,
    they run as int32 and float32 (a model with DOUBLE tensors warns once).
    ``params`` hold each initializer in the dtype it runs as when
    :func:`to_jax` is called.

    Attributes:
      inputs: the graph inputs (:class:`~optkit.onnx.InputInfo`), in ``graph.input`` order.
      outputs: the output names returned, in order.
      param_names: the trainable initializers' names (the keys ``params`` must have).
      model: the checked ``onnx.ModelProto`` (with ``lora=``, the model with its adapter nodes).
      lora: the :class:`~optkit.onnx.LoRA` its adapters were made with, or None.
      adapters: the adapters' names in ``params`` (``<W>.lora_A``, ``<W>.lora_B``), or ().
      stacked: ``{stacked parameter's name: its initializers' names, layer by layer}`` for the scanned runs
        whose weights ``to_jax`` holds stacked (``stacked_params``), else empty.

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
      >>> print(repr(apply_fn).splitlines()[:5])
      ['OnnxFunction(', '  inputs:', '    ids: int64 (N)', '  outputs:', '    rows: float (N, 2)']
      >>> apply_fn(params, {"ids": np.array([2, 0], np.int32)})  # int32 into the INT64 input
      Array([[4., 5.],
             [0., 1.]], dtype=float32)
    """

    def __init__(self, loaded: Converted, param_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
                 outputs: tuple[str, ...], single: bool,
                 checks: bool = False, scan_layers: bool | None = None, remat_layers: bool = False,
                 lora: LoRA | None = None) -> None:
        compilation_cache()  # (JAX's persistent cache on, unless the user chose: optkit.onnx._run.cache)
        self.model: onnx.ModelProto | None = loaded.model
        self.inputs: tuple[InputInfo, ...] = loaded.inputs
        self.outputs: tuple[str, ...] = outputs
        self.param_names: tuple[str, ...] = tuple(param_specs)
        self._graph = loaded.graph
        self._specs = dict(param_specs)
        self._single = single
        self._feeds = Feeds(self.inputs, loaded.static_inputs, double=loaded.facts.double)
        self._functions: dict[Any, Any] = {}
        self._checks = bool(checks)
        self._loaded = loaded
        self._layers = layers_of(loaded, scan_layers, remat_layers)
        if self._layers:  # a value inside a repeated layer: that run unrolled, so that the value is computed
            computed = {name: node for node in self._graph.nodes for name in node.outputs if name}
            self._layers.unrolled.update(self._layers.member[computed[name]] for name in outputs
                                         if name not in loaded.outputs and computed.get(name) in self._layers.member)
        self.stacked: dict[str, tuple[str, ...]] = {}  # (to_jax's stacked_params: _stack_params)
        self._feed_names: dict[str, str] = {}
        self._summary: str | None = None
        self._options = repr((loaded.limits and dataclasses.replace(loaded.limits, max_tensor_bytes=0), outputs,
                              checks, scan_layers, remat_layers, lora))  # (warm starts' key; the free memory aside)
        self.lora: LoRA | None = lora
        self.adapters: tuple[str, ...] = loaded.adapters
        self._frozen: dict[str, jax.Array] = {}  # with lora: the frozen base on the device
        if lora is not None:
            self._hold_frozen()

    def _stack_params(self, initializers: Mapping[str, Any]) -> None:
        """Hold each scanned run's per-layer trained initializers as one parameter with a leading layer axis."""
        self._specs, self.stacked = stacked_specs(self._specs, stacked_groups(self._layers, initializers, self._specs),
                                                  initializers)
        self.param_names = tuple(self._specs)
        self._feed_names = {key: stacked_name(names) for key, names in self.stacked.items()}

    def unstacked(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with each stacked parameter (:func:`to_jax`'s ``stacked_params``) given back as the ONNX
        initializers it holds, one per layer: ``{initializer name: array}``, what
        :func:`~optkit.onnx.with_initializers` and ONNX Runtime's names need. Other entries are passed through.

        Args:
          params: ``{name: array}`` with the names of ``param_names`` (``to_jax``'s ``params``, trained).

        Returns:
          A new dict; ``params`` is not changed. A stacked ``(layers, *shape)`` array gives ``layers`` arrays of
          ``shape`` (slices: views of it for NumPy, new arrays for JAX).

        Example:
          >>> import numpy as np, optkit.onnx
          >>> from onnx import TensorProto, helper, numpy_helper
          >>> nodes, weights, h = [], [], "x"
          >>> for k in range(3):  # three identical layers: h + f(h @ W_k), f six element-wise steps
          ...     nodes.append(helper.make_node("MatMul", [h, f"W{k}"], [f"m{k}_0"]))
          ...     for j, op in enumerate(["Tanh", "Sin", "Cos"] * 2):
          ...         nodes.append(helper.make_node(op, [f"m{k}_{j}"], [f"m{k}_{j + 1}"]))
          ...     nodes.append(helper.make_node("Add", [h, f"m{k}_6"], [f"h{k}"]))
          ...     weights.append(numpy_helper.from_array(np.eye(2, dtype=np.float32) * (k + 1), f"W{k}"))
          ...     h = f"h{k}"
          >>> info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 2])
          >>> graph = helper.make_graph(nodes, "layers", [info("x")], [info(h)], weights)
          >>> apply_fn, params = optkit.onnx.to_jax(helper.make_model(graph), scan_layers=True, stacked_params=True)
          >>> {name: value.shape for name, value in params.items()}
          {'W0...W2': (3, 2, 2)}
          >>> {name: value[0, 0].item() for name, value in apply_fn.unstacked(params).items()}
          {'W0': 1.0, 'W1': 2.0, 'W2': 3.0}
        """
        out: dict[str, Any] = {}
        for name, value in params.items():
            names = self.stacked.get(name)
            if names is None:
                out[name] = value
            else:
                out.update((layer, value[k]) for k, layer in enumerate(names))
        return out

    def _hold_frozen(self, min_bytes: int = 2**20) -> None:
        """Feed the frozen initializers of ``min_bytes`` or more (not trained, not read where a value must be known
        before running) as device arrays made once, instead of NumPy constants of the traced program: with LoRA,
        the base weights. Under a caller's ``jax.jit`` they are then ``jax.Array`` constants, which JAX passes
        as arguments with ``jax_use_simplified_jaxpr_constants`` on, without a copy per call."""
        # (the per-layer weights of a scanned run stacked once here instead of at every call)
        skip = {*self._specs, *(name for names in self.stacked.values() for name in names),
                *self._loaded.static_initializers}
        self._frozen = held_weights(self._graph.initializers, self._layers, skip, min_bytes=min_bytes)

    def __call__(self, params: Mapping[str, Any], *inputs: Any, rng: Any = None) -> Any:
        """Run the model: ``params``, the inputs (positionally or one mapping by name) and, for training-mode
        ``Dropout`` masks, the random operators and LoRA's dropout, a ``jax.random`` key ``rng`` (each node draws
        from it with its name folded in; None: each node's ``seed`` attribute, the same numbers at every call)."""
        feeds = self._feeds.named(inputs[0] if len(inputs) == 1 and isinstance(inputs[0], Mapping) else inputs)
        params = self._checked_params(params)
        feeds = self._feeds.checked(feeds)
        static, dynamic = self._feeds.split(feeds)
        params = gathered_where_used(params, [feeds[name] for name in dynamic])  # FSDP: split like the batch
        values = (*params.values(), *self._frozen.values(), *(feeds[name] for name in dynamic))
        if rng is not None:
            values = (as_key(rng), *values)
        # Inside a caller's trace (jax.jit, jax.grad) the graph is traced into it directly, not as a jax.jit that JAX
        # would trace and then linearize again for the caller's grad (a 12-layer LLaMA's training step: 4.6 s of
        # trace, 2.3 s of it that second pass); checks are then staged for the caller's checkify.checkify.
        inside = any(isinstance(v, jax.core.Tracer) for v in values)
        run = graph_function(self._functions, self._graph, self.outputs, static,
                             (*(self._feed_names.get(name, name) for name in params), *self._frozen, *dynamic),
                             Program(checks=self._checks, jit=not inside, rng=rng is not None, layers=self._layers))
        result = (inside and rng is None and not self._checks and warm_call(  # (exported once: _run/warm.py)
            run, lambda: self._warm_parts(dynamic, static), values)) or run(*values)
        return result[0] if self._single else result

    def _warm_parts(self, dynamic: tuple[str, ...], static: Mapping[str, Any]) -> tuple | None:
        self._identity = getattr(self, "_identity", None) or model_identity(self.model)  # (digest, operators)
        if self._identity is None or self._identity[1] & TABLE.users():
            return None  # (a user's registered operator: code the model's bytes do not show)
        return (self._identity[0], self._options, tuple(self._specs), tuple(self.stacked.items()), tuple(self._frozen),
                program_key(dynamic, Program(jit=False), static))

    def summary(self) -> str:
        """What is in the model (``optkit-onnx summary``'s text), and
        what ``params`` holds: the initializers trained, their values and bytes."""
        if self._summary is None:
            sizes = {name: (int(np.prod(shape, dtype=np.int64)), np.dtype(dtype).itemsize)
                     for name, (shape, dtype) in self._specs.items()}
            count = sum(n for n, _ in sizes.values())
            nbytes = sum(n * size for n, size in sizes.values())
            self._summary = "\n".join([*describe(self._loaded),
                                       f"params (apply_fn's first argument): {len(self.param_names)} initializers, "
                                       f"{count:,} values, {nbytes:,} bytes",
                                       f"returns: {list(self.outputs)}"])
        return self._summary

    def __repr__(self) -> str:
        return "OnnxFunction(\n" + "\n".join(f"  {line}" for line in self.summary().splitlines()) + "\n)"

    def _repr_html_(self) -> str:
        """The summary for notebooks (Jupyter shows it in place of ``repr``)."""
        return "<pre>" + html.escape(repr(self)) + "</pre>"

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
            value, wanted = params[name], run_dtype(dtype)
            if not hasattr(value, "dtype"):
                value = jnp.asarray(value, wanted)
            if tuple(value.shape) != shape:
                raise ValueError(f"params[{name!r}] has shape {tuple(value.shape)}, the initializer {shape}")
            if jnp.dtype(value.dtype) not in (dtype, wanted):
                raise TypeError(f"params[{name!r}] is {jnp.dtype(value.dtype)}, the initializer {dtype}"
                                f"{'' if wanted == dtype else f' (run as {wanted})'}; cast it")
            out[name] = value
        return out


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
    max_node_work: int | None = None,
    max_loop_steps: int | None = None,
    untie: bool | Sequence[str] = False,
    checks: bool = False,
    lora: LoRA | None = None,
    lora_key: Any = None,
    scan_layers: bool | None = None,
    remat_layers: bool = False,
    stacked_params: bool | None = None,
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
        for a model with one output). A name may also be any value that a
        node of the main graph computes: the graph is cut there and only the
        nodes the named values need run (a detector's backbone and heads
        without its box decoding and ``NonMaxSuppression``, whose output
        sizes depend on values; a repeated layer holding such a value runs
        unrolled). Initializers only the cut-off nodes read stay in
        ``params``, with zero gradients.
      base_dir, max_tensor_bytes, max_gradient_depth, max_gradient_passes, max_node_work, max_loop_steps: as
        :func:`prepare`.
      untie: give each node its own copy of the initializers the exporter shared between unrelated nodes
        (torch.onnx's dynamo exporter writes one initializer for equal constants: every zero bias of a
        BERT's LayerNorms is one), which training would otherwise tie; the copies are parameters named
        ``<name>.untied.<k>`` (``apply_fn.model`` is the untied model, for :func:`with_initializers`).
        True: every initializer read by several nodes of one operator at one input position (the rule of
        the warning below); or a sequence of initializer names. Default False: a ``UserWarning`` names the
        trainable initializers so shared.
      checks: check every index that ``Gather``, ``GatherElements``, ``GatherND``, ``ScatterElements`` and
        ``ScatterND`` (``Scatter``) read, as ONNX Runtime does: called with concrete values, ``apply_fn`` runs
        compiled with ``jax.experimental.checkify`` and an out-of-range index raises
        ``checkify.JaxRuntimeError`` (a ``ValueError``) naming the node; inside your own ``jax.jit`` (or
        ``grad``), wrap the function with ``checkify.checkify(f, errors=checkify.user_checks)`` and call
        ``err.throw()``. Default False: an out-of-range index gives NaN (floats) or the type's fill value,
        never another element (JAX's ``mode="fill"``), and costs nothing.
      lora: low-rank adapters (:class:`~optkit.onnx.LoRA`) on the weights of the ``MatMul``, ``Gemm``,
        ``MatMulNBits`` and dynamically quantized ``MatMulInteger`` nodes it targets: each such node computes
        ``x @ W + (alpha / rank) * (x @ A) @ B``.
        ``params`` then holds the adapters, ``<W>.lora_A`` (in x rank, random) and ``<W>.lora_B`` (rank x out,
        zeros: the model starts as exported), float32 (float64 for a DOUBLE weight), plus only the initializers
        ``trainable``
        names explicitly (default none); the base weights are constants of ``apply_fn`` in the file's dtype
        and packing (no gradient, no optimizer state). :func:`with_initializers` writes the adapters back
        (``lora=`` the same). ``apply_fn.lora`` keeps it.
      lora_key: the ``jax.random`` key of the adapters' ``A`` values; default ``jax.random.key(lora.seed)``.
      scan_layers: run the model's repeated layers as one scanned layer (T5X's and MaxText's ``scan_layers``):
        the maximal runs of identical blocks (same operators, attributes and data flow; only the initializers
        differ), each reading the one before, are traced once and compiled as a ``jax.lax.scan`` over their
        weights, held stacked (``stacked_params``). Nodes computed from the graph inputs alone (an attention
        mask an exporter writes inside the first layer) run first. Values a block reads from outside the run
        (masks, rotary tables) are loop invariants; per-layer outputs read after the run (KV caches) are the
        scan's stacked outputs. Outputs and gradients are the
        unrolled form's to float rounding; random operators draw the same numbers. A run the scan cannot
        trace (a per-layer value an operator needs before running) runs unrolled, logged at INFO on the
        ``optkit.onnx`` logger. True: every run of 2 blocks or more; False: every node spelled out, as in
        the file; None (default): runs of 16 blocks or more, where it pays on XLA:CPU (stacked, a 24-layer
        BERT's first training step 15.5 -> 3.9 s and its steady step 0.97x the unrolled one's, GPT-2's 55 -> 5.7 s
        and 0.82x; a 12-layer one's steady step is 1.2x, and LLaMA's 1.5-1.7x at any depth, as a scan written in
        JAX is: docs "Repeated layers").
      remat_layers: rematerialize the scanned layers in the backward pass (``jax.checkpoint`` of the scanned
        body): activation memory of one layer instead of all, for a second forward pass. Default False.
      stacked_params: hold each scanned run's per-layer trained initializers as one parameter with a leading layer
        axis (MaxText's and T5X's scanned parameters), so that no call stacks them: ``params["<first layer's
        name>...<last layer's name>"]`` of shape ``(layers, *shape)`` in place of the layers' own entries
        (``apply_fn.stacked`` maps each to its initializer names, in order). The optimizer's state, ``OnnxModule``'s
        ``nnx.Param``, checkpoints and sharding rules then see the stacked arrays; :func:`with_initializers` (given
        ``apply_fn``, or an ``OnnxModule``) and :meth:`~optkit.onnx.OnnxFunction.unstacked` give them back per
        initializer. A run cut where its weights change shape (ResNet's stages) stacks each stretch of 2 layers or
        more; weights only some layers train, and runs that are not scanned, keep their names. None (default): stacked
        wherever a run is scanned, except LoRA adapters (kept per layer, as ONNX Runtime's adapter files name them);
        True: the same, adapters too; False: every initializer under its own name, the scanned run stacking them
        inside ``apply_fn`` at every call (on XLA:CPU, a 24-layer BERT's first training step took 13.7 s that way
        against 3.9 s stacked: docs "Repeated layers").

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
    limits = Limits.make(max_tensor_bytes, max_gradient_depth, max_gradient_passes=max_gradient_passes,
                         max_node_work=max_node_work, max_loop_steps=max_loop_steps)
    loaded = load(model, limits, base_dir, untie=untie, lora=lora, lora_key=lora_key)
    values = dict(loaded.graph.initializers)
    floating = {name: bool(jnp.issubdtype(np.asarray(v).dtype, jnp.floating)) for name, v in values.items()}
    if lora is None:
        names = select_trainable(floating, loaded.facts.default_trainable, trainable, frozen, allow_empty=True)
    else:  # the adapters, and what trainable= names besides
        extra = [] if trainable is None else select_trainable(floating, loaded.facts.default_trainable, trainable,
                                                               frozen, allow_empty=True)
        names = [*loaded.adapters, *(name for name in extra if name not in loaded.adapters)]
    tied = {name: loaded.facts.shared[name] for name in names if name in loaded.facts.shared}
    if tied and not untie:
        shown = "; ".join(f"{name!r} by {len(nodes)} nodes ({', '.join(map(repr, nodes[:3]))}"
                          f"{', ...' if len(nodes) > 3 else ''})" for name, nodes in list(tied.items())[:3])
        warnings.warn(f"{len(tied)} trainable initializer{'s are' if len(tied) > 1 else ' is'} read by several "
                      f"nodes of one operator (an exporter's deduplication of equal constants): {shown}"
                      f"{' and more' if len(tied) > 3 else ''}. Training ties those nodes; pass untie=True to give "
                      f"each node its own copy, or frozen=[...] to keep them fixed", UserWarning, stacklevel=2)
    computed = {name: node for node in loaded.graph.nodes for name in node.outputs if name}
    if outputs is None:
        chosen, single = loaded.outputs, len(loaded.outputs) == 1
    else:
        single = isinstance(outputs, str)
        chosen = (outputs,) if single else tuple(outputs)
        unknown = [name for name in chosen if name not in loaded.outputs and name not in computed]
        if unknown or not chosen:
            raise ValueError(f"outputs {unknown or list(chosen)} are neither graph outputs nor values a node of "
                             f"the main graph computes; the outputs are {list(loaded.outputs)}")
    if stacked_params is not None and not isinstance(stacked_params, (bool, np.bool_)):
        raise TypeError(f"stacked_params must be True, False or None, got {stacked_params!r}")
    if stacked_params and scan_layers is False:
        raise ValueError("stacked_params=True holds the weights of scanned layers: it needs scan_layers=True (or "
                         "None), not False")
    stacked_params = lora is None if stacked_params is None else bool(stacked_params)
    specs = {name: (tuple(np.shape(values[name])), np.asarray(values[name]).dtype) for name in names}
    apply_fn = OnnxFunction(loaded, specs, tuple(chosen), single, checks, scan_layers, remat_layers, lora)
    if stacked_params:
        apply_fn._stack_params(loaded.graph.initializers)
    params = {}
    for name, (_, dtype) in apply_fn._specs.items():
        layers = apply_fn.stacked.get(name)
        value = values[name] if layers is None else np.stack([np.asarray(values[layer]) for layer in layers])
        params[name] = jnp.asarray(value, run_dtype(dtype))
    return apply_fn, params
