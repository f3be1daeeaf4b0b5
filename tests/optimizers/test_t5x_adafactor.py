"""``optkit.t5x_adafactor`` against T5X's Adafactor, and factor rules in ``optkit.adafactor`` (SPEC 5b).

- T5X: ``optax.apply_updates`` equals an independent NumPy transcription of
  ``t5x/adafactor.py`` (tests/oracles.py, ``T5XAdafactor``) step by step for
  20 steps, float32, within 1e-5 of each leaf's largest magnitude, for every
  option alone and combined, with and without factoring, on 0-D, 1-D, 2-D,
  rank-3 and stacked parameters, jitted and not.
- Stacked layers: ``L`` layers stacked into one ``[L, n, m]`` parameter with a
  batch axis train as the same ``L`` layers kept separate, for every option.
- Flax NNX: blocks made by ``nnx.vmap`` with ``transform_metadata`` and run by
  ``nnx.scan`` train as the same blocks unrolled, names read from the metadata.
- The state: only arrays that exist (T5X's bytes without its placeholders),
  ``jax.eval_shape``, ``inject_hyperparams``, ``flax.serialization`` round trip.
- Bad input: a clear error naming the argument or the parameter's path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit
from tests.oracles import T5X_STANDARD_RULES, T5XAdafactor

STANDARD = optkit.t5x_standard_logical_factor_rules()

# A tree with every kind of parameter: nested paths "enc/..." as T5X joins them.
SHAPES = {
    "enc/scale": (),
    "enc/bias": (136,),
    "enc/kernel": (128, 136),    # factored by the heuristic (both >= 128), the larger axis the columns
    "enc/small": (6, 4),         # too small for the heuristic at 128
    "dec/attn": (16, 4, 8),      # rank 3: needs a rule
    "dec/layers": (3, 12, 10),   # stacked layers: batch, row, column
    "dec/norms": (3, 10),        # stacked vectors: batch, none
}
LOGICAL = {
    "enc/scale": (), "enc/bias": ("mlp",), "enc/kernel": ("embed", "mlp"), "enc/small": ("embed", "heads"),
    "dec/attn": ("embed", "heads", "kv"), "dec/layers": ("layers", "embed", "mlp"),
    "dec/norms": ("layers", "layer_norm_scale"),
}
FACTOR_MAP = [
    (r"attn$", ("row", "col", "col")),
    (r"layers$", ("batch", "row", "col")),
    (r"norms$", ("batch", None)),
    (r"kernel$", ("col", "row")),  # rank 2 without a batch axis: T5X falls back to the heuristic
    (r".*", "heuristic"),
]
NO_RANK3 = [k for k, s in SHAPES.items() if len(s) <= 2]


def _nested(flat):
    out = {}
    for path, value in flat.items():
        a, b = path.split("/")
        out.setdefault(a, {})[b] = value
    return out


def _flat(tree):
    return {f"{a}/{b}": v for a, sub in tree.items() for b, v in sub.items()}


def _params(keys, seed=0):
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(SHAPES[k]) * 0.5).astype(np.float32) for k in keys}


def _grads(keys, step, nan_at=None):
    rng = np.random.default_rng(1000 + step)
    grads = {k: rng.standard_normal(SHAPES[k]).astype(np.float32) * (1 + step % 3) for k in keys}
    if nan_at is not None and step == nan_at:
        grads["enc/bias"] = grads["enc/bias"].copy()
        grads["enc/bias"][3] = np.nan
    return grads


CASES = {
    "defaults": dict(kw={}, keys=NO_RANK3),
    "min_dim 4": dict(kw=dict(min_dim_size_to_factor=4), keys=NO_RANK3),
    "factored False": dict(kw=dict(factored=False), keys=list(SHAPES)),
    "factor_map": dict(kw=dict(factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "logical rules": dict(kw=dict(logical_factor_rules=STANDARD), keys=list(SHAPES), logical=True),
    "beta1": dict(kw=dict(beta1=0.9, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "beta1 bfloat16 momentum": dict(kw=dict(beta1=0.8, dtype_momentum=jnp.bfloat16), keys=NO_RANK3),
    "decay_rate": dict(kw=dict(decay_rate=0.5), keys=NO_RANK3),
    "step_offset": dict(kw=dict(step_offset=3, factor_map=FACTOR_MAP), keys=list(SHAPES), start=5),
    "no clipping": dict(kw=dict(clipping_threshold=None, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "clipping 0.5": dict(kw=dict(clipping_threshold=0.5, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "weight decay": dict(kw=dict(weight_decay_rate=1e-2, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "lr exponent": dict(kw=dict(weight_decay_rate_lr_exponent=2.0), keys=NO_RANK3),
    "lr exponent and rate": dict(kw=dict(weight_decay_rate=0.5, weight_decay_rate_lr_exponent=1.0), keys=NO_RANK3),
    "global norm clip": dict(kw=dict(global_norm_clip_threshold=1.0, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "max parameter scale": dict(kw=dict(max_parameter_scale=0.05, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "no parameter scale": dict(kw=dict(multiply_by_parameter_scale=False), keys=NO_RANK3),
    "parameter scale by path": dict(kw=dict(multiply_by_parameter_scale=[(r"kernel", False), (r".*", True)]),
                                    keys=NO_RANK3),
    "epsilons": dict(kw=dict(epsilon1=1e-3, epsilon2=0.5, factor_map=FACTOR_MAP), keys=list(SHAPES)),
    "skip nan updates": dict(kw=dict(skip_nan_updates=True, beta1=0.5), keys=NO_RANK3, nan_at=4),
    "schedule": dict(kw=dict(factor_map=FACTOR_MAP), keys=list(SHAPES), schedule=True),
    "everything": dict(kw=dict(beta1=0.9, decay_rate=0.7, step_offset=2, clipping_threshold=0.8,
                               weight_decay_rate=1e-3, weight_decay_rate_lr_exponent=0.5,
                               global_norm_clip_threshold=2.0, max_parameter_scale=0.3, skip_nan_updates=True,
                               logical_factor_rules=STANDARD, epsilon2=1e-2), keys=list(SHAPES), logical=True,
                       nan_at=7, schedule=True, start=3),
}


def _schedule(count):
    return 0.02 / (1.0 + 0.1 * count)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", list(CASES))
def test_equals_t5x_step_by_step(name, jit):
    case = CASES[name]
    if not jit and name not in ("defaults", "factor_map", "logical rules", "everything"):
        pytest.skip("eager runs a representative subset (each leaf compiles its own step)")
    kw, keys = dict(case["kw"]), case["keys"]
    lr = _schedule if case.get("schedule") else 1e-2
    oracle_kw = {k: v for k, v in kw.items() if k != "dtype_momentum"}
    if "logical_factor_rules" in kw:
        oracle_kw["logical_factor_rules"] = T5X_STANDARD_RULES
    if "dtype_momentum" in kw:
        oracle_kw["dtype_momentum"] = np.dtype(jnp.bfloat16)
    oracle = T5XAdafactor(learning_rate=None if case.get("schedule") else lr, **oracle_kw)
    axes = None
    if case.get("logical"):
        oracle.set_param_axes({k: LOGICAL[k] for k in keys})
        axes = _nested({k: LOGICAL[k] for k in keys})
    tx = optkit.t5x_adafactor(lr, **kw, param_logical_axes=axes)
    params = _params(keys)
    start = case.get("start", 0)
    ref_params, ref_state = dict(params), oracle.init(params)
    ref_state["step"] = start
    tree = jax.tree.map(jnp.asarray, _nested(params))
    state = tx.init(tree)
    state = (state[0]._replace(count=jnp.asarray(start, jnp.int32)), state[1])
    update = jax.jit(tx.update) if jit else tx.update
    for step in range(start, start + 20):
        grads = _grads(keys, step, case.get("nan_at"))
        ref_params, ref_state = oracle.apply(ref_params, ref_state, grads,
                                             learning_rate=_schedule(step) if case.get("schedule") else None)
        updates, state = update(jax.tree.map(jnp.asarray, _nested(grads)), state, tree)
        tree = optax.apply_updates(tree, updates)
        for k, got in _flat(tree).items():
            want = ref_params[k]
            scale = max(float(np.max(np.abs(want))), 1e-30)
            np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5 * scale,
                                       err_msg=f"{name}: {k} at step {step}")
    # The statistics T5X keeps, and nothing more.
    for k in keys:
        a, b = k.split("/")
        node, ref = state[0].nu[a][b], ref_state["param_states"][k]
        if isinstance(node, optkit.FactoredSecondMoment):
            assert ref["v"] is None and node.v_row.shape == ref["v_row"].shape
            assert node.v_col.shape == ref["v_col"].shape
            np.testing.assert_allclose(node.v_row, ref["v_row"], rtol=2e-5, err_msg=k)
        else:
            assert ref["v_row"] is None and node.v.shape == ref["v"].shape
            np.testing.assert_allclose(node.v, ref["v"], rtol=2e-5, err_msg=k)
        assert node.v_row.dtype == jnp.float32 if hasattr(node, "v_row") else node.v.dtype == jnp.float32
        if "beta1" in kw:
            assert state[0].mu[a][b].dtype == kw.get("dtype_momentum", jnp.float32)
        else:
            assert state[0].mu is None


def test_the_standard_logical_factor_rules_are_t5xs():
    spelled = {"row": "row", "column": "col", "batch": "batch", "none": None}
    assert {k: spelled[v] for k, v in optkit.t5x_standard_logical_factor_rules().items()} == T5X_STANDARD_RULES
    optkit.t5x_standard_logical_factor_rules()["embed"] = "column"  # a fresh dict each call
    assert optkit.t5x_standard_logical_factor_rules()["embed"] == "row"


def test_state_bytes_are_t5xs_without_the_placeholders():
    keys = list(SHAPES)
    tx = optkit.t5x_adafactor(1e-2, beta1=0.9, logical_factor_rules=STANDARD,
                              param_logical_axes=_nested({k: LOGICAL[k] for k in keys}))
    state = tx.init(jax.tree.map(jnp.asarray, _nested(_params(keys))))
    oracle = T5XAdafactor(1e-2, beta1=0.9, logical_factor_rules=T5X_STANDARD_RULES)
    oracle.set_param_axes({k: LOGICAL[k] for k in keys})
    ref = oracle.init(_params(keys))
    t5x_bytes = sum(a.nbytes for s in ref["param_states"].values() for a in s.values() if a is not None)
    got = sum(a.nbytes for a in jax.tree.leaves(state))
    assert got == t5x_bytes + 4  # + the int32 count (T5X's step lives outside param_states)


# ------------------------------------------------------------------ factor rules in optkit.adafactor


L, N, M = 4, 24, 40

STACKED_OPTIONS = {
    "paper": {},
    "b1": dict(b1=0.9),
    "no clipping": dict(clipping_threshold=None),
    "clipping 0.3": dict(clipping_threshold=0.3),
    "fixed lr": dict(learning_rate=3e-3),
    "weight decay": dict(weight_decay_rate=0.1),
    "no parameter scale": dict(multiply_by_parameter_scale=False, learning_rate=1e-2),
    "eps": dict(eps1=1e-3, eps2=0.3),
    "all": dict(b1=0.8, learning_rate=optax.linear_schedule(1e-2, 1e-3, 10), clipping_threshold=0.5,
                weight_decay_rate=0.05, decay_rate=0.6),
}


@pytest.mark.parametrize("name", list(STACKED_OPTIONS) + ["cpu row-block loop", "cpu row-block loop, b1"])
def test_stacked_layers_train_as_separate_ones(name, monkeypatch):
    """[L, n, m] with ("batch", "row", "column") and [L, m] with ("batch", "none") equal L separate
    [n, m] and [m] parameters: statistics, RMS(X), RMS(U) and clipping per slice."""
    if name.startswith("cpu row-block loop"):  # the path large matrices take on CPU, for these small ones
        from optkit._src.adafactor import fast

        monkeypatch.setattr(fast, "LOOP_MIN_SIZE", 1)
        monkeypatch.setattr(fast, "BLOCK_ELEMENTS", 64)
    kw = STACKED_OPTIONS.get(name, {"b1": 0.9} if name.endswith("b1") else {})
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((L, N, M)) * np.linspace(0.1, 3, L)[:, None, None], jnp.float32)
    b = jnp.asarray(rng.standard_normal((L, M)) * np.linspace(3, 0.1, L)[:, None], jnp.float32)
    stacked = {"w": w, "b": b}
    separate = {f"w{i}": w[i] for i in range(L)} | {f"b{i}": b[i] for i in range(L)}
    tx_stacked = optkit.adafactor(**kw, logical_factor_rules={"layers": "batch", "embed": "row", "mlp": "column"},
                                  param_logical_axes={"w": ("layers", "embed", "mlp"), "b": ("layers", "mlp")})
    tx_separate = optkit.adafactor(**kw)
    s1, s2 = tx_stacked.init(stacked), tx_separate.init(separate)
    assert sum(a.size for a in jax.tree.leaves(s1)) == sum(a.size for a in jax.tree.leaves(s2))
    step1, step2 = jax.jit(tx_stacked.update), jax.jit(tx_separate.update)
    for _ in range(10):
        g = rng.standard_normal((L, N, M)).astype(np.float32) * np.geomspace(0.01, 10, L)[:, None, None]
        gb = rng.standard_normal((L, M)).astype(np.float32)
        u1, s1 = step1({"w": jnp.asarray(g), "b": jnp.asarray(gb)}, s1, stacked)
        u2, s2 = step2({f"w{i}": jnp.asarray(g[i]) for i in range(L)} | {f"b{i}": jnp.asarray(gb[i]) for i in range(L)},
                       s2, separate)
        stacked, separate = optax.apply_updates(stacked, u1), optax.apply_updates(separate, u2)
    for i in range(L):
        for k in "wb":
            got, want = np.asarray(stacked[k][i]), np.asarray(separate[f"{k}{i}"])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{k}[{i}]")


def test_whole_array_statistics_differ_from_per_slice_ones():
    """The test above can fail: without the batch rule the stacked parameter trains differently."""
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((L, N, M)) * np.linspace(0.1, 3, L)[:, None, None], jnp.float32)
    tx, state = optkit.adafactor(), None
    state = tx.init({"w": w})
    g = jnp.asarray(rng.standard_normal((L, N, M)) * np.geomspace(0.01, 10, L)[:, None, None], jnp.float32)
    u_whole, _ = tx.update({"w": g}, state, {"w": w})
    u_sep, _ = optkit.adafactor().update({"w": g[0]}, optkit.adafactor().init({"w": w[0]}), {"w": w[0]})
    assert not np.allclose(u_whole["w"][0], u_sep["w"], rtol=1e-3)


def test_several_row_and_column_axes_act_as_one_matrix():
    """[embed, heads, kv] with ("row", "column", "column") is the matrix embed x (heads*kv)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 4, 6)), jnp.float32)
    tx3 = optkit.adafactor(factor_map=[("attn", ("row", "column", "column"))])
    tx2 = optkit.adafactor()
    s3, s2 = tx3.init({"attn": x}), tx2.init({"attn": x.reshape(8, 24)})
    assert s3[0].nu["attn"].v_row.shape == (8,) and s3[0].nu["attn"].v_col.shape == (4, 6)
    for _ in range(3):
        g = jnp.asarray(rng.standard_normal((8, 4, 6)), jnp.float32)
        u3, s3 = tx3.update({"attn": g}, s3, {"attn": x})
        u2, s2 = tx2.update({"attn": g.reshape(8, 24)}, s2, {"attn": x.reshape(8, 24)})
        np.testing.assert_allclose(u3["attn"].reshape(8, 24), u2["attn"], rtol=1e-6)
    np.testing.assert_allclose(s3[0].nu["attn"].v_col.reshape(24), s2[0].nu["attn"].v_col, rtol=1e-6)


def test_without_rules_the_numbers_do_not_change():
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.standard_normal((3, 5, 7)), jnp.float32), "b": jnp.ones(7)}
    g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
    a = optkit.adafactor(b1=0.9).update(g, optkit.adafactor(b1=0.9).init(params), params)[0]
    b = optkit.adafactor(b1=0.9, factor_map=[(".*", "heuristic")]).update(
        g, optkit.adafactor(b1=0.9, factor_map=[(".*", "heuristic")]).init(params), params)[0]
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, b)


# ------------------------------------------------------------------ state, transformations, restore


def _rules_tx(kind):
    axes = {"w": ("layers", "embed", "mlp"), "b": ("layers", "mlp")}
    if kind == "t5x":
        return optkit.t5x_adafactor(1e-2, beta1=0.9, logical_factor_rules=STANDARD, param_logical_axes=axes)
    return optkit.adafactor(b1=0.9, logical_factor_rules=STANDARD, param_logical_axes=axes)


@pytest.mark.parametrize("kind", ["adafactor", "t5x"])
def test_eval_shape_init_and_serialization_round_trip(kind):
    serialization = pytest.importorskip("flax.serialization")
    params = {"w": jnp.ones((3, 8, 16)), "b": jnp.ones((3, 16))}
    tx = _rules_tx(kind)
    state = tx.init(params)
    abstract = jax.eval_shape(tx.init, params)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == jax.tree.map(lambda a: (a.shape, a.dtype), state)
    init_on_structs = tx.init(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params))
    assert jax.tree.structure(init_on_structs) == jax.tree.structure(state)
    grads = jax.tree.map(lambda a: a * 0.3, params)
    _, state = jax.jit(tx.update)(grads, state, params)
    restored = serialization.from_bytes(tx.init(params), serialization.to_bytes(state))
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    jax.tree.map(np.testing.assert_array_equal, restored, state)
    u1, _ = tx.update(grads, restored, params)
    u2, _ = tx.update(grads, state, params)
    jax.tree.map(np.testing.assert_array_equal, u1, u2)


def test_inject_hyperparams_and_chain_under_jit():
    params = {"w": jnp.ones((3, 8, 16)), "b": jnp.ones((3, 16))}
    axes = {"w": ("layers", "embed", "mlp"), "b": ("layers", "mlp")}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optkit.t5x_adafactor)(
        learning_rate=1e-2, beta1=0.9, weight_decay_rate=1e-3, logical_factor_rules=STANDARD,
        param_logical_axes=axes))
    plain = optax.chain(optax.clip_by_global_norm(1.0), optkit.t5x_adafactor(
        1e-2, beta1=0.9, weight_decay_rate=1e-3, logical_factor_rules=STANDARD, param_logical_axes=axes))
    s1, s2 = tx.init(params), plain.init(params)
    grads = jax.tree.map(lambda a: a * 0.3, params)
    u1, s1 = jax.jit(tx.update)(grads, s1, params)
    u2, s2 = jax.jit(plain.update)(grads, s2, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), u1, u2)
    fresh = optax.tree.set(tx.init(params), learning_rate=jnp.asarray(1e-3))
    u3, _ = jax.jit(tx.update)(grads, fresh, params)
    assert not np.allclose(u3["w"], u1["w"])


# ------------------------------------------------------------------ bad input


BAD = [
    ("t5x: rank 3 without a rule", lambda: optkit.t5x_adafactor(1e-2).init({"a": {"k": jnp.ones((2, 3, 4))}}),
     ValueError, r"'a/k' of shape \(2, 3, 4\) has rank > 2 and needs a factor rule"),
    ("t5x: no learning rate", lambda: optkit.t5x_adafactor(None), ValueError, "learning_rate is required"),
    ("t5x: factored False with a map", lambda: optkit.t5x_adafactor(1e-2, factored=False, factor_map=[(".*", None)]),
     ValueError, "factored is False but factor_map"),
    ("rule of the wrong length", lambda: optkit.adafactor(factor_map=[("w", ("row", "column"))]).init(
        {"w": jnp.ones((2, 3, 4))}), ValueError, r"'w'.*has 2 roles, but the parameter has rank 3"),
    ("unknown role", lambda: optkit.adafactor(factor_map=[("w", ("row", "colum"))]), ValueError,
     r"factor_map\[0\]: unknown factoring role 'colum'"),
    ("no match", lambda: optkit.adafactor(factor_map=[("^x$", "heuristic")]).init({"net": {"w": jnp.ones((2, 3))}}),
     ValueError, r"factor_map: no pattern matches the parameter 'net/w'"),
    ("unknown logical name", lambda: optkit.adafactor(logical_factor_rules=STANDARD,
                                                       param_logical_axes={"w": ("embed", "mpl")}).init(
        {"w": jnp.ones((2, 3))}), ValueError, r"'w'|w: the logical axis name 'mpl' is not in logical_factor_rules"),
    ("rows, columns and none", lambda: optkit.adafactor(logical_factor_rules=STANDARD, param_logical_axes={
        "w": ("embed", "mlp", "relpos_buckets")}).init({"w": jnp.ones((2, 3, 4))}), ValueError,
     "w: incomplete factoring"),
    ("rows without columns", lambda: optkit.adafactor(factor_map=[("w", ("batch", "row", "none"))]).init(
        {"w": jnp.ones((2, 3, 4))}), ValueError, "has row axes but no column axes"),
    ("names of the wrong length", lambda: optkit.adafactor(logical_factor_rules=STANDARD,
                                                            param_logical_axes={"w": ("embed",)}).init(
        {"w": jnp.ones((2, 3))}), ValueError, r"w: 1 logical axis names \('embed',\) for a parameter of rank 2"),
    ("factor_map not pairs", lambda: optkit.adafactor(factor_map={"w": ("row", "column")}), TypeError,
     "factor_map must be a sequence of"),
    ("bad regex", lambda: optkit.adafactor(factor_map=[("(", "heuristic")]), ValueError,
     "is not a regular expression"),
    ("logical rules not a mapping", lambda: optkit.adafactor(logical_factor_rules=[("embed", "row")]), TypeError,
     "logical_factor_rules must be a mapping"),
    ("FlatParams", lambda: optkit.t5x_adafactor(1e-2).init(optkit.FlatParams.from_tree({"w": jnp.ones(3)})),
     TypeError, "FlatParams"),
    ("step_offset float", lambda: optkit.t5x_adafactor(1e-2, step_offset=1.5), TypeError,
     "step_offset must be an integer"),
    ("beta1 out of range", lambda: optkit.t5x_adafactor(1e-2, beta1=1.0), ValueError, "beta1"),
    ("max_parameter_scale 0", lambda: optkit.t5x_adafactor(1e-2, max_parameter_scale=0.0), ValueError,
     "max_parameter_scale"),
    ("no name on an axis", lambda: optkit.adafactor(logical_factor_rules=STANDARD,
                                                     param_logical_axes={"w": (None, "mlp")}).init(
        {"w": jnp.ones((2, 3))}), ValueError, "axis 0 has no logical name"),
]


@pytest.mark.parametrize("name, make, error, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error(name, make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_t5x_rank2_rule_falls_back_but_adafactor_applies_it():
    """The one documented difference: a rank-2 rule without a batch axis."""
    x = jnp.ones((6, 4))
    rule = [("w", ("row", "column"))]
    t5x_state = optkit.t5x_adafactor(1e-2, min_dim_size_to_factor=1, factor_map=rule).init({"w": x})
    own_state = optkit.adafactor(factor_map=rule).init({"w": x})
    # T5X's heuristic: the larger axis (0, of 6) is the columns, so the row statistics are over axis 1.
    assert t5x_state[0].nu["w"].v_row.shape == (4,) and type(t5x_state[0].nu["w"]).roles is None
    # As given: axis 0 is the rows.
    assert own_state[0].nu["w"].v_row.shape == (6,) and type(own_state[0].nu["w"]).roles == ("row", "column")
