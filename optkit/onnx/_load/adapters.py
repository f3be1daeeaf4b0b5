"""Low-rank adapters on an ONNX model's matmul weights: :class:`LoRA`, the load stage that adds them
(:func:`add_adapters`) and the forms written back for ONNX Runtime (:func:`write_adapters`).

Each adapted weight ``W`` (``in x out`` as the matmul applies it) gets ``A`` (``in x rank``, uniform in
``+-1/sqrt(in)`` as PEFT initializes it) and ``B`` (``rank x out``, zeros), named ``<W>.lora_A`` and
``<W>.lora_B``: the model starts as exported. Every node that reads ``W`` as its weight computes
``y = x @ W + (alpha / rank) * (x @ A) @ B`` at the node (Hu et al. 2021, eq. 3), the adapters in float32
(float64 for a DOUBLE weight), the base weight left as the file holds it (a constant in its dtype and
packing; ``MatMulNBits``' 4- and 8-bit blocks stay packed). The int8 weight of a dynamically quantized matmul
(``quantize_dynamic``'s ``DynamicQuantizeLinear`` into ``MatMulInteger``, cast and scaled) gets its adapter on the
float activation, added after the ``Mul`` by the scales; the 8-bit weight that a ``DequantizeLinear`` feeds to a
``MatMul`` (``quantize_static``'s QDQ format) gets its adapter on the ``MatMul``'s activation.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["LoRA", "add_adapters", "adapter_targets", "branch_nodes", "checked_adapters", "rewired", "write_adapters",
           "ADAPTER_DOMAIN"]

ADAPTER_DOMAIN = "ai.optkit"
_FLOAT = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
_MS = "com.microsoft"


@dataclasses.dataclass(frozen=True)
class LoRA:
    """Low-rank adapters for :func:`~optkit.onnx.to_jax` and :class:`~optkit.onnx.OnnxModule` (``lora=``).

    Args:
      rank: the adapters' rank r (a positive integer).
      alpha: the scale's numerator: the adapter term is ``(alpha / rank) * (x @ A) @ B``; None (default)
        is ``rank`` (a scale of 1, Flax's ``nnx.LoRA``). PEFT's ``lora_alpha``.
      targets: glob patterns (``fnmatch``, e.g. ``"*q_proj*"``) matched against the weight initializer's
        name and the node's name; a weight is adapted when either matches one. None (default): every 2-D
        float weight that a ``MatMul`` or ``Gemm`` reads as its second input, every ``MatMulNBits``
        weight (com.microsoft, 4- and 8-bit) and every int8 weight of a dynamically quantized matmul
        (``DynamicQuantizeLinear`` into ``MatMulInteger``, as ``quantize_dynamic`` writes it) and every 2-D 8-bit
        weight that a ``DequantizeLinear`` feeds to a ``MatMul`` (the QDQ format of ``quantize_static``).
      dropout: the rate of dropout on the adapter's input (PEFT's ``lora_dropout``), in [0, 1); drawn from
        the run's key (``apply_fn(..., rng=key)``, an ``OnnxModule``'s ``nnx.Rngs``), off without one.
      seed: the seed of ``A``'s initial values for :func:`~optkit.onnx.to_jax` (an ``OnnxModule`` draws
        them from its ``rngs`` instead).

    Raises:
      ValueError: a rank below 1, a dropout outside [0, 1), an alpha that is not a positive number.
      TypeError: targets that are not strings.

    Source: Hu et al. (2021), "LoRA: Low-Rank Adaptation of Large Language Models" (eq. 3; A random, B zero).

    Example:
      >>> import optkit.onnx
      >>> lora = optkit.onnx.LoRA(8, alpha=16, targets=["*q_proj*", "*v_proj*"])
      >>> lora.scale
      2.0
    """

    rank: int
    alpha: float | None = None
    targets: Sequence[str] | None = None
    dropout: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
            raise ValueError(f"rank must be a positive integer, got {self.rank!r}")
        if self.alpha is not None and not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ValueError(f"alpha must be a positive number or None, got {self.alpha!r}")
        if not 0 <= float(self.dropout) < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.targets is not None:
            targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
            if not all(isinstance(t, str) for t in targets):
                raise TypeError(f"targets must be glob patterns (strings), got {self.targets!r}")
            object.__setattr__(self, "targets", targets)

    @property
    def scale(self) -> float:
        """``alpha / rank`` (1 when alpha is None)."""
        return (self.rank if self.alpha is None else float(self.alpha)) / self.rank


@dataclasses.dataclass(frozen=True)
class _Target:
    node: int  # index in graph.node
    weight: str
    fan_in: int
    fan_out: int
    trans_x: bool  # Gemm with transA: the activation is the node's first input transposed
    trans_w: bool  # Gemm with transB: W is stored (out, in)
    gain: float  # Gemm's alpha: the node scales x @ W by it
    quantized: bool  # MatMulNBits, MatMulInteger, QDQ: merged into the weight only as a side branch
    dtype: int  # the activation's element type (the weight's, MatMulNBits' scales', the Cast's after MatMulInteger)
    x: str = ""  # the activation when it is not the node's first input (a DynamicQuantizeLinear's float input)


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _dynamic_matmuls(graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto]) -> dict[int, _Target]:
    """The dynamically quantized matmuls of ``quantize_dynamic``'s files, by the index of the node that ends
    each: ``DynamicQuantizeLinear(x)`` into a ``MatMulInteger`` of a 2-D 8-bit weight initializer, whose only
    reader is a ``Cast`` to a float type, whose only reader is the ``Mul`` by the two scales (that ``Mul`` is
    the target: its output is ``x @ W`` as the file computes it)."""
    producers = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(index)
    outputs = {o.name for o in graph.output}
    found = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type != "MatMulInteger" or len(node.input) < 2:
            continue
        w, quantize = inits.get(node.input[1]), producers.get(node.input[0])
        if (w is None or len(w.dims) != 2 or w.data_type not in (TensorProto.INT8, TensorProto.UINT8)
                or quantize is None or quantize.op_type != "DynamicQuantizeLinear"):
            continue
        chain = [node.output[0]]
        for op_type in ("Cast", "Mul"):
            after = readers.get(chain[-1], [])
            if len(after) != 1 or chain[-1] in outputs or graph.node[after[0]].op_type != op_type:
                break
            chain.append(graph.node[after[0]].output[0])
        else:
            cast = graph.node[readers[node.output[0]][0]]
            to = int(_attr(cast, "to", 0))
            if to in _FLOAT:
                end = readers[cast.output[0]][0]
                found[end] = _Target(end, w.name, int(w.dims[0]), int(w.dims[1]), False, False, 1.0, True, to,
                                     quantize.input[0])
    return found


def _dequantized(graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto]) -> dict[str, _Target]:
    """The 2-D 8-bit weight initializers that a ``DequantizeLinear`` turns into a ``MatMul``'s weight (the QDQ
    format of ``quantize_static``), as targets without a node, by the ``DequantizeLinear``'s output."""
    found = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type != "DequantizeLinear" or len(node.input) < 2:
            continue
        w, scale = inits.get(node.input[0]), inits.get(node.input[1])
        if w is not None and len(w.dims) == 2 and w.data_type in (TensorProto.INT8, TensorProto.UINT8):
            dtype = scale.data_type if scale is not None else TensorProto.FLOAT
            found[node.output[0]] = _Target(-1, w.name, int(w.dims[0]), int(w.dims[1]), False, False, 1.0, True, dtype)
    return found


def _candidates(graph: onnx.GraphProto) -> list[_Target]:
    inits = {t.name: t for t in graph.initializer}
    dynamic = _dynamic_matmuls(graph, inits)
    qdq = _dequantized(graph, inits)
    found = []
    for index, node in enumerate(graph.node):
        if index in dynamic:
            found.append(dynamic[index])
            continue
        if (node.domain in ("", "ai.onnx") and node.op_type == "MatMul" and len(node.input) == 2
                and node.input[1] in qdq):
            found.append(dataclasses.replace(qdq[node.input[1]], node=index))
            continue
        if len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = inits[node.input[1]]
        if node.domain in ("", "ai.onnx") and node.op_type in ("MatMul", "Gemm"):
            if len(w.dims) != 2 or w.data_type not in _FLOAT:
                continue
            gemm = node.op_type == "Gemm"
            trans_w = gemm and bool(_attr(node, "transB", 0))
            fan_in, fan_out = (w.dims[1], w.dims[0]) if trans_w else (w.dims[0], w.dims[1])
            found.append(_Target(index, w.name, int(fan_in), int(fan_out), gemm and bool(_attr(node, "transA", 0)),
                                 trans_w, float(_attr(node, "alpha", 1.0)) if gemm else 1.0, False, w.data_type))
        elif node.domain == _MS and node.op_type == "MatMulNBits" and len(node.input) > 2 and node.input[2] in inits:
            found.append(_Target(index, w.name, int(_attr(node, "K", 0)), int(_attr(node, "N", 0)), False, False, 1.0,
                                 True, inits[node.input[2]].data_type))
    return found


def adapter_targets(model: onnx.ModelProto, lora: LoRA) -> list[_Target]:
    """The matmul nodes ``lora`` adapts, in graph order (one entry per node; nodes sharing a weight share its
    adapter). Raises ValueError when ``lora.targets`` match no weight, listing the weights there are."""
    graph = model.graph
    found = _candidates(graph)
    if lora.targets is None:
        chosen = found
    else:
        def matches(t: _Target) -> bool:
            return any(fnmatch.fnmatchcase(t.weight, p) or fnmatch.fnmatchcase(graph.node[t.node].name, p)
                       for p in lora.targets)

        chosen = [t for t in found if matches(t)]
    if not chosen:
        weights = sorted({t.weight for t in found})
        hint = difflib.get_close_matches(lora.targets[0], weights, n=3, cutoff=0.3) if lora.targets else []
        raise ValueError(f"LoRA targets {list(lora.targets or [])} match no weight of a MatMul, Gemm, MatMulNBits, "
                         f"dynamically quantized MatMulInteger or QDQ MatMul node; the weights are {weights[:20]}"
                         f"{' ...' if len(weights) > 20 else ''}"
                         + (f" (close: {hint})" if hint else ""))
    return chosen


def _names(weight: str) -> tuple[str, str]:
    return f"{weight}.lora_A", f"{weight}.lora_B"


def rewired(model: onnx.ModelProto, targets: Sequence[_Target], build) -> onnx.ModelProto:
    """A copy of ``model`` in which each target node's output ``y`` is renamed ``y.lora_base`` and the nodes
    ``build(target, x, base, y)`` returns follow it (``y = base + adapter term``)."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    by_node = {t.node: t for t in targets}
    nodes = []
    for index, node in enumerate(new.graph.node):
        target = by_node.get(index)
        if target is None:
            nodes.append(node)
            continue
        y = node.output[0]
        node.output[0] = f"{y}.lora_base"
        nodes.append(node)
        nodes.extend(build(target, target.x or node.input[0], node.output[0], y, index))
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    return new


def add_adapters(model: onnx.ModelProto, lora: LoRA, key: Any = None) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``model`` with ``lora``'s adapters (the load stage of ``to_jax(..., lora=...)``): the adapter initializers
    (``A`` drawn from ``key``, else from ``lora.seed``) and an ``ai.optkit::LoRA`` node added to each target
    node's output. Returns the new model and the adapter names, ``A`` then ``B`` per weight in graph order."""
    import jax

    targets = adapter_targets(model, lora)
    taken = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
    key = jax.random.key(lora.seed) if key is None else key
    weights: dict[str, _Target] = {}
    for t in targets:
        weights.setdefault(t.weight, t)
    initializers, names = [], []
    for i, (weight, t) in enumerate(weights.items()):
        a_name, b_name = _names(weight)
        clash = {a_name, b_name} & taken
        if clash:
            raise ValueError(f"the model already has a tensor named {sorted(clash)[0]!r}; LoRA cannot name its adapter "
                             f"for {weight!r} so")
        bound = 1.0 / np.sqrt(t.fan_in)
        dtype = np.float64 if t.dtype == TensorProto.DOUBLE else np.float32  # float32 for 16-bit and packed bases
        a = np.asarray(jax.random.uniform(jax.random.fold_in(key, i), (t.fan_in, lora.rank), minval=-bound,
                                          maxval=bound), np.float32).astype(dtype)
        initializers += [numpy_helper.from_array(a, a_name),
                         numpy_helper.from_array(np.zeros((lora.rank, t.fan_out), dtype), b_name)]
        names += [a_name, b_name]

    def build(t: _Target, x: str, base: str, y: str, index: int):
        a_name, b_name = _names(t.weight)
        delta = f"{y}.lora_delta"
        return [helper.make_node("LoRA", [x, a_name, b_name], [delta], name=f"{y}.lora", domain=ADAPTER_DOMAIN,
                                 scale=lora.scale * t.gain, dropout=float(lora.dropout), trans_x=int(t.trans_x)),
                helper.make_node("Add", [base, delta], [y], name=f"{y}.lora_add")]

    new = rewired(model, targets, build)
    new.graph.initializer.extend(initializers)
    if not any(o.domain == ADAPTER_DOMAIN for o in new.opset_import):
        new.opset_import.append(helper.make_opsetid(ADAPTER_DOMAIN, 1))
    return new, tuple(names)


def branch_nodes(t: _Target, x: str, base: str, y: str, a: str, b: str, scale: str | None) -> list[onnx.NodeProto]:
    """The side branch of target ``t`` in standard operators: ``y = base + MatMul(MatMul(x, a), b)``, times the
    tensor ``scale`` when one is named, ``x`` transposed first for a ``Gemm`` with ``transA``."""
    nodes = []
    if t.trans_x:
        nodes.append(helper.make_node("Transpose", [x], [f"{y}.lora_xT"], name=f"{y}.lora_transpose"))
        x = f"{y}.lora_xT"
    product = f"{y}.lora_xab" if scale else f"{y}.lora_delta"
    nodes += [helper.make_node("MatMul", [x, a], [f"{y}.lora_xa"], name=f"{y}.lora_a"),
              helper.make_node("MatMul", [f"{y}.lora_xa", b], [product], name=f"{y}.lora_b")]
    if scale:
        nodes.append(helper.make_node("Mul", [product, scale], [f"{y}.lora_delta"], name=f"{y}.lora_mul"))
    return nodes + [helper.make_node("Add", [base, f"{y}.lora_delta"], [y], name=f"{y}.lora_add")]


def checked_adapters(targets: Sequence[_Target], values: Mapping[str, Any],
                     lora: LoRA) -> tuple[dict[str, _Target], set[str]]:
    """The first target of each adapted weight, and the weights that ``values`` holds adapters of (``<W>.lora_A``
    and ``<W>.lora_B``), each pair checked against ``targets`` (:func:`adapter_targets`).

    Raises:
      ValueError: an adapter without its pair, of another shape than the weight and ``lora.rank`` give, or for
        a weight that ``lora`` does not adapt.
    """
    by_weight: dict[str, _Target] = {}
    for t in targets:
        by_weight.setdefault(t.weight, t)
    weights = {name.rsplit(".lora_", 1)[0] for name in values if name.endswith((".lora_A", ".lora_B"))}
    for weight in sorted(weights):
        a_name, b_name = _names(weight)
        if a_name not in values or b_name not in values:
            raise ValueError(f"the adapter of {weight!r} needs both {a_name!r} and {b_name!r}")
        if weight not in by_weight:
            raise ValueError(f"{a_name!r} adapts {weight!r}, which is not a weight that {lora} adapts in this model")
        t = by_weight[weight]
        for name, shape in ((a_name, (t.fan_in, lora.rank)), (b_name, (lora.rank, t.fan_out))):
            if tuple(np.shape(values[name])) != shape:
                raise ValueError(f"{name!r} has shape {tuple(np.shape(values[name]))}; rank {lora.rank} on {weight!r} "
                                 f"needs {shape}")
    return by_weight, weights


def write_adapters(model: onnx.ModelProto, values: Mapping[str, Any], lora: LoRA,
                   merge: bool = True) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The adapters in ``values`` (``<W>.lora_A``, ``<W>.lora_B``) written into ``model`` for ONNX Runtime.

    Float weights with ``merge``: ``W + (alpha / rank) * A @ B`` (transposed for a ``Gemm`` with ``transB``),
    computed in float64 and stored in ``W``'s dtype (returned as replacement values, the graph unchanged).
    Otherwise, and always for quantized weights (``MatMulNBits``, ``MatMulInteger``): standard nodes after each
    adapted node, ``y = base + MatMul(MatMul(x, A), B) * scale``, the adapters as initializers in the
    activation's dtype.

    Returns:
      The model (a copy when nodes were added) and ``{weight name: merged value}``.

    Raises:
      ValueError: an adapter without its pair, of another shape than the model's weight gives, or for a
        weight that ``lora`` does not adapt in ``model``.
    """
    targets = adapter_targets(model, lora)
    by_weight, weights = checked_adapters(targets, values, lora)
    merged: dict[str, np.ndarray] = {}
    branched = [t for t in targets if t.weight in weights and (t.quantized or not merge)]
    inits = {t.name: t for t in model.graph.initializer}
    for weight in weights:
        t = by_weight[weight]
        if t.quantized or not merge:
            continue
        delta = lora.scale * (np.asarray(values[f"{weight}.lora_A"], np.float64)
                              @ np.asarray(values[f"{weight}.lora_B"], np.float64))
        base = numpy_helper.to_array(inits[weight]).astype(np.float64)
        merged[weight] = (base + (delta.T if t.trans_w else delta)).astype(helper.tensor_dtype_to_np_dtype(t.dtype))
    if not branched:
        return model, merged

    def build(t: _Target, x: str, base: str, y: str, index: int):
        return branch_nodes(t, x, base, y, *_names(t.weight), scale=f"{y}.lora_scale")

    new = rewired(model, branched, build)
    written = set()
    for t in branched:
        dtype = helper.tensor_dtype_to_np_dtype(t.dtype)
        y = model.graph.node[t.node].output[0]
        new.graph.initializer.append(numpy_helper.from_array(np.asarray(lora.scale * t.gain, dtype),
                                                             f"{y}.lora_scale"))
        for name in _names(t.weight):
            if name not in written:
                new.graph.initializer.append(numpy_helper.from_array(np.asarray(values[name]).astype(dtype), name))
                written.add(name)
    return new, merged
