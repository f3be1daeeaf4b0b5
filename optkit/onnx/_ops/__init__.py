"""The ONNX operators optkit runs, by family, and the op table they make.

Where an operator goes: its family module, by what it does:

- :mod:`~optkit.onnx._ops.elementwise`: arithmetic, activations, comparisons,
  logic, ``Where``, casts;
- :mod:`~optkit.onnx._ops.nn`: ``MatMul``, ``Gemm``, softmaxes, convolution
  (and transposed);
- :mod:`~optkit.onnx._ops.pool`: max, average, Lp and global pooling;
- :mod:`~optkit.onnx._ops.normalization`: batch, layer and instance
  normalization, ``LRN``, ``Dropout``;
- :mod:`~optkit.onnx._ops.recurrent`: ``RNN``, ``GRU``, ``LSTM`` (a ``lax.scan``);
- :mod:`~optkit.onnx._ops.shape`: reshaping, joining, slicing, gathering,
  ``Shape``, ``Constant``;
- :mod:`~optkit.onnx._ops.reduce`: ``Reduce*``, ``CumSum``, ``CumProd``;
- :mod:`~optkit.onnx._ops.loss`: loss functions;
- :mod:`~optkit.onnx._ops.training`: ``ai.onnx.preview.training``: Gradient,
  Adagrad, Adam, Momentum.

- :mod:`~optkit.onnx._ops.control`: ``If``, ``Loop``, ``Scan`` (bodies converted
  by the model's own converter);
- :mod:`~optkit.onnx._ops.attention`: ``Attention``, ``RotaryEmbedding``, ``ai.onnx.preview``'s
  ``FlexAttention``;
- :mod:`~optkit.onnx._ops.algebra`: Einsum, Det, Hardmax, LpNormalization, windows;
- :mod:`~optkit.onnx._ops.indexing`: Scatter*, TopK, OneHot, Compress, NonZero, Unique,
  ReverseSequence, EyeLike, DepthToSpace, SpaceToDepth, CenterCropPad;
- :mod:`~optkit.onnx._ops.resize`: ``Resize``, ``Upsample``;
- :mod:`~optkit.onnx._ops.sampling`: ``GridSample``, ``AffineGrid``, ``Col2Im``, ``RoiAlign``;
- :mod:`~optkit.onnx._ops.state`: ``TensorScatter``, ``CausalConvWithState``, ``LinearAttention``
  (operators that carry a cache or a recurrent state);
- :mod:`~optkit.onnx._ops.sequence`: sequences (Python lists of arrays) and optionals (None when empty):
  ``Sequence*``, ``SplitToSequence``, ``ConcatFromSequence``, ``SequenceMap``, ``Optional*``;
- :mod:`~optkit.onnx._ops.image`: ``ImageDecoder`` (decoded on the host by Pillow);
- :mod:`~optkit.onnx._ops.text`: ``TfIdfVectorizer`` on integer token ids;
- :mod:`~optkit.onnx._ops.randomness`: ``RandomUniform``, ``RandomNormal``, their ``*Like`` forms,
  ``Bernoulli``, ``Multinomial`` (seeded with ``jax.random``);
- :mod:`~optkit.onnx._ops.quantize`: ``QuantizeLinear``, ``DequantizeLinear``,
  ``DynamicQuantizeLinear``;
- :mod:`~optkit.onnx._ops.contrib`: ONNX Runtime's ``com.microsoft`` fused activations and Skip
  normalizations (``FastGelu``, ``BiasGelu``, ``SkipLayerNormalization``...), ``MatMulNBits``,
  ``GatherBlockQuantized``;
- :mod:`~optkit.onnx._ops.contrib_attention`: its fused attentions (``Attention``, ``MultiHeadAttention``,
  ``GroupQueryAttention``, ``RotaryEmbedding``);
- :mod:`~optkit.onnx._ops.adapters`: ``ai.optkit::LoRA``, the low-rank adapter term ``to_jax(..., lora=)``
  adds (no exporter writes it).

Each module registers its builders with one form, the
decorator ``@OPS.op(op_type, *since_versions, params=..., static_inputs=...)``
(:class:`~optkit.onnx._ops._registry.Family`); :data:`TABLE` is assembled here
explicitly, so importing a family module changes nothing elsewhere; a user's operators are added to it by
:func:`optkit.onnx.register_op`. The docs' architecture page, "Adding an operator", says how versions and tests
are declared.
"""

from __future__ import annotations

from optkit.onnx._ops import (
    adapters,
    algebra,
    attention,
    contrib,
    contrib_attention,
    control,
    elementwise,
    image,
    indexing,
    loss,
    ml,
    nn,
    normalization,
    pool,
    quantize,
    randomness,
    recurrent,
    reduce,
    resize,
    sampling,
    sequence,
    shape,
    state,
    text,
    training,
)
from optkit.onnx._ops._registry import OpTable

__all__ = ["TABLE", "supported_ops"]

TABLE = OpTable(elementwise.OPS, nn.OPS, pool.OPS, normalization.OPS, recurrent.OPS, shape.OPS, reduce.OPS, loss.OPS,
                training.OPS, control.OPS, attention.OPS, attention.PREVIEW_OPS, quantize.OPS,
                resize.OPS, sampling.OPS, randomness.OPS, indexing.OPS, algebra.OPS, contrib.OPS,
                contrib_attention.OPS, contrib.DEFAULT_DOMAIN_OPS, adapters.OPS, state.OPS, ml.OPS, sequence.OPS,
                text.OPS, image.OPS)


def supported_ops() -> list[tuple[str, str, int]]:
    """The op table's rows: every operator version optkit runs.

    Returns:
      Sorted ``(domain, op_type, since_version)`` tuples; domain ``""`` is
      ``ai.onnx``, ``"ai.onnx.preview.training"`` holds Adagrad, Adam,
      Momentum and Gradient. (The ``ai.optkit::LoRA`` node that ``to_jax(..., lora=)`` adds is not
      listed.) A model importing opset ``N`` runs an operator
      with the row of the newest ``since_version <= N``, if ONNX has no newer
      version of it at ``N``.

    Example:
      >>> import optkit.onnx
      >>> ("ai.onnx.preview.training", "Adam", 1) in optkit.onnx.supported_ops()
      True
    """
    return [row for row in TABLE.rows() if row[0] != adapters.OPS.domain]  # ai.optkit: optkit's own LoRA node
