"""The specs' own operators: inputs and outputs exactly as ONNX and DirectML define them.

- :func:`onnx_adagrad` — ONNX ``ai.onnx.preview.training::Adagrad`` (SPEC 1)
- :func:`onnx_adam` — ONNX ``ai.onnx.preview.training::Adam`` (SPEC 3)
- :func:`dml_adam` — DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (SPEC 2)
- :func:`onnx_momentum` — ONNX ``ai.onnx.preview.training::Momentum`` (SPEC 4)

Each takes several tensors at once as any pytree (a list is ONNX's variadic form). Each is
defined beside its Optax transformation (``optkit.adagrad``...), and both call the same
per-leaf formula.
"""

from optkit._src.adagrad import OnnxAdagradOutputs, onnx_adagrad
from optkit._src.adam import DmlAdamOutputs, OnnxAdamOutputs, dml_adam, onnx_adam
from optkit._src.momentum import OnnxMomentumOutputs, onnx_momentum

__all__ = [
    "onnx_adagrad",
    "onnx_adam",
    "dml_adam",
    "onnx_momentum",
    "OnnxAdagradOutputs",
    "OnnxAdamOutputs",
    "DmlAdamOutputs",
    "OnnxMomentumOutputs",
]
