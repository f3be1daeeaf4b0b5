"""The layering of docs/architecture.md, read from the package's imports: nothing imports upward."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

import architecture  # noqa: E402

EDGES, MEMBERS = architecture.import_graph(ROOT)
ALGORITHMS = {f"optkit/_src/{m}" for m in ("adagrad", "adam", "momentum", "adafactor", "gradient", "graph", "muon",
                                            "schedule_free", "adam8bit")}


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
    assert not EDGES["optkit/onnx/_ops"] & {"optkit/onnx/_load", "optkit/onnx/_plans", "optkit/onnx/_run"}


# The load wing's stages in the order they run, then what uses a loaded model.
STAGES = [f"optkit/onnx/_load/{m}" for m in ("files", "operators", "functions", "protos", "analysis", "convert",
                                              "pipeline")]
MODULE_EDGES, _ = architecture.import_graph(ROOT, collapse=False)
FACES = {unit for unit in EDGES if unit.startswith("optkit/onnx") and unit not in architecture.WINGS}


def test_each_onnx_wing_imports_only_the_wings_below_it():
    """optkit.onnx in wings by lifetime (docs/architecture.md): _base (the vocabulary), _ops (the operators),
    _plans (per node, at load), _load (once per model), _run (per call); a wing imports only wings below it, and
    no wing imports a face (prepare, to_jax, OnnxModule, the command line)."""
    wings = list(architecture.WINGS)
    for i, wing in enumerate(wings):
        above = EDGES[wing] & (set(wings[i + 1:]) | FACES)
        assert not above, f"{wing} imports {above}, above it"
    assert not EDGES["optkit/onnx/_run"] & {"optkit/onnx/_load"}, "the per-call wing needs nothing of loading"
    assert set(architecture.WINGS) <= set(EDGES)


def test_optkit_onnx_has_its_wings_and_few_modules_at_its_top():
    top = os.path.join(ROOT, "optkit", "onnx")
    private = sorted(n for n in os.listdir(top) if n.startswith("_") and n.endswith(".py") and n != "__init__.py"
                     and n != "__main__.py")
    assert len(private) <= 14, private
    packages = {n for n in os.listdir(top) if os.path.isfile(os.path.join(top, n, "__init__.py"))}
    assert {"_base", "_ops", "_plans", "_load", "_run"} <= packages, packages


def test_the_load_pipeline_only_goes_forward():
    """No stage imports a later one: the pipeline is a straight line, and one entry (_load.pipeline) runs it."""
    for i, stage in enumerate(STAGES):
        later = MODULE_EDGES[stage] & set(STAGES[i + 1:])
        assert not later, f"{stage} imports the later stage(s) {later}"
    assert {"optkit/onnx/_load/files", "optkit/onnx/_load/operators",
            "optkit/onnx/_load/convert"} <= MODULE_EDGES["optkit/onnx/_load/pipeline"]
    assert "optkit/onnx/_load/pipeline" in MODULE_EDGES["optkit/onnx/_backend"]
    assert not MODULE_EDGES["optkit/onnx/_backend"] & {"optkit/onnx/_load/operators", "optkit/onnx/_load/functions"}


def test_the_load_pipeline_reads_straight_without_callbacks():
    """parse, check, map, convert as stages one after another: read_model takes no callback, and the record is
    built once (to_jax hands OnnxFunction everything at construction)."""
    import ast
    import inspect

    from optkit.onnx._load import files

    assert "check" not in inspect.signature(files.read_model).parameters
    tree = ast.parse(open(os.path.join(ROOT, "optkit", "onnx", "_jax.py"), encoding="utf-8").read())
    to_jax = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "to_jax")
    patched = [t.attr for n in ast.walk(to_jax) if isinstance(n, (ast.Assign, ast.AugAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
               for t in ([t] if not isinstance(t, ast.Tuple) else t.elts) if isinstance(t, ast.Attribute)]
    assert not patched, f"to_jax sets {patched} on the function it built"


def test_the_adafactor_and_graph_packages_are_split_by_concern():
    assert set(MEMBERS["optkit/_src/adafactor"]) >= {"paper", "fast", "factoring", "state", "reading", "transform"}
    assert set(MEMBERS["optkit/onnx/_ops"]) >= {"elementwise", "nn", "shape", "reduce", "loss", "training"}
    assert set(MEMBERS["optkit/onnx/_run"]) >= {"feeds", "program", "held", "segments", "scanned"}
    assert set(MEMBERS["optkit/onnx/_plans"]) >= {"hook", "layout", "float16", "layers"}


def test_the_runners_are_siblings_over_the_run_wing():
    """BackendRep and OnnxFunction share one feed path and one program (_run) and neither imports the other."""
    for runner, other in (("optkit/onnx/_backend", "optkit/onnx/_jax"), ("optkit/onnx/_jax", "optkit/onnx/_backend")):
        assert {"optkit/onnx/_run/feeds", "optkit/onnx/_run/program",
                "optkit/onnx/_run/held"} <= MODULE_EDGES[runner], runner
        assert other not in EDGES[runner], f"{runner} imports {other}"


def _graph_private_names() -> set[str]:
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "optkit", "_src", "graph", "__init__.py"), encoding="utf-8").read())
    graph = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Graph")
    names = {n.name for n in graph.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_")
             and not n.name.startswith("__")}
    names |= {n.attr for n in ast.walk(graph) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    return names


def test_nothing_outside_the_graph_package_reaches_a_private_name_of_graph():
    """Graph's evaluators (the scanned layers, the segments, the converter) use its public methods (order,
    producers, dependencies, plan, run_plan, node_count, nodes_from): no ``x._analyzed()`` or ``graph._tensors``
    on an object other than ``self`` outside optkit/_src/graph."""
    import ast

    private = _graph_private_names()
    assert {"_analyzed", "_requested", "_tensors"} <= private
    reached = []
    for folder, _, names in os.walk(os.path.join(ROOT, "optkit")):
        if os.path.join("_src", "graph") in folder:
            continue
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                tree = ast.parse(open(path, encoding="utf-8").read())
                reached += [f"{os.path.relpath(path, ROOT)}:{n.lineno} .{n.attr}" for n in ast.walk(tree)
                            if isinstance(n, ast.Attribute) and n.attr in private
                            and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))]
    assert not reached, reached


def _functions(folder: str):
    import ast

    for directory, _, names in os.walk(os.path.join(ROOT, *folder.split("/"))):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                tree = ast.parse(open(path, encoding="utf-8").read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield os.path.relpath(path, ROOT).replace(os.sep, "/"), node


def _body_lines(node) -> int:
    import ast

    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
            body[0].value.value, str):
        body = body[1:]  # the docstring aside
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_onnx_function_body_is_over_80_lines():
    long = [f"{path}:{node.lineno} {node.name} ({_body_lines(node)} lines)" for path, node in _functions("optkit/onnx")
            if _body_lines(node) > 80]
    assert not long, long


# The public API's options (prepare's, to_jax's, OnnxModule's keyword arguments) may be many; nothing else may.
PUBLIC_OPTIONS = {("optkit/onnx/_backend.py", "prepare"), ("optkit/onnx/_jax.py", "to_jax"),
                  ("optkit/onnx/_nnx.py", "__init__")}


def test_no_onnx_function_outside_the_operators_and_the_public_api_takes_over_8_parameters():
    """The operator handlers (optkit/onnx/_ops: an operator's inputs are its parameters) and the public API's
    options aside, a function that needs more than 8 values takes a record of them (the converter's
    ``BuiltNode``, the program's ``Program``)."""
    many = []
    for path, node in _functions("optkit/onnx"):
        args = node.args
        count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
        count -= bool(args.args and args.args[0].arg in ("self", "cls"))
        if count > 8 and "/_ops/" not in path and (path, node.name) not in PUBLIC_OPTIONS:
            many.append(f"{path}:{node.lineno} {node.name} ({count})")
    assert not many, many


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

    for module in ("_backend", "_jax", "_nnx", "_run/feeds", "_run/program", "_run/held"):
        tree = ast.parse(open(os.path.join(ROOT, "optkit", "onnx", f"{module}.py"), encoding="utf-8").read())
        called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        walks = called & {"nodes_of", "updated_inputs", "grouped_convolution", "looks_trainable", "facts_of"}
        assert not walks, f"optkit/onnx/{module}.py calls {walks}"
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "node"], module


def test_operator_families_keep_their_private_names_and_the_plans_know_no_family():
    """A family module imports no private name of another family (shared helpers live in _ops/_*.py modules);
    the converter and the plans import no family; no plan holds a table of operator names (each operator's
    registration declares its roles: ``layout=``, ``float16=``, ``fusion=``)."""
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
    for stage in ("_load/convert", "_plans/hook", "_plans/layout", "_plans/float16", "_plans/layers"):
        source = open(os.path.join(ROOT, "optkit", "onnx", f"{stage}.py"), encoding="utf-8").read()
        imported = set(re.findall(r"from optkit\.onnx\._ops\.(\w+) import", source))
        assert not imported & families, f"{stage}.py imports the families {imported & families}"
        exported = next((n for n in ast.parse(source).body if isinstance(n, ast.Assign)
                         and getattr(n.targets[0], "id", "") == "__all__"), None)
        lines = source.splitlines()
        if exported is not None:  # (the module's own names)
            del lines[exported.lineno - 1:exported.end_lineno]
        code = "\n".join(line.split("#")[0] for line in lines)
        tables = re.findall(r'[\(\[{]\s*"[A-Z]\w+"\s*(?:,\s*"[A-Z]\w+"\s*)+', code)
        assert not tables, f"{stage}.py names operators in a table: {tables}"


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
