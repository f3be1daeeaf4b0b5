"""LoRA adapters as ONNX Runtime serves them: a base model whose adapted weights take their ``A`` and ``B`` as
graph inputs (:func:`with_adapter_inputs`), one ``.onnx_adapter`` file per fine-tune (:func:`export_adapters`),
and the onnxruntime-genai folder of such a base (:func:`with_adapter_inputs_folder`).

ONNX Runtime's adapter format (``onnxruntime.AdapterFormat``, ONNX Runtime 1.20+) is a file of named tensors; a
run that activates it (``RunOptions.add_active_adapter``, onnxruntime-genai's ``Adapters`` and
``Generator.set_active_adapter``) feeds each tensor to the graph input of its name. The names follow Olive's
``ExtractAdapters`` pass, which onnxruntime-genai's LoRA tutorial uses: the module path of the node that reads
the weight, then ``lora_A.weight`` / ``lora_B.weight`` (see :func:`adapter_input_names`). As Olive does, each
input's rank axis is the symbolic ``lora_r`` and each input has a default of rank 0 (an empty initializer), so
that the model runs with no adapter active and then gives its original outputs; as onnxruntime-genai's builder
does, the adapter's scale ``alpha / rank`` is folded into ``B``, so one base serves adapters of any rank and
alpha.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optkit.onnx._load.adapters import ADAPTER_DOMAIN, LoRA, adapter_targets, branch_nodes, checked_adapters, rewired
from optkit.onnx._load.files import ModelSource, model_proto
from optkit.onnx._training_model import by_initializer_name

__all__ = ["adapter_input_names", "with_adapter_inputs", "export_adapters", "with_adapter_inputs_folder"]

RANK_AXIS = "lora_r"


def _check_lora(lora: Any) -> None:
    if not isinstance(lora, LoRA):
        raise TypeError(f"lora must be an optkit.onnx.LoRA (the adapters' rank, alpha and targets), got "
                        f"{type(lora).__name__}")


def _module_path(node: onnx.NodeProto, weight: str) -> list[str]:
    """The candidate module paths of an adapted node, best first: the node name's scopes without its last part
    (``/model/layers.0/self_attn/q_proj/MatMul`` -> ``model.layers.0.self_attn.q_proj``: the TorchScript
    exporter, Optimum and onnxruntime-genai's builder), a parameter-like weight name without ``.weight``
    (torch.onnx's dynamo exporter keeps ``model.h.0.attn.c_attn.weight``; ONNX Runtime's quantizers' suffixes
    ``_quantized`` and ``_Q4`` dropped), the node's whole name, the weight's."""
    parts = [p for p in re.sub(r"(_quant|_Q[248])$", "", node.name).split("/") if p]  # quantizers' node suffixes
    found = []
    if len(parts) > 1:
        found.append(".".join(parts[:-1]))
    parameter = re.sub(r"(_quantized|_Q[248](G\d+)?)$", "", weight)  # quantize_dynamic's, MatMulNBitsQuantizer's
    if parameter.endswith(".weight") and "::" not in parameter and "/" not in parameter:
        found.append(parameter.removesuffix(".weight"))
    found += [".".join(parts)] if parts else []
    found.append(weight)
    return found


def adapter_input_names(model: ModelSource | Any, lora: LoRA) -> dict[str, str]:
    """The graph input that each adapter of ``to_jax(model, lora=lora)`` becomes in :func:`with_adapter_inputs`.

    The convention is Olive's (``olive/passes/onnx/extract_adapters.py``, ``ExtractAdapters``, whose adapter files
    onnxruntime-genai's tutorial "Generate and run fine-tuned models with LoRA adapters" serves): the module path
    of the node that reads the weight, then ``lora_A.weight`` or ``lora_B.weight``, e.g.
    ``model.layers.0.self_attn.q_proj.lora_A.weight`` for the node ``/model/layers.0/self_attn/q_proj/MatMul``.
    Where the node name has no scopes (torch.onnx's dynamo exporter names nodes ``node_linear_3``), a weight
    named like a parameter gives it (``transformer.h.0.attn.c_attn.weight`` ->
    ``transformer.h.0.attn.c_attn.lora_A.weight``), else the node's name. Two weights that would get one name
    get their nodes' whole names instead. A weight read by several nodes has one adapter, named after the first.

    Args:
      model: the original model (a ``ModelProto``, a path or bytes; not modified).
      lora: the :class:`~optkit.onnx.LoRA` the adapters were (or will be) trained with.

    Returns:
      ``{"<W>.lora_A": input name, "<W>.lora_B": input name}`` for every weight ``W`` that ``lora`` adapts.

    Raises:
      TypeError: ``lora`` is not a :class:`~optkit.onnx.LoRA`; ``model`` is not a model.
      ValueError: ``lora.targets`` match no weight; a name already taken by a tensor of the model.

    Example:
      >>> import numpy as np, optkit.onnx
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="/net/fc/MatMul")], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
      ...     [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")])
      >>> optkit.onnx.adapter_input_names(helper.make_model(graph), optkit.onnx.LoRA(2))
      {'W.lora_A': 'net.fc.lora_A.weight', 'W.lora_B': 'net.fc.lora_B.weight'}
    """
    _check_lora(lora)
    model = model_proto(model)
    return _input_names(model, adapter_targets(model, lora))


def _input_names(model: onnx.ModelProto, targets: Sequence[Any]) -> dict[str, str]:
    """:func:`adapter_input_names` of ``targets`` (:func:`adapter_targets`' of ``model``)."""
    readers = {n.input[1]: n for n in reversed(model.graph.node) if len(n.input) > 1}
    first: dict[str, onnx.NodeProto] = {}
    for t in targets:  # (a dynamically quantized matmul: its MatMulInteger, not the Mul)
        first.setdefault(t.weight, readers[t.weight] if t.x else model.graph.node[t.node])
    candidates = {weight: _module_path(node, weight) for weight, node in first.items()}
    chosen = {weight: paths[0] for weight, paths in candidates.items()}
    for _ in range(3):  # a clash moves both weights to their next candidate
        seen: dict[str, list[str]] = {}
        for weight, path in chosen.items():
            seen.setdefault(path, []).append(weight)
        clashes = [weights for weights in seen.values() if len(weights) > 1]
        if not clashes:
            break
        for weights in clashes:
            for weight in weights:
                paths = candidates[weight]
                chosen[weight] = paths[min(paths.index(chosen[weight]) + 1, len(paths) - 1)]
    taken = ({t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
             | {o for n in model.graph.node for o in n.output})
    names: dict[str, str] = {}
    for weight, path in chosen.items():
        for part in ("A", "B"):
            name = f"{path}.lora_{part}.weight"
            if name in taken or name in names.values():
                raise ValueError(f"the adapter input {name!r} for {weight!r} is already a tensor of the model")
            names[f"{weight}.lora_{part}"] = name
    return names


def with_adapter_inputs(model: ModelSource | Any, lora: LoRA) -> onnx.ModelProto:
    """A copy of ``model`` in which every weight that ``lora`` adapts gets a LoRA side branch whose ``A`` and
    ``B`` are graph inputs: the base model that ONNX Runtime's adapter files (:func:`export_adapters`) plug into.

    Each adapted node's output ``y`` becomes ``y + MatMul(MatMul(x, A), B)`` in standard operators (``x`` the
    node's activation: a ``Gemm``'s ``transA`` applied, a dynamically quantized matmul's float input; a ``Gemm``'s
    ``alpha`` applied to the branch too), the base weights bit for bit as they were, float, ``MatMulNBits``
    (4- and 8-bit), ``MatMulInteger`` or QDQ (``DequantizeLinear`` into ``MatMul``) alike. ``A`` is declared
    ``[in, "lora_r"]`` and ``B`` ``["lora_r", out]`` in the activation's dtype, named by
    :func:`adapter_input_names`; each has a default of rank 0 (an empty initializer), so the model runs with no
    adapter fed and gives the original outputs.

    Args:
      model: the original model (a ``ModelProto``, a path with its external data, bytes; not modified): the
        file given to ``to_jax(..., lora=lora)``, not ``apply_fn.model``.
      lora: the :class:`~optkit.onnx.LoRA` of the adapters (its targets; rank and alpha live in the files).

    Returns:
      A new ``onnx.ModelProto``.

    Raises:
      TypeError: ``lora`` is not a :class:`~optkit.onnx.LoRA`; ``model`` is not a model.
      ValueError: ``lora.targets`` match no weight; a model that already holds optkit's LoRA nodes; an input
        name already taken.

    Source: ONNX Runtime's "Multi LoRA" adapter format (``onnxruntime.AdapterFormat``, 1.20); the side branch
    and empty defaults as Olive's ``ExtractAdapters`` pass writes them (``make_inputs``, ``dynamic_lora_r``,
    ``optional_inputs``).

    Example:
      >>> import onnx.parser, optkit.onnx
      >>> model = onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
      ...     g (float[N, 4] x) => (float[N, 3] y) <float[3, 4] W = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}>
      ...     { y = Gemm <transB = 1> (x, W) }''')
      >>> base = optkit.onnx.with_adapter_inputs(model, optkit.onnx.LoRA(2))
      >>> [(i.name, [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]) for i in base.graph.input]
      [('x', ['N', 4]), ('W.lora_A.weight', [4, 'lora_r']), ('W.lora_B.weight', ['lora_r', 3])]
    """
    _check_lora(lora)
    model = model_proto(model)
    if any(node.domain == ADAPTER_DOMAIN for node in model.graph.node):
        raise ValueError("model holds optkit's LoRA nodes (apply_fn.model): pass the model you gave to_jax")
    targets = adapter_targets(model, lora)
    names = _input_names(model, targets)
    gains: dict[str, tuple[float, int]] = {}

    def build(t: Any, x: str, base: str, y: str, index: int) -> list[onnx.NodeProto]:
        if t.gain != 1.0:  # (a Gemm's alpha: the model's, not the adapter's)
            gains[f"{y}.lora_gain"] = (t.gain, t.dtype)
        return branch_nodes(t, x, base, y, names[f"{t.weight}.lora_A"], names[f"{t.weight}.lora_B"],
                            scale=f"{y}.lora_gain" if t.gain != 1.0 else None)

    new = rewired(model, targets, build)
    declared = set()
    for t in targets:
        if t.weight in declared:
            continue
        declared.add(t.weight)
        dtype = helper.tensor_dtype_to_np_dtype(t.dtype)
        for part, shape, empty in (("A", [t.fan_in, RANK_AXIS], (t.fan_in, 0)),
                                   ("B", [RANK_AXIS, t.fan_out], (0, t.fan_out))):
            name = names[f"{t.weight}.lora_{part}"]
            new.graph.input.append(helper.make_tensor_value_info(name, t.dtype, shape))
            new.graph.initializer.append(numpy_helper.from_array(np.zeros(empty, dtype), name))
    for name, (gain, elem) in gains.items():
        new.graph.initializer.append(numpy_helper.from_array(
            np.asarray(gain, helper.tensor_dtype_to_np_dtype(elem)), name))
    return new


def export_adapters(model: ModelSource | Any, params: Mapping[str, Any] | Any, lora: LoRA,
                    path: str | os.PathLike[str], *, adapter_version: int = 1, model_version: int = 1) -> pathlib.Path:
    """Write trained adapters as an ONNX Runtime adapter file (``.onnx_adapter``) for :func:`with_adapter_inputs`'
    base model.

    Each ``<W>.lora_A`` is written as is and each ``<W>.lora_B`` times ``alpha / rank`` (computed in float64),
    both cast to the dtype the input declares (the activation's: float16 for a float16 base), under the names
    of :func:`adapter_input_names`. ONNX Runtime feeds them to those inputs in a run that activates the file::

        adapter = onnxruntime.LoraAdapter(); adapter.Load(path)
        options = onnxruntime.RunOptions(); options.add_active_adapter(adapter)
        session.run(None, feeds, options)

    Args:
      model: the original model (as for :func:`with_adapter_inputs`; not modified).
      params: the adapters, as ``to_jax(model, lora=lora)``'s params hold them (``<W>.lora_A`` ``[in, rank]``,
        ``<W>.lora_B`` ``[rank, out]``), or an :class:`~optkit.onnx.OnnxModule` or its ``nnx.State``. Every
        pair given is written; a weight left out keeps its rank-0 default (no adaptation).
      lora: the :class:`~optkit.onnx.LoRA` they were trained with (rank, alpha, targets).
      path: the file to write (its directory must exist).
      adapter_version, model_version: the format's two version fields (integers, default 1).

    Returns:
      ``path`` as a ``pathlib.Path``.

    Raises:
      ImportError: onnxruntime (1.20+) is not installed (``pip install "optkit[ort]"``).
      TypeError: ``lora`` is not a :class:`~optkit.onnx.LoRA`; ``params`` not a mapping, state or module.
      FileNotFoundError: ``path``'s directory does not exist.
      ValueError: ``params`` holds something other than adapters (write those with
        :func:`~optkit.onnx.with_initializers`), an adapter without its pair or of another shape, no adapter.

    Source: ONNX Runtime's ``onnxruntime.AdapterFormat`` (``set_parameters``, ``export_adapter``).

    Example:
      >>> import numpy as np, optkit.onnx, tempfile, pathlib
      >>> from onnx import TensorProto, helper, numpy_helper
      >>> graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="/net/fc/MatMul")], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
      ...     [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")])
      >>> model, lora = helper.make_model(graph), optkit.onnx.LoRA(2)
      >>> _, params = optkit.onnx.to_jax(model, lora=lora)
      >>> path = optkit.onnx.export_adapters(model, params, lora, pathlib.Path(tempfile.mkdtemp()) / "a.onnx_adapter")
      >>> path.suffix
      '.onnx_adapter'
    """
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError('export_adapters writes with onnxruntime (1.20+): pip install "optkit[ort]"') from err
    _check_lora(lora)
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"path {str(path)!r}: its directory does not exist")
    model = model_proto(model)
    values = by_initializer_name(params, "params")
    others = sorted(name for name in values if not name.endswith((".lora_A", ".lora_B")))
    if others:
        raise ValueError(f"params holds {others[:3]}{' ...' if len(others) > 3 else ''}, which are not adapters: an "
                         f"adapter file holds LoRA's A and B only (write other weights with with_initializers)")
    if not values:
        raise ValueError("params holds no adapter")
    targets = adapter_targets(model, lora)
    by_weight, weights = checked_adapters(targets, values, lora)
    names = _input_names(model, targets)
    tensors = {}
    for weight in sorted(weights):
        dtype = helper.tensor_dtype_to_np_dtype(by_weight[weight].dtype)
        a = np.asarray(values[f"{weight}.lora_A"], np.float64)
        b = lora.scale * np.asarray(values[f"{weight}.lora_B"], np.float64)
        for key, array in ((f"{weight}.lora_A", a), (f"{weight}.lora_B", b)):
            tensors[names[key]] = onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array.astype(dtype)))
    adapter = onnxruntime.AdapterFormat()
    adapter.set_adapter_version(int(adapter_version))
    adapter.set_model_version(int(model_version))
    adapter.set_parameters(tensors)
    adapter.export_adapter(str(path))  # pyright: ignore[reportArgumentType] (its stub says PathLike; it takes str)
    return path


def with_adapter_inputs_folder(folder: str | os.PathLike[str], out: str | os.PathLike[str], lora: LoRA) -> pathlib.Path:
    """A copy of an onnxruntime-genai model folder whose model takes adapter inputs (:func:`with_adapter_inputs`),
    for onnxruntime-genai's ``Adapters``.

    ``folder`` is what onnxruntime-genai's model builder writes: ``genai_config.json`` naming the decoder's file
    (``model.decoder.filename``), that file and its external data, the tokenizer. ``out`` gets every file of it
    but the model (symbolic links are not followed), and the adapter-input model saved with its weights in
    ``<filename>.data`` beside it.
    Serve it with::

        model = onnxruntime_genai.Model(out)
        adapters = onnxruntime_genai.Adapters(model)
        adapters.load("poems.onnx_adapter", "poems")      # export_adapters' files
        generator = onnxruntime_genai.Generator(model, params)
        generator.set_active_adapter(adapters, "poems")  # per generator: several adapters on one base

    Args:
      folder: the builder's folder (read only).
      out: the folder to write (created; files of the same names in it are replaced); not ``folder``.
      lora: the :class:`~optkit.onnx.LoRA` of the adapters (its targets).

    Returns:
      ``out`` as a ``pathlib.Path``.

    Raises:
      TypeError: ``lora`` is not a :class:`~optkit.onnx.LoRA`.
      FileNotFoundError: ``folder`` has no ``genai_config.json`` or no model file it names.
      ValueError: ``out`` is ``folder``; a ``genai_config.json`` without ``model.decoder.filename``; and
        :func:`with_adapter_inputs`'.

    Source: onnxruntime-genai's ``genai_config.json`` and its ``Adapters`` API (0.5+).

    Example:
      >>> import optkit.onnx  # doctest: +SKIP
      >>> optkit.onnx.with_adapter_inputs_folder("llama_int4", "llama_int4_adapters",
      ...                                        optkit.onnx.LoRA(8))  # doctest: +SKIP
      PosixPath('llama_int4_adapters')
    """
    _check_lora(lora)
    folder, out = pathlib.Path(folder), pathlib.Path(out)
    config_path = folder / "genai_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no genai_config.json: not an onnxruntime-genai model folder")
    if out.resolve() == folder.resolve():
        raise ValueError("out must be another folder than folder (the base model is kept as it is)")
    decoder = json.loads(config_path.read_text()).get("model", {}).get("decoder", {})
    filename = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(filename, str) or pathlib.Path(filename).name != filename:
        raise ValueError(f"{config_path} names no model file in model.decoder.filename (got {filename!r})")
    source = folder / filename
    if not source.is_file():
        raise FileNotFoundError(f"{source}, the model that {config_path} names, does not exist")
    base = with_adapter_inputs(model_proto(source), lora)
    data = {t.external_data[i].value for t in onnx.load(str(source), load_external_data=False).graph.initializer
            for i in range(len(t.external_data)) if t.external_data[i].key == "location"}
    out.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():  # (a link is not followed: nothing outside the folder is read)
        if item.is_file() and not item.is_symlink() and item.name != filename and item.name not in data:
            shutil.copy2(item, out / item.name)
    for stale in (out / filename, out / f"{filename}.data"):
        stale.unlink(missing_ok=True)
    onnx.save(base, str(out / filename), save_as_external_data=True, location=f"{filename}.data",
              size_threshold=1024)
    return out
