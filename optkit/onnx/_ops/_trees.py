"""Tree ensembles as arrays, shared by the ``ai.onnx.ml`` tree operators (:mod:`~optkit.onnx._ops.ml`):
``TreeEnsembleRegressor`` and ``TreeEnsembleClassifier`` (versions 1 and 3: nodes named by tree and node ids,
leaf weights listed per class or target) and ``TreeEnsemble`` (version 5: nodes and leaves indexed apart, each
leaf one weight of one target, set membership splits). Either is held as one global index over the nodes (and,
for version 5, the leaves after them), walked by every row of X at once for as many steps as the deepest tree
(``Trees.leaves``)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from optkit.onnx._ops._common import aligned, take

# Comparison codes: version 1/3's ``nodes_modes`` strings in this order, version 5's integers 0-5 the same;
# LEAF stays where it is, MEMBER (version 5's 6) is "x is one of the node's set".
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "LEAF")
LEAF, MEMBER = 6, 7


@dataclasses.dataclass
class Trees:
    """A tree ensemble: per global index its comparison ``mode``, ``feature``, threshold ``value``, where a
    missing value (NaN) goes (``missing_true``), its ``true`` and ``false`` successors; each tree's ``roots``
    index; ``weights`` (index, outputs) added where a row ends; ``members`` (index, k) the NaN-padded set of a
    MEMBER node, or None; ``depth`` the longest root-to-leaf path."""

    mode: np.ndarray
    feature: np.ndarray
    value: np.ndarray
    missing_true: np.ndarray
    true: np.ndarray
    false: np.ndarray
    roots: np.ndarray
    weights: np.ndarray
    reached: np.ndarray  # (index, outputs) True where the index adds a weight to the output
    members: np.ndarray | None = None
    depth: int = 0

    def __post_init__(self):
        depth = {int(r): 0 for r in self.roots}
        order = list(depth)
        while order:
            i = order.pop()
            if self.mode[i] != LEAF:
                for c in (int(self.true[i]), int(self.false[i])):
                    if c not in depth:
                        depth[c] = depth[i] + 1
                        order.append(c)
        self.depth = max(depth.values(), default=0)

    @classmethod
    def from_nodes(cls, ctx, outputs: int, prefix: str) -> Trees:
        """Versions 1 and 3: ``nodes_*`` by (tree id, node id); the leaves' weights from ``<prefix>_*``
        (``target`` or ``class``)."""
        a = ctx.attrs
        if "nodes_values_as_tensor" in a or f"{prefix}_weights_as_tensor" in a:
            raise ctx.unsupported("the *_as_tensor attributes (double thresholds) are not run")
        trees, ids = np.asarray(a["nodes_treeids"], np.int64), np.asarray(a["nodes_nodeids"], np.int64)
        key = {(int(t), int(n)): i for i, (t, n) in enumerate(zip(trees, ids))}
        modes = [m.decode() if isinstance(m, bytes) else m for m in a["nodes_modes"]]
        bad = sorted(set(modes) - set(MODES))
        if bad:
            raise ctx.error(f"unknown nodes_modes {bad}")
        count = len(ids)
        mode = np.asarray([MODES.index(m) for m in modes], np.int32)
        missing = a.get("nodes_missing_value_tracks_true")

        def child(name):
            out = np.zeros(count, np.int64)
            for i, (t, n) in enumerate(zip(trees, a.get(name, [0] * count))):
                out[i] = key.get((int(t), int(n)), i) if mode[i] != LEAF else i
            return out

        first: dict[int, int] = {}  # each tree's root: its smallest node id
        for t, n in key:
            first[t] = min(n, first.get(t, n))
        weights = np.zeros((count, outputs), np.float64)
        for t, n, o, w in zip(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"], a[f"{prefix}_ids"],
                              a[f"{prefix}_weights"]):
            if not 0 <= int(o) < outputs:
                raise ctx.error(f"{prefix}_ids {int(o)} is outside the {outputs} outputs")
            if (int(t), int(n)) not in key:
                raise ctx.error(f"{prefix}_treeids/{prefix}_nodeids ({int(t)}, {int(n)}) name no node of "
                                f"nodes_treeids/nodes_nodeids")
            weights[key[(int(t), int(n))], int(o)] += w
        return cls(mode, np.asarray(a.get("nodes_featureids", [0] * count), np.int64),
                   np.asarray(a.get("nodes_values", [0.0] * count), np.float64),
                   np.asarray(missing if missing else [0] * count, bool), child("nodes_truenodeids"),
                   child("nodes_falsenodeids"), np.asarray([key[(t, first[t])] for t in sorted(first)], np.int64),
                   weights, weights != 0)

    @classmethod
    def from_leaves(cls, ctx, outputs: int) -> Trees:
        """Version 5: nodes 0..K-1 (``nodes_*``, ``tree_roots`` into them), then the leaves K..K+L-1
        (``leaf_weights`` to ``leaf_targetids``); a branch goes to a leaf where ``nodes_trueleafs`` /
        ``nodes_falseleafs`` says so. MEMBER nodes take their sets from ``membership_values`` in node order,
        each ended by a NaN."""
        a = ctx.attrs
        mode = np.asarray(a["nodes_modes"], np.int32).reshape(-1)
        count = len(mode)
        if np.any((mode < 0) | (mode > 6)):
            raise ctx.error(f"nodes_modes must be 0-6, got {sorted(set(mode.tolist()) - set(range(7)))}")
        mode = np.where(mode == 6, MEMBER, mode).astype(np.int32)
        leaf_weights = np.asarray(a["leaf_weights"], np.float64).reshape(-1)
        targets = np.asarray(a["leaf_targetids"], np.int64)
        if len(targets) != len(leaf_weights) or np.any((targets < 0) | (targets >= outputs)):
            raise ctx.error(f"leaf_targetids must give each of the {len(leaf_weights)} leaf weights a target in "
                            f"0..{outputs - 1}")

        def successors(ids, leafs):
            ids, leafs = np.asarray(a[ids], np.int64), np.asarray(a[leafs], bool)
            if len(ids) != count or len(leafs) != count:
                raise ctx.error(f"{ids} and {leafs} must have one entry per node ({count})")
            bound = np.where(leafs, len(leaf_weights), count)
            if np.any((ids < 0) | (ids >= bound)):
                raise ctx.error("a node's successor is outside the nodes or leaves")
            return np.where(leafs, ids + count, ids)

        true, false = successors("nodes_truenodeids", "nodes_trueleafs"), successors("nodes_falsenodeids",
                                                                                      "nodes_falseleafs")
        total = count + len(leaf_weights)
        weights = np.zeros((total, outputs), np.float64)
        reached = np.zeros((total, outputs), bool)
        weights[count + np.arange(len(leaf_weights)), targets] = leaf_weights
        reached[count + np.arange(len(leaf_weights)), targets] = True
        members = None
        if np.any(mode == MEMBER):
            values = np.asarray(a.get("membership_values", []), np.float64).reshape(-1)
            ends = np.flatnonzero(np.isnan(values))
            if len(ends) != int(np.sum(mode == MEMBER)):
                raise ctx.error("membership_values must hold one NaN-ended set per set membership node")
            sets, start = [], 0
            for end in ends:
                sets.append(values[start:end])
                start = end + 1
            members = np.full((total, max(1, max(len(m) for m in sets))), np.nan)
            for i, m in zip(np.flatnonzero(mode == MEMBER), sets):
                members[i, :len(m)] = m
        pad = np.zeros(total - count)
        missing = a.get("nodes_missing_value_tracks_true")
        roots = np.asarray(a["tree_roots"], np.int64)
        if np.any((roots < 0) | (roots >= count)):
            raise ctx.error("tree_roots must index nodes")
        return cls(np.concatenate([mode, np.full(total - count, LEAF, np.int32)]),
                   np.concatenate([np.asarray(a["nodes_featureids"], np.int64), pad.astype(np.int64)]),
                   np.concatenate([np.asarray(a["nodes_splits"], np.float64).reshape(-1), pad]),
                   np.concatenate([np.asarray(missing if missing else np.zeros(count), bool), pad.astype(bool)]),
                   np.concatenate([true, count + np.arange(total - count)]),
                   np.concatenate([false, count + np.arange(total - count)]), roots, weights, reached, members)

    def leaves(self, x):
        """(N, trees) the index where each row ends in each tree."""
        node = jnp.broadcast_to(jnp.asarray(self.roots), (x.shape[0], len(self.roots)))
        node = aligned((x, node), skip=(1,))[1]  # (split as the rows are, under explicit mesh axes)
        mode, feature = jnp.asarray(self.mode), jnp.asarray(self.feature)
        value = jnp.asarray(self.value, x.dtype)
        true, false, missing_true = jnp.asarray(self.true), jnp.asarray(self.false), jnp.asarray(self.missing_true)
        members = None if self.members is None else jnp.asarray(self.members, x.dtype)
        for _ in range(self.depth):
            m, v = take(mode, node, 0), take(value, node, 0)
            f = jnp.take_along_axis(x, take(feature, node, 0), axis=1)
            go = jnp.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                            [f <= v, f < v, f >= v, f > v, f == v, f != v], False)
            if members is not None:
                go = jnp.where(m == MEMBER, jnp.any(take(members, node, 0) == f[..., None], axis=-1), go)
            go = jnp.where(jnp.isnan(f), take(missing_true, node, 0), go)
            node = jnp.where(m == LEAF, node, jnp.where(go, take(true, node, 0), take(false, node, 0)))
        return node
