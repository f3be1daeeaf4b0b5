"""The operator check: every node's operator version looked up once, all the missing ones named in one error.

A stage of loading (:mod:`optkit.onnx._load.pipeline`) that runs before ``onnx.checker``
(whose full pass over a large model takes seconds): what optkit cannot run is
refused first. Its result, :class:`Operators`, is what the converter builds
nodes from; nothing is looked up twice.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import onnx
import onnx.defs

from optkit.onnx._base.errors import UnsupportedOpError
from optkit.onnx._base.values import DEFAULT_DOMAIN, domain_text, node_name, node_where, normalize_domain
from optkit.onnx._base.walk import nodes_of
from optkit.onnx._ops import TABLE
from optkit.onnx._ops._registry import OpSpec

__all__ = ["Operators", "check_operators"]


@dataclasses.dataclass(frozen=True)
class Operators:
    """The operators of a model, resolved: :func:`check_operators`'s result.

    Attributes:
      opsets: the opset version the model imports for each domain.
      rows: ``(domain, op_type)`` -> ``(OpSpec, since_version, ONNX schema or None)``
        for every operator of the graph, its sub-graphs and its local functions' bodies.
    """

    opsets: dict[str, int]
    rows: dict[tuple[str, str], tuple[OpSpec, int, Any]]

    def row(self, node: onnx.NodeProto) -> tuple[OpSpec, int, Any]:
        return self.rows[(normalize_domain(node.domain), node.op_type)]


def check_operators(model: onnx.ModelProto) -> Operators:
    """Resolve every operator of ``model``; refuse, naming every one in one error, those optkit does not run.

    The graph's nodes (sub-graphs included) and the model-local functions'
    nodes, except the calls of those functions (expanded later, see
    :mod:`optkit.onnx._load.functions`).

    Raises:
      ValueError: a node of a domain the model does not import; an op type,
        domain or name that is not valid UTF-8.
      UnsupportedOpError: one or more operators (or operator versions) that
        optkit does not run, each with its domain, the model's opset and the
        nodes that use it; an opset ONNX does not define.
    """
    nodes = list(nodes_of(model.graph))
    for function in model.functions:
        nodes += list(enumerate(function.node))
    for _, node in nodes:
        if not all(isinstance(text, str) for text in (node.op_type, node.domain, node.name)):
            raise ValueError(f"malformed model: a node's op type, domain or name is not valid UTF-8 "
                             f"({node.op_type!r}, {node.domain!r}, {node.name!r})")
    # Calls of local functions are checked in their bodies; a function named as a standard operator of its
    # domain does not replace it (expand_functions drops it), so its calls are looked up here.
    local = {(normalize_domain(f.domain), f.name) for f in model.functions
             if not onnx.defs.has(f.name, normalize_domain(f.domain))}
    opsets = _opsets(model)
    rows: dict[tuple[str, str], tuple[OpSpec, int, Any]] = {}
    missing: dict[tuple[str, str, int], tuple[str, list[str]]] = {}
    for index, node in nodes:
        domain = normalize_domain(node.domain)
        key = (domain, node.op_type)
        if key in local or key in rows:
            continue
        name = node_name(node.name, node.op_type, index)
        if domain not in opsets:
            raise ValueError(f"{node_where(name, domain, node.op_type)}: the model does not import the domain "
                             f"{domain_text(domain)!r}")
        if (*key, opsets[domain]) in missing:
            missing[(*key, opsets[domain])][1].append(name)
            continue
        try:
            rows[key] = TABLE.lookup(domain, node.op_type, opsets[domain])
        except UnsupportedOpError as err:
            missing[(*key, opsets[domain])] = (str(err), [name])
    if missing:
        raise UnsupportedOpError(_missing_text(missing))
    return Operators(opsets, rows)


def _missing_text(missing: dict[tuple[str, str, int], tuple[str, list[str]]]) -> str:
    lines = []
    for (domain, op_type, opset), (why, names) in missing.items():
        shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        lines.append(f"  {domain_text(domain)}::{op_type} (opset {opset}), {len(names)} node{'s' * (len(names) > 1)} "
                     f"{shown}: {why}")
    return (f"the model uses {len(missing)} operator{'s' * (len(missing) > 1)} optkit.onnx does not run:\n"
            + "\n".join(lines) + "\nTo run an operator of your own or a vendor's, register a JAX function for it "
            "with optkit.onnx.register_op(domain, op_type, fn) (docs: 'Custom operators').")


@functools.cache
def _newest_opsets() -> dict[str, int]:
    """The newest opset version ONNX defines for each domain that has schemas."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = normalize_domain(schema.domain)
        newest[domain] = max(newest.get(domain, 0), int(schema.since_version))
    newest[DEFAULT_DOMAIN] = max(newest.get(DEFAULT_DOMAIN, 0), onnx.defs.onnx_opset_version())
    return newest


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The opset version the model imports for each domain; one ONNX does not define is refused."""
    opsets: dict[str, int] = {}
    newest = _newest_opsets()  # cached: read-only
    for opset in model.opset_import:
        domain = normalize_domain(opset.domain)
        opsets[domain] = int(opset.version)
        if domain in newest and not 1 <= opsets[domain] <= newest[domain]:
            raise UnsupportedOpError(
                f"the model imports opset {opsets[domain]} of domain {domain_text(domain)!r}, which ONNX does "
                f"not define (versions 1 to {newest[domain]} in the installed onnx package); optkit runs "
                f"no operator under an opset it does not know")
    return opsets
