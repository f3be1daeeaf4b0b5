"""The picture of optkit's layers on the architecture page, drawn from the package's own imports.

Each box is a module of ``optkit`` (a package of modules, such as
``_src/adafactor`` or ``onnx/_ops``, is one box listing its modules); an arrow
goes from a module to each optkit module it imports, and a module's row is one
above the highest row of what it imports, so the picture is the layering the
code really has: whatever the bottom row imports is outside optkit, and
nothing points up.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

PACKAGES = ("optkit/_src/adafactor", "optkit/_src/graph", "optkit/onnx/_base", "optkit/onnx/_ops",
            "optkit/onnx/_plans", "optkit/onnx/_load", "optkit/onnx/_run")
# optkit.onnx's wings, bottom to top: each imports only the wings below it (and optkit's optimizers and Graph);
# the modules at optkit/onnx's top (the faces: prepare, to_jax, OnnxModule, the command line) sit above them all.
WINGS = ("optkit/onnx/_base", "optkit/onnx/_ops", "optkit/onnx/_plans", "optkit/onnx/_load", "optkit/onnx/_run")


def _unit(path: str, collapse: bool = True) -> str:
    """The box a source file belongs to: its package (collapsed) or its module, without ``.py``."""
    for package in PACKAGES if collapse else ():
        if path.startswith(package + "/"):
            return package
    name = path[:-3]
    return name[: -len("/__init__")] if name.endswith("/__init__") else name


def _module_path(module: str, root: str) -> str | None:
    """``optkit.x.y`` -> ``optkit/x/y.py`` or ``optkit/x/y/__init__.py`` (relative to ``root``), if it exists."""
    base = module.replace(".", "/")
    for candidate in (base + ".py", base + "/__init__.py"):
        if os.path.exists(os.path.join(root, candidate)):
            return candidate
    return None


def import_graph(root: str, collapse: bool = True) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """``(edges, members)``: each unit's imported units, and the module files of each unit; with ``collapse``
    False every module is a unit of its own (the edges between the modules of one package)."""
    edges: dict[str, set[str]] = defaultdict(set)
    members: dict[str, list[str]] = defaultdict(list)
    for directory, _, files in os.walk(os.path.join(root, "optkit")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
            unit = _unit(path, collapse)
            members[unit].append(os.path.basename(path)[:-3])
            tree = ast.parse(open(os.path.join(root, path), encoding="utf-8").read())
            for node in ast.walk(tree):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [_module_path(alias.name, root) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    # ``from optkit._src import trees`` imports the module trees, not the package's __init__
                    targets = [_module_path(f"{node.module}.{alias.name}", root) or _module_path(node.module, root)
                               for alias in node.names]
                for target in targets:
                    if target is not None and target.startswith("optkit/") and _unit(target, collapse) != unit:
                        edges[unit].add(_unit(target, collapse))
            edges.setdefault(unit, set())
    return dict(edges), dict(members)


def layers(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's row: 0 for units that import no optkit unit, else 1 + the highest row they import."""
    row: dict[str, int] = {}

    def depth(unit: str, path: tuple[str, ...] = ()) -> int:
        if unit in row:
            return row[unit]
        if unit in path:
            raise ValueError(f"import cycle: {' -> '.join(path + (unit,))}")
        row[unit] = 1 + max((depth(t, path + (unit,)) for t in edges.get(unit, ())), default=-1)
        return row[unit]

    for unit in edges:
        depth(unit)
    return row


def _label(unit: str, members: list[str]) -> str:
    name = unit.removeprefix("optkit/").replace("_src/", "") or "optkit"
    if unit == "optkit":
        name = "optkit"
    if unit in PACKAGES:
        inner = sorted(m for m in members if m != "__init__")
        if len(inner) > 12:  # (the operator families: a count, so the box stays the size of its neighbours)
            return f"{name}/\n{len(inner)} modules"
        rows = [inner[i:i + 4] for i in range(0, len(inner), 4)]  # four a line: the boxes stay narrow
        return f"{name}/\n" + ",\n".join(", ".join(row) for row in rows)
    return name


def draw(root: str, path: str) -> None:
    """Write the picture as an SVG file at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges, members = import_graph(root)
    # optkit/_src/__init__.py only marks the package: no box for it.
    edges = {u: t for u, t in edges.items() if u != "optkit/_src"}
    row = layers(edges)
    by_row: dict[int, list[str]] = defaultdict(list)
    for unit in sorted(edges, key=lambda u: (u.startswith("optkit/onnx"), u)):
        by_row[row[unit]].append(unit)
    width = max(len(units) for units in by_row.values())
    fig, ax = plt.subplots(figsize=(1.9 * width, 1.0 * len(by_row)))
    position = {}
    for r, units in by_row.items():
        for i, unit in enumerate(units):
            position[unit] = ((i + 0.5) * width / len(units), r)
    for unit, targets in edges.items():
        x0, y0 = position[unit]
        for target in targets:
            x1, y1 = position[target]
            ax.annotate("", xy=(x1, y1 + 0.22), xytext=(x0, y0 - 0.22),
                        arrowprops=dict(arrowstyle="->", color="#9aa4b2", lw=0.6, shrinkA=0, shrinkB=0))
    for unit, (x, y) in position.items():
        onnx = unit.startswith("optkit/onnx")
        public = unit in ("optkit", "optkit/ops", "optkit/onnx")
        color = "#fde2c8" if public else ("#d9ecff" if onnx else "#e3f4e1")
        ax.text(x, y, _label(unit, members[unit]), ha="center", va="center", fontsize=9.5, family="monospace",
                bbox=dict(boxstyle="round,pad=0.35", fc=color, ec="#5b6573", lw=0.8))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.6, len(by_row) - 0.4)
    ax.axis("off")
    ax.set_title("each module imports only rows below it\n(orange: public, blue: optkit.onnx, green: optkit._src)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)
