"""Neural-network operators: MatMul and Gemm, Softmax and LogSoftmax, convolution (and transposed)."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from optkit.onnx._ops import _depthwise as dw
from optkit.onnx._ops._common import aligned, axis_index, log_softmax, on_cpu, softmax
from optkit.onnx._ops._registry import Accepts, Family, Layout
from optkit.onnx._ops._window import (
    Window,
    auto_pads,
    logical_shape,
    per_channel,
    spatial,
    spatial_attrs,
    windowed,
)

OPS = Family("nn")


@OPS.op("MatMul", 1, 9, 13)
def _matmul(ctx):
    def matmul(a, b):
        if jnp.ndim(a) > 2 and jnp.ndim(b) > 2:  # (batch axes sharded on one operand only: both)
            a, b = aligned((a, b), skip=(1, 2))
        return jnp.matmul(a, b)

    return matmul


@OPS.op("Gemm", 6, 7, 9, 11, 13, accepts=Accepts({"transA": frozenset({0, 1}), "transB": frozenset({0, 1})},
                                                  {0: (2, 2), 1: (2, 2)}))
def _gemm(ctx):
    alpha = ctx.attrs.get("alpha", 1.0)
    beta = ctx.attrs.get("beta", 1.0)
    trans_a = bool(ctx.attrs.get("transA", 0))
    trans_b = bool(ctx.attrs.get("transB", 0))

    def gemm(a, b, c=None):
        if jnp.ndim(a) != 2 or jnp.ndim(b) != 2:
            raise ctx.error(f"A and B must be matrices, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        y = jnp.matmul(a, b)
        if alpha != 1.0:
            y = alpha * y
        if c is not None and beta != 0.0:
            if ctx.version < 7 and not ctx.attrs.get("broadcast", 0) and jnp.shape(c) != jnp.shape(y):
                raise ctx.error(f"C {jnp.shape(c)} must have the output's shape {jnp.shape(y)} when broadcast=0")
            y = y + (c if beta == 1.0 else beta * c)
        return y

    return gemm


@OPS.op("Softmax", 1, 11, 13, params=(softmax,))
@OPS.op("LogSoftmax", 1, 11, 13, params=(log_softmax,))
def _softmax(ctx, fn):
    if ctx.version >= 13:
        axis = ctx.attrs.get("axis", -1)

        def softmax(x):
            return fn(x, axis=axis_index(ctx, axis, jnp.ndim(x)))

        return softmax

    # Before opset 13 the input is coerced to 2-D at `axis` (default 1):
    # [prod(shape[:axis]), prod(shape[axis:])], normalized along the second.
    axis = ctx.attrs.get("axis", 1)

    def softmax_2d(x):
        rank = jnp.ndim(x)
        a = axis_index(ctx, axis, rank) if rank else 0
        shape = jnp.shape(x)
        flat = jnp.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))
        return jnp.reshape(fn(flat, axis=1), shape)

    return softmax_2d


# Output elements from which a depthwise convolution is computed by _depthwise.depthwise on CPU: all of them.
# (2**16 until issue 45: one thread, XLA's grouped convolution took 8.6 ms for (2, 4, 4, 672) and a 5x5 kernel,
# the shifted slices 0.23 ms; efficientnet_b0 at 2 x 3 x 64 x 64 ran in 49 ms instead of 3.4 ms, its first
# call 2.6 s instead of 4.3 s; benchmarks/RESULTS.md "Small inputs".)
_SHIFTED_MIN = 0


def _conv_numbers(n, channels_last):
    """``lax.conv_general_dilated``'s dimension numbers for ``n`` spatial axes: W is (M, C/group, k...); X and Y
    are (N, C, D...), or (N, D..., C) when ``channels_last``."""
    features = (0, n + 1, *range(1, n + 1)) if channels_last else tuple(range(n + 2))
    return lax.ConvDimensionNumbers(features, tuple(range(n + 2)), features)


@OPS.op("Conv", 1, 11, 22, layout=Layout("conv"))
def build_conv(ctx):
    """The ``Conv`` node's function (also the float core of ``ConvInteger`` and ``QLinearConv``)."""
    group = int(ctx.attrs.get("group", 1))

    def conv(x, w, b=None):
        n = jnp.ndim(x) - 2
        shape = logical_shape(jnp.shape(x), ctx.channels_last)
        if n < 1 or jnp.ndim(w) != n + 2:
            raise ctx.error(f"X must be (N, C, D1, ...) and W (M, C/group, k1, ...) of the same rank, "
                            f"got shapes {shape} and {jnp.shape(w)}")
        kernel = list(ctx.attrs.get("kernel_shape") or jnp.shape(w)[2:])
        if tuple(kernel) != tuple(jnp.shape(w)[2:]):
            raise ctx.error(f"kernel_shape {kernel} does not match W's shape {jnp.shape(w)}")
        if shape[1] != jnp.shape(w)[1] * group:
            raise ctx.error(f"X has {shape[1]} channels but W {jnp.shape(w)} with group={group} "
                            f"expects {jnp.shape(w)[1] * group}")
        strides, dilations, pads = spatial_attrs(ctx, n, kernel)
        pads = auto_pads(ctx, shape[2:], kernel, strides, dilations, pads)
        windows = []
        for size, k, d, s_, (begin, end) in zip(shape[2:], kernel, dilations, strides, pads):
            span = (k - 1) * d + 1
            if size + begin + end < span:
                raise ctx.error(f"the kernel ({span} with dilation) is larger than the padded input "
                                f"{size + begin + end} for input shape {shape} and pads {pads}")
            windows.append(Window(size, k, d, s_, begin, (size + begin + end - span) // s_ + 1))
        ctx.check_size((shape[0], jnp.shape(w)[0], *(win.out for win in windows)), jnp.result_type(x),
                       "the output")
        # Only the part of X the windows reach, with at most a span of padding on each side, which the
        # convolution pads itself: XLA:CPU's convolution with padding larger than the kernel on a tiny input
        # crashed the process, and padding all of pads can be far larger than memory. (A separate pad before a
        # VALID convolution kept XLA:CPU from carrying its channels-last layout from one convolution to the next:
        # resnet18's inference took 496 ms instead of 234 ms, with 47 transposes instead of 8.)
        # One input channel per group (MobileNet, EfficientNet), on CPU, on an output large enough for its running
        # time to matter more than the longer compile (see _depthwise.shifted).
        depthwise = (group > 1 and jnp.shape(w)[1] == 1 and on_cpu()
                     and shape[0] * jnp.shape(w)[0] * math.prod(win.out for win in windows) >= _SHIFTED_MIN)
        numbers = _conv_numbers(n, ctx.channels_last)
        # A small output of many input channels (ResNet's last stage on a 32-64 px image: 2 x 2 x 512), on CPU
        # (channels-last):
        # the windows gathered as shifted slices and one matrix product. XLA:CPU's convolution against that, one
        # thread, 3x3 kernels, NHWC (benchmarks/RESULTS.md "Small inputs"): 1.5-54x slower at 1 or 4 output
        # points per image, 1-3x at 16 with 128+ input channels, 1-1.7x at 49-64 with 256+ and a batch of 1-2;
        # faster at larger outputs, where it stays.
        points, depth = math.prod(win.out for win in windows), shape[1] * math.prod(kernel)
        small = points <= 4 or (points <= 16 and depth >= 1152) or (
            points <= 64 and depth >= 2304 and shape[0] * points <= 128)
        patches = group == 1 and ctx.channels_last and on_cpu() and small

        def convolve(core, pads, _):
            if patches:  # the windows as shifted slices (not lax.conv_general_dilated_patches: a grouped
                # convolution, as slow here), in the channels-last plan
                padded = jnp.pad(core, spatial(n + 2, ctx.channels_last, pads, (0, 0)))
                taps = [tap for _, tap in dw.taps(padded, (shape[1], 1, *kernel), strides, dilations, True)]
                gathered = jnp.stack(taps, axis=n + 2)  # (N, D..., C, taps): C-major, as W's (C, k...) flattens
                flat = jnp.reshape(gathered, (*jnp.shape(gathered)[:n + 1], -1))
                dtype = jnp.result_type(core, w)
                wide = dw.accumulator(dtype)  # 16-bit: a float32 accumulator
                return lax.dot_general(flat.astype(dtype), jnp.reshape(w, (jnp.shape(w)[0], -1)).astype(dtype),
                                       (((n + 1,), (1,)), ((), ())),
                                       preferred_element_type=wide).astype(dtype)  # (N, D..., M)
            if depthwise:
                return dw.depthwise(jnp.pad(core, spatial(n + 2, ctx.channels_last, pads, (0, 0))), w, tuple(strides),
                           tuple(dilations), ctx.channels_last)
            return lax.conv_general_dilated(core, w, window_strides=strides, padding=pads, rhs_dilation=dilations,
                                            feature_group_count=group, dimension_numbers=numbers)

        y, out_shape, _ = windowed(ctx, x, windows, None, convolve, 0, ctx.channels_last)
        if y is None:  # every window lies in the padding
            out_shape = list(out_shape)
            out_shape[n + 1 if ctx.channels_last else 1] = jnp.shape(w)[0]
            y = jnp.zeros(out_shape, jnp.result_type(x, w))
        if b is not None:
            y = y + jnp.reshape(b, per_channel(n + 2, ctx.channels_last))
        return y

    return conv


@OPS.op("ConvTranspose", 1, 11, 22)
def _conv_transpose(ctx):
    group = int(ctx.attrs.get("group", 1))
    auto_pad = ctx.attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ctx.error(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")

    def conv_transpose(x, w, b=None):
        n = jnp.ndim(x) - 2
        channels = jnp.shape(x)[1] if n >= 1 else 0
        if n < 1 or jnp.ndim(w) != n + 2 or group < 1 or channels % group or jnp.shape(w)[0] != channels:
            raise ctx.error(f"X must be (N, C, D1, ...) and W (C, M/group, k1, ...) of the same rank, with C "
                            f"divisible by group={group}; got shapes {jnp.shape(x)} and {jnp.shape(w)}")
        kernel = list(ctx.attrs.get("kernel_shape") or jnp.shape(w)[2:])
        if tuple(kernel) != tuple(jnp.shape(w)[2:]):
            raise ctx.error(f"kernel_shape {kernel} does not match W's shape {jnp.shape(w)}")
        strides, dilations, pads = spatial_attrs(ctx, n, kernel)
        output_padding = list(ctx.attrs.get("output_padding") or [0] * n)
        output_shape = ctx.attrs.get("output_shape")
        if len(output_padding) != n or any(not 0 <= p < max(s, d)
                                           for p, s, d in zip(output_padding, strides, dilations)):
            raise ctx.error(f"output_padding {output_padding} must hold {n} entries, each less than its stride "
                            f"or dilation")
        spatial = jnp.shape(x)[2:]
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        full = [s * (size - 1) + p + span for s, size, p, span in zip(strides, spatial, output_padding, spans)]
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # The pads follow from the output shape (ONNX: total_padding split by auto_pad).
            target = list(output_shape) if output_shape is not None else [size * s for size, s in zip(spatial, strides)]
            target = target[-n:]
            if len(target) != n or any(t < 1 for t in target):
                raise ctx.error(f"output_shape {output_shape} must give {n} positive spatial sizes")
            pads = []
            for f, t in zip(full, target):
                total = f - t
                small, large = total // 2, total - total // 2
                pads.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
        elif auto_pad == "VALID":
            pads = [(0, 0)] * n
        out = [f - pb - pe for f, (pb, pe) in zip(full, pads)]
        if any(o < 1 for o in out):
            raise ctx.error(f"the output would have spatial shape {out} for input {jnp.shape(x)}, pads {pads}")
        m = jnp.shape(w)[1] * group
        ctx.check_size((jnp.shape(x)[0], m, *out), jnp.result_type(x), "the output")
        # As the gradient of a convolution: X dilated by the strides, convolved with W flipped and its
        # in/out channels swapped per group, padded by span - 1 - pad (output_padding at the end).
        k = jnp.reshape(w, (group, channels // group, m // group, *kernel))
        k = jnp.swapaxes(k, 1, 2).reshape((m, channels // group, *kernel))
        k = jnp.flip(k, axis=tuple(range(2, n + 2)))
        padding = [(span - 1 - pb, span - 1 - pe + p) for span, (pb, pe), p in zip(spans, pads, output_padding)]
        y = lax.conv_general_dilated(x, k, window_strides=(1,) * n, padding=padding, lhs_dilation=strides,
                                     rhs_dilation=dilations, feature_group_count=group)
        if b is not None:
            y = y + jnp.reshape(b, (1, -1) + (1,) * n)
        return y

    return conv_transpose
