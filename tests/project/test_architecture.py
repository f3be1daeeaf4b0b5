"""The layering of docs/architecture.md, read from the package's imports: nothing imports upward."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

import architecture  # noqa: E402

EDGES, MEMBERS = architecture.import_graph(ROOT)
ALGORITHMS = {f"optkit/_src/{m}" for m in ("adagrad", "adam", "momentum", "adafactor", "gradient", "graph")}


def test_no_import_cycle_between_modules():
    rows = architecture.layers(EDGES)  # raises on a cycle, naming it
    assert rows["optkit/_src/numerics"] == 0 and rows["optkit"] > rows["optkit/_src/adafactor"]


def test_foundations_import_only_below_them():
    assert EDGES["optkit/_src/numerics"] == set()
    assert EDGES["optkit/_src/hyperparams"] <= {"optkit/_src/numerics"}
    assert EDGES["optkit/_src/trees"] <= {"optkit/_src/numerics"}


def test_no_algorithm_imports_another():
    for unit in ALGORITHMS:
        others = EDGES[unit] & (ALGORITHMS - {unit}) - ({"optkit/_src/gradient"} if unit.endswith("graph") else set())
        assert not others, f"{unit} imports {others}"


def test_optimizers_never_import_the_onnx_backend_and_operators_no_onnx_stage():
    for unit, targets in EDGES.items():
        if unit.startswith("optkit/_src") or unit in ("optkit", "optkit/ops"):
            assert not any(t.startswith("optkit/onnx") for t in targets), (unit, targets)
    assert not EDGES["optkit/onnx/_ops"] & set(STAGES)


# The load pipeline's stages in the order they run, then what uses a loaded model.
STAGES = [f"optkit/onnx/_{m}" for m in ("files", "operators", "functions", "protos", "analysis", "convert",
                                           "load", "backend", "training_model")]


def test_the_load_pipeline_only_goes_forward():
    """No stage imports a later one: the pipeline is a straight line, and one entry (_load) runs it."""
    for i, stage in enumerate(STAGES):
        later = EDGES[stage] & set(STAGES[i + 1:])
        assert not later, f"{stage} imports the later stage(s) {later}"
    assert {"optkit/onnx/_files", "optkit/onnx/_operators", "optkit/onnx/_convert"} <= EDGES["optkit/onnx/_load"]
    assert "optkit/onnx/_load" in EDGES["optkit/onnx/_backend"]
    assert not EDGES["optkit/onnx/_backend"] & {"optkit/onnx/_operators", "optkit/onnx/_functions"}


def test_the_adafactor_and_graph_packages_are_split_by_concern():
    assert set(MEMBERS["optkit/_src/adafactor"]) >= {"paper", "fast", "factoring", "state", "reading", "transform"}
    assert set(MEMBERS["optkit/onnx/_ops"]) >= {"elementwise", "nn", "shape", "reduce", "loss", "training"}


def test_the_runners_are_siblings_over_the_feed_module():
    """BackendRep and OnnxFunction share one feed path (_feeds) and neither imports the other."""
    for runner, other in (("optkit/onnx/_backend", "optkit/onnx/_jax"), ("optkit/onnx/_jax", "optkit/onnx/_backend")):
        assert "optkit/onnx/_feeds" in EDGES[runner], runner
        assert other not in EDGES[runner], f"{runner} imports {other}"
    assert not EDGES["optkit/onnx/_feeds"] & set(STAGES)


def _imports_and_names(module):
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "optkit", "_src", "adafactor", f"{module}.py"), encoding="utf-8").read())
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return imports, names


def test_the_adafactor_engine_knows_no_public_form():
    """The engine imports neither public form and no name in it says t5x; T5X's form does not reach into the
    paper's."""
    assert "engine" in MEMBERS["optkit/_src/adafactor"]
    imports, names = _imports_and_names("engine")
    assert not imports & {"optkit._src.adafactor.transform", "optkit._src.adafactor.t5x"}
    assert not [name for name in names if "t5x" in name.lower()]
    assert "optkit._src.adafactor.transform" not in _imports_and_names("t5x")[0]


def test_the_runners_read_what_loading_found_instead_of_the_proto():
    """BackendRep and to_jax take updated inputs, grouped convolutions, the default trainable set and the DOUBLE
    tensors from the load record (Converted.facts); neither walks the model's nodes again."""
    import ast

    for module in ("_backend", "_jax", "_nnx", "_feeds"):
        tree = ast.parse(open(os.path.join(ROOT, "optkit", "onnx", f"{module}.py"), encoding="utf-8").read())
        called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        walks = called & {"nodes_of", "updated_inputs", "grouped_convolution", "looks_trainable", "facts_of"}
        assert not walks, f"optkit/onnx/{module}.py calls {walks}"
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "node"], module


def test_operator_families_keep_their_private_names_and_the_converter_knows_no_family():
    """A family module imports no private name of another family (shared helpers live in _ops/_*.py modules);
    the converter and the layout plan import no family; _layout.py holds no table of operator names."""
    import ast
    import re

    ops = os.path.join(ROOT, "optkit", "onnx", "_ops")
    families = {name[:-3] for name in os.listdir(ops) if name.endswith(".py") and not name.startswith("_")}
    for name in sorted(families):
        tree = ast.parse(open(os.path.join(ops, f"{name}.py"), encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("optkit.onnx._ops."):
                other = node.module.rsplit(".", 1)[1]
                if other in families:
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    assert not private, f"_ops/{name}.py imports {private} from the {other} family"
    for stage in ("_convert", "_layout"):
        source = open(os.path.join(ROOT, "optkit", "onnx", f"{stage}.py"), encoding="utf-8").read()
        imported = set(re.findall(r"from optkit\.onnx\._ops\.(\w+) import", source))
        assert not imported & families, f"{stage}.py imports the families {imported & families}"
    layout = open(os.path.join(ROOT, "optkit", "onnx", "_layout.py"), encoding="utf-8").read()
    code = "\n".join(line.split("#")[0] for line in layout.splitlines())
    tables = re.findall(r'[\(\[{]\s*"[A-Z]\w+"\s*(?:,\s*"[A-Z]\w+"\s*)+', code)
    assert not tables, f"_layout.py names operators in a table: {tables}"


def test_no_module_is_over_450_lines():
    """Every module under optkit/ stays readable in one sitting: 450 lines at most (a module that grows past it is
    split by what it does, as _ops/contrib.py and _ops/contrib_attention.py were)."""
    long = {}
    for folder, _, names in os.walk(os.path.join(ROOT, "optkit")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    count = sum(1 for _ in f)
                if count > 450:
                    long[os.path.relpath(path, ROOT)] = count
    assert not long, f"modules over 450 lines: {long}"
