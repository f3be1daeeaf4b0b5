"""optkit: spec-exact optimizers and the ONNX Gradient operator for JAX.

Every optimizer is an :class:`optax.GradientTransformation` whose numbers are
those of a published specification (see SPEC.md):

- :func:`adagrad` — ONNX ``ai.onnx.preview.training::Adagrad``;
- :func:`adam` — DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (epsilon-hat
  form) with ONNX Adam's ``norm_coefficient`` and ``norm_coefficient_post``;
- :func:`momentum` — ONNX ``ai.onnx.preview.training::Momentum``;

The specs' own operators, with their inputs and outputs, are in :mod:`optkit.ops`.
For trees of thousands of parameter arrays, :class:`FlatParams` keeps them in one
contiguous buffer per dtype, which every element-wise optimizer steps over at once.
"""

from optkit import ops
from optkit._src.adagrad import ScaleByOnnxAdagradState, adagrad, scale_by_onnx_adagrad
from optkit._src.adam import ScaleByDmlAdamState, adam, scale_by_dml_adam
from optkit._src.flat import FlatParams
from optkit._src.momentum import ScaleByOnnxMomentumState, momentum, scale_by_onnx_momentum

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ops",
    "adagrad",
    "scale_by_onnx_adagrad",
    "ScaleByOnnxAdagradState",
    "adam",
    "scale_by_dml_adam",
    "ScaleByDmlAdamState",
    "momentum",
    "scale_by_onnx_momentum",
    "ScaleByOnnxMomentumState",
    "FlatParams",
]
