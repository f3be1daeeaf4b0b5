"""Graph: named tensors computed by JAX callables, with ONNX Gradient nodes (SPEC 6).

A :class:`Graph` is what an ONNX graph is, in JAX: graph inputs and
initializers (constant tensors) name the leaves, and each node names the
tensors it reads and the tensors it produces. Evaluating it calls the nodes'
functions in dependency order, so under ``jax.jit`` the program is the one the
same functions would give written out by hand.

A Gradient node (:class:`GradientNode`) is the ONNX
``ai.onnx.preview.training::Gradient`` operator. Its ``xs``, ``zs`` and ``y``
name a sub-graph: the graph cut at the tensors in ``xs + zs`` (their producers
are ignored and the node's inputs replace them), keeping the nodes that ``y``
needs. The node re-traces that sub-graph inside ``jax.vjp``; a Gradient node
inside the sub-graph of another is therefore differentiated again, which gives
higher derivatives (nested ``jax.vjp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from optkit._src.checks import check_differentiable, check_feed, check_gradient_names, check_names, check_shape
from optkit._src.gradient import differentiate

__all__ = ["Graph", "GraphNode", "GradientNode"]


@dataclasses.dataclass(frozen=True, eq=False)
class GraphNode:
    """A node ``outputs <- fn(inputs)`` of a :class:`Graph`; made by :meth:`Graph.add`.

    Attributes:
      fn: a JAX-traceable callable. With ``keywords=None`` it is called with
        the input tensors positionally, else as ``fn(**dict(zip(keywords, values)))``.
        An absent optional input (name ``""``) is passed as None.
      inputs: names of the tensors read, in call order; ``""`` is an absent input.
      outputs: names of the tensors produced; ``""`` is an output not produced.
      name: the node's name, used in error messages.
      keywords: the keyword for each input, or None for positional calls.
    """

    fn: Callable[..., Any] = dataclasses.field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str
    keywords: tuple[str, ...] | None = dataclasses.field(default=None, repr=False)

    def __call__(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """Run ``fn`` on the input values; return one value per output name."""
        if self.keywords is None:
            out = self.fn(*values)
        else:
            out = self.fn(**dict(zip(self.keywords, values, strict=True)))
        if len(self.outputs) == 1:
            return (out,)
        if isinstance(out, Mapping):
            missing = [o for o in self.outputs if o and o not in out]
            if missing:
                raise ValueError(f"node {self.name!r} returned the tensors {list(out)}, "
                                 f"without its output {missing[0]!r}")
            return tuple(out[o] if o else None for o in self.outputs)
        if not isinstance(out, (tuple, list)) or len(out) != len(self.outputs):
            got = (f"{len(out)} values" if isinstance(out, (tuple, list))
                   else f"one {type(out).__name__}")
            raise ValueError(f"node {self.name!r} has {len(self.outputs)} outputs "
                             f"{list(self.outputs)} but its function returned {got}; return "
                             f"a tuple with one value per output or a mapping from output names")
        return tuple(out)


@dataclasses.dataclass(frozen=True, eq=False)
class GradientNode:
    """An ONNX Gradient node of a :class:`Graph`; made by :meth:`Graph.add_gradient`.

    Attributes:
      xs, zs, y: the ONNX attributes: the differentiated inputs, the fixed
        inputs, and the target tensor of the sub-graph (SPEC 6).
      inputs: names of the tensors fed for ``xs + zs`` (in that order); the
        gradient is taken at their values.
      outputs: one name per ``xs``: output i is ``dy/d(xs[i])``; ``""`` is not produced.
      name: the node's name, used in error messages.
    """

    xs: tuple[str, ...]
    zs: tuple[str, ...]
    y: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str


Node = GraphNode | GradientNode


@dataclasses.dataclass(frozen=True)
class _InputSpec:
    shape: tuple[int | None, ...] | None
    dtype: Any


@dataclasses.dataclass(frozen=True)
class _GradientPlan:
    nodes: tuple[Node, ...]  # the cut sub-graph from xs + zs to y, in evaluation order
    leaves: tuple[str, ...]  # initializers the sub-graph reads besides xs + zs


@dataclasses.dataclass(frozen=True)
class _Analysis:
    order: tuple[Node, ...]
    deps: dict[Node, tuple[str, ...]]
    gradients: dict[GradientNode, _GradientPlan]


def _name_of(node: Node) -> str:
    kind = "Gradient node" if isinstance(node, GradientNode) else "node"
    return f"{kind} {node.name!r}"


class Graph:
    """An ordered set of nodes over named tensors, evaluated in JAX (SPEC 6).

    Graph inputs (fed at evaluation) and initializers (constant tensors, which
    a feed of the same name may override when the name is also an input) are
    the leaves. :meth:`add` appends a node computing named tensors with a JAX
    callable; :meth:`add_gradient` appends an ONNX Gradient node. Nodes may be
    added in any order (a node may read a tensor produced by a later node);
    :meth:`validate`, run by every evaluation, checks the whole graph.

    A tensor is an array or any pytree of arrays (e.g. Flax parameters), so a
    Flax module's ``apply`` is a node like any other. Evaluation runs only the
    nodes the requested outputs need, in dependency order; it is pure JAX, so
    ``jax.jit(graph.as_function(...))`` compiles the whole graph, Gradient
    nodes included, to one XLA program, the one the hand-written function gives.

    Args:
      inputs: graph input names, or a mapping from names to None, to a
        ``(shape, dtype)`` pair (shape entries may be None for a free
        dimension), or to anything with ``.shape`` and ``.dtype`` (e.g.
        ``jax.ShapeDtypeStruct``); feeds are checked against declared ones.
      outputs: names of the graph outputs, the default of :meth:`evaluate`
        and :meth:`as_function`. None: every node output no node reads.
      initializers: a mapping from names to constant tensors.

    Raises:
      TypeError, ValueError: a name that is empty, not a string, or declared twice;
        an input spec that is not None, ``(shape, dtype)`` or shaped and typed
        (see :meth:`add_input`); ``initializers`` that is not a mapping.

    Source: SPEC section 6; the ONNX graph (IR) model of inputs, initializers and nodes.

    Example:
      >>> import jax, jax.numpy as jnp, optkit
      >>> g = optkit.Graph(inputs=["X", "W", "L"])
      >>> g.add(jnp.matmul, inputs=["X", "W"], outputs=["Y"], name="Gemm")
      GraphNode(inputs=('X', 'W'), outputs=('Y',), name='Gemm')
      >>> _ = g.add(lambda y, l: jnp.sum((y - l) ** 2), ["Y", "L"], ["O"], name="Loss")
      >>> _ = g.add_gradient(xs=["X", "W"], zs=["L"], y="O", outputs=["dO/dX", "dO/dW"])
      >>> g.add_gradient(xs=["X", "W"], zs=["L"], y="dO/dW", outputs=["", "d2O/dW2"])
      GradientNode(xs=('X', 'W'), zs=('L',), y='dO/dW', inputs=('X', 'W', 'L'), \
outputs=('', 'd2O/dW2'), name='Gradient#3')
      >>> f = jax.jit(g.as_function(["X", "W", "L"], ["dO/dW", "d2O/dW2"]))
      >>> f(jnp.eye(2), jnp.array([1.0, 2.0]), jnp.zeros(2))
      (Array([2., 4.], dtype=float32), Array([2., 2.], dtype=float32))
    """

    def __init__(
        self,
        inputs: Sequence[str] | Mapping[str, Any] = (),
        *,
        outputs: Sequence[str] | None = None,
        initializers: Mapping[str, Any] | None = None,
    ) -> None:
        self._inputs: dict[str, _InputSpec] = {}
        self._initializers: dict[str, Any] = {}
        self._nodes: list[Node] = []
        self._producer: dict[str, Node] = {}
        self._outputs: tuple[str, ...] | None = None
        self._analysis: _Analysis | None = None
        self._plans: dict[tuple[tuple[str, ...], frozenset[str]], tuple[Node, ...]] = {}
        if isinstance(inputs, Mapping):
            for name, spec in inputs.items():
                if spec is None:
                    self.add_input(name)
                elif hasattr(spec, "shape") and hasattr(spec, "dtype"):
                    self.add_input(name, spec.shape, spec.dtype)
                elif isinstance(spec, (tuple, list)) and len(spec) == 2:
                    shape, dtype = spec
                    self.add_input(name, shape, dtype)
                else:
                    raise TypeError(f"graph input {name!r}: expected None, a (shape, dtype) pair or "
                                    f"an object with .shape and .dtype (jax.ShapeDtypeStruct), "
                                    f"got {spec!r}")
        else:
            for name in check_names("inputs", inputs):
                self.add_input(name)
        if initializers is not None and not isinstance(initializers, Mapping):
            raise TypeError(f"initializers must be a mapping from tensor names to constant "
                            f"tensors, got {type(initializers).__name__}")
        for name, value in (initializers or {}).items():
            self.add_initializer(name, value)
        if outputs is not None:
            self.outputs = outputs

    # ----------------------------------------------------------------- building

    def _changed(self) -> None:
        self._analysis = None
        self._plans.clear()

    def _claim(self, name: str, what: str, *, input_and_initializer: bool = False) -> None:
        """Refuse a second definition of ``name``, naming the first. A graph input may
        also be an initializer (its default) when ``input_and_initializer``."""
        if not isinstance(name, str):
            raise TypeError(f"{what} name must be a non-empty string, got {name!r}")
        if not name:
            raise ValueError(f"{what} name must be a non-empty string, got ''")
        if name in self._producer:
            raise ValueError(f"tensor {name!r} ({what}) is already the output of "
                             f"{_name_of(self._producer[name])}")
        if name in self._inputs and not (input_and_initializer and what == "initializer"):
            raise ValueError(f"tensor {name!r} ({what}) is already a graph input")
        if name in self._initializers and not (input_and_initializer and what == "graph input"):
            raise ValueError(f"tensor {name!r} ({what}) is already an initializer")

    def add_input(
        self, name: str, shape: Sequence[int | None] | None = None, dtype: Any = None
    ) -> None:
        """Declare a graph input, optionally with its shape and dtype.

        Args:
          name: the tensor's name.
          shape: the expected shape; None entries are free dimensions (ONNX
            ``dim_param``); None leaves the shape unchecked.
          dtype: the expected dtype; None leaves it unchecked.

        Raises:
          ValueError: ``name`` is already a graph input or a node output; a
            negative dimension.
          TypeError: ``shape`` is not a sequence of integers and None, or
            ``dtype`` is not a dtype.
        """
        self._claim(name, "graph input", input_and_initializer=True)
        if shape is not None:
            shape = check_shape(f"graph input {name!r}: shape", shape, allow_none=True)
        if dtype is not None:
            try:
                dtype = jnp.dtype(dtype)
            except TypeError:
                raise TypeError(f"graph input {name!r}: dtype must be a NumPy/JAX dtype, "
                                f"got {dtype!r}") from None
        self._inputs[name] = _InputSpec(shape, dtype)
        self._changed()

    def add_initializer(self, name: str, value: Any) -> None:
        """Add a constant tensor (an ONNX initializer).

        If ``name`` is also a graph input, ``value`` is that input's default,
        which a feed overrides (ONNX IR semantics).

        Raises:
          ValueError: ``name`` is already an initializer or a node output.
        """
        self._claim(name, "initializer", input_and_initializer=True)
        self._initializers[name] = value
        self._changed()

    def _append(self, node: Node) -> Node:
        named = [out for out in node.outputs if out]
        for out in named:
            if named.count(out) > 1:
                raise ValueError(f"{_name_of(node)} names the output {out!r} twice")
            self._claim(out, f"output of {_name_of(node)}")
        self._nodes.append(node)
        self._producer.update((out, node) for out in named)
        self._changed()
        return node

    def add(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[str] | Mapping[str, str],
        outputs: Sequence[str],
        *,
        name: str | None = None,
    ) -> GraphNode:
        """Append a node ``outputs <- fn(inputs)``.

        Args:
          fn: a JAX-traceable callable (a jnp function, a Flax module's
            ``apply``, an optkit op, an ONNX op handler...).
          inputs: names of the tensors passed to ``fn`` positionally, or a
            mapping from ``fn``'s keyword names to tensor names. ``""`` is an
            absent optional input, passed as None.
          outputs: names of the tensors ``fn`` produces; ``""`` is an output
            not produced. With one output, ``fn`` returns that tensor (any
            pytree); with several, a tuple/list with one value per name or a
            mapping from the output names to values.
          name: the node's name for error messages; default ``fn``'s name.

        Returns:
          The new :class:`GraphNode`.

        Raises:
          TypeError: ``fn`` is not callable or a name is not a string.
          ValueError: an output name is repeated or already defined.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        keywords = None
        if isinstance(inputs, Mapping):
            keywords = tuple(inputs.keys())
            inputs = tuple(inputs.values())
        inputs = check_names("inputs", inputs, allow_absent=True)
        outputs = check_names("outputs", outputs, allow_absent=True)
        if not outputs:
            raise ValueError("outputs must name at least one tensor")
        if name is None:
            name = f"{getattr(fn, '__name__', 'node')}#{len(self._nodes)}"
        return self._append(GraphNode(fn, inputs, outputs, str(name), keywords))

    def add_gradient(
        self,
        *,
        xs: Sequence[str],
        y: str,
        zs: Sequence[str] = (),
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
        name: str | None = None,
    ) -> GradientNode:
        """Append an ONNX Gradient node: ``outputs[i] = d sum(y) / d xs[i]`` (SPEC 6).

        The differentiated sub-graph is the function from the tensors in
        ``xs + zs`` to ``y``: the graph cut at those tensors (their producers
        are ignored), keeping the nodes ``y`` needs. The gradient is taken at
        the values of ``inputs``, which may be other tensors than ``xs + zs``
        (ONNX's "H_1" example). A ``y`` that is another Gradient node's output
        gives second derivatives, and so on.

        Args:
          xs: names of the differentiated tensors (ONNX attribute ``xs``):
            graph inputs, initializers or intermediate tensors.
          y: name of the target tensor (ONNX attribute ``y``).
          zs: names of tensors held fixed (ONNX attribute ``zs``), any dtype.
            ``xs + zs`` must determine ``y`` and be independent (SPEC 6).
          inputs: the tensors fed for ``xs + zs`` (the node's inputs); default
            ``xs + zs`` themselves, i.e. the gradient at the forward values.
          outputs: one name per ``xs``; ``""`` is an output not produced.
            Default ``"d{y}/d{x}"`` for each ``x`` in ``xs``.
          name: the node's name for error messages; default ``"Gradient#i"``.

        Returns:
          The new :class:`GradientNode`.

        Raises:
          TypeError: a name is not a (non-empty) string.
          ValueError: ``xs`` is empty; a name in both ``xs`` and ``zs`` or
            repeated; ``inputs`` or ``outputs`` of the wrong length; an output
            name already defined. Errors that need the whole graph (``y`` never
            computed, a name in ``xs``/``zs`` not in the graph, ``xs + zs`` not
            independent or not determining ``y``, cycles) are raised by
            :meth:`validate`, and so by evaluation.
        """
        xs, zs, y = check_gradient_names(xs, zs, y, y_required=True)
        # The same tensor may be fed for two names, so repeats are allowed.
        fed = xs + zs if inputs is None else check_names("inputs", inputs, allow_absent=True)
        if "" in fed:
            raise ValueError(f"a Gradient node needs a value for every tensor of xs + zs; "
                             f"inputs {list(fed)} has an absent ('') entry")
        if len(fed) != len(xs) + len(zs):
            raise ValueError(f"a Gradient node is fed one value per tensor of xs + zs = "
                             f"{list(xs + zs)}, so it needs {len(xs) + len(zs)} inputs, "
                             f"got {len(fed)}: {list(fed)}")
        if outputs is None:
            outputs = tuple(f"d{y}/d{x}" for x in xs)
        outputs = check_names("outputs", outputs, allow_absent=True)
        if len(outputs) != len(xs):
            raise ValueError(f"a Gradient node has one output per tensor of xs = {list(xs)}, "
                             f"got {len(outputs)}: {list(outputs)} (use '' to skip one)")
        if name is None:
            name = f"Gradient#{len(self._nodes)}"
        return self._append(GradientNode(xs, zs, y, fed, outputs, str(name)))

    # ------------------------------------------------------------ introspection

    @property
    def inputs(self) -> tuple[str, ...]:
        """The graph input names, in declaration order."""
        return tuple(self._inputs)

    @property
    def initializers(self) -> Mapping[str, Any]:
        """The constant tensors, by name (a read-only view)."""
        return _ReadOnly(self._initializers)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes, in the order they were added."""
        return tuple(self._nodes)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The graph outputs: the declared ones, else every node output no node reads."""
        if self._outputs is not None:
            return self._outputs
        read = {n for node in self._nodes for n in node.inputs}
        return tuple(o for node in self._nodes for o in node.outputs if o and o not in read)

    @outputs.setter
    def outputs(self, names: Sequence[str]) -> None:
        self._outputs = check_names("outputs", names)

    def __repr__(self) -> str:
        return (f"Graph(inputs={list(self._inputs)}, initializers={list(self._initializers)}, "
                f"nodes={[n.name for n in self._nodes]}, outputs={list(self.outputs)})")

    # --------------------------------------------------------------- validation

    def _defined(self, name: str) -> bool:
        return name in self._producer or name in self._inputs or name in self._initializers

    def validate(self) -> None:
        """Check the whole graph; every evaluation calls this (cached until the graph changes).

        Raises:
          ValueError, naming the tensor (and node): a node input, a declared
            output or a Gradient's ``y``/``xs``/``zs``/input that no graph
            input, initializer or node defines; a cycle; a Gradient whose
            ``xs + zs`` are not independent (one is computed from others) or
            do not determine ``y`` (the cut sub-graph reads a graph input not
            in ``xs + zs``); a Gradient differentiated through itself.
        """
        self._analyze()

    def _analyze(self) -> _Analysis:
        if self._analysis is not None:
            return self._analysis
        for node in self._nodes:
            if isinstance(node, GradientNode):
                if not self._defined(node.y):
                    raise ValueError(f"{_name_of(node)}: y {node.y!r} is never computed by the "
                                     f"graph (not a graph input, initializer or node output)")
                for attr, names in (("xs", node.xs), ("zs", node.zs)):
                    for name in names:
                        if not self._defined(name):
                            raise ValueError(
                                f"{_name_of(node)}: {name!r} in {attr} is not a graph input, "
                                f"an initializer or an intermediate tensor of the graph")
            for name in node.inputs:
                if name and not self._defined(name):
                    raise ValueError(f"{_name_of(node)} reads the tensor {name!r}, which is not "
                                     f"a graph input, an initializer or any node's output")
        for name in self._outputs or ():
            if not self._defined(name):
                raise ValueError(f"graph output {name!r} is not a graph input, an initializer "
                                 f"or any node's output")

        deps: dict[Node, tuple[str, ...]] = {}
        cuts: dict[GradientNode, tuple[frozenset[Node], tuple[str, ...]]] = {}
        in_progress: list[GradientNode] = []

        def node_deps(node: Node) -> tuple[str, ...]:
            if node not in deps:
                names = tuple(n for n in node.inputs if n)
                if isinstance(node, GradientNode):
                    names += cut(node)[1]
                deps[node] = names
            return deps[node]

        def cut(grad: GradientNode) -> tuple[frozenset[Node], tuple[str, ...]]:
            if grad in cuts:
                return cuts[grad]
            if grad in in_progress:
                chain = " -> ".join(repr(g.name) for g in in_progress[in_progress.index(grad):])
                raise ValueError(f"cycle: {_name_of(grad)} differentiates through its own "
                                 f"output (Gradient nodes {chain} -> {grad.name!r})")
            in_progress.append(grad)
            nodes, leaves = self._walk_back([grad.y], set(grad.xs) | set(grad.zs), node_deps)
            for name in leaves:
                if name not in self._initializers:
                    raise ValueError(
                        f"{_name_of(grad)}: y {grad.y!r} depends on the graph input {name!r}, "
                        f"which is in neither xs {list(grad.xs)} nor zs {list(grad.zs)}; xs "
                        f"and zs must determine y (SPEC 6): add {name!r} to zs")
            in_progress.pop()
            cuts[grad] = (frozenset(nodes), leaves)
            return cuts[grad]

        for node in self._nodes:
            node_deps(node)
        order = self._topological_order(deps)
        position = {node: i for i, node in enumerate(order)}
        gradients = {
            grad: _GradientPlan(tuple(sorted(nodes, key=position.__getitem__)), leaves)
            for grad, (nodes, leaves) in cuts.items()
        }
        for grad in gradients:
            self._check_independent(grad, deps)
        self._analysis = _Analysis(order, deps, gradients)
        return self._analysis

    def _topological_order(self, deps: Mapping[Node, tuple[str, ...]]) -> tuple[Node, ...]:
        """Nodes in dependency order, ties broken by insertion order; iterative DFS,
        since graphs loaded from ONNX can be deeper than Python's recursion limit."""
        order: list[Node] = []
        state: dict[Node, int] = {}  # 1: on the DFS path, 2: done
        for root in self._nodes:
            if state.get(root) == 2:
                continue
            path: list[tuple[Node, Iterable[str]]] = [(root, iter(deps[root]))]
            state[root] = 1
            while path:
                node, pending = path[-1]
                for name in pending:
                    producer = self._producer.get(name)
                    if producer is None or state.get(producer) == 2:
                        continue
                    if state.get(producer) == 1:
                        on_path = [n for n, _ in path]
                        cycle = on_path[on_path.index(producer):] + [producer]
                        text = " -> ".join(repr(n.name) for n in reversed(cycle))
                        raise ValueError(f"the graph has a cycle through tensor {name!r}: "
                                         f"nodes {text}, each feeding the next")
                    state[producer] = 1
                    path.append((producer, iter(deps[producer])))
                    break
                else:
                    path.pop()
                    state[node] = 2
                    order.append(node)
        return tuple(order)

    def _check_independent(self, grad: GradientNode, deps: Mapping[Node, tuple[str, ...]]) -> None:
        listed = {name: "xs" for name in grad.xs} | {name: "zs" for name in grad.zs}
        for name in listed:
            if name not in self._producer:
                continue
            direct = deps[self._producer[name]]
            nodes, _ = self._walk_back(direct, (), deps.__getitem__)
            ancestors = set(direct).union(*(deps[node] for node in nodes))
            for ancestor in listed:
                if ancestor in ancestors:
                    raise ValueError(
                        f"{_name_of(grad)}: xs and zs must be independent (SPEC 6), but "
                        f"{name!r} (in {listed[name]}) is computed from {ancestor!r} (in "
                        f"{listed[ancestor]}); drop one of them")

    def _walk_back(
        self,
        targets: Iterable[str],
        stop: Collection[str],
        deps: Callable[[Node], Iterable[str]],
    ) -> tuple[set[Node], tuple[str, ...]]:
        """The nodes that compute ``targets`` when the graph is cut at ``stop``, and the
        tensors outside ``stop`` that no node produces (graph inputs, initializers)."""
        nodes: set[Node] = set()
        leaves: set[str] = set()
        seen: set[str] = set()
        stack = list(targets)
        while stack:
            name = stack.pop()
            if name in seen or name in stop:
                continue
            seen.add(name)
            producer = self._producer.get(name)
            if producer is None:
                leaves.add(name)
            elif producer not in nodes:
                nodes.add(producer)
                stack.extend(deps(producer))
        return nodes, tuple(sorted(leaves))

    # --------------------------------------------------------------- evaluation

    def _plan(self, targets: tuple[str, ...], known: frozenset[str]) -> tuple[Node, ...]:
        """The nodes that compute ``targets`` from the ``known`` tensors, in order."""
        key = (targets, known)
        if key in self._plans:
            return self._plans[key]
        analysis = self._analyze()
        needed, missing = self._walk_back(targets, known, analysis.deps.__getitem__)
        if missing:
            # Undefined names were refused already; what is left is an input not fed.
            raise ValueError(f"graph input {missing[0]!r} is needed for the outputs "
                             f"{list(targets)} but was not fed")
        plan = tuple(node for node in analysis.order if node in needed)
        self._plans[key] = plan
        return plan

    def _run(self, plan: Iterable[Node], env: dict[str, Any]) -> None:
        """Evaluate ``plan`` in order, adding every produced tensor to ``env``."""
        for node in plan:
            values = [env[name] if name else None for name in node.inputs]
            if isinstance(node, GradientNode):
                results = self._run_gradient(node, values, env)
            else:
                results = node(values)
            for name, value in zip(node.outputs, results, strict=True):
                if name:
                    env[name] = value

    def _run_gradient(
        self, node: GradientNode, fed: Sequence[Any], env: Mapping[str, Any]
    ) -> tuple[Any, ...]:
        sub = self._analyze().gradients[node]
        base = {leaf: env[leaf] for leaf in sub.leaves}
        base.update(zip(node.xs + node.zs, fed, strict=True))
        # Only the xs whose gradient is asked for are differentiated (differentiate
        # checks their dtypes); the rest are held fixed like zs, which gives the same
        # numbers with less work, but must still be floating point (SPEC 6).
        wanted = [i for i, out in enumerate(node.outputs) if out]
        for i, x in enumerate(node.xs):
            if i not in wanted:
                check_differentiable(x, fed[i])
        wanted_xs = tuple(node.xs[i] for i in wanted)

        def target(x_values: tuple[Any, ...]) -> Any:
            local = dict(base)
            local.update(zip(wanted_xs, x_values, strict=True))
            self._run(sub.nodes, local)
            return local[node.y]

        grads = differentiate(target, wanted_xs, tuple(fed[i] for i in wanted), node.y)
        results: list[Any] = [None] * len(node.xs)
        for i, g in zip(wanted, grads, strict=True):
            results[i] = g
        return tuple(results)

    def _check_feed(self, name: str, value: Any) -> None:
        spec = self._inputs.get(name)
        if spec is None:
            if name in self._initializers:
                return
            if name in self._producer:
                raise ValueError(f"feed {name!r} is the output of {_name_of(self._producer[name])}"
                                 f"; only graph inputs and initializers can be fed")
            raise ValueError(f"feed {name!r} is not a graph input (inputs: {list(self._inputs)})")
        check_feed(name, value, spec.shape, spec.dtype)

    def evaluate(
        self, feeds: Mapping[str, Any], outputs: str | Sequence[str] | None = None
    ) -> Any:
        """Evaluate the graph on ``feeds``; jittable (pure JAX).

        Args:
          feeds: values for graph inputs (and overrides for initializers), by name.
          outputs: the tensor names to compute, in order, or one name; default
            :attr:`outputs`. Only the nodes these need run.

        Returns:
          A dict from each requested name to its value, in the requested
          order; the value itself when ``outputs`` is one name.

        Raises:
          ValueError: a feed that is not a graph input or initializer, or that
            does not match the input's declared shape or dtype; a graph input
            the outputs need that is not fed; an invalid graph
            (:meth:`validate`); an integer or boolean value fed for a
            Gradient's ``xs``.
          TypeError: ``feeds`` is not a mapping.
        """
        if not isinstance(feeds, Mapping):
            raise TypeError(f"feeds must be a mapping from tensor names to values, got "
                            f"{type(feeds).__name__}; as_function() takes positional values")
        single = isinstance(outputs, str)
        if outputs is None:
            outputs = self.outputs
        names = (outputs,) if single else check_names("outputs", outputs)
        self._analyze()
        for name in names:
            if not self._defined(name):
                raise ValueError(f"output {name!r} is not a graph input, an initializer or "
                                 f"any node's output")
        for name, value in feeds.items():
            self._check_feed(name, value)
        env = dict(self._initializers)
        env.update(feeds)
        self._run(self._plan(names, frozenset(env)), env)
        return env[names[0]] if single else {name: env[name] for name in names}

    def as_function(
        self,
        inputs: Sequence[str] | None = None,
        outputs: str | Sequence[str] | None = None,
    ) -> Callable[..., Any]:
        """The graph as a function of positional values for ``inputs``.

        ``jax.jit(graph.as_function(inputs, outputs))`` compiles the whole
        graph (Gradient nodes included) to one XLA program.

        Args:
          inputs: the names fed positionally (graph inputs or initializers);
            default :attr:`inputs`.
          outputs: the names returned, or one name; default :attr:`outputs`.

        Returns:
          ``f(*values)`` returning a tuple with one value per output name, or
          the value itself when ``outputs`` is one name. A jitted ``f`` keeps
          the graph as it was when traced: after changing the graph, call
          ``as_function`` again.

        Raises:
          ValueError: as :meth:`evaluate`, at once for names and graph errors,
            at call time for values; also a wrong number of values.
        """
        inputs = self.inputs if inputs is None else check_names("inputs", inputs)
        single = isinstance(outputs, str)
        if outputs is None:
            outputs = self.outputs
        names = (outputs,) if single else check_names("outputs", outputs)
        for name in inputs:
            if name not in self._inputs and name not in self._initializers:
                self._check_feed(name, None)  # raises, naming the tensor
        self._analyze()
        for name in names:
            if not self._defined(name):
                raise ValueError(f"output {name!r} is not a graph input, an initializer or "
                                 f"any node's output")

        def graph_function(*values: Any) -> Any:
            if len(values) != len(inputs):
                raise ValueError(f"expected {len(inputs)} values, one per input "
                                 f"{list(inputs)}, got {len(values)}")
            result = self.evaluate(dict(zip(inputs, values, strict=True)), names)
            return result[names[0]] if single else tuple(result[name] for name in names)

        return graph_function


class _ReadOnly(Mapping):
    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)
