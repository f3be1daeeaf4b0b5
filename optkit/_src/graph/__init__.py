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

The parts, each its own module: :mod:`~optkit._src.graph.nodes` (the node
types), :mod:`~optkit._src.graph.names` (every name defined once, feeds
checked), :mod:`~optkit._src.graph.analysis` (what the graph means: closure,
order, each Gradient node's sub-graph, the checks that need the whole graph)
and :mod:`~optkit._src.graph.run` (evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import chex
from jax.typing import DTypeLike

from optkit._src.gradient import check_names
from optkit._src.graph.analysis import GraphAnalysis
from optkit._src.graph.names import Tensors
from optkit._src.graph.nodes import GradientNode, GraphNode, Node, check_gradient_node
from optkit._src.graph.run import GraphRunner

__all__ = ["Graph", "GraphNode", "GradientNode"]


class Graph:
    """An ordered set of nodes over named tensors, evaluated in JAX (SPEC 6).

    Graph inputs (fed at evaluation) and initializers (constant tensors, which
    a feed of the same name may override when the name is also an input) are
    the leaves. :meth:`~optkit.Graph.add` appends a node computing named tensors with a JAX
    callable; :meth:`~optkit.Graph.add_gradient` appends an ONNX Gradient node. Nodes may be
    added in any order (a node may read a tensor produced by a later node);
    :meth:`~optkit.Graph.validate`, run by every evaluation, checks the whole graph.

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
      outputs: names of the graph outputs, the default of :meth:`~optkit.Graph.evaluate`
        and :meth:`~optkit.Graph.as_function`. None: every node output no node reads.
      initializers: a mapping from names to constant tensors.

    Raises:
      TypeError, ValueError: a name that is empty, not a string, or declared twice;
        an input spec that is not None, ``(shape, dtype)`` or shaped and typed
        (see :meth:`~optkit.Graph.add_input`); ``initializers`` that is not a mapping.

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
        initializers: Mapping[str, chex.ArrayTree] | None = None,
    ) -> None:
        self._tensors = Tensors()
        self._outputs: tuple[str, ...] | None = None
        self._runner: GraphRunner | None = None  # the analysis and runner of this version of the graph
        self._tensors.add_inputs(inputs)
        self._tensors.add_initializers(initializers)
        if outputs is not None:
            self.outputs = outputs

    # ----------------------------------------------------------------- building

    def _changed(self) -> None:
        self._runner = None

    def _analyzed(self) -> GraphRunner:
        """The runner of the graph as it is now (analysed once per version; raises if invalid)."""
        if self._runner is None:
            self._runner = GraphRunner(GraphAnalysis(self._tensors, self._outputs))
        return self._runner

    def add_input(
        self, name: str, shape: Sequence[int | None] | None = None, dtype: DTypeLike | None = None
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
        self._tensors.add_input(name, shape, dtype)
        self._changed()

    def add_initializer(self, name: str, value: chex.ArrayTree) -> None:
        """Add a constant tensor (an ONNX initializer).

        If ``name`` is also a graph input, ``value`` is that input's default,
        which a feed overrides (ONNX IR semantics).

        Raises:
          ValueError: ``name`` is already an initializer or a node output.
        """
        self._tensors.add_initializer(name, value)
        self._changed()

    def _append(self, node: Node) -> Node:
        self._tensors.append(node)
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
            name = f"{getattr(fn, '__name__', 'node')}#{len(self._tensors.nodes)}"
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
            :meth:`~optkit.Graph.validate`, and so by evaluation.
        """
        xs, zs, y, fed, outputs = check_gradient_node(xs, zs, y, inputs, outputs)
        if name is None:
            name = f"Gradient#{len(self._tensors.nodes)}"
        return self._append(GradientNode(xs, zs, y, fed, outputs, str(name)))

    # ------------------------------------------------------------ introspection

    @property
    def inputs(self) -> tuple[str, ...]:
        """The graph input names, in declaration order."""
        return tuple(self._tensors.inputs)

    @property
    def initializers(self) -> Mapping[str, Any]:
        """The constant tensors, by name (a read-only view)."""
        return _ReadOnly(self._tensors.initializers)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes, in the order they were added."""
        return tuple(self._tensors.nodes)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of the graph outputs; the declared ones, else every node output no node reads."""
        if self._outputs is not None:
            return self._outputs
        nodes = self._tensors.nodes
        read = {n for node in nodes for n in node.inputs}
        return tuple(o for node in nodes for o in node.outputs if o and o not in read)

    @outputs.setter
    def outputs(self, names: Sequence[str]) -> None:
        self._outputs = check_names("outputs", names)

    def __repr__(self) -> str:
        t = self._tensors
        return (f"Graph(inputs={list(t.inputs)}, initializers={list(t.initializers)}, "
                f"nodes={[n.name for n in t.nodes]}, outputs={list(self.outputs)})")

    # --------------------------------------------------------------- validation

    def validate(self) -> None:
        """Check the whole graph; every evaluation calls this (cached until the graph changes).

        Raises:
          ValueError: (naming the tensor and the node) a node input, a declared
            output or a Gradient's ``y``/``xs``/``zs``/input that no graph
            input, initializer or node defines; a cycle; a Gradient whose
            ``xs + zs`` are not independent (one is computed from others) or
            do not determine ``y`` (the cut sub-graph reads a graph input not
            in ``xs + zs``); a Gradient differentiated through itself.
        """
        self._analyzed()

    # --------------------------------------------------------------- evaluation

    def _requested(self, outputs: str | Sequence[str] | None) -> tuple[tuple[str, ...], bool, GraphRunner]:
        """The output names asked for (default :attr:`outputs`), each defined; whether one name was; the runner."""
        single = isinstance(outputs, str)
        names = (outputs,) if single else check_names("outputs", self.outputs if outputs is None else outputs)
        runner = self._analyzed()
        for name in names:
            if not self._tensors.defined(name):
                raise ValueError(f"output {name!r} is not a graph input, an initializer or "
                                 f"any node's output")
        return names, single, runner

    @property
    def order(self) -> tuple[Node, ...]:
        """Every node in dependency order (ties in the order the nodes were added); ValueError if invalid."""
        return self._analyzed()._analysis.order

    @property
    def producers(self) -> Mapping[str, Node]:
        """``{tensor name: the node whose output it is}``, read-only (graph inputs and initializers have none)."""
        return _ReadOnly(self._tensors.producer)

    @property
    def node_count(self) -> int:
        """How many nodes the graph has (``len(graph.nodes)`` without copying them)."""
        return len(self._tensors.nodes)

    def nodes_from(self, start: int) -> tuple[Node, ...]:
        """The nodes added from position ``start`` on, in the order they were added: what a builder added since
        it read :attr:`node_count`."""
        return tuple(self._tensors.nodes[start:])

    def dependencies(self, node: Node) -> tuple[str, ...]:
        """The tensor names ``node`` reads: its inputs, and for a Gradient node the tensors its sub-graph reads
        besides ``xs + zs``. Raises ValueError for an invalid graph, KeyError for a node of another graph."""
        return tuple(self._analyzed()._analysis.deps[node])

    def plan(self, outputs: str | Sequence[str] | None, known: Iterable[str]) -> tuple[tuple[str, ...],
                                                                                     tuple[Node, ...]]:
        """``(names, nodes)``: the output names asked for (default :attr:`outputs`) and the nodes that compute
        them from the ``known`` tensor names, in dependency order (only the nodes they need); what
        :meth:`evaluate` runs, for an evaluator that runs a plan its own way (some nodes scanned, some compiled
        apart) with :meth:`run_plan`.

        Raises:
          ValueError: an output no graph input, initializer or node defines; a graph input the outputs need that
            is not ``known``; an invalid graph.

        Example:
          >>> import jax.numpy as jnp, optkit
          >>> g = optkit.Graph(["x"])
          >>> _ = g.add(jnp.sin, ["x"], ["y"])
          >>> _ = g.add(jnp.cos, ["x"], ["z"])
          >>> names, nodes = g.plan("y", ["x"])        # only the node y needs
          >>> env = {"x": jnp.zeros(2)}
          >>> g.run_plan(nodes, env)
          >>> names, len(nodes), env["y"]
          (('y',), 1, Array([0., 0.], dtype=float32))
        """
        names, _, runner = self._requested(outputs)
        return names, runner.plan(names, frozenset(known))

    def run_plan(self, nodes: Iterable[Node], env: dict[str, Any]) -> None:
        """Run ``nodes`` (of :meth:`plan`, in its order) on the values in ``env``, adding every output to ``env``
        (a Gradient node as ``jax.vjp`` of its sub-graph, SPEC 6). Jittable (pure JAX)."""
        self._analyzed().run(nodes, env)

    def evaluate(
        self, feeds: Mapping[str, chex.ArrayTree], outputs: str | Sequence[str] | None = None, *,
        check_feeds: bool = True
    ) -> Any:
        """Evaluate the graph on ``feeds``; jittable (pure JAX).

        Args:
          feeds: values for graph inputs (and overrides for initializers), by name.
          outputs: the tensor names to compute, in order, or one name; default
            :attr:`outputs`. Only the nodes these need run.
          check_feeds: False skips the check of each fed value against the
            graph input's declared shape and dtype, for a caller that checked
            them already (:class:`optkit.onnx.BackendRep`, with ONNX's rules).

        Returns:
          A dict from each requested name to its value, in the requested
          order; the value itself when ``outputs`` is one name.

        Raises:
          ValueError: a feed that is not a graph input or initializer, or that
            does not match the input's declared shape or dtype; a graph input
            the outputs need that is not fed; an invalid graph
            (:meth:`~optkit.Graph.validate`); an integer or boolean value fed for a
            Gradient's ``xs``.
          TypeError: ``feeds`` is not a mapping.
        """
        if not isinstance(feeds, Mapping):
            raise TypeError(f"feeds must be a mapping from tensor names to values, got "
                            f"{type(feeds).__name__}; as_function() takes positional values")
        names, single, runner = self._requested(outputs)
        for name, value in feeds.items():
            self._tensors.check_feed(name, value if check_feeds else None)
        env = dict(self._tensors.initializers)
        env.update(feeds)
        runner.run(runner.plan(names, frozenset(env)), env)
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
          ValueError: as :meth:`~optkit.Graph.evaluate`, at once for names and graph errors,
            at call time for values; also a wrong number of values.
        """
        inputs = self.inputs if inputs is None else check_names("inputs", inputs)
        for name in inputs:
            self._tensors.check_feed(name, None)  # a name that cannot be fed raises, naming it
        names, single, _ = self._requested(outputs)

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
