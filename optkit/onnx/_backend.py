"""``onnx.backend.base`` Backend and BackendRep: run an ONNX model as one jitted JAX function.

ONNX's own test runner (``onnx.backend.test.BackendTest``) drives
:class:`Backend`; :class:`BackendRep` is also the way to run a training graph
step after step from Python.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.backend.base
import onnx.defs

from optkit import Graph
from optkit.onnx._base.errors import PAST_CAP, ValueDependentError
from optkit.onnx._base.limits import Limits, jax_device
from optkit.onnx._load.analysis import Facts
from optkit.onnx._load.convert import Converted
from optkit.onnx._load.files import ModelSource
from optkit.onnx._load.pipeline import load
from optkit.onnx._load.protos import InputInfo, node_model
from optkit.onnx._ops._common import on_cpu
from optkit.onnx._plans.layers import layers_of
from optkit.onnx._run.cache import compilation_cache
from optkit.onnx._run.feeds import Feeds
from optkit.onnx._run.held import held_weights
from optkit.onnx._run.program import Program, graph_function, static_key
from optkit.onnx._run.segments import SegmentedRun

__all__ = ["Backend", "BackendRep", "prepare", "run_model", "run_node"]


# XLA:CPU (jaxlib 0.10) hands large convolutions to YNNPACK; with this option they stay XLA's own (Eigen's).
# Measured on 2 cores, batch 8 (benchmarks/RESULTS.md): inference 15-25% faster for resnet18, mobilenet_v3_small
# and efficientnet_b0, resnet18's training step 10% faster; but a training step that differentiates a grouped
# (depthwise) convolution 4x slower (mobilenet_v3_small: 0.21 s -> 0.84 s). So: not for those.
_EIGEN_CONVOLUTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def _option_accepted() -> bool:
    """Whether this jaxlib's XLA knows the option (an unknown compile option fails the compile)."""
    try:
        jax.jit(lambda x: x + 1, compiler_options=_EIGEN_CONVOLUTIONS).lower(np.float32(0)).compile()
    except jax.errors.JaxRuntimeError:
        return False
    return True


def compiler_options(facts: Facts | None, device: Any) -> dict[str, Any] | None:
    """XLA options for a loaded model's graph (its :class:`~optkit.onnx._load.analysis.Facts`) compiled for ``device``
    by :class:`BackendRep`: XLA's own convolutions on CPU unless a Gradient node may differentiate a grouped
    convolution; else None. (``to_jax``'s function runs inside the caller's ``jax.jit``, which alone takes
    options.)"""
    if facts is None or not on_cpu(device) or not _option_accepted():
        return None
    return None if facts.grouped_convolution and facts.gradient else dict(_EIGEN_CONVOLUTIONS)


class BackendRep(onnx.backend.base.BackendRep):
    """A loaded ONNX model, ready to run as one compiled JAX function.

    :func:`optkit.onnx.prepare` makes it: loading reads and checks the model
    and maps every node (see :func:`optkit.onnx.to_graph`), so an unsupported
    operator or an invalid node fails there. :meth:`~optkit.onnx.BackendRep.run`
    checks the feeds against the
    declared graph inputs (a float dtype exactly, as ONNX Runtime does; every fixed
    dimension; a symbolic dimension the same size wherever it appears) before
    anything runs, then calls the compiled graph: the first call for a new
    input signature traces and compiles it (including Gradient nodes), later
    calls reuse it.

    A graph input that XLA needs before running (a ``Reshape`` shape or the
    axes of a reduction fed as a graph input, as in ONNX's node test cases)
    is a compile-time constant: the graph is compiled once per distinct value.

    Runs happen in the caller's JAX 64-bit setting, never switched: with
    ``jax_enable_x64`` on (``jax.enable_x64(True)``) ONNX's INT64 and DOUBLE
    are int64 and float64, as ONNX Runtime runs them; with it off (JAX's
    default) they run as int32 (fed integers range-checked) and float32, and
    a model with DOUBLE tensors warns once. FLOAT tensors stay float32.

    Args:
      loaded: the loaded model (what the load pipeline returns).
      device: the ``jax.Device`` to run on.
      jit: compile the graph with ``jax.jit`` (see :func:`optkit.onnx.prepare`).
      limits: the bounds it was loaded with.

    Attributes:
      model: the checked ``onnx.ModelProto``.
      graph: the :class:`optkit.Graph` it was mapped to.
      inputs: the graph inputs (:class:`InputInfo`: name, dtype, shape), in
        ``graph.input`` order.
      outputs: the output names, in ``graph.output`` order.
      updated_inputs: the graph inputs that an ``Adam``, ``Adagrad`` or
        ``Momentum`` node updates (its ``X`` and state tensors), in
        ``graph.input`` order: what ``run(..., donate=True)`` donates.
      device: the ``jax.Device``; limits: the bounds.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"])
      >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [info("x")], [info("y")])
      >>> rep = optkit.onnx.prepare(helper.make_model(g))
      >>> rep.run([np.array([-1.0, 2.0], np.float32)])
      Outputs(y=array([0., 2.], dtype=float32))
    """

    def __init__(self, loaded: Converted, device: Any, *, jit: bool = True, limits: Limits,
                 checks: bool = False, scan_layers: bool | None = None) -> None:
        compilation_cache()  # (JAX's persistent cache on, unless the user chose: optkit.onnx._run.cache)
        self.device: Any = device  # a jax.Device
        self.limits: Limits = limits
        self.model: onnx.ModelProto = loaded.model
        self._default_device = self.device == jax.devices()[0]
        self._jit = bool(jit)
        self._checks = bool(checks)
        self.graph: Graph = loaded.graph
        self.inputs: tuple[InputInfo, ...] = loaded.inputs
        self.outputs: tuple[str, ...] = loaded.outputs
        self._feeds = Feeds(self.inputs, loaded.static_inputs, double=loaded.facts.double)
        self.updated_inputs: tuple[str, ...] = loaded.facts.updated_inputs if loaded.facts else ()
        self._options = compiler_options(loaded.facts, device)
        self._result_type = onnx.backend.base.namedtupledict("Outputs", list(self.outputs))
        self._functions: dict[Any, Any] = {}
        self._checked: set[Any] = set()
        self._segmented: dict[Any, SegmentedRun] = {}
        self._layers = layers_of(loaded, scan_layers, False) if self._jit else None
        # The weights mapped from external data, given to the compiled program as arguments: as constants, XLA
        # would copy their bytes into the program. On the CPU the device array is the mapped file itself (a
        # page-aligned view: jax.device_put makes no copy).
        # A scanned run's per-layer weights stacked once, not inside the program at every call.
        self._held = held_weights(self.graph.initializers, self._layers, loaded.static_initializers,
                                  device=device) if self._jit else {}

    # -------------------------------------------------------------- running

    def _donated(self, donate: bool | Sequence[str], dynamic: tuple[str, ...]) -> tuple[int, ...]:
        if donate is True or donate is False:
            names = self.updated_inputs if donate else ()
        elif isinstance(donate, str) or not all(name in self._feeds.by_name for name in donate):
            raise ValueError(f"donate must be True, False or a list of graph input names "
                             f"{[info.name for info in self.inputs]}, got {donate!r}")
        else:
            names = tuple(donate)
        return tuple(i for i, name in enumerate(dynamic) if name in names) if self._jit else ()

    def run(self, inputs: Any, *, as_numpy: bool = True, donate: bool | Sequence[str] = False,
            **kwargs: Any) -> tuple[Any, ...]:
        """Run the model on ``inputs``; the outputs in ``graph.output`` order.

        Args:
          inputs: one value per graph input in ``graph.input`` order (inputs
            with an initializer default may be left off the end), or a dict
            from input names to values. Values are NumPy or JAX arrays of the
            declared dtype, any integer dtype for an integer input (Python
            numbers and lists are converted; docs "Training ONNX models in
            JAX", "Integer and 64-bit types").
          as_numpy: return NumPy arrays (default), or JAX arrays that stay on
            the device (to feed back into the next step without a copy).
          donate: give XLA the buffers of these fed JAX arrays to write the
            outputs into (``jax.jit``'s ``donate_argnums``): ``True`` for
            ``updated_inputs`` (a training step's parameters and optimizer
            state, which its outputs replace), or a list of input names.
            A donated array is deleted by the run; NumPy feeds are copied to
            the device first, so theirs are unaffected. Ignored with
            ``prepare(..., jit=False)``. Default ``False``: nothing fed is
            touched.

        Returns:
          A named tuple of the outputs (index it, or by output name).

        Raises:
          TypeError: a float, complex or bool value of another dtype, or not
            an array (integers of any integer dtype are converted).
          ValueError: a wrong shape, an unknown or missing input, an integer
            that does not fit the input's dtype, a ``donate``
            name that is not a graph input.
          TypeError, ValueError: an error raised while the graph is traced
            (e.g. incompatible shapes inside the graph), before anything runs.
          TensorTooLargeError: a node output above ``max_tensor_bytes``,
            found while the graph is traced, before anything is allocated.
          ValueError: a node's work above ``max_node_work`` or a Loop's above
            ``max_loop_steps`` (before it runs where its size is known), a
            Loop that cannot stop, a compiled condition-driven Loop whose
            condition still holds at its bound of iterations.
        """
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        feeds = self._feeds.checked(self._feeds.named(inputs))
        static, dynamic = self._feeds.split(feeds)
        values = [feeds[name] for name in dynamic]
        donated = self._donated(donate, dynamic)
        traced = any(isinstance(v, jax.core.Tracer) for v in values)  # inside jax.jit: JAX takes no options here
        placement = contextlib.nullcontext() if self._default_device else jax.default_device(self.device)
        segmented_key = (dynamic, bool(jax.config.jax_enable_x64), static_key(static))
        try:
            with placement:
                segmented = self._segmented.get(segmented_key)
                if segmented is not None:
                    return self._outputs(segmented.run(feeds), as_numpy)
                fn = graph_function(self._functions, self.graph, self.outputs, static, dynamic, Program(
                    jit=self._jit, donate=donated, options=None if traced else self._options, checks=self._checks,
                    layers=self._layers, held=self._held))
                if not self._jit:
                    # Op by op, NumPy values would be folded as constants: make them JAX arrays.
                    values = jax.tree.map(jnp.asarray, values)
                    signature = (id(fn), str(jax.tree.map(lambda v: (v.shape, v.dtype), values)))
                    if signature not in self._checked:
                        try:
                            jax.eval_shape(getattr(fn, "traceable", fn), *values)  # trace it all before running any op
                        except ValueDependentError:
                            pass  # shapes known only from values (a Loop): its op-by-op run checks them as it goes
                        self._checked.add(signature)
                # jax.jit moves NumPy values to the (default) device itself, fastest.
                try:
                    results = fn(*values)
                except ValueDependentError:
                    if not self._jit or traced:
                        raise
                    # An output size known only from values: compiled segments around such nodes, from now on.
                    segmented = self._segmented[segmented_key] = SegmentedRun(
                        self.graph, self.outputs, static, options=self._options, checks=self._checks)
                    results = segmented.run(feeds)
            return self._outputs(results, as_numpy)
        except jax.errors.JaxRuntimeError as err:  # a compiled Loop stopped at its bound (optkit.onnx._ops.control)
            text = str(err)
            if PAST_CAP not in text:
                raise
            raise ValueError(text[text.index(PAST_CAP) + len(PAST_CAP):].splitlines()[0]) from None

    def _outputs(self, results: Sequence[Any], as_numpy: bool) -> tuple[Any, ...]:
        if as_numpy:  # (a sequence output is a list of arrays, an empty optional None)
            results = [jax.tree.map(np.asarray, r) if isinstance(r, list) else None if r is None else np.asarray(r)
                       for r in results]
        return self._result_type(*results)

    def __repr__(self) -> str:
        return (f"BackendRep(inputs={[info.name for info in self.inputs]}, outputs={list(self.outputs)}, "
                f"device={self.device}, jit={self._jit})")


class Backend(onnx.backend.base.Backend):
    """optkit as an ONNX backend: ONNX models, training operators included, run on XLA.

    ``prepare`` returns a :class:`BackendRep`; ``run_model`` and ``run_node``
    are one-off runs. ONNX's test runner drives it::

        import onnx.backend.test, optkit.onnx
        tests = onnx.backend.test.BackendTest(optkit.onnx.Backend, __name__)

    Source: SPEC sections 1, 3, 4, 6 and "Conformance data"; ``onnx.backend.base``.
    """

    @classmethod
    def prepare(cls, model: ModelSource, device: str = "CPU", **kwargs: Any) -> BackendRep:
        """Load ``model`` for repeated runs; ``kwargs`` as :func:`optkit.onnx.prepare`'s."""
        return prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model: ModelSource, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """Load and run ``model`` once on ``inputs``; the outputs in ``graph.output`` order."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (one value per non-empty node input, or a dict by name).

        The node is wrapped in a model importing ``opset_version`` (keyword;
        default the newest opset) for the default domain, and version 1 of
        ``ai.onnx.preview.training`` for a training operator.
        """
        opset_version = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model, values = node_model(node, inputs, outputs_info, opset_version)
        return cls.prepare(model, device, **kwargs).run(values)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for ``"CPU"``, and for ``"CUDA[:i]"`` when JAX has that GPU."""
        try:
            jax_device(device)
        except (TypeError, ValueError):
            return False
        return True


def prepare(
    model: ModelSource,
    device: str = "CPU",
    *,
    jit: bool = True,
    base_dir: str | os.PathLike[str] | None = None,
    max_tensor_bytes: int | None = None,
    max_gradient_depth: int | None = None,
    max_gradient_passes: int | None = None,
    max_node_work: int | None = None,
    max_loop_steps: int | None = None,
    checks: bool = False,
    scan_layers: bool | None = None,
) -> BackendRep:
    """Load an ONNX model for repeated runs (``Backend.prepare``).

    Args:
      model: a ``ModelProto``, its serialized bytes, a path to a ``.onnx``
        file, or a binary file object.
      device: ``"CPU"`` or ``"CUDA[:index]"``.
      jit: compile the graph with ``jax.jit`` (default) or run it op by op.
      base_dir: the directory of the external data of a model given without
        a path; None (default) refuses such data.
      max_tensor_bytes: the largest tensor the graph may declare or compute,
        in bytes; default half the memory available on ``device`` now.
      max_gradient_depth: how deep Gradient nodes may nest, 1 to 16 (default 8).
      max_gradient_passes: the reverse passes the Gradient nodes may need in
        all (default 4096).
      max_node_work: the elements one node may produce or iterate over, checked
        before it runs (a ``Resize``'s output times the input elements each
        output reads; a ``Loop``'s or ``Scan``'s iterations times the
        elements its body computes in one); default 2**32.
      max_loop_steps: the body nodes a ``Loop`` run op by op (between compiled
        segments) may evaluate in all, nested Loops counted in; default
        10,000 (seconds on 2 CPU cores for a body of small nodes).
      checks: raise on an out-of-range index of a ``Gather``, ``GatherElements``, ``GatherND``,
        ``ScatterElements`` or ``ScatterND``, naming the node, as ONNX Runtime does
        (``jax.experimental.checkify``: ``checkify.JaxRuntimeError``, a ``ValueError``). Default False:
        such an index gives NaN or the type's fill value, never another element.
      scan_layers: compile the model's repeated layers (identical blocks chained one into the next, as a
        transformer's) as one ``jax.lax.scan`` over their stacked weights: True every run of 2 blocks or
        more, False none, None (default) runs of 16 or more, as :func:`to_jax` (docs "Repeated layers").

    Returns:
      A :class:`BackendRep`; call its ``run(inputs)``.

    Raises:
      ValueError: malformed bytes, a model ``onnx.checker`` rejects, external
        data outside the model's directory or without one, an invalid node
        (optimizer input count not ``2 + k*n``, missing required
        attributes...), a declared shape with a negative dimension, Gradient
        nodes nested too deep, a bad device.
      TensorTooLargeError: a declared shape above ``max_tensor_bytes``.
      UnsupportedOpError: an operator, operator version, opset version or
        element type optkit does not run (the message names op type, domain
        and opset).

    Source: ``onnx.backend.base.Backend.prepare``; SPEC sections 1, 3, 4, 6.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> t = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
      >>> g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "g", [t("x")], [t("y")])
      >>> optkit.onnx.prepare(helper.make_model(g)).run([np.zeros(2, np.float32)]).y
      array([1., 1.], dtype=float32)
    """
    placed = jax_device(device)
    limits = Limits.make(max_tensor_bytes, max_gradient_depth, placed, max_gradient_passes, max_node_work=max_node_work,
                         max_loop_steps=max_loop_steps)
    return BackendRep(load(model, limits, base_dir), placed, jit=jit, limits=limits, checks=checks,
                      scan_layers=scan_layers)


def run_model(model: ModelSource, inputs: Any, device: str = "CPU", *, jit: bool = True,
              **limits: Any) -> tuple[Any, ...]:
    """Load ``model`` and run it once on ``inputs`` (``Backend.run_model``).

    Args:
      model: as :func:`prepare`.
      inputs: one value per graph input in ``graph.input`` order, or a dict by name.
      device, jit: as :func:`prepare`.
      limits: ``base_dir``, ``max_tensor_bytes``, ``max_gradient_depth``, ``max_gradient_passes``,
        ``max_node_work``, ``max_loop_steps``, as :func:`prepare`.

    Returns:
      The outputs in ``graph.output`` order (a named tuple of NumPy arrays).

    Raises:
      ValueError, TypeError, TensorTooLargeError, UnsupportedOpError: as
        :func:`prepare` and :meth:`~optkit.onnx.BackendRep.run`.

    Source: ``onnx.backend.base.Backend.run_model``.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper
      >>> t = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
      >>> g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [t("x")], [t("y")])
      >>> optkit.onnx.run_model(helper.make_model(g), [np.ones(2, np.float32)])
      Outputs(y=array([-1., -1.], dtype=float32))
    """
    return Backend.run_model(model, inputs, device, jit=jit, **limits)


def run_node(node: onnx.NodeProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
    """Run one ONNX node on ``inputs`` (``Backend.run_node``).

    Args:
      node: the ``NodeProto``.
      inputs: one value per non-empty node input, or a dict by input name.
      device: as :func:`prepare`.
      kwargs: ``opset_version`` (default: the newest), ``outputs_info``
        (``(dtype, shape)`` per output), ``jit``.

    Returns:
      The node's outputs (a named tuple of NumPy arrays); the node runs as a one-node model
      (source: ``onnx.backend.base.Backend.run_node``).

    Raises:
      The errors of :func:`run_model`.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import helper
      >>> optkit.onnx.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [np.float32(2), np.float32(3)])
      Outputs(c=array(5., dtype=float32))
    """
    return Backend.run_node(node, inputs, device, **kwargs)
