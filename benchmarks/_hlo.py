"""Reading a compiled XLA program: how many times a step passes over its full-size arrays."""

from __future__ import annotations

import re

import numpy as np

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\((.*?)\)(?:,|$)")
# Instructions that move no array data of their own.
_FREE_OPS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy-start", "copy-done"}


def _entry(hlo: str) -> str:
    return hlo[hlo.index("\nENTRY"):]


def _kernel_traffic(hlo: str, count):
    """``(kernels, read, written)`` summed over the entry's top-level kernels, ``count(type text)`` per array.

    A ``while`` loop counts its carried operand as read once and writes nothing.
    """
    types: dict[str, str] = {}
    kernels = read = written = 0
    for line in _entry(hlo).splitlines()[1:]:
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, out_type, opcode, operands = match.groups()
        types[name] = out_type
        if opcode in _FREE_OPS:
            continue
        names = re.findall(r"%([\w.\-]+)", operands)
        if opcode == "while":
            r, w = count(types.get(names[0], "")), 0
        else:
            r, w = sum(count(types.get(n, "")) for n in names), count(out_type)
        if r or w:
            kernels, read, written = kernels + 1, read + r, written + w
    return kernels, read, written


def full_array_traffic(hlo: str, size: int) -> dict[str, int]:
    """Top-level kernels of the entry computation of ``hlo`` that touch an array of ``size`` elements.

    ``hlo`` is the text of a compiled program (``jax.jit(f).lower(...).compile().as_text()``).
    Each operand with ``size`` elements (any shape, any dtype; bitcasts reshape
    for free) is one read, a result with ``size`` elements one write; a ``while``
    loop carrying such an array (read in blocks by its body) counts one read and
    no write. Returns ``{"kernels", "reads", "writes"}``.
    """

    def count(type_text: str) -> int:
        dims = re.findall(r"\b[fsub]\w*\[([\d,]*)\]", type_text)
        return sum(1 for d in dims if int(np.prod([int(x) for x in d.split(",") if x] or [1])) == size)

    kernels, reads, writes = _kernel_traffic(hlo, count)
    return {"kernels": kernels, "reads": reads, "writes": writes}


def tree_traffic(hlo: str, sizes) -> dict[str, int]:
    """Bytes that the top-level kernels of ``hlo`` read and write in arrays of the given element counts.

    For a program over a tree of parameters: ``sizes`` are the element counts
    of its large leaves (count only those, so that the small statistics
    vectors of the same lengths as small leaves are not mistaken for them).
    An operand of one of these sizes is a read of its bytes, a result one
    write; a ``while`` loop carrying one reads it once. Returns
    ``{"kernels", "read_bytes", "written_bytes"}``.
    """
    sizes = set(sizes)
    itemsize = {"f64": 8, "s64": 8, "u64": 8, "c64": 8, "f32": 4, "s32": 4, "u32": 4,
                "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}

    def count(type_text: str) -> int:
        total = 0
        for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", type_text):
            n = int(np.prod([int(x) for x in dims.split(",") if x] or [1]))
            if n in sizes:
                total += n * itemsize.get(dtype, 4)
        return total

    kernels, read, written = _kernel_traffic(hlo, count)
    return {"kernels": kernels, "read_bytes": read, "written_bytes": written}


def kernel_count(hlo: str) -> int:
    """Fusions and loops in the entry computation of ``hlo`` (a proxy for per-array overhead)."""
    return sum(1 for line in _entry(hlo).splitlines() if " fusion(" in line or " while(" in line)
