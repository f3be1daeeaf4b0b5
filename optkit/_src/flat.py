"""Parameters kept as one contiguous buffer per dtype, so that an optimizer step over
thousands of parameter arrays handles a few arrays instead.

Why: a jitted step pays a fixed cost for every array passed in or out (about
2.5 microseconds each on a 2-core CPU) and XLA compiles a kernel or three per
array (minutes for 10000 arrays). ONNX's training operators view several
tensors as one concatenated tensor (SPEC.md section 1); for element-wise
optimizers that view gives the same numbers, so keeping the parameters
concatenated *across steps* (not concatenating them at every step) removes the
per-array costs. Parameters, gradients and optimizer state then all have the
shape of :class:`FlatParams`: one 1-D array per dtype.

This is a switch, not the default: one buffer lives on one device, so it does
not fit parameters sharded over several devices (keep those per leaf, the
default), and it only gives per-leaf results for transformations that treat
every element alike (see :class:`FlatParams`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import DictKey, PyTreeDef

from optkit._src import trees

__all__ = ["FlatParams", "refuse_flat"]


class _Layout:
    """Where each leaf of a tree lives in the per-dtype buffers (static, hashable pytree aux data).

    ``leaves[i] = (group, offset, shape)`` for the i-th leaf in ``treedef``
    order; ``dtypes[group]`` is that buffer's dtype and ``sizes[group]`` its
    length. Equality compares the tree structure, dtypes, offsets and shapes.
    """

    __slots__ = ("treedef", "dtypes", "sizes", "leaves", "_key", "_hash")

    treedef: PyTreeDef
    dtypes: tuple[np.dtype, ...]
    sizes: tuple[int, ...]
    leaves: tuple[tuple[int, int, tuple[int, ...]], ...]

    def __init__(
        self,
        treedef: PyTreeDef,
        dtypes: tuple[np.dtype, ...],
        sizes: tuple[int, ...],
        leaves: tuple[tuple[int, int, tuple[int, ...]], ...],
    ):
        self.treedef = treedef
        self.dtypes = dtypes
        self.sizes = sizes
        self.leaves = leaves
        self._key = (treedef, dtypes, sizes, leaves)
        # jit hashes and compares the aux data of its arguments at every call;
        # with thousands of leaves that must not be recomputed each time.
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, _Layout) and self._hash == other._hash and self._key == other._key

    def shapes_tree(self) -> Any:
        """The tree of ``jax.ShapeDtypeStruct`` this layout stores (for checks and messages)."""
        return self.treedef.unflatten(
            [jax.ShapeDtypeStruct(shape, self.dtypes[group]) for group, _, shape in self.leaves]
        )

    def __repr__(self) -> str:
        groups = ", ".join(f"{d.name}[{n}]" for d, n in zip(self.dtypes, self.sizes))
        return f"{groups} from {len(self.leaves)} leaves"


def _is_tracer(leaf: Any) -> bool:
    return isinstance(leaf, jax.core.Tracer)


def _device_of(leaves_with_paths: Sequence[tuple[Any, Any]]):
    """The one device the concrete jax arrays among the leaves are committed to, or None.

    Raises ValueError (naming the leaf) for a leaf sharded over several devices
    or for leaves committed to different devices.
    """
    device, first_path = None, None
    for path, leaf in leaves_with_paths:
        if not isinstance(leaf, jax.Array) or _is_tracer(leaf):
            continue
        devices = leaf.sharding.device_set
        if len(devices) > 1:
            raise ValueError(
                f"FlatParams keeps one buffer per dtype on one device, but the leaf at "
                f"{trees.keystr(path)} is sharded over {len(devices)} devices; keep sharded "
                f"parameters per leaf (the default path)"
            )
        if not leaf.committed:
            continue
        (leaf_device,) = devices
        if device is None:
            device, first_path = leaf_device, path
        elif leaf_device != device:
            raise ValueError(
                f"FlatParams needs every leaf on one device: the leaf at {trees.keystr(path)} is on "
                f"{leaf_device} but the leaf at {trees.keystr(first_path)} is on {device}"
            )
    return device


def _build_buffers(layout: _Layout, leaves: list[Any], device) -> tuple[Any, ...]:
    """Concatenate ``leaves`` (in ``layout.treedef`` order) into the layout's buffers."""
    groups: list[list[Any]] = [[] for _ in layout.dtypes]
    for leaf, (group, _, _) in zip(leaves, layout.leaves):
        groups[group].append(leaf)
    if any(_is_tracer(leaf) for leaf in leaves):
        # Inside a traced function: one concatenate per dtype in the program.
        return tuple(
            jnp.concatenate([jnp.ravel(jnp.asarray(x, dtype)) for x in group])
            for group, dtype in zip(groups, layout.dtypes)
        )
    # Concrete arrays: concatenate on the host (jnp.concatenate of thousands of
    # operands compiles for tens of seconds), then one transfer per dtype.
    return tuple(
        _to_device(np.concatenate([np.ravel(np.asarray(x)).astype(dtype, copy=False) for x in group]), device)
        for group, dtype in zip(groups, layout.dtypes)
    )


def _to_device(host: np.ndarray, device) -> jax.Array:
    """A device array that owns a copy of ``host``.

    ``jax.device_put`` of a NumPy array may alias its memory on CPU (and
    ``np.asarray`` of a CPU array aliases the device buffer); an owned copy
    keeps later in-place (donated) updates from reaching other arrays.
    """
    array = jnp.asarray(host)  # copies
    if device is not None and array.sharding.device_set != {device}:
        array = jax.device_put(array, device)
    return array


@jax.tree_util.register_pytree_with_keys_class
class FlatParams(Mapping[str, Any]):
    """A pytree of parameters stored as one contiguous 1-D buffer per dtype.

    The per-leaf tree is a view: :meth:`~optkit.FlatParams.to_tree` slices it back out. Because
    :class:`FlatParams` is itself a pytree whose leaves are the buffers, every
    Optax transformation, ``jax.grad``, ``jax.jit`` and ``optax.apply_updates``
    work on it unchanged, and see one array per dtype instead of one per
    parameter: gradients and optimizer state come out as :class:`FlatParams`
    of the same layout. Keep the parameters in this form across steps (build it
    once with :meth:`~optkit.FlatParams.from_tree`); the model reads ``flat.to_tree()`` inside the
    jitted step, where XLA fuses the slices into their consumers.

    Same numbers as per leaf: for transformations that treat every element
    alike, a step on :class:`FlatParams` computes the per-leaf formula on the
    same values. ``optkit.adam``, ``optkit.adagrad`` and ``optkit.momentum``
    give the per-leaf results bit for bit (tested at every alignment); other
    element-wise transformations (``optax.sgd``, ``optax.adam``, schedules)
    agree to float rounding, and those with a global reduction
    (``optax.clip_by_global_norm``) up to the summation order. Transformations
    that look at each parameter's shape or treat parameters separately do NOT
    give per-leaf results: Adafactor (it factors matrices), per-layer trust
    ratios (LARS, LAMB), per-leaf clipping, and masks by tree path
    (``optax.masked``, weight-decay masks). Use the per-leaf tree for those.

    Buffers: one per distinct dtype among the leaves, in order of first
    appearance in ``jax.tree.leaves`` order; each leaf occupies
    ``size(leaf)`` consecutive elements (row-major), no padding. The pytree
    key of a buffer is its dtype's name, e.g. ``flat["float32"]``: a
    FlatParams is a read-only ``Mapping[str, jax.Array]`` from dtype names to
    buffers, so type checkers accept it wherever Optax expects parameters or
    updates (``tx.init``, ``tx.update``, ``optax.apply_updates``). It is
    compared and hashed by identity.

    Not for sharded parameters: a buffer lives on one device. The default
    per-leaf path is the one to shard.

    Attributes:
      buffers: tuple of 1-D ``jax.Array``, one per dtype.
      dtypes: tuple of the buffers' ``numpy.dtype``.
      treedef: the ``PyTreeDef`` of the per-leaf tree.
      num_leaves: number of leaves of the per-leaf tree.
      size: total number of elements.

    Example:
      >>> import jax, jax.numpy as jnp, optax, optkit
      >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
      >>> flat = optkit.FlatParams.from_tree(params)
      >>> flat
      FlatParams(float32[8] from 2 leaves)
      >>> tx = optkit.adam(1e-3)
      >>> state = tx.init(flat)
      >>> @jax.jit
      ... def step(flat, state):
      ...     loss = lambda f: jnp.sum(f.to_tree()["w"] ** 2)
      ...     grads = jax.grad(loss)(flat)           # a FlatParams too
      ...     updates, state = tx.update(grads, state, flat)
      ...     return optax.apply_updates(flat, updates), state
      >>> flat, state = step(flat, state)
      >>> flat.to_tree()["w"].shape
      (3, 2)
    """

    __slots__ = ("_buffers", "_layout")

    def __init__(self, buffers: Sequence[Any], layout: _Layout):
        """Internal: use :meth:`~optkit.FlatParams.from_tree` or :meth:`~optkit.FlatParams.pack`."""
        if not isinstance(layout, _Layout):
            raise TypeError("use FlatParams.from_tree(tree) to build a FlatParams")
        self._buffers = tuple(buffers)
        self._layout = layout

    # -- pytree protocol ------------------------------------------------------

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], _Layout]:
        """The pytree protocol: the buffers, keyed by dtype name, and the layout as aux data."""
        keys = [DictKey(dtype.name) for dtype in self._layout.dtypes]
        return list(zip(keys, self._buffers)), self._layout

    @classmethod
    def tree_unflatten(cls, layout: _Layout, children: Iterable[Any]) -> FlatParams:
        """The pytree protocol: a FlatParams of ``layout`` holding ``children`` as its buffers."""
        # Children may be anything a tree map produces (None, masks, tracers,
        # ShapeDtypeStruct): no checks here.
        obj = object.__new__(cls)
        obj._buffers = tuple(children)
        obj._layout = layout
        return obj

    # -- building and viewing -------------------------------------------------

    @classmethod
    def from_tree(cls, tree: Any) -> FlatParams:
        """Concatenate the leaves of ``tree`` into one 1-D buffer per dtype.

        Args:
          tree: a pytree of floating-point arrays (any shapes, including 0-d
            and empty; float16, bfloat16, float32, float64 with
            ``jax_enable_x64``), all on one device. NumPy arrays and Python
            floats are accepted (a Python float becomes float32). Inside
            ``jax.jit`` the leaves may be tracers.

        Returns:
          A :class:`FlatParams` holding copies of the leaves (the input is not
          modified); buffers are committed to the leaves' device if they were.

        Raises:
          ValueError: ``tree`` has no leaves; a leaf is sharded over several
            devices, or leaves are on different devices (the message names
            the leaf).
          TypeError: a leaf is not floating point (the message names it).

        Example:
          >>> import jax.numpy as jnp, optkit
          >>> flat = optkit.FlatParams.from_tree([jnp.ones(3), jnp.ones((2, 2), jnp.bfloat16)])
          >>> [b.shape for b in flat.buffers]
          [(3,), (4,)]
        """
        trees.check_floating(tree, "params")
        leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
        if not leaves_with_paths:
            raise ValueError(f"FlatParams.from_tree needs at least one array leaf, got {tree!r}")
        group_of: dict[np.dtype, int] = {}
        sizes: list[int] = []
        entries = []
        for _, leaf in leaves_with_paths:
            dtype = trees.leaf_dtype(leaf, canonical=True)
            shape = tuple(int(d) for d in np.shape(leaf))
            group = group_of.setdefault(dtype, len(group_of))
            if group == len(sizes):
                sizes.append(0)
            entries.append((group, sizes[group], shape))
            sizes[group] += int(np.prod(shape, dtype=np.int64))
        layout = _Layout(treedef, tuple(group_of), tuple(sizes), tuple(entries))
        device = _device_of(leaves_with_paths)
        return cls(_build_buffers(layout, [leaf for _, leaf in leaves_with_paths], device), layout)

    def pack(self, tree: Any) -> FlatParams:
        """``tree``'s values in this layout, e.g. gradients computed per leaf.

        Prefer gradients taken with respect to the :class:`FlatParams` itself
        (``jax.grad(lambda f: loss(f.to_tree()))(flat)``), which come out
        flat with no extra copy; ``pack`` concatenates.

        Args:
          tree: a pytree with the same structure, shapes and dtypes as
            ``self.to_tree()``.

        Returns:
          A :class:`FlatParams` with this layout.

        Raises:
          ValueError: structure or a shape differs (the message names the path).
          TypeError: a leaf's dtype differs from the layout's (named).

        Example:
          >>> import jax.numpy as jnp, optkit
          >>> flat = optkit.FlatParams.from_tree({"w": jnp.ones(2)})
          >>> grads = flat.pack({"w": jnp.array([0.5, -1.0])})
        """
        reference = self._layout.shapes_tree()
        trees.check_same_shapes(tree, reference, "tree", "the FlatParams layout")
        leaves_with_paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        for (path, leaf), (group, _, _) in zip(leaves_with_paths, self._layout.leaves):
            want = self._layout.dtypes[group]
            if trees.leaf_dtype(leaf, canonical=True) != want:
                raise TypeError(
                    f"tree leaf at {trees.keystr(path)} has dtype {trees.leaf_dtype(leaf, canonical=True)} but the "
                    f"FlatParams layout stores {want} there"
                )
        device = _device_of(leaves_with_paths)
        if device is None and not any(_is_tracer(b) for b in self._buffers):
            device = _device_of([((), b) for b in self._buffers])
        leaves = [leaf for _, leaf in leaves_with_paths]
        return FlatParams(_build_buffers(self._layout, leaves, device), self._layout)

    def to_tree(self) -> Any:
        """The per-leaf tree: each leaf sliced out of its buffer and reshaped.

        Inside ``jax.jit`` (the intended use: the model reads the parameters
        from the flat buffers in the step) the slices are one ``split`` per
        dtype that XLA fuses into their consumers; its transpose, under
        ``jax.grad``, is one concatenation, so the gradient comes out flat.
        Outside ``jit`` (checkpointing, inspection) the slices are taken on
        the host and transferred back, which avoids compiling a program with
        thousands of outputs.

        Returns:
          A pytree with the structure, shapes and dtypes given to
          :meth:`~optkit.FlatParams.from_tree`; new arrays (the buffers are not aliased).

        Example:
          >>> import jax.numpy as jnp, optkit
          >>> optkit.FlatParams.from_tree({"w": jnp.ones((2, 2))}).to_tree()["w"].shape
          (2, 2)
        """
        layout = self._layout
        if any(_is_tracer(b) for b in self._buffers):
            pieces = []
            for group, buffer in enumerate(self._buffers):
                offsets = [offset for g, offset, _ in layout.leaves if g == group][1:]
                pieces.append(iter(jnp.split(buffer, offsets)))
            leaves = [next(pieces[group]).reshape(shape) for group, _, shape in layout.leaves]
            return layout.treedef.unflatten(leaves)
        hosts = [np.asarray(b) for b in self._buffers]
        devices = [next(iter(b.sharding.device_set)) if isinstance(b, jax.Array) and b.committed else None
                   for b in self._buffers]
        leaves = [
            _to_device(hosts[group][offset : offset + int(np.prod(shape, dtype=np.int64))].reshape(shape),
                       devices[group])
            for group, offset, shape in layout.leaves
        ]
        return layout.treedef.unflatten(leaves)

    # -- accessors --------------------------------------------------------------

    @property
    def buffers(self) -> tuple[Any, ...]:
        """The 1-D buffers, one per dtype, in :attr:`dtypes` order."""
        return self._buffers

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
        """The buffers' dtypes, in order of first appearance among the leaves."""
        return self._layout.dtypes

    @property
    def treedef(self) -> PyTreeDef:
        """The ``PyTreeDef`` of the per-leaf tree."""
        return self._layout.treedef

    @property
    def num_leaves(self) -> int:
        """Number of leaves of the per-leaf tree."""
        return len(self._layout.leaves)

    @property
    def size(self) -> int:
        """Total number of elements over all buffers."""
        return int(sum(self._layout.sizes))

    def __getitem__(self, dtype: Any) -> Any:
        """The buffer of ``dtype`` (a dtype or its name, e.g. ``"float32"``)."""
        try:
            wanted = jnp.dtype(dtype)
        except TypeError:
            raise KeyError(
                f"FlatParams buffers are indexed by dtype (e.g. 'float32'), got {dtype!r}; "
                f"this FlatParams has {[d.name for d in self.dtypes]}"
            ) from None
        for d, buffer in zip(self._layout.dtypes, self._buffers):
            if d == wanted:
                return buffer
        raise KeyError(f"no {wanted} buffer; this FlatParams has {[d.name for d in self.dtypes]}")

    def __iter__(self) -> Iterator[str]:
        """The buffers' dtype names, in :attr:`dtypes` order (the keys of ``flat[...]``)."""
        return iter(d.name for d in self._layout.dtypes)

    def __len__(self) -> int:
        """The number of buffers (distinct dtypes)."""
        return len(self._buffers)

    def __eq__(self, other: object) -> bool:
        """Identity: a Mapping would compare items, elementwise for arrays."""
        return self is other

    def __hash__(self) -> int:
        """By identity, as :meth:`__eq__`."""
        return id(self)

    def __repr__(self) -> str:
        return f"FlatParams({self._layout!r})"


def refuse_flat(tree: Any, transformation: str) -> None:
    """Raise ``TypeError`` if ``tree`` is, or holds, a :class:`FlatParams`.

    For transformations that are not element-wise (they read each
    parameter's shape or take statistics per parameter, as Adafactor does):
    over the concatenated buffers they would compute a different algorithm,
    with no error to show it.
    """
    found = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, FlatParams))
    if any(isinstance(x, FlatParams) for x in found):
        raise TypeError(
            f"{transformation}: got an optkit.FlatParams, which holds every parameter in one buffer per dtype; "
            f"{transformation} factors and normalizes each parameter by its own shape, so over FlatParams it "
            f"would compute another algorithm. Give it the per-leaf tree (flat.to_tree(), and gradients taken "
            f"with respect to it); FlatParams is for element-wise optimizers such as optkit.adam, adagrad "
            f"and momentum"
        )
