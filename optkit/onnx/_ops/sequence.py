"""Sequences and optionals: ONNX's ``Sequence*``, ``SplitToSequence``, ``ConcatFromSequence``, ``SequenceMap`` and
``Optional``, ``OptionalHasElement``, ``OptionalGetElement``.

A sequence is a Python list of arrays and an empty optional is None: both are JAX pytrees, so a graph that builds,
indexes and concatenates sequences traces and compiles as one program (``jax.jit`` takes the list whole). A
sequence's length is known before running (it is the list's length), and so is every position that indexes it
(``SequenceAt``'s, ``SequenceInsert``'s and ``SequenceErase``'s ``position``, ``SplitToSequence``'s ``split``: an
initializer, a constant, or a fed value, which compiles once per value). ``SequenceMap`` runs its body once per
element, unrolled, each element keeping its own shape. A sequence fed as a graph input is a list of arrays; an
optional input is fed None when it is empty (docs "Running ONNX models", "Sequences and optionals").

Semantics from ONNX's operator pages (``SequenceAt``... ``OptionalGetElement``), checked against ONNX's node test
cases (tests/onnx/ops/test_backend.py) and ONNX Runtime (tests/onnx/ops/test_sequences.py).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import onnx_dtype
from optkit.onnx._ops._common import body_runner
from optkit.onnx._ops._registry import Family, Float16

OPS = Family("sequence")

# The most tensors a sequence may hold: each is a separate traced value (and SequenceMap traces its body once per
# tensor), so a file that splits a large tensor into single elements is refused by name instead of taking the
# process's memory.
MAX_SEQUENCE_LENGTH = 2**16


def _bounded(ctx, length: int, what: str) -> None:
    if length > MAX_SEQUENCE_LENGTH:
        raise ctx.error(f"{what} would hold {length} tensors, more than optkit's limit of {MAX_SEQUENCE_LENGTH} "
                        f"for one sequence")


def _sequence(ctx, value: Any, what: str = "input_sequence") -> list:
    if not isinstance(value, list):
        raise ctx.error(f"{what} must be a sequence, got a {'tensor' if hasattr(value, 'shape') else value!r}")
    return value


def _position(ctx, position: Any, length: int, *, insert: bool = False) -> int:
    """A position in ``[-length, length - 1]`` (``[-length, length]`` to insert) as an index from the front."""
    if np.size(position) != 1:  # (a scalar; ONNX Runtime also takes one element of shape (1,))
        raise ctx.error(f"position must be a scalar, got shape {np.shape(position)}")
    p = int(np.asarray(position).reshape(()))
    high = length if insert else length - 1
    if not -length <= p <= high:
        raise ctx.error(f"position {p} is out of range for a sequence of {length} tensors "
                        f"([{-length}, {high}])")
    return p + length if p < 0 else p


@OPS.op("SequenceEmpty", 11)
def _sequence_empty(ctx):
    if "dtype" in ctx.attrs:
        onnx_dtype(int(ctx.attrs["dtype"]), f"{ctx.where}: attribute 'dtype'")  # an element type optkit runs
    return lambda: []


@OPS.op("SequenceConstruct", 11, float16=Float16(kernel_since=11))
def _sequence_construct(ctx):
    def sequence_construct(*inputs):
        if not inputs:
            raise ctx.error("SequenceConstruct needs at least one tensor")
        kinds = {jnp.result_type(x) for x in inputs}
        if len(kinds) > 1:
            raise ctx.error(f"a sequence's tensors have one element type, got {sorted(map(str, kinds))}")
        return list(inputs)

    return sequence_construct


@OPS.op("SequenceAt", 11, static_inputs=(1,), float16=Float16(kernel_since=11))
def _sequence_at(ctx):
    def sequence_at(input_sequence, position):
        seq = _sequence(ctx, input_sequence)
        return seq[_position(ctx, position, len(seq))]

    return sequence_at


@OPS.op("SequenceInsert", 11, static_inputs=(2,))
def _sequence_insert(ctx):
    def sequence_insert(input_sequence, tensor, position=None):
        seq = list(_sequence(ctx, input_sequence))
        if seq and jnp.result_type(seq[0]) != jnp.result_type(tensor):
            raise ctx.error(f"tensor of {jnp.result_type(tensor)} inserted into a sequence of "
                            f"{jnp.result_type(seq[0])}")
        _bounded(ctx, len(seq) + 1, "the sequence")
        where = len(seq) if position is None else _position(ctx, position, len(seq), insert=True)
        seq.insert(where, tensor)
        return seq

    return sequence_insert


@OPS.op("SequenceErase", 11, static_inputs=(1,))
def _sequence_erase(ctx):
    def sequence_erase(input_sequence, position=None):
        seq = list(_sequence(ctx, input_sequence))
        if not seq:
            raise ctx.error("cannot erase from an empty sequence")
        del seq[len(seq) - 1 if position is None else _position(ctx, position, len(seq))]
        return seq

    return sequence_erase


@OPS.op("SequenceLength", 11, static_outputs=True)
def _sequence_length(ctx):
    return lambda input_sequence: np.asarray(len(_sequence(ctx, input_sequence)), np.int64)


@OPS.op("SplitToSequence", 11, 24, static_inputs=(1,), float16=Float16(kernel_since=11))
def _split_to_sequence(ctx):
    axis_attr, keepdims = int(ctx.attrs.get("axis", 0)), bool(ctx.attrs.get("keepdims", 1))

    def split_to_sequence(input, split=None):  # noqa: A002 (ONNX's name)
        x = jnp.asarray(input)
        if not -x.ndim <= axis_attr < x.ndim:
            raise ctx.error(f"axis {axis_attr} is out of range for an input of rank {x.ndim}")
        axis = axis_attr % x.ndim
        size = x.shape[axis]
        if split is None:
            _bounded(ctx, size, "the split")
            pieces = [jnp.take(x, i, axis=axis) if not keepdims else
                      jnp.take(x, jnp.arange(i, i + 1), axis=axis) for i in range(size)]
            return pieces
        split = np.asarray(split).astype(np.int64)
        if split.ndim == 0:
            if split <= 0:
                raise ctx.error(f"split must be positive, got {int(split)}")
            sizes = [int(split)] * (size // int(split)) + ([size % int(split)] if size % int(split) else [])
        elif split.ndim == 1:
            sizes = [int(s) for s in split]
            if any(s < 0 for s in sizes) or sum(sizes) != size:
                raise ctx.error(f"split {sizes} must be non-negative and sum to the axis size {size}")
        else:
            raise ctx.error(f"split must be a scalar or 1-D, got shape {split.shape}")
        _bounded(ctx, len(sizes), "the split")
        starts = np.cumsum([0, *sizes[:-1]])
        return [jnp.take(x, jnp.arange(int(s), int(s) + n), axis=axis) for s, n in zip(starts, sizes)]

    return split_to_sequence


@OPS.op("ConcatFromSequence", 11)
def _concat_from_sequence(ctx):
    if "axis" not in ctx.attrs:
        raise ctx.error("the attribute 'axis' is required")
    axis, new_axis = int(ctx.attrs["axis"]), bool(ctx.attrs.get("new_axis", 0))

    def concat_from_sequence(input_sequence):
        seq = _sequence(ctx, input_sequence)
        if not seq:
            raise ctx.error("cannot concatenate an empty sequence (its result's shape is unknown)")
        rank = jnp.ndim(seq[0]) + new_axis
        if not -rank <= axis < rank:
            raise ctx.error(f"axis {axis} is out of range for rank {rank}")
        return jnp.stack(seq, axis=axis) if new_axis else jnp.concatenate(seq, axis=axis)

    return concat_from_sequence


@OPS.op("SequenceMap", 17)
def _sequence_map(ctx):
    body = ctx.convert_subgraph("body")
    if len(body.inputs) != len(ctx.inputs):
        raise ctx.error(f"the body has {len(body.inputs)} inputs, the node {len(ctx.inputs)}")
    if len(body.outputs) != len(ctx.outputs):
        raise ctx.error(f"the body has {len(body.outputs)} outputs, the node {len(ctx.outputs)}")

    def sequence_map(input_sequence, *additional_inputs, captured=None):
        seq = _sequence(ctx, input_sequence)
        for i, extra in enumerate(additional_inputs):
            if isinstance(extra, list) and len(extra) != len(seq):
                raise ctx.error(f"additional input {i} is a sequence of {len(extra)} tensors, input_sequence "
                                f"of {len(seq)}")
        run = body_runner(body, captured)
        outs: list[list] = [[] for _ in body.outputs]
        for i, item in enumerate(seq):
            row = run(item, *(e[i] if isinstance(e, list) else e for e in additional_inputs))
            for out, value in zip(outs, row):
                out.append(value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return sequence_map


@OPS.op("Optional", 15, 28, float16=Float16(kernel_since=15))
def _optional(ctx):
    if not (ctx.inputs and ctx.inputs[0]) and ctx.attrs.get("type") is None:
        raise ctx.error("an empty Optional needs its 'type' attribute")
    return lambda input=None: input  # noqa: A002 (ONNX's name)


@OPS.op("OptionalHasElement", 15, 18, 28, static_outputs=True, float16=Float16(kernel_since=18))
def _optional_has_element(ctx):
    return lambda input=None: np.asarray(input is not None)  # noqa: A002 (ONNX's name)


@OPS.op("OptionalGetElement", 15, 18, 28, float16=Float16(kernel_since=15))
def _optional_get_element(ctx):
    def optional_get_element(input=None):  # noqa: A002 (ONNX's name)
        if input is None:
            raise ctx.error("the optional input is empty (OptionalGetElement needs a value)")
        return input

    return optional_get_element
