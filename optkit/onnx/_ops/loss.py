"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import is_integer, log_softmax
from optkit.onnx._ops._registry import Family, NodeContext

OPS = Family("loss")


def _nll(ctx: NodeContext, log_prob, labels, weights, reduction: str, ignore_index):
    """NegativeLogLikelihoodLoss on (N, C, d...) log-probabilities and (N, d...) labels."""
    if jnp.ndim(log_prob) < 2:
        raise ctx.error(f"input must be (N, C) or (N, C, d1, ...), got shape {jnp.shape(log_prob)}")
    expected = jnp.shape(log_prob)[:1] + jnp.shape(log_prob)[2:]
    if jnp.shape(labels) != expected:
        raise ctx.error(f"target must have shape {expected} for input shape {jnp.shape(log_prob)}, "
                        f"got {jnp.shape(labels)}")
    if not is_integer(labels):
        raise ctx.error(f"target must be int32 or int64, got {jnp.result_type(labels)}")
    dtype = jnp.result_type(log_prob)
    classes = jnp.shape(log_prob)[1]
    if isinstance(labels, (np.ndarray, np.generic)):  # known at load time (an initializer): checked now
        labels = np.asarray(labels)
        kept = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
        bad = labels[kept & ((labels < 0) | (labels >= classes))]
        if bad.size:
            raise ctx.error(f"target labels {bad.tolist()[:8]} are out of range for {classes} classes")
    keep = jnp.ones(jnp.shape(labels), bool) if ignore_index is None else labels != ignore_index
    # Tested in the labels' own dtype (an int64 label of 2**32 + 1 must not wrap to class 1).
    valid = (labels >= 0) & (labels < classes)
    # An ignored label may be out of range (e.g. -1): gather at 0, then zero it; a kept label out
    # of range gives NaN, as onnx.reference's IndexError would have stopped the run.
    safe = jnp.where(keep & valid, labels, 0)
    picked = jnp.take_along_axis(log_prob, jnp.expand_dims(safe, 1), axis=1)
    picked = jnp.where(keep & ~valid, jnp.asarray(jnp.nan, dtype), jnp.squeeze(picked, 1))
    weight = keep.astype(dtype)
    if weights is not None:
        weight = weight * jnp.take(weights, safe, axis=0)
    loss = -picked * weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        return jnp.sum(loss) / jnp.sum(weight)
    raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


@OPS.op("NegativeLogLikelihoodLoss", 12, 13, 22)
def _negative_log_likelihood_loss(ctx):
    reduction = ctx.attrs.get("reduction", "mean")
    ignore_index = ctx.attrs.get("ignore_index")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")

    def nll(x, target, weight=None):
        return _nll(ctx, x, target, weight, reduction, ignore_index)

    return nll


@OPS.op("SoftmaxCrossEntropyLoss", 12, 13)
def _softmax_cross_entropy_loss(ctx):
    reduction = ctx.attrs.get("reduction", "mean")
    ignore_index = ctx.attrs.get("ignore_index")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    want_log_prob = ctx.has_output(1)

    def softmax_cross_entropy_loss(scores, labels, weights=None):
        if jnp.ndim(scores) < 2:
            raise ctx.error(f"scores must be (N, C) or (N, C, d1, ...), got shape {jnp.shape(scores)}")
        log_prob = log_softmax(scores, axis=1)
        loss = _nll(ctx, log_prob, labels, weights, reduction, ignore_index)
        if len(ctx.outputs) == 1:
            return loss
        return loss, (log_prob if want_log_prob else None)

    return softmax_cross_entropy_loss
