"""Tensor algebra and signals: Einsum, Det, Hardmax, LpNormalization, Hann/Hamming/Blackman windows, DFT, STFT.

``DFT`` and ``STFT`` follow ONNX's reference implementation: a signal's last axis holds 1 (real) or 2 (real,
imaginary) values; the transform is zero-padded or cut to ``dft_length``, ``onesided`` keeps the first
``n // 2 + 1`` frequencies of a forward transform and makes an inverse one real (``irfft``); outputs hold the
real and imaginary parts on the last axis, in the input's dtype. Both are ``jnp.fft``, so they differentiate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._common import axis_index
from optkit.onnx._ops._registry import Family

OPS = Family("algebra")


@OPS.op("Einsum", 12, 28)
def _einsum(ctx):
    equation = ctx.attrs.get("equation", "").replace(" ", "")
    if not equation:
        raise ctx.error("the equation attribute is required")

    def einsum(*operands):
        try:
            return jnp.einsum(equation, *operands)
        except ValueError as err:
            raise ctx.error(f"equation {equation!r} does not fit the operands' shapes "
                            f"{[jnp.shape(o) for o in operands]}: {err}") from None

    return einsum


@OPS.op("Det", 11, 22)
def _det(ctx):
    return jnp.linalg.det


@OPS.op("Hardmax", 1, 11, 13)
def _hardmax(ctx):
    axis = int(ctx.attrs.get("axis", -1 if ctx.version >= 13 else 1))

    def hardmax(x):
        x = jnp.asarray(x)
        a = axis_index(ctx, axis, x.ndim)
        if ctx.version >= 13:  # along one axis
            hot = jnp.argmax(x, axis=a, keepdims=True) == jnp.expand_dims(
                jnp.arange(x.shape[a]), tuple(i for i in range(x.ndim) if i != a))
            return hot.astype(x.dtype)
        flat = jnp.reshape(x, (int(np.prod(x.shape[:a])), -1))  # versions 1 and 11: axes a.. flattened
        hot = jnp.argmax(flat, axis=1, keepdims=True) == jnp.arange(flat.shape[1])[None, :]
        return jnp.reshape(hot.astype(x.dtype), x.shape)

    return hardmax


@OPS.op("LpNormalization", 1, 22)
def _lp_normalization(ctx):
    axis, p = int(ctx.attrs.get("axis", -1)), int(ctx.attrs.get("p", 2))
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")

    def lp_normalization(x):
        x = jnp.asarray(x)
        a = axis_index(ctx, axis, x.ndim)
        norm = jnp.sum(jnp.abs(x), axis=a, keepdims=True) if p == 1 else jnp.sqrt(
            jnp.sum(x * x, axis=a, keepdims=True))
        return jnp.where(norm == 0, jnp.zeros_like(x), x / jnp.where(norm == 0, 1, norm))

    return lp_normalization


@OPS.op("HannWindow", 17, static_inputs=(0,), params=((0.5, 0.5, 0.0),))
@OPS.op("HammingWindow", 17, static_inputs=(0,), params=((25 / 46, 21 / 46, 0.0),))
@OPS.op("BlackmanWindow", 17, static_inputs=(0,), params=((0.42, 0.5, 0.08),))
def _window(ctx, coefficients):
    """``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)``, ``N = size`` (periodic) or ``size - 1`` (symmetric)."""
    periodic = bool(ctx.attrs.get("periodic", 1))
    dtype = onnx_dtype(ctx.attrs.get("output_datatype", 1), ctx.message("output_datatype"))
    a0, a1, a2 = coefficients

    def window(size):
        n = int(np.reshape(size, -1)[0])
        ctx.check_size((max(n, 0),), dtype, "the window")
        denominator = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        angle = 2 * np.pi * k / (denominator if denominator else 1)
        return (a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)).astype(dtype)

    return window


@OPS.op("MelWeightMatrix", 17, static_inputs=(0, 1, 2, 3, 4))
def _mel_weight_matrix(ctx):
    """A (dft_length // 2 + 1, num_mel_bins) matrix of triangles of peak 1 on the mel scale
    ``mel(f) = 2595 log10(1 + f / 700)``: ``num_mel_bins + 2`` points from the lower to the upper edge's mel
    (in steps of the range over ``num_mel_bins + 2``, as ONNX's reference steps), each mapped back to hertz and to
    the spectrogram bin ``floor((dft_length + 1) f / sample_rate)``; triangle i rises from point i to point i + 1
    and falls to point i + 2. Computed once, in float64 NumPy, then cast to ``output_datatype``."""
    dtype = onnx_dtype(ctx.attrs.get("output_datatype", 1), ctx.message("output_datatype"))

    def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        bins, length, rate = (int(np.reshape(v, -1)[0]) for v in (num_mel_bins, dft_length, sample_rate))
        low, high = (float(np.reshape(v, -1)[0]) for v in (lower_edge_hertz, upper_edge_hertz))
        if bins < 1 or length < 1 or rate < 1 or not 0 <= low < high:
            raise ctx.error(f"num_mel_bins, dft_length and sample_rate must be >= 1 and 0 <= lower_edge_hertz < "
                            f"upper_edge_hertz; got {bins}, {length}, {rate}, {low}, {high}")
        spectrum = length // 2 + 1
        ctx.check_size((spectrum, bins), dtype, "the matrix")
        mel_low, mel_high = (2595 * np.log10(1 + f / 700) for f in (low, high))
        mels = mel_low + np.arange(bins + 2) * (mel_high - mel_low) / (bins + 2)
        hertz = 700 * (10 ** (mels / 2595) - 1)
        points = np.floor((length + 1) * hertz / rate).astype(np.int64)
        out = np.zeros((spectrum, bins))
        for i in range(bins):
            left, center, right = points[i], points[i + 1], points[i + 2]
            if center == left:
                out[center, i] = 1
            else:
                j = np.arange(left, center + 1)
                out[j, i] = (j - left) / (center - left)
            if right > center:
                j = np.arange(center, right)
                out[j, i] = (right - j) / (right - center)
        return out.astype(dtype)

    return mel_weight_matrix


def _complex(ctx, x):
    """A real-valued ONNX signal (..., 1) or (..., 2) as a complex array without its last axis."""
    if jnp.ndim(x) < 2 or jnp.shape(x)[-1] not in (1, 2):
        raise ctx.error(f"the signal's last axis must hold 1 (real) or 2 (complex) values, got shape {jnp.shape(x)}")
    # In float64 where JAX's 64-bit mode is on, as ONNX's reference (NumPy's FFT) computes: a float32 FFT
    # leaves rounding noise of about 1e-6 of the largest frequency where the exact value is 0.
    x = jnp.asarray(x).astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.result_type(x))
    return x[..., 0] if jnp.shape(x)[-1] == 1 else jax.lax.complex(x[..., 0], x[..., 1])


def _parts(z, dtype):
    """A complex (or real) array as ONNX's (..., 2) real and imaginary parts (or (..., 1)) in ``dtype``."""
    if not jnp.iscomplexobj(z):
        return z[..., None].astype(dtype)
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).astype(dtype)


def _length(ctx, value, what):
    n = int(np.reshape(value, -1)[0])
    if n < 1:
        raise ctx.error(f"{what} must be >= 1, got {n}")
    return n


@OPS.op("DFT", 17, 20, static_inputs=(1, 2))
def _dft(ctx):
    inverse, onesided = bool(ctx.attrs.get("inverse", 0)), bool(ctx.attrs.get("onesided", 0))

    def dft(x, dft_length=None, axis=None):
        signal = _complex(ctx, x)
        if ctx.version < 20:
            a = int(ctx.attrs.get("axis", 1))
        else:
            a = -2 if axis is None else int(np.reshape(axis, -1)[0])
        a = axis_index(ctx, a, jnp.ndim(x))
        if a == jnp.ndim(x) - 1:
            raise ctx.error("axis must not be the last one (it holds the real and imaginary parts)")
        size = jnp.shape(x)[a]
        n = _length(ctx, dft_length, "dft_length") if dft_length is not None else (
            2 * (size - 1) if inverse and onesided else size)
        ctx.check_size((*jnp.shape(x)[:a], n, *jnp.shape(x)[a + 1:]), jnp.result_type(x), "the transform")
        if inverse:
            z = jnp.fft.irfft(signal, n=n, axis=a) if onesided else jnp.fft.ifft(signal, n=n, axis=a)
        else:
            z = jnp.fft.fft(signal, n=n, axis=a)
            if onesided:
                z = jax.lax.slice_in_dim(z, 0, n // 2 + 1, axis=a)
        return _parts(z, jnp.result_type(x))

    return dft


@OPS.op("STFT", 17, static_inputs=(1, 3))
def _stft(ctx):
    onesided = bool(ctx.attrs.get("onesided", 1))

    def stft(x, frame_step, window=None, frame_length=None):
        if jnp.ndim(x) == 2:  # (batch, length) real, as torch's TorchScript export of torch.stft feeds it and
            x = jnp.asarray(x)[..., None]  # ONNX Runtime runs it (the spec says (batch, length, 1))
        if jnp.ndim(x) != 3:
            raise ctx.error(f"the signal must be (batch, length, 1 or 2) or (batch, length), got shape "
                            f"{jnp.shape(x)}")
        step = _length(ctx, frame_step, "frame_step")
        length = _length(ctx, frame_length, "frame_length") if frame_length is not None else (
            jnp.shape(window)[0] if window is not None else jnp.shape(x)[1])
        if window is not None and jnp.shape(window) != (length,):
            raise ctx.error(f"the window of shape {jnp.shape(window)} must have frame_length {length} values")
        frames = 1 + (jnp.shape(x)[1] - length) // step
        if frames < 1:
            raise ctx.error(f"a signal of length {jnp.shape(x)[1]} holds no frame of {length}")
        ctx.check_size((jnp.shape(x)[0], frames, length, 2), jnp.result_type(x), "the frames")
        signal = _complex(ctx, x)
        index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
        framed = signal[:, index]  # (batch, frames, length)
        if window is not None:
            framed = framed * jnp.asarray(window).astype(framed.real.dtype)
        z = jnp.fft.fft(framed, axis=-1)
        if onesided:
            z = z[..., : length // 2 + 1]
        return _parts(z, jnp.result_type(x))

    return stft
