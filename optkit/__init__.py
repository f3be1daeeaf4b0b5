"""optkit: spec-exact optimizers and the ONNX Gradient operator for JAX.

Every optimizer is an :class:`optax.GradientTransformation` whose numbers are
those of a published specification (see SPEC.md):

- :func:`adagrad` — ONNX ``ai.onnx.preview.training::Adagrad``;
- :func:`adam` — DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` (epsilon-hat
  form) with ONNX Adam's ``norm_coefficient`` and ``norm_coefficient_post``;
- :func:`momentum` — ONNX ``ai.onnx.preview.training::Momentum``;
- :func:`gradient` and :class:`Graph` — ONNX ``ai.onnx.preview.training::Gradient``
  on named tensors, as nested ``jax.vjp``;
- :func:`muon` — Muon as ``torch.optim.Muon`` computes it (2-D parameters);
- :func:`schedule_free_adamw` — schedule-free AdamW as ``schedulefree.AdamWScheduleFree`` computes it;
- :func:`adam8bit` — 8-bit blockwise Adam as bitsandbytes' ``Adam8bit`` computes it;
- :func:`adafactor` — Adafactor (Shazeer & Stern 2018), with sublinear memory;
  :func:`t5x_adafactor` — the same algorithm with T5X's arguments and factor rules.

The specs' own operators, with their inputs and outputs, are in :mod:`optkit.ops`.

Under ``jax.sharding`` every optimizer's state is sharded like the parameters
(Adafactor's row and column statistics like the parameter without the reduced
axis), with no communication code of optkit's own: see the docs page "Sharding and multiple hosts".
:func:`state_sharding` and :func:`shard_state` split a state over the data axis as well (ZeRO stage 1);
:func:`fsdp_rule` splits an ``OnnxModule``'s parameters so (FSDP).

For trees of thousands of parameter arrays, :class:`FlatParams` keeps them in one
contiguous buffer per dtype, which every element-wise optimizer steps over at once.
"""

from optkit import ops
from optkit._src.adafactor import (
    FactoredSecondMoment,
    FullSecondMoment,
    ScaleByAdafactorState,
    ScaleByFactoredRmsState,
    adafactor,
    factored_axes,
    scale_by_adafactor,
    scale_by_factored_rms,
    t5x_adafactor,
    t5x_standard_logical_factor_rules,
)
from optkit._src.adagrad import ScaleByOnnxAdagradState, adagrad, scale_by_onnx_adagrad
from optkit._src.adam import ScaleByDmlAdamState, adam, scale_by_dml_adam
from optkit._src.adam8bit import ScaleByAdam8bitState, adam8bit
from optkit._src.blockwise import QuantizedMoment, dequantize_blockwise, dynamic_map, quantize_blockwise
from optkit._src.flat import FlatParams
from optkit._src.gradient import gradient
from optkit._src.graph import GradientNode, Graph, GraphNode
from optkit._src.momentum import ScaleByOnnxMomentumState, momentum, scale_by_onnx_momentum
from optkit._src.muon import ScaleByMuonState, muon, newton_schulz
from optkit._src.schedule_free import ScheduleFreeAdamWState, schedule_free_adamw, schedule_free_eval_params
from optkit._src.zero import fsdp_rule, shard_state, state_sharding

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
    "muon",
    "newton_schulz",
    "ScaleByMuonState",
    "adam8bit",
    "ScaleByAdam8bitState",
    "QuantizedMoment",
    "quantize_blockwise",
    "dequantize_blockwise",
    "dynamic_map",
    "schedule_free_adamw",
    "schedule_free_eval_params",
    "ScheduleFreeAdamWState",
    "adafactor",
    "scale_by_adafactor",
    "scale_by_factored_rms",
    "ScaleByAdafactorState",
    "ScaleByFactoredRmsState",
    "FactoredSecondMoment",
    "FullSecondMoment",
    "factored_axes",
    "t5x_adafactor",
    "t5x_standard_logical_factor_rules",
    "gradient",
    "Graph",
    "GraphNode",
    "GradientNode",
    "FlatParams",
    "state_sharding",
    "shard_state",
    "fsdp_rule",
]
