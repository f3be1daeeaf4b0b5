"""Every differentiable operator in the op table, differentiated through an ONNX Gradient node
(SPEC 6) and compared with central finite differences in float64.

For each operator: a model computes ``loss = sum_k ReduceSum(out_k * C_k)`` of the operator's
outputs (``C_k`` fixed random weights), a Gradient node gives ``d loss / d x`` for each of its
floating-point inputs, and the same loss model, run forward at ``x +- h e_i``, gives the finite
differences. Both run compiled (``jax.jit``), where a handler without a gradient rule (a traced
initial value in ``lax.reduce_window``, once) fails. Inputs are kept away from kinks (Relu, Abs,
max) so the finite differences are those of a smooth function.
"""

import jax
import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402
import onnx.shape_inference  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._load.files import ORT_DEFAULT_DOMAIN_OPS  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(23)


def _x(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, size=shape)


def _away(*shape, gap=0.2):
    """Values at least ``gap`` from 0 and from each other's neighbours' ties (for kinks at 0, max)."""
    values = RNG.permutation(np.linspace(-1.5, 1.5, int(np.prod(shape))))
    values = np.where(np.abs(values) < gap, values + np.sign(values + 1e-12) * gap, values)
    return values.reshape(shape)


def _pos(*shape):
    return _x(*shape, low=0.5, high=1.5)


def _i64(*values):
    return np.array(values, np.int64)


def _body(inputs, nodes, outputs, initializers=None):
    """A sub-graph: ``inputs`` as (name, dtype, shape), ``nodes`` as (op, inputs, output), ``outputs`` as
    (name, shape[, dtype]) (float64 unless given), ``initializers`` by name."""
    return helper.make_graph(
        [helper.make_node(op, ins, [out]) for op, ins, out in nodes], "body",
        [_info(n, d, s) for n, d, s in inputs],
        [_info(o[0], o[2] if len(o) > 2 else np.float64, o[1]) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])


SCATTER = ["data", "indices", "updates"]

# name, op, differentiated inputs (name -> float64 value), constant inputs (name -> value, or "" for
# an absent optional input; in the node's input order after the differentiated ones, or before
# them when the name starts with "_"), attributes, outputs, opset
CASES = [
    ("Add", "Add", {"a": _x(2, 3), "b": _x(3)}, {}, {}, 1, 17),
    ("Sub", "Sub", {"a": _x(2, 3), "b": _x(2, 3)}, {}, {}, 1, 17),
    ("Mul", "Mul", {"a": _x(2, 3), "b": _x(1, 3)}, {}, {}, 1, 17),
    ("Div", "Div", {"a": _x(2, 3), "b": _pos(2, 3)}, {}, {}, 1, 17),
    ("Add-6", "Add", {"a": _x(2, 3, 2), "b": _x(3)}, {}, {"broadcast": 1, "axis": 1}, 1, 6),
    ("Pow", "Pow", {"a": _pos(2, 3), "b": _x(2, 3)}, {}, {}, 1, 17),
    ("Neg", "Neg", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Abs", "Abs", {"x": _away(2, 3)}, {}, {}, 1, 17),
    ("Sqrt", "Sqrt", {"x": _pos(2, 3)}, {}, {}, 1, 17),
    ("Exp", "Exp", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Log", "Log", {"x": _pos(2, 3)}, {}, {}, 1, 17),
    ("Reciprocal", "Reciprocal", {"x": _pos(2, 3)}, {}, {}, 1, 17),
    ("Sigmoid", "Sigmoid", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Tanh", "Tanh", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Relu", "Relu", {"x": _away(2, 3)}, {}, {}, 1, 17),
    ("LeakyRelu", "LeakyRelu", {"x": _away(2, 3)}, {}, {"alpha": 0.1}, 1, 17),
    ("PRelu", "PRelu", {"x": _away(2, 3), "slope": _x(3)}, {}, {}, 1, 17),
    ("Elu", "Elu", {"x": _away(2, 3)}, {}, {"alpha": 0.7}, 1, 17),
    ("Selu", "Selu", {"x": _away(2, 3)}, {}, {}, 1, 17),
    ("Celu", "Celu", {"x": _away(2, 3)}, {}, {"alpha": 1.3}, 1, 17),
    ("ThresholdedRelu", "ThresholdedRelu", {"x": _away(2, 3)}, {}, {"alpha": 0.1}, 1, 17),
    ("HardSigmoid", "HardSigmoid", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("HardSwish", "HardSwish", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Softplus", "Softplus", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Softsign", "Softsign", {"x": _away(2, 3)}, {}, {}, 1, 17),
    ("Mish", "Mish", {"x": _x(2, 3)}, {}, {}, 1, 18),
    ("Erf", "Erf", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Gelu", "Gelu", {"x": _x(2, 3)}, {}, {}, 1, 20),
    ("Gelu-tanh", "Gelu", {"x": _x(2, 3)}, {}, {"approximate": "tanh"}, 1, 20),
    ("Sin", "Sin", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Cos", "Cos", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Tan", "Tan", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Asin", "Asin", {"x": _x(2, 3, low=-0.8, high=0.8)}, {}, {}, 1, 17),
    ("Acos", "Acos", {"x": _x(2, 3, low=-0.8, high=0.8)}, {}, {}, 1, 17),
    ("Atan", "Atan", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Sinh", "Sinh", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Cosh", "Cosh", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Asinh", "Asinh", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Acosh", "Acosh", {"x": _x(2, 3, low=1.5, high=3)}, {}, {}, 1, 17),
    ("Atanh", "Atanh", {"x": _x(2, 3, low=-0.8, high=0.8)}, {}, {}, 1, 17),
    ("Clip", "Clip", {"x": _away(2, 3)}, {"lo": np.array(-0.8), "hi": np.array(0.8)}, {}, 1, 17),
    ("Max", "Max", {"a": _away(2, 3), "b": _away(2, 3) + 0.05}, {}, {}, 1, 17),
    ("Min", "Min", {"a": _away(2, 3), "b": _away(2, 3) + 0.05}, {}, {}, 1, 17),
    ("Sum", "Sum", {"a": _x(2, 3), "b": _x(3), "c": _x(2, 1)}, {}, {}, 1, 17),
    ("Mean", "Mean", {"a": _x(2, 3), "b": _x(3)}, {}, {}, 1, 17),
    ("Where", "Where", {"a": _x(2, 3), "b": _x(2, 3)}, {"_c": np.array([True, False, True])}, {}, 1, 17),
    ("Identity", "Identity", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("MatMul", "MatMul", {"a": _x(2, 3, 4), "b": _x(4, 2)}, {}, {}, 1, 17),
    ("Gemm", "Gemm", {"a": _x(4, 3), "b": _x(5, 4), "c": _x(5)}, {}, {"transA": 1, "transB": 1, "alpha": 0.5}, 1, 17),
    ("Softmax", "Softmax", {"x": _x(2, 3, 4)}, {}, {"axis": 1}, 1, 17),
    ("LogSoftmax", "LogSoftmax", {"x": _x(2, 3, 4)}, {}, {}, 1, 17),
    ("Conv", "Conv", {"x": _x(1, 4, 5, 5), "w": _x(6, 2, 3, 3), "b": _x(6)}, {},
     {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}, 1, 17),
    ("ConvTranspose", "ConvTranspose", {"x": _x(1, 4, 3, 3), "w": _x(4, 2, 3, 2), "b": _x(4)}, {},
     {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}, 1, 17),
    ("MaxPool", "MaxPool", {"x": _away(1, 2, 5, 5)}, {}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                         "pads": [1, 1, 1, 1]}, 1, 17),
    ("AveragePool", "AveragePool", {"x": _x(1, 2, 5, 5)}, {},
     {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}, 1, 17),
    ("GlobalAveragePool", "GlobalAveragePool", {"x": _x(2, 3, 2, 2)}, {}, {}, 1, 17),
    ("GlobalMaxPool", "GlobalMaxPool", {"x": _away(2, 3, 2, 2)}, {}, {}, 1, 17),
    ("BatchNormalization", "BatchNormalization",
     {"x": _x(2, 3, 2, 2), "s": _x(3), "b": _x(3), "m": _x(3), "v": _pos(3)}, {}, {}, 1, 15),
    ("BatchNormalization-train", "BatchNormalization",
     {"x": _x(2, 3, 2, 2), "s": _x(3), "b": _x(3), "m": _x(3), "v": _pos(3)}, {},
     {"training_mode": 1, "momentum": 0.8}, 3, 15),
    ("LayerNormalization", "LayerNormalization", {"x": _x(2, 3, 4), "s": _x(3, 4), "b": _x(4)}, {},
     {"axis": 1, "stash_type": 11}, 3, 17),
    ("InstanceNormalization", "InstanceNormalization", {"x": _x(2, 3, 4), "s": _x(3), "b": _x(3)}, {}, {}, 1, 17),
    ("LRN", "LRN", {"x": _x(2, 4, 2, 2)}, {}, {"size": 3, "alpha": 0.1, "beta": 0.6, "bias": 1.2}, 1, 17),
    ("Dropout", "Dropout", {"x": _x(2, 3)}, {}, {}, 1, 17),
    ("Flatten", "Flatten", {"x": _x(2, 3, 2)}, {}, {"axis": 2}, 1, 17),
    ("Reshape", "Reshape", {"x": _x(2, 3, 2)}, {"shape": _i64(3, -1)}, {}, 1, 17),
    ("Transpose", "Transpose", {"x": _x(2, 3, 2)}, {}, {"perm": [2, 0, 1]}, 1, 17),
    ("Squeeze", "Squeeze", {"x": _x(2, 1, 3)}, {"axes": _i64(1)}, {}, 1, 17),
    ("Unsqueeze", "Unsqueeze", {"x": _x(2, 3)}, {"axes": _i64(0, 3)}, {}, 1, 17),
    ("Concat", "Concat", {"a": _x(2, 3), "b": _x(2, 1)}, {}, {"axis": 1}, 1, 17),
    ("Split", "Split", {"x": _x(2, 5)}, {"split": _i64(2, 3)}, {"axis": 1}, 2, 17),
    ("Slice", "Slice", {"x": _x(4, 5)}, {"starts": _i64(3, 0), "ends": _i64(0, 5), "axes": _i64(0, 1),
                                       "steps": _i64(-1, 2)}, {}, 1, 17),
    ("Gather", "Gather", {"x": _x(4, 3)}, {"i": _i64(3, -4, 3)}, {}, 1, 17),
    ("GatherElements", "GatherElements", {"x": _x(3, 3)}, {"i": np.array([[0, 2, 1], [2, 2, 0]])}, {"axis": 0},
     1, 17),
    ("GatherND", "GatherND", {"x": _x(2, 3, 4)}, {"i": np.array([[[1], [0]], [[2], [1]]])}, {"batch_dims": 1}, 1,
     17),
    ("Expand", "Expand", {"x": _x(3, 1)}, {"shape": _i64(2, 1, 4)}, {}, 1, 17),
    ("Tile", "Tile", {"x": _x(2, 3)}, {"r": _i64(2, 2)}, {}, 1, 17),
    ("Pad-constant", "Pad", {"x": _x(2, 3)}, {"p": _i64(1, 0, 0, 2), "v": np.array(0.5)}, {}, 1, 17),
    ("Pad-reflect", "Pad", {"x": _x(2, 4)}, {"p": _i64(1, 2, 1, 1)}, {"mode": "reflect"}, 1, 17),
    ("Pad-edge", "Pad", {"x": _x(2, 3)}, {"p": _i64(0, 2, 1, 1)}, {"mode": "edge"}, 1, 17),
    ("Trilu", "Trilu", {"x": _x(3, 4)}, {"k": _i64(1)}, {"upper": 0}, 1, 17),
    ("CumSum", "CumSum", {"x": _x(2, 4)}, {"axis": _i64(1)}, {"exclusive": 1, "reverse": 1}, 1, 17),
    ("ReduceSum", "ReduceSum", {"x": _x(2, 3, 2)}, {"axes": _i64(0, 2)}, {}, 1, 17),
    ("ReduceMean", "ReduceMean", {"x": _x(2, 3, 2)}, {"axes": _i64(1)}, {"keepdims": 0}, 1, 18),
    ("ReduceMax", "ReduceMax", {"x": _away(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceMin", "ReduceMin", {"x": _away(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceProd", "ReduceProd", {"x": _pos(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceL1", "ReduceL1", {"x": _away(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceL2", "ReduceL2", {"x": _x(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceSumSquare", "ReduceSumSquare", {"x": _x(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceLogSum", "ReduceLogSum", {"x": _pos(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("ReduceLogSumExp", "ReduceLogSumExp", {"x": _x(2, 3, 2)}, {"axes": _i64(1)}, {}, 1, 18),
    ("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLoss", {"x": _x(3, 4)}, {"labels": _i64(0, 3, 1)}, {}, 1, 17),
    ("NegativeLogLikelihoodLoss", "NegativeLogLikelihoodLoss", {"x": _x(3, 4)}, {"labels": _i64(0, 3, 1)},
     {"reduction": "sum"}, 1, 17),
    ("RNN", "RNN", {"x": _x(3, 2, 2), "w": _x(2, 3, 2), "r": _x(2, 3, 3), "b": _x(2, 6)},
     {"lens": np.array([3, 2], np.int32), "h0": _x(2, 2, 3)}, {"hidden_size": 3, "direction": "bidirectional"}, 2,
     17),
    ("GRU", "GRU", {"x": _x(3, 2, 2), "w": _x(1, 9, 2), "r": _x(1, 9, 3), "b": _x(1, 18)},
     {"lens": "", "h0": _x(1, 2, 3)}, {"hidden_size": 3, "linear_before_reset": 1}, 2, 17),
    ("GRU-reverse", "GRU", {"x": _x(3, 2, 2), "w": _x(1, 9, 2), "r": _x(1, 9, 3)},
     {}, {"hidden_size": 3, "direction": "reverse"}, 2, 17),
    ("LSTM", "LSTM", {"x": _x(3, 2, 2), "w": _x(1, 8, 2), "r": _x(1, 8, 2), "b": _x(1, 16)},
     {"lens": np.array([2, 3], np.int32), "h0": _x(1, 2, 2), "c0": _x(1, 2, 2), "p": _x(1, 6)},
     {"hidden_size": 2}, 3, 17),
    ("RMSNormalization", "RMSNormalization", {"x": _x(2, 3, 4), "scale": _x(4)}, {},
     {"epsilon": 1e-3, "stash_type": 11}, 1, 23),
    ("RotaryEmbedding", "RotaryEmbedding", {"x": _x(2, 3, 8), "cos": _x(2, 3, 2), "sin": _x(2, 3, 2)}, {},
     {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}, 1, 23),
    ("Attention", "Attention", {"q": _x(1, 2, 3, 4), "k": _x(1, 2, 5, 4), "v": _x(1, 2, 5, 4)}, {},
     {"is_causal": 1, "softcap": 2.0}, 1, 23),
    ("Attention-3d", "Attention", {"q": _x(2, 3, 8), "k": _x(2, 4, 4), "v": _x(2, 4, 6)}, {},
     {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3}, 1, 23),
    ("Resize", "Resize", {"x": _x(1, 2, 3, 4)}, {"roi": "", "scales": np.array([1, 1, 1.5, 2], np.float32)},
     {"mode": "linear"}, 1, 19),
    ("Resize-cubic", "Resize", {"x": _x(1, 1, 5, 6)}, {"roi": "", "scales": "", "sizes": _i64(1, 1, 3, 4)},
     {"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "align_corners"}, 1, 19),
    ("Upsample", "Upsample", {"x": _x(1, 2, 2, 3)}, {"scales": np.array([1, 1, 2, 3], np.float32)}, {}, 1, 9),
    ("ScatterElements", "ScatterElements", {"data": _x(3, 3), "updates": _x(2, 3)},
     {"indices": np.array([[1, 0, 2], [0, 2, 1]], np.int64)}, {"axis": 0, "_order": SCATTER}, 1, 18),
    ("ScatterElements-add", "ScatterElements", {"data": _x(3, 3), "updates": _x(2, 3)},
     {"indices": np.array([[1, 0, 2], [1, 0, 2]], np.int64)}, {"axis": 0, "reduction": "add", "_order": SCATTER},
     1, 18),
    ("Scatter", "Scatter", {"data": _x(3, 3), "updates": _x(1, 2)}, {"indices": np.array([[1, 2]], np.int64)},
     {"axis": 1, "_order": SCATTER}, 1, 9),
    ("ScatterND", "ScatterND", {"data": _x(4, 3), "updates": _x(2, 3)}, {"indices": np.array([[3], [1]], np.int64)},
     {"_order": SCATTER}, 1, 18),
    ("TopK", "TopK", {"x": _away(3, 5)}, {"k": _i64(2)}, {"axis": 1, "_unused_outputs": 1}, 1, 11),
    ("OneHot", "OneHot", {"values": _x(2)}, {"_indices": np.array([1, 0, 2], np.int64), "_depth": _i64(3)},
     {}, 1, 11),
    ("ReverseSequence", "ReverseSequence", {"x": _x(4, 2, 3)}, {"lens": np.array([3, 1], np.int64)},
     {"batch_axis": 1, "time_axis": 0}, 1, 10),
    ("DepthToSpace", "DepthToSpace", {"x": _x(1, 8, 2, 3)}, {}, {"blocksize": 2, "mode": "CRD"}, 1, 13),
    ("SpaceToDepth", "SpaceToDepth", {"x": _x(1, 2, 4, 6)}, {}, {"blocksize": 2}, 1, 13),
    ("CenterCropPad", "CenterCropPad", {"x": _x(3, 5, 2)}, {"shape": _i64(5, 3)}, {"axes": [0, 1]}, 1, 18),
    ("Einsum", "Einsum", {"a": _x(2, 3, 4), "b": _x(2, 4, 5)}, {}, {"equation": "bij,bjk->bik"}, 1, 12),
    ("Pow-1", "Pow", {"a": _pos(2, 3, 2), "b": _x(3)}, {}, {"broadcast": 1, "axis": 1}, 1, 6),
    ("Slice-1", "Slice", {"x": _x(4, 5)}, {}, {"starts": [1, 0], "ends": [3, 4], "axes": [0, 1]}, 1, 9),
    ("GridSample-linear", "GridSample", {"x": _x(1, 2, 3, 4), "grid": _x(1, 2, 3, 2, low=-0.9, high=0.9)}, {},
     {"mode": "linear"}, 1, 22),
    ("GridSample-cubic-reflection", "GridSample", {"x": _x(1, 1, 4, 4), "grid": _x(1, 2, 2, 2, low=-1.3, high=1.3)},
     {}, {"mode": "cubic", "padding_mode": "reflection"}, 1, 22),
    ("GridSample-16-border", "GridSample", {"x": _x(2, 1, 3, 3), "grid": _x(2, 2, 2, 2, low=-1.2, high=1.2)}, {},
     {"mode": "bilinear", "padding_mode": "border", "align_corners": 1}, 1, 16),
    ("RoiAlign", "RoiAlign", {"x": _x(1, 2, 6, 6)},
     {"rois": np.array([[0.5, 0.7, 4.2, 3.9], [1.1, 0.3, 5.0, 5.5]]), "batch_indices": _i64(0, 0)},
     {"output_height": 2, "output_width": 3, "sampling_ratio": 2}, 1, 16),
    ("RoiAlign-max", "RoiAlign", {"x": _away(1, 1, 5, 5)},
     {"rois": np.array([[0.2, 0.4, 3.3, 4.1]]), "batch_indices": _i64(0)},
     {"output_height": 2, "output_width": 2, "sampling_ratio": 2, "mode": "max"}, 1, 16),
    ("AffineGrid", "AffineGrid", {"theta": _x(2, 2, 3)}, {"size": _i64(2, 1, 3, 4)}, {}, 1, 20),
    ("Col2Im", "Col2Im", {"x": _x(1, 8, 6)}, {"image_shape": _i64(3, 4), "block_shape": _i64(2, 2)}, {}, 1, 18),
    ("DFT", "DFT", {"x": _x(2, 5, 1)}, {"dft_length": _i64(6), "axis": _i64(1)},
     {"onesided": 1, "_output_shapes": [[2, 4, 2]]}, 1, 20),
    ("DFT-inverse", "DFT", {"x": _x(2, 5, 2)}, {"dft_length": "", "axis": _i64(-2)},
     {"inverse": 1, "_output_shapes": [[2, 5, 2]]}, 1, 20),
    ("STFT", "STFT", {"x": _x(1, 12, 1), "window": _x(6)}, {"frame_step": _i64(3)},
     {"_order": ["x", "frame_step", "window"]}, 1, 17),
    ("Det", "Det", {"x": _x(2, 3, 3) + 2 * np.eye(3)}, {}, {}, 1, 11),
    ("LpNormalization", "LpNormalization", {"x": _x(3, 4)}, {}, {"axis": 1, "p": 2}, 1, 17),
    ("LpPool", "LpPool", {"x": _pos(1, 2, 4, 5)}, {}, {"kernel_shape": [2, 3], "p": 3, "strides": [1, 2],
                                                       "pads": [0, 1, 1, 0]}, 1, 18),
    ("GroupNormalization", "GroupNormalization", {"x": _x(2, 4, 3), "scale": _x(4), "bias": _x(4)}, {},
     {"num_groups": 2, "stash_type": 11, "_output_shapes": [[2, 4, 3]]}, 1, 21),
    ("MeanVarianceNormalization", "MeanVarianceNormalization", {"x": _x(2, 3, 2, 2)}, {},
     {"_output_shapes": [[2, 3, 2, 2]]}, 1, 13),
    ("Swish", "Swish", {"x": _x(2, 3)}, {}, {"alpha": 0.7}, 1, 24),
    ("Shrink", "Shrink", {"x": _away(2, 3, gap=0.3)}, {}, {"bias": 0.2, "lambd": 0.1}, 1, 17),
    ("SwiGLU", "SwiGLU", {"a": _x(2, 3), "b": _x(2, 3)}, {}, {"alpha": 1.5}, 1, 28),
    ("CumProd", "CumProd", {"x": _pos(2, 4)}, {"axis": np.array(1, np.int64)}, {"exclusive": 1, "reverse": 1}, 1, 26),
    ("If", "If", {"outer_x": _x(2, 3)}, {"_c": np.array(False)},
     {"then_branch": _body([], [("Identity", ["outer_x"], "y")], [("y", [2, 3])]),
      "else_branch": _body([], [("Sin", ["outer_x"], "s"), ("Mul", ["s", "outer_x"], "y")], [("y", [2, 3])])},
     1, 17),
    ("Loop", "Loop", {"v": _x(2, 3), "outer_a": _x(3)}, {"_M": np.array(3, np.int64), "_cond": ""},
     {"body": _body([("i", np.int64, []), ("c", np.bool_, []), ("v_in", np.float64, [2, 3])],
                    [("Identity", ["c"], "c_out"), ("Sin", ["v_in"], "s"), ("Mul", ["s", "outer_a"], "v_out"),
                     ("Tanh", ["v_out"], "y")],
                    [("c_out", [], np.bool_), ("v_out", [2, 3]), ("y", [2, 3])]),
      "_output_shapes": [[2, 3], None]}, 2, 17),
    ("Loop-until", "Loop", {"v": _x(3) + 2.0}, {"_M": np.array(6, np.int64), "_cond": np.array(True)},
     {"body": _body([("i", np.int64, []), ("c", np.bool_, []), ("v_in", np.float64, [3])],
                    [("Mul", ["v_in", "half"], "v_out"), ("ReduceSum", ["v_out"], "total"),
                     ("Greater", ["total", "one"], "c_out")],
                    [("c_out", [], np.bool_), ("v_out", [3])],
                    {"half": np.array(0.5), "one": np.array(1.0)}), "_output_shapes": [[3]]}, 1, 17),
    ("TensorScatter", "TensorScatter", {"past": _x(2, 5, 3), "update": _x(2, 2, 3)},
     {"write_indices": np.array([1, 4], np.int64)}, {"mode": "circular", "axis": 1}, 1, 24),
    ("CausalConvWithState", "CausalConvWithState", {"x": _x(2, 3, 5), "w": _x(3, 1, 3), "b": _x(3),
                                                    "past": _x(2, 3, 2)}, {}, {"activation": "silu"}, 2, 27),
    ("LinearAttention", "LinearAttention", {"q": _x(1, 3, 4), "k": _x(1, 3, 2) * 0.5, "v": _x(1, 3, 4),
                                            "past": _x(1, 1, 2, 4), "g": _x(1, 3, 1) * 0.3,
                                            "beta": _pos(1, 3, 1) * 0.5}, {},
     {"q_num_heads": 2, "kv_num_heads": 1, "update_rule": "gated_delta"}, 2, 27),
    ("MaxUnpool", "MaxUnpool", {"x": _x(1, 1, 2, 2)}, {"i": np.array([[[[0, 3], [9, 14]]]], np.int64)},
     {"kernel_shape": [2, 2], "strides": [2, 2]}, 1, 22),
    ("Scan", "Scan", {"state": _x(3), "xs": _x(3, 4)}, {},
     {"body": _body([("s", np.float64, [3]), ("x", np.float64, [3])],
                    [("Mul", ["s", "x"], "p"), ("Sin", ["x"], "q"), ("Add", ["p", "q"], "s_out"),
                     ("Tanh", ["s_out"], "y")], [("s_out", [3]), ("y", [3])]),
      "num_scan_inputs": 1, "scan_input_axes": [1], "scan_input_directions": [1], "scan_output_axes": [1]},
     2, 17),
]


def _loss_model(op, diff, const, attrs, n_out, opset, weights=None):
    """The op's node and the weighted sum of its outputs; returns the model and the output names. A
    differentiated input named ``outer_*`` is a graph input the node's sub-graphs read, not a node input."""
    attrs = dict(attrs)
    shapes = attrs.pop("_output_shapes", None)  # outputs' shapes where shape inference cannot give them
    order = attrs.pop("_order", None)  # the node's inputs in order, where constants sit between them
    unused = attrs.pop("_unused_outputs", 0)  # trailing outputs left out of the loss (TopK's indices)
    first = [n for n in const if n.startswith("_")]  # a constant the node takes first (Where's condition)
    names = order or first + [n for n in diff if not n.startswith("outer_")] + [n for n in const if n not in first]
    outs = [f"out{k}" for k in range(n_out)]
    nodes = [helper.make_node(op, names, outs + [f"unused{k}" for k in range(unused)], **attrs)]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in const.items() if not isinstance(v, str)]
    names_in_node = [("" if isinstance(const.get(n), str) else n) for n in names]
    nodes[0].ClearField("input")
    nodes[0].input.extend(names_in_node)
    inputs = [_info(n, np.float64, list(np.shape(v))) for n, v in diff.items()]
    if weights is None:
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
                                  initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        for out, shape in zip(model.graph.output, shapes or []):  # what inference leaves unknown (a Loop's)
            if shape is not None and not (out.type.HasField("tensor_type") and out.type.tensor_type.HasField("shape")):
                out.CopyFrom(_info(out.name, np.float64, shape))
        return model
    terms = []
    for k, (o, w) in enumerate(zip(outs, weights)):
        inits.append(numpy_helper.from_array(w, f"C{k}"))
        nodes += [helper.make_node("Mul", [o, f"C{k}"], [f"m{k}"]),
                  helper.make_node("ReduceSum", [f"m{k}"], [f"s{k}"], keepdims=0)]
        terms.append(f"s{k}")
    nodes.append(helper.make_node("Sum", terms, ["loss"]) if len(terms) > 1 else
                 helper.make_node("Identity", terms, ["loss"]))
    grads = [f"d_{n}" for n in diff]
    grad_node = helper.make_node("Gradient", list(diff), grads, domain=TRAINING, xs=list(diff), y="loss")
    graph = helper.make_graph(nodes + [grad_node], "g", inputs,
                              [_info("loss", np.float64, [])] + [_info(g, np.float64, list(np.shape(diff[n])))
                                                                 for g, n in zip(grads, diff)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TRAINING, 1)])


@pytest.mark.parametrize("name, op, diff, const, attrs, n_out, opset", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, op, diff, const, attrs, n_out, opset):
    forward, params = optkit.onnx.to_jax(_loss_model(op, diff, const, attrs, n_out, opset), trainable=[])
    with jax.enable_x64(True):  # the output shapes, traced only
        outputs = jax.eval_shape(lambda *values: forward(params, *values), *diff.values())
    shapes = [o.shape for o in (outputs if isinstance(outputs, tuple) else (outputs,))]
    weights = [RNG.normal(size=s) for s in shapes]
    rep = optkit.onnx.prepare(_loss_model(op, diff, const, attrs, n_out, opset, weights), jit=True)
    loss, *grads = rep.run(diff)

    def loss_at(values):
        return float(rep.run(values)[0])

    h = 1e-6
    for (n, value), grad in zip(diff.items(), grads):
        assert grad.dtype == np.float64 and grad.shape == np.shape(value), n
        fd = np.zeros(np.shape(value))
        for i in np.ndindex(np.shape(value)):
            up, down = dict(diff), dict(diff)
            up[n], down[n] = np.array(value, copy=True), np.array(value, copy=True)
            up[n][i] += h
            down[n][i] -= h
            fd[i] = (loss_at(up) - loss_at(down)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6, err_msg=f"{name}: d loss / d {n}")


def test_every_differentiable_operator_is_checked():
    """The cases cover every ai.onnx operator in the table that has floating-point inputs with a
    gradient; the others are listed here with the reason."""
    without_gradient = {
        # comparisons, logic, integer and index results, shapes, casts: no gradient to check
        "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Not", "Xor", "IsNaN",
        "IsInf", "Shape", "Size", "Constant", "ConstantOfShape", "Range", "ArgMax", "ArgMin", "Cast",
        "CastLike", "Floor", "Ceil", "Round", "Sign", "Mod", "BitShift",
        # integer outputs; a QDQ pair's straight-through gradient is tests/onnx/files/test_quantized.py's
        "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul",
        "ConvInteger", "QLinearConv", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "EyeLike", "NonZero",
        "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix",
        "Hardmax",  # piecewise constant: 0 almost everywhere
        "Compress", "Unique", "NonMaxSuppression",  # output sizes that depend on values: op by op, never traced
        "BitCast",  # the bits reinterpreted: no derivative
        "StringNormalizer", "StringSplit", "StringConcat", "RegexFullMatch", "ImageDecoder",  # strings, bytes
        "TfIdfVectorizer",  # counts of integer token ids
        "SequenceEmpty", "SequenceLength", "OptionalHasElement",  # no float input, or an integer/bool result
        # sequences and optionals move tensors without arithmetic, and DeformConv: their gradients are
        # tests/onnx/ops/test_sequences.py's and tests/onnx/ops/test_versions.py's (central differences in float64)
        "SequenceConstruct", "SequenceAt", "SequenceInsert", "SequenceErase", "SplitToSequence",
        "ConcatFromSequence", "SequenceMap", "Optional", "OptionalGetElement", "DeformConv",
        # random draws: constants for differentiation (tests/onnx/ops/test_versions.py)
        "RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial",
    }
    checked = {c[1] for c in CASES}
    # ONNX Runtime's default-domain extensions: their gradients are checked in tests/onnx/ops/test_contrib.py.
    table = {op for domain, op, _ in optkit.onnx.supported_ops() if domain == ""} - ORT_DEFAULT_DOMAIN_OPS
    assert table - checked - without_gradient == set(), sorted(table - checked - without_gradient)
