"""Model-local functions expanded into the graph (as ONNX Runtime does), the expansion bounded.

A stage of loading (:mod:`optkit.onnx._load.pipeline`) that runs after ``onnx.checker``
and before the converter: the converter sees one graph of standard operators.
"""

from __future__ import annotations

import onnx
import onnx.defs
import onnx.inliner

from optkit.onnx._base.limits import MAX_EXPANDED_NODES
from optkit.onnx._base.values import node_name, node_where, normalize_domain

__all__ = ["expand_functions"]


def expand_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions expanded into the graph (as ONNX Runtime does), after checks.

    - A local function whose name is a standard operator of its domain (a
      ``Relu`` of the default domain) does not replace it: standard operators
      win, as in ONNX Runtime, and such a function is dropped.
    - Every call gives at most as many inputs and outputs as the function
      declares.
    - The expansion is counted first, callees before callers: the model may
      grow to :data:`~optkit.onnx._base.limits.MAX_EXPANDED_NODES` nodes, or to the
      number of nodes its file holds if that is more (a function calling
      another twice, nested 30 deep, is 2**30 nodes).

    Raises:
      ValueError: a call with more inputs or outputs than its function
        declares, or an expansion beyond the bound, naming the function.
    """
    functions = {}
    for function in model.functions:
        domain = normalize_domain(function.domain)
        if onnx.defs.has(function.name, domain):
            continue  # the standard operator wins
        functions[(domain, function.name)] = function
    bodies = [("the graph", model.graph.node)] + [(f"function {f.name!r}", f.node) for f in functions.values()]
    for owner, nodes in bodies:
        for index, node in enumerate(nodes):
            function = functions.get((normalize_domain(node.domain), node.op_type))
            if function is None:
                continue
            for kind, given, declared in (("inputs", node.input, function.input),
                                          ("outputs", node.output, function.output)):
                if len(given) > len(declared):
                    raise ValueError(
                        f"{node_where(node_name(node.name, node.op_type, index), node.domain, node.op_type)} of "
                        f"{owner} calls the model-local function "
                        f"{node.op_type!r} with {len(given)} {kind}, but it declares {len(declared)}: "
                        f"{list(declared)}")
    written = len(model.graph.node) + sum(len(f.node) for f in model.functions)
    bound = max(MAX_EXPANDED_NODES, written)
    size: dict[tuple[str, str], int] = {}
    pending = list(functions)
    while pending:
        progressed = False
        for key in list(pending):
            calls = [(normalize_domain(n.domain), n.op_type) for n in functions[key].node]
            if any(c in functions and c not in size for c in calls):
                continue
            size[key] = min(sum(size.get(c, 1) for c in calls), bound + 1)
            pending.remove(key)
            progressed = True
        if not progressed:
            break  # a cycle: onnx.checker has refused it already
    total = sum(size.get((normalize_domain(n.domain), n.op_type), 1) for n in model.graph.node)
    if total > bound:
        raise ValueError(f"the model's local functions expand it to more than {bound} nodes (optkit.onnx's bound: "
                         f"{MAX_EXPANDED_NODES} nodes, or as many as the file holds); it is refused rather than "
                         f"built")
    kept = onnx.ModelProto()
    kept.CopyFrom(model)
    del kept.functions[:]
    kept.functions.extend(functions.values())
    return onnx.inliner.inline_local_functions(kept)
