"""Pages generated from the package when the documentation is built.

- ``_generated/api.md``: the API reference, one autodoc entry per name in the
  public ``__all__`` of ``optkit``, ``optkit.ops`` and ``optkit.onnx`` (so moving
  a private module never breaks it);
- ``_generated/supported_ops.md``: the ONNX operator table, from
  ``optkit.onnx.supported_ops()``;
- ``_generated/architecture.svg``: the picture of the layers, from the package's
  imports (``_ext/architecture.py``);
- ``_generated/spec_<n>.md``: each section of ``optkit/SPEC.md`` (the file that
  ships in the package), without its heading, for the optimizer pages.
"""

from __future__ import annotations

import inspect
import os
import re
from collections import defaultdict

import architecture
import formulas
from sphinx.util.nodes import make_refnode

import optkit
import optkit.onnx
import optkit.ops

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = os.path.join(HERE, "_generated")
SPEC = os.path.join(os.path.dirname(HERE), "optkit", "SPEC.md")

# Classes whose public methods and properties belong in the reference.
WITH_MEMBERS = {"FlatParams", "Graph", "BackendRep", "Backend", "InputInfo", "OnnxFunction"}
# optkit's type aliases: documented as data, referred to as classes by type hints.
TYPE_ALIASES = {"optkit.onnx.ModelSource"}
# Members that are protocols, not API (JAX's pytree registration).
EXCLUDED_MEMBERS = {"FlatParams": "tree_flatten_with_keys, tree_unflatten"}


def _entry(module_name: str, name: str) -> str:
    obj = getattr(__import__(module_name, fromlist=[name]), name)
    qualified = f"{module_name}.{name}"
    # autodoc output is reStructuredText: in a MyST page it must go through eval-rst to be parsed as such.
    if inspect.isclass(obj):
        members = "\n   :members:" if name in WITH_MEMBERS else ""
        if name in EXCLUDED_MEMBERS:
            members += f"\n   :exclude-members: {EXCLUDED_MEMBERS[name]}"
        return f"```{{eval-rst}}\n.. autoclass:: {qualified}{members}\n```\n"
    if callable(obj) and qualified not in TYPE_ALIASES:
        return f"```{{eval-rst}}\n.. autofunction:: {qualified}\n```\n"
    return f"```{{eval-rst}}\n.. autodata:: {qualified}\n   :no-value:\n```\n"


def _api() -> str:
    parts = ["# API reference\n", "Every public name, from the packages' `__all__`; the pages on each optimizer "
             "show the same entries beside their specification.\n"]
    for module in (optkit, optkit.ops, optkit.onnx):
        names = [n for n in module.__all__ if not n.startswith("__") and not inspect.ismodule(getattr(module, n))]
        parts.append(f"## `{module.__name__}`\n")
        doc = (module.__doc__ or "").strip().split("\n\n")[0]
        parts.append(doc.replace(":func:", "").replace(":class:", "").replace(":mod:", "") + "\n")
        parts += [_entry(module.__name__, n) for n in names]
    return "\n".join(parts)


def _supported_ops() -> str:
    versions: dict[tuple[str, str], list[int]] = defaultdict(list)
    for domain, op_type, since in optkit.onnx.supported_ops():
        versions[(domain or "ai.onnx", op_type)].append(since)
    lines = ["| domain | operator | versions (since_version) |", "|---|---|---|"]
    for (domain, op_type), since in sorted(versions.items(), key=lambda kv: (kv[0][0] != "ai.onnx.preview.training",
                                                                           kv[0])):
        lines.append(f"| `{domain}` | {op_type} | {', '.join(map(str, sorted(since)))} |")
    count = len(versions)
    return f"{count} operators, {sum(map(len, versions.values()))} operator versions.\n\n" + "\n".join(lines) + "\n"


def _math_blocks(markdown: str) -> str:
    """The SPEC's fenced blocks of formulas as MyST math blocks (other fenced blocks stay code)."""

    def block(match: re.Match) -> str:
        lines = match.group(1).splitlines()
        if not formulas.is_formula_block(lines):
            return match.group(0)
        rows = [formulas.to_latex(line.strip()) for line in lines if line.strip()]
        return "```{math}\n\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}\n```"

    return re.sub(r"```\n(.*?)\n```", block, markdown, flags=re.S)


def _spec_sections() -> dict[str, str]:
    text = _math_blocks(open(SPEC, encoding="utf-8").read())
    sections = {}
    for match in re.finditer(r"^## (\d+)\. .*?$\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        sections[match.group(1)] = match.group(2).strip() + "\n"
    conformance = re.search(r"^## Conformance data\n(.*)", text, re.S | re.M)
    if conformance:
        sections["conformance"] = conformance.group(1).strip() + "\n"
    return sections


def generate(app=None) -> None:
    os.makedirs(GENERATED, exist_ok=True)
    architecture.draw(os.path.dirname(HERE), os.path.join(GENERATED, "architecture.svg"))
    files = {"api.md": _api(), "supported_ops.md": _supported_ops()}
    files.update({f"spec_{key}.md": body for key, body in _spec_sections().items()})
    for name, body in files.items():
        path = os.path.join(GENERATED, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != body:  # unchanged files keep their time stamps: no needless rebuilds
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)


def _type_alias_reference(app, env, node, contnode):
    """Resolve a ``py:class`` reference to one of optkit's type aliases (``optkit.onnx.ModelSource``),
    which autodoc documents as data: the type hints of signatures refer to them as classes."""
    if node.get("refdomain") != "py" or node.get("reftype") != "class":
        return None
    target = node["reftarget"]
    for name in (target, f"optkit.onnx.{target}", f"optkit.{target}"):
        if name in TYPE_ALIASES:
            entry = env.get_domain("py").objects.get(name)
            if entry is not None:
                return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)
    return None


def _alias_names(app, doctree):
    """Show a type alias as its name: Sphinx renders ``DTypeLike | None`` as a reference to its internal
    ``TypeAliasForwardRef`` followed by ``(``, ``'jax.typing.DTypeLike'`` and ``)``; make that a
    reference to ``jax.typing.DTypeLike`` that reads ``DTypeLike``."""
    from sphinx import addnodes

    for ref in list(doctree.findall(addnodes.pending_xref)):
        if ref.get("reftarget") != "TypeAliasForwardRef":
            continue
        parent = ref.parent
        index = parent.index(ref)
        taken, text = [], ""
        for sibling in parent.children[index + 1:]:
            taken.append(sibling)
            text += sibling.astext()
            if text.rstrip().endswith(")"):
                break
        match = re.fullmatch(r"\('([\w.]+)'\)(\s*)", text)
        if match is None:
            continue
        name = match.group(1)
        for sibling in taken:
            parent.remove(sibling)
        ref["reftarget"] = name
        emphasis = ref.children[0]
        emphasis.children = [type(emphasis.children[0])(name.split(".")[-1] + match.group(2))]


def setup(app):
    app.connect("doctree-read", _alias_names)
    app.connect("autodoc-process-docstring", formulas.process_docstring)
    app.connect("builder-inited", generate)
    app.connect("missing-reference", _type_alias_reference)
    return {"version": optkit.__version__, "parallel_read_safe": True, "parallel_write_safe": True}
