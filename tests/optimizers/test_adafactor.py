"""Adafactor (SPEC section 5): optkit.adafactor, scale_by_adafactor, scale_by_factored_rms.

The oracle is the paper's algorithm (Shazeer & Stern 2018, Algorithms 4 and 5)
transcribed in NumPy float64 (``tests/oracles.py``: ``PaperAdafactor``), with the
paper's *sums* for the row and column statistics (the implementation uses
means) and its own choice of the factored axes; it shares no code with optkit. Other expectations are analytic
(a rank-1 gradient, whose factored estimate is exact) or Optax's own Adafactor
in the configuration that must equal it.
"""

from __future__ import annotations

import doctest

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optkit
from benchmarks._hlo import full_array_traffic
from optkit._src.adafactor import fast, paper
from tests.helpers import x64  # noqa: F401 (float64 for every test here)
from tests.oracles import PaperAdafactor

TRANSFORMS = [pytest.param(jax.jit, id="jit"), pytest.param(lambda f: f, id="nojit")]


def tx_kwargs(oracle_kw):
    """optkit.adafactor's arguments for PaperAdafactor's keyword names."""
    names = {"lr": "learning_rate", "d": "clipping_threshold", "mps": "multiply_by_parameter_scale",
             "wd": "weight_decay_rate", "min_dim": "min_dim_size_to_factor"}
    return {names.get(k, k): v for k, v in oracle_kw.items()}


SHAPES = {"matrix": (5, 7), "vector": (6,), "scalar": (), "rank3": (3, 4, 5), "rank4": (2, 3, 4, 2)}


def random_problem(seed, shapes, steps):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in shapes.items()}
    # gradients whose scale changes from step to step, so that b2_t, clipping and
    # the parameter scale all matter
    grads = [
        {k: rng.standard_normal(s) * (0.1 + 3.0 * (i % 4)) for k, s in shapes.items()} for i in range(steps)
    ]
    return params, grads


def run_optkit(tx, params, grads, dtype, transform=jax.jit):
    p = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    state = tx.init(p)
    update = transform(tx.update)
    deltas, states = [], []
    for gr in grads:
        u, state = update({k: jnp.asarray(v, dtype) for k, v in gr.items()}, state, p)
        p = optax.apply_updates(p, u)
        deltas.append(u)
        states.append(state)
    return p, deltas, states


def assert_rel_close(actual, expected, rtol, what=""):
    """max |actual - expected| <= rtol * max |expected|, leaf by leaf."""
    for k in expected:
        a, e = np.asarray(actual[k], np.float64), np.asarray(expected[k], np.float64)
        assert a.shape == e.shape, (what, k)
        scale = np.max(np.abs(e)) if e.size else 0.0
        err = np.max(np.abs(a - e)) if e.size else 0.0
        assert err <= rtol * scale, f"{what} {k}: max error {err:.3g} vs scale {scale:.3g}"


ORACLE_CONFIGS = [
    pytest.param({}, id="paper-defaults"),
    pytest.param({"factored_dims": "largest"}, id="largest"),
    pytest.param({"b1": 0.9, "wd": 0.1}, id="b1-weight-decay"),
    pytest.param({"mps": False, "lr": 0.03}, id="no-param-scale-float-lr"),
    pytest.param({"lr": lambda count: 0.05 / (1.0 + count)}, id="schedule"),
    pytest.param({"d": 0.3, "decay_rate": 0.5, "eps2": 0.5}, id="clipping-active"),
    pytest.param({"d": None}, id="no-clipping"),
    pytest.param({"factored": False}, id="unfactored"),
    pytest.param({"min_dim": 5}, id="min-dim-5"),
]


# ---------------------------------------------------------------- the paper, float64 and float32


@pytest.mark.parametrize("config", ORACLE_CONFIGS)
def test_float64_equals_the_paper_over_100_steps(config):
    """SPEC 5: every update of a float64 run equals the paper's to 1e-12 relative."""
    params, grads = random_problem(0, SHAPES, 100)
    oracle = PaperAdafactor(params, **config)
    expected = [oracle.step(g) for g in grads]
    p, deltas, _ = run_optkit(optkit.adafactor(**tx_kwargs(config)), params, grads, jnp.float64)
    for i, (d, e) in enumerate(zip(deltas, expected)):
        assert_rel_close(d, e, 1e-12, f"step {i + 1}")
    assert_rel_close(p, oracle.X, 1e-12, "final params")


@pytest.mark.parametrize("config", ORACLE_CONFIGS[:4])
def test_float32_within_1e5_of_the_paper_over_100_steps(config):
    params, grads = random_problem(1, SHAPES, 100)
    params = {k: np.float32(v).astype(np.float64) for k, v in params.items()}
    grads = [{k: np.float32(v).astype(np.float64) for k, v in g.items()} for g in grads]
    oracle = PaperAdafactor(params, **config)
    for g in grads:
        oracle.step(g)
    p, deltas, states = run_optkit(optkit.adafactor(**tx_kwargs(config)), params, grads, jnp.float32)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(p))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(states[-1][0].nu))
    assert_rel_close(p, oracle.X, 1e-5, "final params")


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_jit_and_eager_agree_with_the_paper(transform):
    params, grads = random_problem(2, {"matrix": (5, 7), "rank3": (3, 4, 5), "vector": (6,)}, 3)
    oracle = PaperAdafactor(params, b1=0.5)
    expected = [oracle.step(g) for g in grads]
    _, deltas, _ = run_optkit(optkit.adafactor(b1=0.5), params, grads, jnp.float64, transform)
    for d, e in zip(deltas, expected):
        assert_rel_close(d, e, 1e-12)


@pytest.mark.parametrize(
    "config, dtype",
    [({}, jnp.float64), ({"factored_dims": "largest"}, jnp.float64), ({"eps1": 0.0, "b1": 0.8}, jnp.float64),
     ({"mps": False, "lr": 0.01}, jnp.float64), ({}, jnp.float32)],
)
def test_cpu_blocked_reductions_equal_the_paper(monkeypatch, config, dtype):
    """Large or wide matrices on CPU take a loop over row blocks; force it on small ones, with a tail block."""
    monkeypatch.setattr(fast, "LOOP_MIN_SIZE", 0)
    monkeypatch.setattr(fast, "BLOCK_ELEMENTS", 64)  # 8-row blocks
    shapes = {"tall": (37, 20), "wide": (20, 37), "stacked": (2, 3, 29, 21), "vector": (9,)}
    params, grads = random_problem(3, shapes, 12)
    if dtype == jnp.float32:
        params = {k: np.float32(v).astype(np.float64) for k, v in params.items()}
        grads = [{k: np.float32(v).astype(np.float64) for k, v in g.items()} for g in grads]
    oracle = PaperAdafactor(params, **config)
    expected = [oracle.step(g) for g in grads]
    tx = optkit.adafactor(**tx_kwargs(config))
    hlo = jax.jit(tx.update).lower(
        jax.tree.map(jnp.asarray, grads[0]), tx.init(jax.tree.map(jnp.asarray, params)), params
    ).as_text()
    assert hlo.count("stablehlo.while") == 4  # one loop per matrix, one over the stacked matrices
    _, deltas, _ = run_optkit(tx, params, grads, dtype)
    rtol = 1e-12 if dtype == jnp.float64 else 1e-5
    for d, e in zip(deltas, expected):
        assert_rel_close(d, e, rtol)


LEAF_OPTIONS = [
    pytest.param(dict(), id="paper"),
    pytest.param(dict(b1=0.8, weight_decay_rate=0.1), id="b1-decay"),
    pytest.param(dict(eps1=0.0, d=None), id="eps1-0-no-clipping"),
    pytest.param(dict(multiply_by_parameter_scale=False, d=0.2), id="no-scale-clipping"),
]


@pytest.mark.parametrize("path", ["reductions", "row-block loop", "split"])
@pytest.mark.parametrize("shape, axes", [((5, 7), (0, 1)), ((3, 4, 5), (1, 2)), ((37, 20), (0, 1)), ((4, 9, 3), (0, 1)),
                                         ((6,), None), ((), None)])
@pytest.mark.parametrize("options", LEAF_OPTIONS)
def test_the_fast_step_equals_the_paper_literal_step(monkeypatch, path, shape, axes, options):
    """optkit._src.adafactor.paper (SPEC 5 as written) and fast (what runs) give the same step, on every path."""
    if path == "row-block loop":
        monkeypatch.setattr(fast, "LOOP_MIN_SIZE", 0)
        monkeypatch.setattr(fast, "BLOCK_ELEMENTS", 64)
    rng = np.random.default_rng(hash((shape, path)) % 2**32)
    g, x = rng.standard_normal(shape), rng.standard_normal(shape)
    g.flat[::3] = 0.0
    if axes is None:
        nu = optkit.FullSecondMoment(np.abs(rng.standard_normal(shape)))
    else:
        row, col = axes
        nu = optkit.FactoredSecondMoment(np.abs(rng.standard_normal(shape[:col] + shape[col + 1:])),
                                         np.abs(rng.standard_normal(shape[:row] + shape[row + 1:])))
    m = rng.standard_normal(shape)
    kw = dict(eps1=1e-30, d=1.0, multiply_by_parameter_scale=True, b1=None, weight_decay_rate=None) | options
    b2, rho = 0.6, 0.01
    want_x, want_nu, want_m = paper.adafactor_leaf(jnp.asarray(g), jnp.asarray(x), jax.tree.map(jnp.asarray, nu),
                                                  jnp.asarray(m), axes=axes, b2=b2, rho=rho, eps2=1e-3, **kw)
    update, got_nu, got_m = jax.jit(lambda g, x, nu, m: fast.leaf_step(
        g, x, nu, m, axes=axes, b2=jnp.float64(b2), lr=jnp.float64(rho),
        options=fast.Options(kw["eps1"], 1e-3, kw["d"], kw["b1"], kw["weight_decay_rate"]),
        multiply_by_parameter_scale=kw["multiply_by_parameter_scale"], guard=kw["eps1"] == 0, dtype=jnp.float64,
        split=path == "split"))(g, x, nu, m)
    np.testing.assert_allclose(x - np.asarray(update), want_x, rtol=1e-12, atol=1e-14)
    for got, want in zip(got_nu, want_nu):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    if kw["b1"] is not None:
        np.testing.assert_allclose(got_m, want_m, rtol=1e-12, atol=1e-15)


def test_the_reductions_without_barriers_equal_the_cpu_ones():
    """GPUs and TPUs take the reductions without optimization barriers: the same statistics and sums."""
    rng = np.random.default_rng(5)
    g, x = rng.standard_normal((2, 6, 9)), rng.standard_normal((2, 6, 9))
    nu = optkit.FactoredSecondMoment(np.abs(rng.standard_normal((2, 6))), np.abs(rng.standard_normal((2, 9))))
    plain = fast._factored_plain(g, x, nu, 0.5, 1e-30, 1, 2, False, jnp.float64)
    separate = fast._factored_plain(g, x, nu, 0.5, 1e-30, 1, 2, False, jnp.float64, separate=True)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(separate)):
        np.testing.assert_allclose(a, b, rtol=1e-13)


@pytest.mark.xla_structure
@pytest.mark.parametrize("factored_dims", ["last", "largest"])
def test_cpu_statistics_are_reductions_of_g_without_a_temporary(factored_dims):
    """Each statistic is one reduction that squares G itself: no G^2 as large as the leaf, 28 B a parameter."""
    shape = (256, 384)
    tx = optkit.adafactor(factored_dims=factored_dims)
    p = jnp.ones(shape)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(p, tx.init(p), p).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < p.nbytes // 8
    traffic = full_array_traffic(compiled.as_text(), p.size)
    # G: row means, column means, w, the update; X: RMS(X), the update; X written once.
    assert (traffic["reads"], traffic["writes"]) == (6, 1)


def test_each_distinct_leaf_is_traced_once(monkeypatch):
    """Repeated leaf shapes (a transformer's layers) are traced once each, and every leaf is still right."""
    traced = []
    full, factored = fast._full_moments, fast._factored_moments

    def counting_full(g, *args):
        traced.append((g.shape, None))
        return full(g, *args)

    def counting_factored(g, x, nu, b2, eps1, row, col, *args):
        traced.append((g.shape, (row, col)))
        return factored(g, x, nu, b2, eps1, row, col, *args)

    monkeypatch.setattr(fast, "_full_moments", counting_full)
    monkeypatch.setattr(fast, "_factored_moments", counting_factored)
    fast._leaf_step_jit.clear_cache()
    shapes = {f"layer{i}": {"w": (11, 13), "b": (13,)} for i in range(5)}
    shapes["head"] = {"w": (13, 3)}
    flat_shapes = {f"{k}/{n}": s for k, leaves in shapes.items() for n, s in leaves.items()}
    params, grads = random_problem(4, flat_shapes, 2)
    oracle = PaperAdafactor(params, b1=0.5)
    expected = [oracle.step(g) for g in grads]
    _, deltas, _ = run_optkit(optkit.adafactor(b1=0.5), params, grads, jnp.float64, jax.jit)
    # One trace per distinct (shape, factored axes) for the one jitted update, not one per leaf.
    assert sorted(traced) == sorted([((11, 13), (0, 1)), ((13,), None), ((13, 3), (0, 1))])
    for d, e in zip(deltas, expected):
        assert_rel_close(d, e, 1e-12)


@settings(max_examples=6)
@given(
    shape=st.lists(st.integers(1, 5), min_size=0, max_size=4).map(tuple),
    factored_dims=st.sampled_from(["last", "largest"]),
    seed=st.integers(0, 2**16),
)
def test_any_shape_equals_the_paper(shape, factored_dims, seed):
    params, grads = random_problem(seed, {"x": shape}, 2)
    oracle = PaperAdafactor(params, factored_dims=factored_dims, b1=0.3)
    expected = [oracle.step(g) for g in grads]
    _, deltas, _ = run_optkit(optkit.adafactor(factored_dims=factored_dims, b1=0.3), params, grads,
                              jnp.float64, transform=lambda f: f)
    for d, e in zip(deltas, expected):
        assert_rel_close(d, e, 1e-12)


# ---------------------------------------------------------------- analytic cases


def test_first_step_needs_no_bias_correction():
    """b2_1 = 0: after one update the statistics are the first gradient's own means."""
    rng = np.random.default_rng(4)
    g = {"w": rng.standard_normal((4, 6)), "b": rng.standard_normal(6)}
    params = {"w": rng.standard_normal((4, 6)), "b": rng.standard_normal(6)}
    tx = optkit.scale_by_factored_rms(eps1=1e-3)
    _, state = tx.update(g, tx.init(params))
    np.testing.assert_allclose(state.nu["w"].v_row, np.mean(g["w"] ** 2 + 1e-3, axis=1), rtol=1e-15)
    np.testing.assert_allclose(state.nu["w"].v_col, np.mean(g["w"] ** 2 + 1e-3, axis=0), rtol=1e-15)
    np.testing.assert_allclose(state.nu["b"].v, g["b"] ** 2 + 1e-3, rtol=1e-15)
    assert int(state.count) == 1


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_rank_one_gradient_gives_sign_steps(transform):
    """For G = a b^T the factored estimate is exact (V = G^2), so U = sign(G) and RMS(U) = 1."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(5), rng.standard_normal(8)
    x = rng.standard_normal((5, 8))
    g = np.outer(a, b)
    alpha = 1e-2 * max(1e-3, np.sqrt(np.mean(x**2)))
    for d, factor in [(1.0, 1.0), (4.0, 1.0), (0.25, 0.25)]:  # clipping inactive at 1 and 4, active at 0.25
        tx = optkit.adafactor(eps1=0.0, clipping_threshold=d)
        u, _ = transform(tx.update)({"x": g}, tx.init({"x": x}), {"x": x})
        np.testing.assert_allclose(u["x"], -alpha * factor * np.sign(g), rtol=1e-14)


@pytest.mark.parametrize("d", [0.05, 0.3])
def test_active_clipping_sets_rms_of_update_to_d(d):
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((6, 9)), rng.standard_normal((6, 9))
    tx = optkit.adafactor(clipping_threshold=d, learning_rate=0.1, multiply_by_parameter_scale=False)
    u, _ = jax.jit(tx.update)({"x": g}, tx.init({"x": x}), {"x": x})
    np.testing.assert_allclose(np.sqrt(np.mean(np.asarray(u["x"]) ** 2)), 0.1 * d, rtol=1e-13)


def test_inactive_clipping_equals_no_clipping():
    params, grads = random_problem(7, {"m": (4, 5), "v": (3,)}, 5)
    _, with_big_d, _ = run_optkit(optkit.adafactor(clipping_threshold=1e6), params, grads, jnp.float64)
    _, without, _ = run_optkit(optkit.adafactor(clipping_threshold=None), params, grads, jnp.float64)
    for a, b in zip(with_big_d, without):
        chex.assert_trees_all_close(a, b, rtol=1e-15, atol=0)


def test_rho_is_used_when_learning_rate_is_none_and_caps_at_1e2():
    """rho_t = min(1e-2, 1/sqrt(t)): 1e-2 until t = 10^4, then 1/sqrt(t)."""
    x, g = {"v": jnp.array([3.0, -4.0])}, {"v": jnp.array([1.0, 1.0])}
    tx = optkit.adafactor(multiply_by_parameter_scale=False, clipping_threshold=None)
    state = tx.init(x)
    for count, rho in [(0, 1e-2), (9_998, 1e-2), (39_999, 1 / 200)]:
        state = (state[0]._replace(count=jnp.asarray(count, jnp.int32)), state[1])
        state = (state[0]._replace(nu={"v": optkit.FullSecondMoment(jnp.ones(2))}), state[1])
        u, _ = tx.update(g, state, x)
        b2 = 1 - (count + 1) ** -0.8
        v = b2 * 1 + (1 - b2) * (1 + 1e-30)
        np.testing.assert_allclose(u["v"], -rho / np.sqrt(v) * np.ones(2), rtol=1e-14)


@pytest.mark.parametrize(
    "eps1, dtype",
    [(1e-30, jnp.float16), (1e-30, jnp.bfloat16), (1e-30, jnp.float32), (1e-30, jnp.float64),
     (0.0, jnp.float32), (0.0, jnp.float64)],
)
def test_zero_gradients_give_zero_updates_without_nan(eps1, dtype):
    """eps1 = 0 would make V = 0 and U = 0/0; 16-bit states cannot even hold eps1 = 1e-30."""
    params = {"m": jnp.ones((3, 4), dtype), "v": jnp.ones(4, dtype), "s": jnp.ones((), dtype)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    tx = optkit.adafactor(eps1=eps1, b1=0.9)
    state = tx.init(params)
    for _ in range(3):
        u, state = jax.jit(tx.update)(zeros, state, params)
    for leaf in jax.tree.leaves((u, state)):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
    assert all(np.all(np.asarray(leaf) == 0) for leaf in jax.tree.leaves(u))
    assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(u))


def test_empty_leaves_stay_empty_and_finite():
    params = {"a": jnp.ones((0, 5)), "b": jnp.ones((3, 0)), "c": jnp.ones((2, 0, 4)), "d": jnp.ones(3)}
    tx = optkit.adafactor()
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    u, state = jax.jit(tx.update)(grads, state, params)
    assert jax.tree.map(jnp.shape, u) == jax.tree.map(jnp.shape, params)
    for leaf in jax.tree.leaves((u, state)):
        assert np.all(np.isfinite(leaf))


# ---------------------------------------------------------------- factored axes and state layout


@pytest.mark.parametrize(
    "shape, factored_dims, min_dim, expected",
    [
        ((5, 7), "last", 1, (0, 1)),
        ((7, 5), "largest", 1, (1, 0)),
        ((5, 3, 4), "last", 1, (1, 2)),
        ((5, 3, 4), "largest", 1, (2, 0)),
        ((4, 4), "largest", 1, (0, 1)),
        ((1, 7), "last", 1, (0, 1)),
        ((5, 7), "last", 6, None),
        ((5, 7), "last", 5, (0, 1)),
        ((200, 3, 130), "largest", 128, (2, 0)),
        ((200, 3, 100), "largest", 128, None),
        ((8,), "last", 1, None),
        ((), "last", 1, None),
        ((0, 5), "last", 1, None),
    ],
)
def test_factored_axes(shape, factored_dims, min_dim, expected):
    axes = optkit.factored_axes(shape, factored_dims=factored_dims, min_dim_size_to_factor=min_dim)
    assert axes == expected
    assert optkit.factored_axes(shape, factored=False) is None


@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=5).map(tuple))
def test_largest_axes_are_optax_axes(shape):
    from optax._src import factorized

    optax_axes = factorized._factored_dims(shape, True, 2)
    ours = optkit.factored_axes(shape, factored_dims="largest", min_dim_size_to_factor=2)
    assert ours == (None if optax_axes is None else tuple(optax_axes))


def test_state_holds_only_what_the_algorithm_needs():
    params = {"w": jnp.ones((3, 5, 7)), "b": jnp.ones(7), "s": jnp.ones(()), "small": jnp.ones((2, 9))}
    state, _ = optkit.adafactor(min_dim_size_to_factor=3).init(params)
    assert isinstance(state, optkit.ScaleByAdafactorState)
    assert state.count.shape == () and state.count.dtype == jnp.int32
    assert state.mu is None
    chex.assert_trees_all_equal(
        state.nu,
        {
            "w": optkit.FactoredSecondMoment(jnp.zeros((3, 5)), jnp.zeros((3, 7))),
            "b": optkit.FullSecondMoment(jnp.zeros(7)),
            "s": optkit.FullSecondMoment(jnp.zeros(())),
            "small": optkit.FullSecondMoment(jnp.zeros((2, 9))),  # 2 < min_dim_size_to_factor
        },
    )
    sizes = [leaf.size for leaf in jax.tree.leaves(state)]
    assert sum(sizes) == 1 + 15 + 21 + 7 + 1 + 18
    assert all(size > 0 for size in sizes)  # no placeholder arrays

    with_mu, _ = optkit.adafactor(b1=0.9, mu_dtype=jnp.bfloat16).init(params)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), with_mu.mu) == jax.tree.map(
        lambda a: (a.shape, jnp.dtype(jnp.bfloat16)), params
    )


def test_state_bytes_of_the_transformer_tree():
    """Sublinear memory on a real model: rows + columns per matrix, a full array per vector."""
    pytest.importorskip("flax")  # the example's model is Flax
    from examples.transformer import TransformerConfig, abstract_params

    cfg = TransformerConfig(vocab_size=50, d_model=32, num_heads=2, num_layers=2, max_len=16)
    params = abstract_params(cfg)
    expected = 4  # the int32 count
    for leaf in jax.tree.leaves(params):
        expected += 4 * (sum(leaf.shape) if leaf.ndim == 2 else leaf.size)
    state = jax.eval_shape(optkit.adafactor().init, params)
    assert sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(state)) == expected
    with_mu = jax.eval_shape(optkit.adafactor(b1=0.9).init, params)
    mu_bytes = sum(4 * leaf.size for leaf in jax.tree.leaves(params))
    assert sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(with_mu)) == expected + mu_bytes


def test_state_shapes_follow_the_factored_axes():
    params = {"x": jnp.ones((5, 3, 4))}
    last = optkit.scale_by_factored_rms().init(params).nu["x"]
    largest = optkit.scale_by_factored_rms(factored_dims="largest").init(params).nu["x"]
    assert (last.v_row.shape, last.v_col.shape) == ((5, 3), (5, 4))
    assert (largest.v_row.shape, largest.v_col.shape) == ((3, 4), (5, 3))


def test_eval_shape_and_checkpoint_round_trip():
    serialization = pytest.importorskip("flax.serialization")  # the checkpoint extra
    params = {"w": jnp.ones((4, 6)), "b": jnp.ones(6)}
    tx = optkit.adafactor(b1=0.9, nu_dtype=jnp.float32)
    abstract = jax.eval_shape(tx.init, params)
    concrete = tx.init(params)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == jax.tree.map(
        lambda a: (a.shape, a.dtype), concrete
    )
    grads = jax.tree.map(lambda a: a * 0.5, params)
    _, state = tx.update(grads, concrete, params)
    restored = serialization.from_bytes(concrete, serialization.to_bytes(state))
    chex.assert_trees_all_equal(restored, state)
    chex.assert_trees_all_equal(tx.update(grads, restored, params), tx.update(grads, state, params))


# ---------------------------------------------------------------- Optax


@pytest.mark.parametrize("momentum", [None, 0.9])
def test_equals_optax_adafactor_in_its_configuration(momentum):
    """Largest axes, min size 128 and rho_t as a schedule: the same algorithm as optax.adafactor."""
    shapes = {"f": (130, 200), "g": (200, 130), "unfactored": (64, 300), "rank3": (2, 130, 129),
              "vector": (150,), "scalar": ()}
    params, grads = random_problem(8, shapes, 5)
    with jax.enable_x64(False):
        rho = lambda count: jnp.minimum(1e-2, 1 / jnp.sqrt(count + 1.0))  # noqa: E731
        theirs = optax.adafactor(learning_rate=rho, min_dim_size_to_factor=128, momentum=momentum)
        ours = optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128, b1=momentum,
                                mu_dtype=None if momentum is None else jnp.float32)
        p_theirs, _, _ = run_optkit(theirs, params, grads, jnp.float32)
        p_ours, _, states = run_optkit(ours, params, grads, jnp.float32)
        nu = states[-1][0].nu
    assert isinstance(nu["f"], optkit.FactoredSecondMoment)
    assert isinstance(nu["unfactored"], optkit.FullSecondMoment)
    for k in shapes:
        np.testing.assert_allclose(p_ours[k], p_theirs[k], rtol=2e-6, atol=2e-6, err_msg=k)


# ---------------------------------------------------------------- mixed precision


def test_bfloat16_parameters_with_float32_statistics():
    """Arithmetic is float32; the result is the float32 computation rounded once to bfloat16."""
    params, grads = random_problem(9, {"w": (6, 10), "b": (10,)}, 5)
    to = lambda tree, dt: {k: jnp.asarray(v, dt) for k, v in tree.items()}  # noqa: E731
    p16 = to(params, jnp.bfloat16)
    p32 = to(p16, jnp.float32)  # the same values
    tx16 = optkit.adafactor(b1=0.9, nu_dtype=jnp.float32, mu_dtype=jnp.float32)
    tx32 = optkit.adafactor(b1=0.9)
    s16, s32 = tx16.init(p16), tx32.init(p32)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves((s16[0].nu, s16[0].mu)))
    for gr in grads:
        g16 = to(gr, jnp.bfloat16)
        u16, s16 = jax.jit(tx16.update)(g16, s16, p16)
        u32, s32 = jax.jit(tx32.update)(to(g16, jnp.float32), s32, p32)
        assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(u16))
        chex.assert_trees_all_equal(u16, jax.tree.map(lambda a: a.astype(jnp.bfloat16), u32))
        chex.assert_trees_all_equal(s16[0].nu, s32[0].nu)
        p16 = optax.apply_updates(p16, u16)
        p32 = to(p16, jnp.float32)


def test_state_dtype_defaults_to_the_parameter_dtype():
    params = {"w": jnp.ones((3, 4), jnp.bfloat16), "b": jnp.ones(4, jnp.float32)}
    state, _ = optkit.adafactor(b1=0.5).init(params)
    assert state.nu["w"].v_row.dtype == jnp.bfloat16 and state.mu["w"].dtype == jnp.bfloat16
    assert state.nu["b"].v.dtype == jnp.float32
    grads = jax.tree.map(jnp.ones_like, params)
    u, _ = jax.jit(optkit.adafactor(b1=0.5).update)(grads, (state, optax.EmptyState()), params)
    assert u["w"].dtype == jnp.bfloat16 and u["b"].dtype == jnp.float32


# ---------------------------------------------------------------- building blocks and hyperparameters


def test_scale_by_factored_rms_chained_equals_adafactor_without_parameter_scale():
    params, grads = random_problem(10, SHAPES, 8)
    chained = optax.chain(optkit.scale_by_factored_rms(), optax.clip_by_block_rms(1.0),
                          optax.scale_by_learning_rate(0.02))
    p_chain, _, _ = run_optkit(chained, params, grads, jnp.float64)
    oracle = PaperAdafactor(params, mps=False, lr=0.02)
    for g in grads:
        oracle.step(g)
    assert_rel_close(p_chain, oracle.X, 1e-12)


def test_inject_hyperparams():
    params, grads = random_problem(11, {"w": (4, 6), "b": (6,)}, 4)
    kwargs = dict(learning_rate=0.02, b1=0.9, decay_rate=0.7, eps2=1e-2, clipping_threshold=0.5,
                  weight_decay_rate=0.1)
    injected = optax.inject_hyperparams(optkit.adafactor, static_args=("min_dim_size_to_factor",))(**kwargs)
    p_inj, _, _ = run_optkit(injected, params, grads, jnp.float64)
    p_ref, _, _ = run_optkit(optkit.adafactor(**kwargs), params, grads, jnp.float64)
    chex.assert_trees_all_close(p_inj, p_ref, rtol=1e-14)
    # a traced min_dim_size_to_factor cannot decide the state's structure
    traced = optax.inject_hyperparams(optkit.adafactor)(**kwargs)
    with pytest.raises(ValueError, match="static_args"):
        jax.jit(traced.init)(params)
    traced.init(params)  # concrete at init: fine, and update follows the state
    p_traced, _, _ = run_optkit(traced, params, grads, jnp.float64)
    chex.assert_trees_all_close(p_traced, p_ref, rtol=1e-14)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"decay_rate": 0.0}, ValueError, "decay_rate"),
        ({"decay_rate": -0.8}, ValueError, "decay_rate"),
        ({"eps1": -1e-30}, ValueError, "eps1"),
        ({"eps2": -1e-3}, ValueError, "eps2"),
        ({"clipping_threshold": 0.0}, ValueError, "clipping_threshold"),
        ({"clipping_threshold": -1.0}, ValueError, "clipping_threshold"),
        ({"factored_dims": "first"}, ValueError, "factored_dims"),
        ({"factored_dims": None}, ValueError, "factored_dims"),
        ({"b1": 1.0}, ValueError, "b1"),
        ({"learning_rate": -0.1}, ValueError, "learning_rate"),
        ({"weight_decay_rate": -0.1}, ValueError, "weight_decay_rate"),
        ({"min_dim_size_to_factor": 0}, ValueError, "min_dim_size_to_factor"),
        ({"min_dim_size_to_factor": 2.5}, TypeError, "min_dim_size_to_factor"),
        ({"min_dim_size_to_factor": True}, TypeError, "min_dim_size_to_factor"),
        ({"factored": "yes"}, TypeError, "factored"),
        ({"multiply_by_parameter_scale": 1}, TypeError, "multiply_by_parameter_scale"),
        ({"nu_dtype": jnp.int32}, TypeError, "nu_dtype"),
        ({"eps1": float("nan")}, ValueError, "eps1"),
    ],
)
def test_bad_hyperparameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        optkit.adafactor(**kwargs)


def test_bad_hyperparameters_of_scale_by_factored_rms():
    with pytest.raises(ValueError, match="decay_rate"):
        optkit.scale_by_factored_rms(decay_rate=0.0)
    with pytest.raises(ValueError, match="factored_dims"):
        optkit.scale_by_factored_rms(factored_dims="smallest")


def test_bad_update_inputs():
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4)}
    tx = optkit.adafactor()
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    with pytest.raises(ValueError, match="params"):
        tx.update(grads, state)
    with pytest.raises(ValueError, match=r"\['w'\]"):
        tx.update({"w": jnp.ones((4, 3)), "b": jnp.ones(4)}, state, params)
    with pytest.raises(ValueError, match="state.nu"):
        tx.update({"w": jnp.ones((3, 4)), "c": jnp.ones(4)}, state, {"w": jnp.ones((3, 4)), "c": jnp.ones(4)})
    with pytest.raises(TypeError, match=r"\['b'\]"):
        tx.update({"w": jnp.ones((3, 4)), "b": jnp.ones(4, jnp.int32)}, state, params)
    with pytest.raises(ValueError, match=r"params leaf at \['b'\]"):
        tx.update(grads, state, {"w": jnp.ones((3, 4)), "b": jnp.ones(5)})
    # without the parameter scale or weight decay, params are not needed
    tx = optkit.adafactor(multiply_by_parameter_scale=False)
    tx.update(grads, tx.init(params))
    tx = optkit.adafactor(multiply_by_parameter_scale=False, weight_decay_rate=0.1)
    with pytest.raises(ValueError, match="weight_decay_rate"):
        tx.update(grads, tx.init(params))


def test_docstring_examples():
    from optkit._src.adafactor import factoring, transform

    attempted = 0
    for module in (factoring, transform):
        results = doctest.testmod(module, verbose=False)
        assert results.failed == 0, module.__name__
        attempted += results.attempted
    assert attempted >= 4
