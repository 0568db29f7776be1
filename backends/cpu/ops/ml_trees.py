"""The tree ensembles of the ai.onnx.ml domain: TreeEnsemble (opset 5) and TreeEnsembleRegressor (opsets
1, 3 and 5), both read into one Forest of branch nodes and leaves, then scored with ml_scoring.py's post
transforms.

Where the spec is explicit it is followed even where onnxruntime differs: TreeEnsemble's post_transform enum
(1 is SOFTMAX, 2 LOGISTIC), base values added to every target (also one no leaf voted for). Where it is
silent and implementations disagree, the run is refused: MIN/MAX of a target no leaf voted for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .ml import F32, ML, is_string
from .ml_scoring import POST_TRANSFORMS, check_post_transform, post_transform

AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
_COMPARE = (np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal)


class Forest:
    """Trees of branch nodes and leaves. A child or a root is a node position, or a leaf index when flagged.

    Each leaf holds a run of (target, weight) votes: votes_start[leaf] .. votes_start[leaf + 1].
    """

    def __init__(self, feature, mode, true_id, true_leaf, false_id, false_leaf, missing_true, members,
                 root_id, root_leaf, votes_start, vote_target, vote_weight, n_targets, aggregate):
        self.feature = np.asarray(feature, dtype=np.int64)
        self.mode = np.asarray(mode, dtype=np.int64)
        self.true_id = np.asarray(true_id, dtype=np.int64)
        self.true_leaf = np.asarray(true_leaf, dtype=bool)
        self.false_id = np.asarray(false_id, dtype=np.int64)
        self.false_leaf = np.asarray(false_leaf, dtype=bool)
        self.missing_true = np.asarray(missing_true, dtype=bool)
        self.members = members  # node position -> array of set members
        self.root_id = np.asarray(root_id, dtype=np.int64)
        self.root_leaf = np.asarray(root_leaf, dtype=bool)
        self.votes_start = np.asarray(votes_start, dtype=np.int64)
        self.vote_target = np.asarray(vote_target, dtype=np.int64)
        self.vote_weight = np.asarray(vote_weight, dtype=np.float64)
        self.n_targets = int(n_targets)
        if self.n_targets <= 0:
            raise Unsupported(f"n_targets {n_targets}")
        self.aggregate = aggregate
        n_nodes, n_leaves = self.feature.size, self.votes_start.size - 1
        for ids, leaf, what in ((self.true_id, self.true_leaf, "true"), (self.false_id, self.false_leaf, "false"),
                                (self.root_id, self.root_leaf, "root")):
            lim = np.where(leaf, n_leaves, n_nodes)
            if ((ids < 0) | (ids >= lim)).any():
                raise Unsupported(f"a {what} branch points past the {n_nodes} nodes / {n_leaves} leaves")
        if ((self.vote_target < 0) | (self.vote_target >= self.n_targets)).any():
            raise Unsupported(f"a leaf targets an index outside [0, {self.n_targets})")
        if (self.feature < 0).any():
            raise Unsupported("a negative feature id")
        if ((self.mode < 0) | (self.mode >= len(MODES))).any():
            raise Unsupported("an unknown node mode")

    def leaves(self, x: np.ndarray, split: np.ndarray) -> np.ndarray:
        """The leaf each row of x (N, F) reaches in each tree: (N, trees). split: thresholds in x's dtype."""
        n, n_trees = x.shape[0], self.root_id.size
        if self.feature.size and x.shape[1] <= int(self.feature.max()):
            raise ValueError(f"the trees use feature {int(self.feature.max())}, the input has {x.shape[1]}")
        cur = np.tile(self.root_id, n)
        at_leaf = np.tile(self.root_leaf, n)
        row = np.repeat(np.arange(n), n_trees)
        act = np.flatnonzero(~at_leaf)
        for _ in range(self.feature.size + 1):
            if act.size == 0:
                break
            nd = cur[act]
            v = x[row[act], self.feature[nd]]
            cond = self._cond(v, nd, split)
            cur[act] = np.where(cond, self.true_id[nd], self.false_id[nd])
            leaf = np.where(cond, self.true_leaf[nd], self.false_leaf[nd])
            act = act[~leaf]
        else:
            raise ValueError("the trees have a cycle")
        return cur.reshape(n, n_trees)

    def _cond(self, v: np.ndarray, nd: np.ndarray, split: np.ndarray) -> np.ndarray:
        mode = self.mode[nd]
        s = split[nd]
        cond = np.zeros(nd.size, dtype=bool)
        with np.errstate(invalid="ignore"):
            for code, fn in enumerate(_COMPARE):
                sel = mode == code
                if sel.any():
                    cond[sel] = fn(v[sel], s[sel])
        sel = np.flatnonzero(mode == 6)
        if sel.size:
            for node in np.unique(nd[sel]):
                at = sel[nd[sel] == node]
                cond[at] = np.isin(v[at], self.members[int(node)].astype(v.dtype))
        miss = self.missing_true[nd]
        if miss.any():
            cond |= miss & np.isnan(v)
        return cond

    def scores(self, x: np.ndarray, split: np.ndarray) -> np.ndarray:
        """Aggregated (N, n_targets) float64 scores, before base values and post transforms."""
        n, t = x.shape[0], self.n_targets
        leaf = self.leaves(x, split).reshape(-1)
        n_trees = self.root_id.size
        start = self.votes_start[leaf]
        count = self.votes_start[leaf + 1] - start
        rows = np.repeat(np.arange(n).repeat(n_trees), count)
        offs = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        votes = np.repeat(start, count) + offs
        cell = rows * t + self.vote_target[votes]
        w = self.vote_weight[votes]
        if self.aggregate in ("SUM", "AVERAGE"):
            out = np.bincount(cell, weights=w, minlength=n * t).astype(np.float64)
            if self.aggregate == "AVERAGE":
                out /= max(n_trees, 1)
        else:
            out = np.full(n * t, np.inf if self.aggregate == "MIN" else -np.inf)
            (np.minimum if self.aggregate == "MIN" else np.maximum).at(out, cell, w)
            has = np.bincount(cell, minlength=n * t) > 0
            if not has.all():
                # onnxruntime scores 0 there, the onnx reference the float extreme; the spec says nothing.
                bad = int(np.flatnonzero(~has)[0])
                raise ValueError(f"no leaf voted for target {bad % t} of row {bad // t}: "
                                 f"{self.aggregate} of no values is undefined")
        return out.reshape(n, t)


def _float_array(v: Any) -> np.ndarray:
    return np.asarray(v).reshape(-1)


def _tree_input(x: np.ndarray, op_type: str) -> np.ndarray:
    if is_string(x) or x.dtype.kind not in "iuf":
        raise TypeError(f"{op_type} does not take {x.dtype}")
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"{op_type} takes an (N, F) input, got shape {x.shape}")
    return x


class TreeEnsemble(CpuOp):
    """ai.onnx.ml opset 5: nodes and leaves in separate attribute tuples, integer enums."""

    def __init__(self, node, inputs, outputs, tree_roots=None, nodes_featureids=None, nodes_splits=None,
                 nodes_modes=None, nodes_truenodeids=None, nodes_trueleafs=None, nodes_falsenodeids=None,
                 nodes_falseleafs=None, nodes_missing_value_tracks_true=None, nodes_hitrates=None,
                 membership_values=None, leaf_targetids=None, leaf_weights=None, n_targets=None,
                 aggregate_function=1, post_transform=0):
        super().__init__(node, inputs, outputs)
        need = {"tree_roots": tree_roots, "nodes_featureids": nodes_featureids, "nodes_splits": nodes_splits,
                "nodes_modes": nodes_modes, "nodes_truenodeids": nodes_truenodeids,
                "nodes_trueleafs": nodes_trueleafs, "nodes_falsenodeids": nodes_falsenodeids,
                "nodes_falseleafs": nodes_falseleafs, "leaf_targetids": leaf_targetids,
                "leaf_weights": leaf_weights, "n_targets": n_targets}
        missing = [k for k, v in need.items() if v is None]
        if missing:
            raise Unsupported(f"missing attribute(s) {', '.join(missing)}")
        if aggregate_function not in range(4):
            raise Unsupported(f"aggregate_function {aggregate_function}")
        if post_transform not in range(5):
            raise Unsupported(f"post_transform {post_transform}")
        # The enum: NONE 0, SOFTMAX 1, LOGISTIC 2, SOFTMAX_ZERO 3, PROBIT 4 (onnxruntime swaps 1 and 2).
        self.how = check_post_transform(POST_TRANSFORMS[post_transform], int(n_targets))
        mode = _float_array(nodes_modes).astype(np.int64)
        splits = _float_array(nodes_splits)
        n = mode.size
        lists = [nodes_featureids, nodes_truenodeids, nodes_trueleafs, nodes_falsenodeids, nodes_falseleafs]
        if splits.size != n or any(len(a) != n for a in lists):
            raise Unsupported("the nodes_* attributes differ in length")
        miss = list(nodes_missing_value_tracks_true or [0] * n)
        if len(miss) != n:
            raise Unsupported("nodes_missing_value_tracks_true differs in length from the nodes")
        weights = _float_array(leaf_weights)
        targets = list(leaf_targetids)
        if weights.size != len(targets):
            raise Unsupported("leaf_targetids and leaf_weights differ in length")
        if weights.dtype.kind != "f" or splits.dtype.kind != "f":
            raise Unsupported("nodes_splits and leaf_weights must be float tensors")
        members: dict[int, np.ndarray] = {}
        member_nodes = np.flatnonzero(mode == 6)
        if member_nodes.size:
            if membership_values is None:
                raise Unsupported("BRANCH_MEMBER nodes without membership_values")
            mv = _float_array(membership_values)
            cuts = np.flatnonzero(np.isnan(mv))
            sets = np.split(mv, cuts)
            sets = [s[~np.isnan(s)] for s in sets]
            if mv.size and np.isnan(mv[-1]):
                sets = sets[:-1]
            if len(sets) < member_nodes.size:
                raise Unsupported(f"{member_nodes.size} BRANCH_MEMBER nodes but {len(sets)} membership sets")
            members = {int(nd): s for nd, s in zip(member_nodes, sets)}
        roots = np.asarray(tree_roots, dtype=np.int64)
        self.splits = splits
        self.forest = Forest(nodes_featureids, mode, nodes_truenodeids, nodes_trueleafs, nodes_falsenodeids,
                             nodes_falseleafs, miss, members, roots, np.zeros(roots.size, bool),
                             np.arange(weights.size + 1), targets, weights.astype(np.float64), n_targets,
                             AGGREGATES[aggregate_function])

    def run(self, x):
        x2 = _tree_input(x, "TreeEnsemble")
        if x2.dtype.kind != "f":
            raise TypeError(f"TreeEnsemble takes float, double or float16, not {x.dtype}")
        # Thresholds are rounded to the input's type; float16 then compares in float32.
        xc = x2.astype(np.float32) if x2.dtype == np.float16 else x2
        scores = self.forest.scores(xc, self.splits.astype(x2.dtype).astype(xc.dtype))
        return post_transform(scores, self.how).astype(x.dtype)


op("TreeEnsemble", 5, domain=ML)(TreeEnsemble)


class _NodeIndex:
    """Finds node positions by (tree id, node id); -1 where there is none."""

    def __init__(self, tree: np.ndarray, ids: np.ndarray):
        self.empty = tree.size == 0
        if self.empty:
            return
        self.t0, self.i0 = int(tree.min()), int(ids.min())
        self.span = int(ids.max()) - self.i0 + 1
        self.trees = int(tree.max()) - self.t0 + 1
        if self.trees * self.span >= 2 ** 62:
            raise Unsupported("tree and node ids too far apart")
        key = (tree - self.t0) * self.span + (ids - self.i0)
        self.order = np.argsort(key, kind="stable")
        self.keys = key[self.order]
        same = self.keys[1:] == self.keys[:-1]
        if same.any():
            k = self.order[int(np.flatnonzero(same)[0])]
            raise Unsupported(f"node (tree {tree[k]}, id {ids[k]}) appears twice")

    def __call__(self, tree: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.full(tree.shape, -1, dtype=np.int64)
        if self.empty:
            return out
        ok = (tree >= self.t0) & (tree - self.t0 < self.trees) & (ids >= self.i0) & (ids - self.i0 < self.span)
        q = np.where(ok, (tree - self.t0) * self.span + (ids - self.i0), 0)
        j = np.minimum(np.searchsorted(self.keys, q), self.keys.size - 1)
        hit = ok & (self.keys[j] == q)
        out[hit] = self.order[j[hit]]
        return out


class TreeEnsembleRegressor(CpuOp):
    """ai.onnx.ml opsets 1, 3, 5: nodes keyed by (tree id, node id), string enums, votes at LEAF nodes."""

    def __init__(self, node, inputs, outputs, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                 n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                 nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                 nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                 nodes_values_as_tensor=None, post_transform="NONE", target_ids=None, target_nodeids=None,
                 target_treeids=None, target_weights=None, target_weights_as_tensor=None):
        super().__init__(node, inputs, outputs)
        if node.opset < 3 and any(v is not None for v in (base_values_as_tensor, nodes_hitrates_as_tensor,
                                                           nodes_values_as_tensor, target_weights_as_tensor)):
            raise Unsupported(f"the *_as_tensor attributes need opset 3, the model has {node.opset}")
        if aggregate_function not in AGGREGATES:
            raise Unsupported(f"aggregate_function {aggregate_function!r}")
        if post_transform not in POST_TRANSFORMS:
            raise Unsupported(f"post_transform {post_transform!r}")
        if n_targets is None:
            raise Unsupported("n_targets is missing")
        self.how = check_post_transform(post_transform, int(n_targets))
        values = self._one(nodes_values, nodes_values_as_tensor, "nodes_values")
        weights = self._one(target_weights, target_weights_as_tensor, "target_weights")
        base = self._one(base_values, base_values_as_tensor, "base_values")
        modes = list(nodes_modes or [])
        n = len(modes)
        codes = {m: i for i, m in enumerate(MODES[:6])}
        codes["LEAF"] = -1
        unknown = set(modes) - set(codes)
        if unknown:
            raise Unsupported(f"node mode(s) {sorted(unknown)}")
        mode = np.fromiter((codes[m] for m in modes), dtype=np.int64, count=n)
        tree, ids, feat, tru, fal = (np.asarray(v or [], dtype=np.int64) for v in (
            nodes_treeids, nodes_nodeids, nodes_featureids, nodes_truenodeids, nodes_falsenodeids))
        if values is None:
            values = np.zeros(n)
        miss = np.asarray(nodes_missing_value_tracks_true or [0] * n, dtype=bool)
        if any(a.size != n for a in (tree, ids, feat, tru, fal, miss, values)):
            raise Unsupported("the nodes_* attributes differ in length")
        find = _NodeIndex(tree, ids)
        is_leaf = mode < 0
        branch = np.flatnonzero(~is_leaf)
        rank = np.zeros(n, dtype=np.int64)  # a node's index among the branches, or among the leaves
        rank[branch] = np.arange(branch.size)
        rank[is_leaf] = np.arange(n - branch.size)

        def refs(trees: np.ndarray, node_ids: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
            j = find(trees, node_ids)
            if (j < 0).any():
                k = int(np.flatnonzero(j < 0)[0])
                raise Unsupported(f"{what} (tree {trees[k]}, node {node_ids[k]}) does not exist")
            return rank[j], is_leaf[j]

        t_ids, t_leaf = refs(tree[branch], tru[branch], "a true branch to")
        f_ids, f_leaf = refs(tree[branch], fal[branch], "a false branch to")
        trees = np.unique(tree)
        root_id, root_leaf = refs(trees, np.zeros_like(trees), "the root")  # node ids start at 0
        # Votes, grouped by leaf.
        tt, tn, ti = (np.asarray(v or [], dtype=np.int64) for v in (target_treeids, target_nodeids, target_ids))
        if weights is None:
            weights = np.zeros(0)
        if not (tt.size == tn.size == ti.size == weights.size):
            raise Unsupported("the target_* attributes differ in length")
        leaf_k, voted_leaf = refs(tt, tn, "a vote for")
        if not voted_leaf.all():
            raise Unsupported("a vote for a node that is not a leaf")
        order = np.argsort(leaf_k, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(leaf_k, minlength=n - branch.size))]).astype(np.int64)
        self.forest = Forest(feat[branch], mode[branch], t_ids, t_leaf, f_ids, f_leaf, miss[branch], {}, root_id,
                             root_leaf, starts, ti[order], weights.astype(np.float64)[order], n_targets,
                             aggregate_function)
        self.split = values[branch]
        if base is not None and base.size not in (0, int(n_targets)):
            raise Unsupported(f"{base.size} base values for {n_targets} targets")
        self.base = None if base is None or base.size == 0 else base.astype(np.float64)

    @staticmethod
    def _one(plain: Any, tensor: Any, name: str) -> np.ndarray | None:
        if plain is not None and tensor is not None:
            raise Unsupported(f"both {name} and {name}_as_tensor are set")
        if tensor is not None:
            return _float_array(tensor)
        if plain is not None:
            return np.asarray(plain, dtype=np.float32)
        return None

    def run(self, x):
        x2 = _tree_input(x, "TreeEnsembleRegressor")
        # float inputs compare in float, the others in double.
        xc = x2 if x2.dtype == F32 else x2.astype(np.float64)
        scores = self.forest.scores(xc, self.split.astype(xc.dtype))
        if self.base is not None:
            scores = scores + self.base
        return post_transform(scores, self.how).astype(F32)


op("TreeEnsembleRegressor", 1, domain=ML)(TreeEnsembleRegressor)
