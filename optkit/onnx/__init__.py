"""optkit.onnx: run ONNX training graphs (Gradient, Adagrad, Adam, Momentum) on XLA.

ONNX Runtime's CPU build cannot load the ``ai.onnx.preview.training``
operators, and ONNX's reference evaluator has no Gradient. This module loads
an ONNX model into an :class:`optkit.Graph` (its Gradient nodes become Graph
Gradient nodes, SPEC 6; its Adagrad, Adam and Momentum nodes call
:mod:`optkit.ops`, SPEC 1, 3, 4) and runs it as one jitted JAX function.

One load pipeline, :mod:`optkit.onnx._load.pipeline`, its stages one module each:
``_files`` (reading a file safely; ``onnx.checker``), ``_operators`` (every
operator looked up once), ``_functions`` (local functions inlined),
``_protos`` (declarations and attributes decoded), ``_convert`` (nodes ->
Graph, sub-graphs too) with ``_analysis`` (load-time walks); ``_limits``
holds the bounds, ``_backend`` runs a loaded model; the operators by family
in :mod:`optkit.onnx._ops`.

Install with the extra ``optkit[onnx]``; ``import optkit`` alone does not
import ``onnx``.

- :func:`load_model` — read (file, bytes, ModelProto) and ``onnx.checker`` a model;
- :func:`to_graph` — the model as an :class:`optkit.Graph`;
- :func:`prepare` / :class:`BackendRep` — load once, :meth:`~optkit.onnx.BackendRep.run` many times;
- :func:`run_model`, :func:`run_node` — one-off runs;
- :class:`Backend` — an ``onnx.backend.base.Backend`` for ONNX's test runner;
- :func:`to_jax` — the model as ``apply_fn(params, *inputs)`` and a dict of its trainable
  initializers (:class:`OnnxFunction`), for Optax, optkit and ``jax.grad``; :class:`OnnxModule`
  the same as a Flax NNX module (needs ``flax``); :class:`LoRA` low-rank adapters for either;
- :func:`make_training_model` — an inference model plus a loss, a Gradient node and an optimizer
  node over its initializers; :func:`next_feeds` carries a step's new weights and state into the next;
  :func:`with_initializers` writes trained weights back;
- :func:`with_adapter_inputs`, :func:`export_adapters`, :func:`with_adapter_inputs_folder` — LoRA adapters as
  ONNX Runtime serves them: a base model with adapter inputs and one ``.onnx_adapter`` file per fine-tune;
- :func:`compilation_cache` — JAX's persistent compilation cache, which every model load turns on (opt-out:
  ``OPTKIT_COMPILATION_CACHE=off``);
- :func:`supported_ops` — the op table's ``(domain, op_type, since_version)`` rows;
- :func:`register_op` / :func:`unregister_op` — a JAX function for an operator of your own or a vendor's;
- :class:`UnsupportedOpError` — raised for operators, versions or types optkit does not run;
- :class:`TensorTooLargeError` — a tensor above ``max_tensor_bytes`` (default
  :func:`default_max_tensor_bytes`), refused before it is allocated.

Files from strangers: external data is read only from the model's own
directory (never for a model given without one, unless ``base_dir`` names
it), every tensor and every Gradient nesting level is bounded, and what
optkit cannot run is refused at load time (docs page "The ONNX backend",
"Loading ONNX files from strangers").

Example:
  >>> import numpy as np, optkit.onnx
  >>> from onnx import TensorProto, helper
  >>> f = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
  >>> node = helper.make_node("Gradient", ["x"], ["dy_dx"], domain="ai.onnx.preview.training",
  ...                         xs=["x"], y="y")
  >>> graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"]), node], "g",
  ...                           [f("x", [2])], [f("dy_dx", [2])])
  >>> model = helper.make_model(graph, opset_imports=[
  ...     helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.preview.training", 1)])
  >>> optkit.onnx.run_model(model, [np.array([1.0, 3.0], np.float32)])
  Outputs(dy_dx=array([2., 6.], dtype=float32))
"""

try:
    import onnx as _onnx  # noqa: F401
except ImportError as _err:
    raise ImportError(
        'optkit.onnx needs the onnx package, which optkit installs only with its "onnx" extra: '
        'pip install "optkit[onnx]"'
    ) from _err

from optkit.onnx._adapter_files import (
    adapter_input_names,
    export_adapters,
    with_adapter_inputs,
    with_adapter_inputs_folder,
)
from optkit.onnx._backend import Backend, BackendRep, prepare, run_model, run_node
from optkit.onnx._base.errors import TensorTooLargeError, UnsupportedOpError
from optkit.onnx._base.limits import GRADIENT_DEPTH_CEILING, MAX_GRADIENT_DEPTH, default_max_tensor_bytes
from optkit.onnx._custom import register_op, unregister_op
from optkit.onnx._jax import OnnxFunction, to_jax
from optkit.onnx._load.adapters import LoRA
from optkit.onnx._load.files import ModelSource, load_model
from optkit.onnx._load.pipeline import to_graph
from optkit.onnx._load.protos import InputInfo
from optkit.onnx._ops import supported_ops
from optkit.onnx._run.cache import compilation_cache
from optkit.onnx._training_model import make_training_model, next_feeds, with_initializers

__all__ = [
    "Backend",
    "BackendRep",
    "GRADIENT_DEPTH_CEILING",
    "InputInfo",
    "LoRA",
    "MAX_GRADIENT_DEPTH",
    "ModelSource",
    "OnnxFunction",
    "OnnxModule",
    "TensorTooLargeError",
    "UnsupportedOpError",
    "adapter_input_names",
    "compilation_cache",
    "default_max_tensor_bytes",
    "export_adapters",
    "load_model",
    "make_training_model",
    "next_feeds",
    "prepare",
    "register_op",
    "run_model",
    "run_node",
    "supported_ops",
    "to_graph",
    "to_jax",
    "unregister_op",
    "with_adapter_inputs",
    "with_adapter_inputs_folder",
    "with_initializers",
]


def __getattr__(name: str) -> type:
    """``optkit.onnx.OnnxModule``, imported on first use (it needs flax, which optkit.onnx alone does not).

    Raises:
      ImportError: flax is not installed. AttributeError: any other name.
    """
    if name == "OnnxModule":  # needs flax, which optkit.onnx alone does not
        try:
            from optkit.onnx._nnx import OnnxModule
        except ImportError as err:
            raise ImportError('optkit.onnx.OnnxModule needs flax: pip install "optkit[examples]" or flax') from err
        return OnnxModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, ``OnnxModule`` included (it is imported on first use)."""
    return sorted(set(globals()) | set(__all__))


# The public path in tracebacks and reprs: ``optkit.onnx.UnsupportedOpError``, not the private module's.
UnsupportedOpError.__module__ = TensorTooLargeError.__module__ = __name__
