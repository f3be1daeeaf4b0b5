"""A mutation fuzzer of ``optkit.onnx`` over the committed model fixtures (issue 63): every mutant must end in a run
or a documented error that names its node, input or tensor (or, for bytes that are no model at all, the file),
never an undocumented error, a crash, a hang or a memory blow-up.

Each mutant is one committed fixture (``tests/onnx/models``: both torch.onnx exporters, jax2onnx, ONNX Runtime's
optimizer and quantizers, Optimum, the GenAI builder's folders, skl2onnx) changed in one way (:data:`KINDS`),
written into a directory of its own (the fixture's external data copied beside it), then loaded with
``optkit.onnx.prepare`` and run on random inputs (``optkit-onnx run``'s, which fit language models) in a worker
process with an address-space bound; a worker that dies, or runs a mutant past the time bound, is replaced. Each
outcome is classified (:data:`OUTCOMES`).

The slow form (thousands)::

    python -m benchmarks.fuzz --count 3000 --seed 0          # table by outcome and by kind; benchmarks/out/fuzz.json

The suite's form (``tests/onnx/untrusted/test_mutants.py``) runs a seeded few hundred of them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "onnx" / "models"
OUT = pathlib.Path(__file__).resolve().parent / "out" / "fuzz.json"

OUTCOMES = {
    "ran": "loaded and ran on random inputs",
    "refused": "a documented error (ValueError, TypeError, UnsupportedOpError, TensorTooLargeError) naming the node, "
               "input, initializer, tensor or attribute, or for bytes that are no model, the file",
    "undocumented": "any other exception, or a documented type whose message names nothing",
    "escaped": "an external-data escape that was read instead of refused",
    "crash": "the worker process died (a signal)",
    "timeout": "the mutant ran past the time bound",
    "memory": "MemoryError from the address-space bound (an allocation no limit refused)",
}

# What a documented message names: a node, a graph input or output, an initializer or tensor, an attribute; or, for
# a file refused as a whole (bytes that do not parse, the checker's verdict, an opset), the file.
_NAMES = re.compile(r"node '|node \d|input '|output '|initializer '|tensor '|attribute '|function '|graph input|"
                    r"external data|onnx\.checker rejects|not a valid ONNX|cannot be parsed|malformed|protobuf|"
                    r"opset|operator")


# ----------------------------------------------------------------------------- the mutations


def _pick(rng: random.Random, items: list) -> Any:
    return items[rng.randrange(len(items))] if items else None


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                nodes.extend(_all_nodes(attr.g))
    return nodes


def _bit_flips(data: bytes, model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _truncated(data: bytes, model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    return data[:rng.randrange(1, len(data))]


_EXTREME_INTS = [2**62, -2**62, -1, 0, 2**31 - 1, 2**31, 65536, 7]
_EXTREME_FLOATS = [float("inf"), float("-inf"), float("nan"), -1e30, 1e30, 0.0, -1.0]


def _attribute_values(model: onnx.ModelProto, rng: random.Random, domain: str | None = None) -> bytes | None:
    """An int or float attribute (or one entry of a list) set to an extreme value."""
    candidates = [(node, attr) for node in _all_nodes(model.graph) for attr in node.attribute
                  if attr.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.INTS,
                                   onnx.AttributeProto.FLOATS)
                  and (domain is None or node.domain == domain)]
    if not candidates:
        return None
    node, attr = _pick(rng, candidates)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = _pick(rng, _EXTREME_INTS)
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = _pick(rng, _EXTREME_FLOATS)
    elif attr.type == onnx.AttributeProto.INTS and attr.ints:
        attr.ints[rng.randrange(len(attr.ints))] = _pick(rng, _EXTREME_INTS)
    elif attr.type == onnx.AttributeProto.FLOATS and attr.floats:
        attr.floats[rng.randrange(len(attr.floats))] = _pick(rng, _EXTREME_FLOATS)
    else:
        return None
    return model.SerializeToString()


def _contrib_attributes(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    """A com.microsoft operator's attribute set to an extreme value, or removed."""
    nodes = [n for n in _all_nodes(model.graph) if n.domain == "com.microsoft" and n.attribute]
    if not nodes:
        return None
    if rng.random() < 0.25:
        node = _pick(rng, nodes)
        del node.attribute[rng.randrange(len(node.attribute))]
        return model.SerializeToString()
    return _attribute_values(model, rng, "com.microsoft")


_TYPES = [TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT4E2M1, TensorProto.INT4,
          TensorProto.UINT4, TensorProto.STRING, TensorProto.BOOL, TensorProto.DOUBLE, TensorProto.FLOAT16,
          TensorProto.BFLOAT16, TensorProto.INT8, TensorProto.UINT64, TensorProto.COMPLEX64, TensorProto.INT64]


def _retyped_input(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    inputs = [i for i in model.graph.input if i.type.HasField("tensor_type")]
    if not inputs:
        return None
    _pick(rng, inputs).type.tensor_type.elem_type = _pick(rng, _TYPES)
    return model.SerializeToString()


def _retyped_initializer(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    inits = [t for t in model.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    if not inits:
        return None
    _pick(rng, inits).data_type = _pick(rng, _TYPES)
    return model.SerializeToString()


def _initializer_dims(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    """An initializer's dims changed with its data left as it is: a dim appended, doubled, halved or negated."""
    inits = [t for t in model.graph.initializer if t.dims]
    if not inits:
        return None
    tensor = _pick(rng, inits)
    dims = list(tensor.dims)
    i = rng.randrange(len(dims))
    how = rng.randrange(5)
    if how == 0:
        dims.append(1)
    elif how == 1:
        dims[i] *= 2
    elif how == 2:
        dims[i] = max(dims[i] // 2, 0)
    elif how == 3:
        dims[i] = -dims[i] - 1
    else:
        dims.reverse()
    del tensor.dims[:]
    tensor.dims.extend(dims)
    return model.SerializeToString()


_SWAPS = {1: ["Relu", "Neg", "Not", "Sqrt", "Softmax", "Identity", "Shape", "NonZero", "IsNaN", "Size", "Flatten"],
          2: ["Add", "Xor", "MatMul", "Concat", "Equal", "Gather", "Reshape", "Expand", "Pow", "Mod", "Tile",
              "BitShift"],
          3: ["Where", "Gemm", "Clip", "Slice", "Range", "ScatterElements", "LayerNormalization"]}


def _swapped_op(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    nodes = [n for n in model.graph.node if n.domain in ("", "ai.onnx") and len(n.input) in _SWAPS]
    if not nodes:
        return None
    node = _pick(rng, nodes)
    node.op_type = _pick(rng, [op for op in _SWAPS[len(node.input)] if op != node.op_type])
    del node.attribute[:]
    return model.SerializeToString()


def _declared_shape(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    dims = [d for i in model.graph.input if i.type.HasField("tensor_type")
            for d in i.type.tensor_type.shape.dim]
    if not dims:
        return None
    dim = _pick(rng, dims)
    dim.dim_value = _pick(rng, [2**40, 2**31, -5, 0, 1, 3])
    return model.SerializeToString()


def _renamed_input(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    nodes = [n for n in model.graph.node if n.input]
    if not nodes:
        return None
    node = _pick(rng, nodes)
    node.input[rng.randrange(len(node.input))] = _pick(rng, ["no_such_tensor", "", node.output[0]])
    return model.SerializeToString()


def _external_escape(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    """An initializer's data moved to an external location outside the model's directory."""
    inits = [t for t in model.graph.initializer if t.dims]
    if not inits:
        return None
    tensor = _pick(rng, inits)
    location = _pick(rng, ["../outside.bin", "/etc/passwd", "../../../../../../etc/passwd", "sub/../../outside.bin",
                           "/proc/self/environ", "link_out.bin"])
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return model.SerializeToString()


def _deep_nesting(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    """The graph's first node wrapped in Ifs nested 9 to 25 deep (optkit runs 8; protobuf parses about 30)."""
    nodes = [n for n in model.graph.node if len(n.output) == 1 and n.op_type not in ("If", "Loop", "Scan")]
    if not nodes:
        return None
    node = nodes[0]
    leaf = helper.make_graph([onnx.NodeProto.FromString(node.SerializeToString())], "leaf", [],
                             [helper.make_value_info(node.output[0], onnx.TypeProto())])
    inner = leaf
    for _ in range(rng.randint(9, 25)):  # (the else branches a leaf each: the file grows linearly with the depth)
        wrap = helper.make_node("If", ["__cond"], [node.output[0]], then_branch=inner, else_branch=leaf)
        inner = helper.make_graph([wrap], "level", [], [helper.make_value_info(node.output[0], onnx.TypeProto())])
    index = list(model.graph.node).index(node)
    model.graph.node[index].CopyFrom(inner.node[0])
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "__cond"))
    return model.SerializeToString()


def _looped(model: onnx.ModelProto, rng: random.Random) -> bytes | None:
    """A one-output node of the graph recomputed in a Loop: no trip count and a constant-true condition (endless),
    a trip count of 10^9, or a condition computed from the counter with a scan output growing each iteration."""
    nodes = [n for n in model.graph.node if len(n.output) == 1 and n.output[0] and n.domain in ("", "ai.onnx")
             and n.op_type not in ("If", "Loop", "Scan", "Constant")]
    if not nodes:
        return None
    node = _pick(rng, nodes)
    out = node.output[0]
    copy = onnx.NodeProto.FromString(node.SerializeToString())
    del copy.output[:]
    copy.output.append("__y")
    how = rng.randrange(3)
    cond_node = (helper.make_node("Identity", ["__c"], ["__c_out"]) if how < 2 else
                 helper.make_node("Less", ["__i", "__big"], ["__c_out"]))
    body_inits = [numpy_helper.from_array(np.array(10**12, np.int64), "__big")] if how == 2 else []
    body = helper.make_graph(
        [copy, cond_node, helper.make_node("Identity", ["__y"], ["__scan"])], "looped",
        [helper.make_tensor_value_info("__i", TensorProto.INT64, []),
         helper.make_tensor_value_info("__c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("__c_out", TensorProto.BOOL, []), helper.make_value_info("__scan",
                                                                                               onnx.TypeProto())],
        body_inits)
    trip = "__trip" if how == 1 else ""
    loop = helper.make_node("Loop", [trip, "__true"], ["__stacked"], body=body, name="__loop")
    pick = helper.make_node("Gather", ["__stacked", "__zero"], [out], axis=0)
    index = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    model.graph.node.insert(index, pick)
    model.graph.node.insert(index, loop)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(True), "__true"),
                                    numpy_helper.from_array(np.array(0, np.int64), "__zero"),
                                    numpy_helper.from_array(np.array(10**9, np.int64), "__trip")])
    return model.SerializeToString()


# kind -> mutation of (bytes, ModelProto, rng) (None: the fixture has nothing it changes)
KINDS: dict[str, Callable[..., bytes | None]] = {
    "bit_flips": _bit_flips,
    "truncated": _truncated,
    "attribute_values": lambda data, model, rng: _attribute_values(model, rng),
    "contrib_attributes": lambda data, model, rng: _contrib_attributes(model, rng),
    "retyped_input": lambda data, model, rng: _retyped_input(model, rng),
    "retyped_initializer": lambda data, model, rng: _retyped_initializer(model, rng),
    "initializer_dims": lambda data, model, rng: _initializer_dims(model, rng),
    "swapped_op": lambda data, model, rng: _swapped_op(model, rng),
    "declared_shape": lambda data, model, rng: _declared_shape(model, rng),
    "renamed_input": lambda data, model, rng: _renamed_input(model, rng),
    "external_escape": lambda data, model, rng: _external_escape(model, rng),
    "deep_nesting": lambda data, model, rng: _deep_nesting(model, rng),
    "looped": lambda data, model, rng: _looped(model, rng),
}


def fixtures(root: pathlib.Path = MODELS) -> list[pathlib.Path]:
    """Every committed ``.onnx`` fixture (a GenAI builder's folder counts by its ``model.onnx``)."""
    return sorted(p for p in root.rglob("*.onnx") if p.is_file())


def mutants(count: int, seed: int, files: Iterable[pathlib.Path] | None = None,
            kinds: Iterable[str] | None = None) -> list[tuple[pathlib.Path, str, int]]:
    """``count`` mutants as ``(fixture, kind, seed)``, fixtures and kinds in turn (seeded, reproducible)."""
    files = list(files or fixtures())
    kinds = list(kinds or KINDS)
    rng = random.Random(seed)
    return [(files[i % len(files)], kinds[(i // len(files) + i) % len(kinds)], rng.randrange(2**31))
            for i in range(count)]


def write_mutant(fixture: pathlib.Path, kind: str, seed: int, directory: pathlib.Path) -> pathlib.Path | None:
    """The mutant written as ``directory/model.onnx``, the fixture's other files (external data, a GenAI
    folder's config) copied beside it, and a file outside it (``directory/../outside.bin``) for escapes to reach;
    None where the kind changes nothing in this fixture."""
    data = fixture.read_bytes()
    model = onnx.load_model_from_string(data)
    mutated = KINDS[kind](data, model, random.Random(seed))
    if mutated is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    for other in fixture.parent.iterdir():
        if other.is_file() and other.suffix != ".onnx" and other.suffix != ".npz" and (
                other.name.startswith(fixture.stem) or fixture.name == "model.onnx"):
            shutil.copy(other, directory / other.name)
    (directory.parent / "outside.bin").write_bytes(b"\x00" * 4096)
    if not (directory / "link_out.bin").exists():
        os.symlink(directory.parent / "outside.bin", directory / "link_out.bin")
    path = directory / "model.onnx"
    path.write_bytes(mutated)
    return path


# ----------------------------------------------------------------------------- running them


def classify(kind: str, error_type: str | None, message: str, documented: bool = True) -> str:
    """The outcome class (:data:`OUTCOMES`) of a mutant that ran (``error_type`` None) or raised ``error_type``
    (``documented``: a ``ValueError``, ``TypeError`` or ``NotImplementedError``, optkit's own errors among them)."""
    if error_type is None:
        return "escaped" if kind == "external_escape" else "ran"
    if error_type == "MemoryError":
        return "memory"
    return "refused" if documented and _NAMES.search(message) else "undocumented"


def _feeds(rep: Any, folder: str) -> dict[str, Any]:
    """``optkit-onnx run``'s random inputs (one call for all: the sizes of a symbolic dimension agree); zeros of
    the declared type for the types it draws nothing of (float8, int4); an input of unknown rank or type left out
    (the run then names it)."""
    from optkit.onnx._cli_run import random_inputs

    known = [i for i in rep.inputs if not i.has_default and i.shape is not None and i.dtype is not None]
    drawn = [i for i in known if np.dtype(i.dtype).kind in "fciub"]
    feeds = random_inputs(drawn, {}, 0, 8, folder)
    for info in known:
        if info.name not in feeds:
            feeds[info.name] = np.zeros(tuple(d if isinstance(d, int) else 2 for d in info.shape), info.dtype)
    return feeds


def _run_one(path: str) -> tuple[str | None, str, bool]:
    import jax

    import optkit.onnx

    try:
        with jax.enable_x64(True):  # ONNX's own types, as ONNX Runtime runs them (as optkit-onnx run)
            rep = optkit.onnx.prepare(path)
            rep.run(_feeds(rep, os.path.dirname(path)))
        return None, "", True
    except Exception as err:  # noqa: BLE001 - the fuzzer's point: classify whatever escapes
        return type(err).__name__, str(err)[:2000], isinstance(err, (ValueError, TypeError, NotImplementedError))
    finally:
        jax.clear_caches()


def _worker() -> None:
    """Read mutant paths on stdin, one a line; write one JSON result a line."""
    for line in sys.stdin:
        path = line.strip()
        start = time.perf_counter()
        error_type, message, documented = _run_one(path)
        print(json.dumps({"type": error_type, "message": message, "documented": documented,
                          "seconds": time.perf_counter() - start}), flush=True)


class _Worker:
    """A worker process under an address-space bound, fed one mutant at a time."""

    def __init__(self, memory_gib: float) -> None:
        limit = int(memory_gib * 2**30)
        code = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
                f"sys.path.insert(0, {str(ROOT)!r}); from benchmarks.fuzz import _worker; _worker()")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
        env.setdefault("JAX_PLATFORMS", "cpu")
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)

    def run(self, path: pathlib.Path, timeout: float) -> dict[str, Any]:
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.close()
            return {"outcome": "timeout", "message": f"no result in {timeout:.0f} s"}
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            return {"outcome": "crash", "message": f"the worker exited with {code}"}
        return json.loads(line)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def run_mutants(jobs: list[tuple[pathlib.Path, str, int]], *, timeout: float = 60, memory_gib: float = 8,
                progress: bool = False) -> list[dict[str, Any]]:
    """Each mutant's outcome: ``{"fixture", "kind", "seed", "outcome", "type", "message", "seconds"}``, run one
    after another in a worker process that is replaced when a mutant crashes it or runs past ``timeout``."""
    results = []
    worker = None
    with tempfile.TemporaryDirectory(prefix="optkit-fuzz-") as tmp:
        for index, (fixture, kind, seed) in enumerate(jobs):
            try:
                path = write_mutant(fixture, kind, seed, pathlib.Path(tmp) / f"m{index}" / "model")
            except Exception:  # noqa: BLE001 - a mutation that does not apply to this fixture (a GraphProto it
                path = None  # cannot rebuild): skipped, as one that changes nothing
            if path is None:
                continue
            if worker is None or worker.process.poll() is not None:
                worker = _Worker(memory_gib)
            result = worker.run(path, timeout)
            if "outcome" not in result:
                result["outcome"] = classify(kind, result["type"], result["message"], result["documented"])
            if result["outcome"] in ("timeout", "crash"):
                worker = None
            result.update(fixture=str(fixture.relative_to(ROOT)), kind=kind, seed=seed)
            results.append(result)
            if progress:
                print(f"{index + 1}/{len(jobs)} {result['outcome']:12} {kind:20} {fixture.name}", flush=True)
            shutil.rmtree(path.parent.parent, ignore_errors=True)
        if worker is not None:
            worker.close()
    return results


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of the outcomes by mutation kind."""
    kinds = sorted({r["kind"] for r in results})
    counts = collections.Counter((r["kind"], r["outcome"]) for r in results)
    lines = ["| kind | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
    for kind in kinds:
        lines.append(f"| {kind} | " + " | ".join(str(counts[kind, o]) for o in OUTCOMES) + " |")
    totals = collections.Counter(r["outcome"] for r in results)
    lines.append("| **all** | " + " | ".join(f"**{totals[o]}**" for o in OUTCOMES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="mutants to run (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60, help="seconds one mutant may take (default 60)")
    parser.add_argument("--memory-gib", type=float, default=8, help="each worker's address space (default 8)")
    parser.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="only these mutation kinds")
    parser.add_argument("--out", default=str(OUT), help="the JSON of every outcome (default %(default)s)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run_mutants(mutants(args.count, args.seed, kinds=args.kinds), timeout=args.timeout,
                          memory_gib=args.memory_gib, progress=True)
    print(table(results))
    print(f"{len(results)} mutants in {time.perf_counter() - start:.0f} s")
    for r in results:
        if r["outcome"] not in ("ran", "refused"):
            print(f"- {r['outcome']}: {r['fixture']} {r['kind']} seed {r['seed']}: {r.get('type')}: "
                  f"{r['message'][:300]}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
    return 0 if all(r["outcome"] in ("ran", "refused") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
