"""Optax's generic optimizer tests, run over every optkit optimizer (our own code, Optax's checks).

Optax runs the same checks over every optimizer it ships; these are those
checks, rewritten here and parametrized over optkit's optimizers and
configurations. Each test names the Optax test it ports. The source is Optax
v0.2.8 (commit 107e9ad20ca62bcbee1a8c016daab71c690a678c):

- ``optax/_src/alias_test.py``: ``test_optimization`` (Optax's parabola and
  Rosenbrock problems, 10000 steps, rtol = atol = 3e-2, ``tree_map_params``,
  no recompilation), ``test_optimizers_accept_extra_args``,
  ``test_optimizers_can_be_wrapped_in_inject_hyperparams``,
  ``test_explicit_dtype``, ``test_preserve_dtype``,
  ``test_state_shape_dtype_shard_stability``, ``test_gradient_accumulation``;
- ``optax/_src/float64_test.py``: ``test_mixed_dtype_input_outputs``;
- ``optax/_src/sharding_test.py``: ``test_init_with_abstract_input`` (the
  Explicit-mesh tests are in tests/sharding/test_optax_sharding.py);
- ``optax/transforms/_accumulation_test.py``: ``test_multi_steps``,
  ``test_multi_steps_mixed_precision``;
- ``optax/transforms/_masking_test.py``: ``test_masked``, ``test_empty``,
  ``test_masked_state_structure``, ``test_nested_mask``;
- ``optax/transforms/_combining_test.py``: ``test_partition``,
  ``test_extra_args``, ``test_empty``;
- ``optax/transforms/_conditionality_test.py``: ``test_apply_if_finite``;
- ``optax/tree_utils/_state_utils_test.py``: ``test_tree_get``,
  ``test_tree_set`` (of ``count`` and injected hyperparameters) and
  ``tree_map_params``.

Optax's problems, step counts and tolerances are kept; where a check compares
with a value, the value comes from optkit's own algorithm (never Optax's
numbers: the algorithms differ). Where optkit deliberately differs, the test
asserts the documented error instead of skipping: complex parameters are
refused (SPEC section 1: the specs define real float tensors), as are
complex state dtypes. Element-wise optimizers also run on ``FlatParams``.
"""

from __future__ import annotations

import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit

# (name, kwargs): every optimizer, with Optax's learning rates for its nearest Optax
# counterpart (adagrad 1.0, adam 1e-1, sgd with momentum 1e-3, adafactor 5e-3 and None),
# and the options that change the state (dtypes, Nesterov, factoring, b1).
OPTIMIZERS = [
    ("adagrad", {"learning_rate": 1.0}),
    ("adagrad", {"learning_rate": 1.0, "accumulator_dtype": jnp.float32}),
    ("adam", {"learning_rate": 1e-1}),
    ("adam", {"learning_rate": 1e-1, "mu_dtype": jnp.float32}),
    ("momentum", {"learning_rate": 1e-3, "alpha": 0.9}),
    ("momentum", {"learning_rate": 1e-3, "alpha": 0.9, "nesterov": True}),
    ("adafactor", {"learning_rate": 5e-3}),
    ("adafactor", {}),
    ("adafactor", {"learning_rate": 5e-3, "b1": 0.9, "factored_dims": "largest"}),
]
IDS = [name + "(" + ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in kw.items()) + ")"
       for name, kw in OPTIMIZERS]
ELEMENTWISE = ("adagrad", "adam", "momentum")


def _opt(name, kwargs):
    return getattr(optkit, name)(**kwargs)


def _parametrize(f):
    return pytest.mark.parametrize("name,kwargs", OPTIMIZERS, ids=IDS)(f)


def _setup_parabola(dtype):
    initial = jnp.array([-1.0, 10.0, 1.0], dtype=dtype)
    final = jnp.array([1.0, -1.0, 1.0], dtype=dtype)
    return initial, final, lambda p: jnp.sum(jnp.abs(p - final) ** 2)


def _setup_rosenbrock(dtype):
    a, b = 1.0, 100.0
    initial = jnp.array([0.0, 0.0], dtype=dtype)
    final = jnp.array([a, a**2], dtype=dtype)
    return initial, final, lambda p: jnp.abs(a - p[0]) ** 2 + b * jnp.abs(p[1] - p[0] ** 2) ** 2


def _refuses_complex(fn):
    with pytest.raises(TypeError, match="must be a floating-point array, got dtype complex"):
        fn()


# ---------------------------------------------------------------- alias_test.py


@_parametrize
@pytest.mark.parametrize("target", [_setup_parabola, _setup_rosenbrock], ids=["parabola", "rosenbrock"])
@pytest.mark.parametrize("flat", [False, True], ids=["tree", "FlatParams"])
def test_optimization(name, kwargs, target, flat):
    """alias_test.py::test_optimization (float32; complex64 is the next test)."""
    opt = _opt(name, kwargs)
    initial, final, objective = target(jnp.float32)
    params = {"x": initial}
    loss = lambda p: objective(p["x"])  # noqa: E731
    if flat:
        params = optkit.FlatParams.from_tree(params)
        loss = lambda f: objective(f.to_tree()["x"])  # noqa: E731
        if name not in ELEMENTWISE:
            with pytest.raises(TypeError, match="FlatParams"):
                opt.init(params)
            return

    @jax.jit
    def step(params, state):
        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    state = optax.tree.map_params(opt, lambda v: v, state)  # tree_map_params works (a no-op)
    for _ in range(10000):
        params, state = step(params, state)
    assert step._cache_size() == 1, "the optimizer recompiles on a later call to update"
    if name == "adafactor" and kwargs.get("learning_rate") is None:
        return  # as Optax: the relative step size is far too small for these problems in 10000 steps
    got = params.to_tree()["x"] if flat else params["x"]
    np.testing.assert_allclose(got, final, rtol=3e-2, atol=3e-2)


@_parametrize
def test_optimization_refuses_complex_parameters(name, kwargs):
    """alias_test.py::test_optimization with complex64: optkit's documented refusal."""
    initial, _, _ = _setup_parabola(jnp.complex64)
    _refuses_complex(lambda: _opt(name, kwargs).init(initial))


@_parametrize
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no-jit"])
def test_optimizers_accept_extra_args(name, kwargs, jit):
    """alias_test.py::test_optimizers_accept_extra_args."""
    opt = _opt(name, kwargs)
    params, _, objective = _setup_rosenbrock(jnp.float32)

    def step(params, state):
        updates, state = opt.update(jax.grad(objective)(params), state, params,
                                    unexpected_extra_args_your_optimizer_doesnt_expect=1)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    state = opt.init(params)
    for _ in range(2):
        params, state = step(params, state)
    assert np.all(np.isfinite(params))


@_parametrize
def test_jit_equals_no_jit(name, kwargs):
    """The same steps compiled and not: equal within float32 rounding (XLA fuses multiply-adds)."""
    opt = _opt(name, kwargs)
    params0, _, objective = _setup_rosenbrock(jnp.float32)

    def step(params, state):
        updates, state = opt.update(jax.grad(objective)(params), state, params)
        return optax.apply_updates(params, updates), state

    results = []
    for fn in (jax.jit(step), step):
        params, state = params0, opt.init(params0)
        for _ in range(5):
            params, state = fn(params, state)
        results.append((params, state))
    chex.assert_trees_all_close(results[0], results[1], rtol=1e-5, atol=1e-7)


@_parametrize
@pytest.mark.parametrize("flat", [False, True], ids=["tree", "FlatParams"])
def test_optimizers_can_be_wrapped_in_inject_hyperparams(name, kwargs, flat):
    """alias_test.py::test_optimizers_can_be_wrapped_in_inject_hyperparams (with and without jit)."""
    if flat and name not in ELEMENTWISE:
        return
    factory = getattr(optkit, name)
    opt = factory(**kwargs)
    # As Optax's test: Adafactor's factoring threshold decides the state's structure, so it is static;
    # a dtype such as jnp.float32 is callable, and inject_hyperparams would take it for a schedule.
    static = ("min_dim_size_to_factor",) if name == "adafactor" else ()
    static += tuple(k for k in kwargs if k.endswith("_dtype"))
    opt_inject = optax.inject_hyperparams(factory, static_args=static)(**kwargs)
    params = [-jnp.ones((2, 3)), jnp.ones((2, 5, 2))]
    grads = [jnp.ones((2, 3)), -jnp.ones((2, 5, 2))]
    if flat:
        params, grads = optkit.FlatParams.from_tree(params), optkit.FlatParams.from_tree(grads)
    for transform in (jax.jit, lambda f: f):
        updates, new_state = transform(opt.update)(grads, transform(opt.init)(params), params)
        state_inject = transform(opt_inject.init)(params)
        updates_inject, new_state_inject = transform(opt_inject.update)(grads, state_inject, params)
        chex.assert_trees_all_close(updates_inject, updates, rtol=1e-3)
        chex.assert_trees_all_close(new_state_inject.inner_state, new_state, rtol=1e-4)


# name, state dtype argument, state attribute (optax.tree.get): every state dtype option.
EXPLICIT_DTYPES = [
    ("momentum", "accumulator_dtype", "trace"),
    ("adagrad", "accumulator_dtype", "sum_of_squares"),
    ("adam", "mu_dtype", "mu"),
    ("adam", "nu_dtype", "nu"),
    ("adafactor", "mu_dtype", "mu"),
]


@pytest.mark.parametrize("params_dtype", ["bfloat16", "float32", "complex64", None])
@pytest.mark.parametrize("state_dtype", ["bfloat16", "float32", "complex64", None])
@pytest.mark.parametrize("name,argument,attribute", EXPLICIT_DTYPES)
def test_explicit_dtype(name, argument, attribute, params_dtype, state_dtype):
    """alias_test.py::test_explicit_dtype (complex: optkit's documented errors)."""
    kwargs = {argument: state_dtype, **({"b1": 0.9} if name == "adafactor" else {})}
    if state_dtype == "complex64":
        with pytest.raises(TypeError, match=f"{argument} must be a floating dtype or None, got complex64"):
            getattr(optkit, name)(0.1, **kwargs)
        return
    opt = getattr(optkit, name)(0.1, **kwargs)
    params_dtype = jax.dtypes.canonicalize_dtype(params_dtype)
    params = jnp.array([0.0, 0.0], dtype=params_dtype)
    if params_dtype == jnp.complex64:
        _refuses_complex(lambda: opt.init(params))
        return
    state = opt.init(params)
    expected = params_dtype if state_dtype is None else jax.dtypes.canonicalize_dtype(state_dtype)
    assert optax.tree.get(state, attribute).dtype == expected


@_parametrize
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_preserve_dtype(name, kwargs, dtype):
    """alias_test.py::test_preserve_dtype: updates have the gradients' dtype."""
    opt = _opt(name, kwargs)
    params = jnp.array([1.0, 2.0], dtype=jnp.dtype(dtype))
    grads = jax.grad(lambda x: jnp.sum(x**2))(params)
    updates, _ = jax.jit(opt.update)(grads, jax.jit(opt.init)(params), params)
    assert updates.dtype == grads.dtype


@_parametrize
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_state_shape_dtype_shard_stability(name, kwargs, dtype):
    """alias_test.py::test_state_shape_dtype_shard_stability: lax.cond between the updated state and the
    old one needs both to have the same shapes and dtypes."""
    with jax.enable_x64(dtype in ("float64", "complex128")):
        dtype = jnp.dtype(dtype)
        opt = _opt(name, kwargs)
        initial, _, objective = _setup_parabola(dtype)
        if jnp.iscomplexobj(initial):
            _refuses_complex(lambda: opt.init(initial))
            return

        @jax.jit
        def step(params, state):
            updates = jax.grad(objective)(params)
            cond = jax.random.randint(jax.random.key(0), (), 0, 2) == 0
            updates, state = jax.lax.cond(cond, lambda: opt.update(updates, state, params),
                                          lambda: (params, state))
            return optax.apply_updates(params, updates), state

        params, state = initial, opt.init(initial)
        for _ in range(2):
            params, new_state = step(params, state)
            assert jax.tree.leaves(params)[0].dtype == dtype
            cond = jax.random.randint(jax.random.key(0), (), 0, 2) == 0
            state = jax.lax.cond(cond, lambda: state, lambda: new_state)  # noqa: B023


@_parametrize
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gradient_accumulation(name, kwargs, dtype):
    """alias_test.py::test_gradient_accumulation: inside optax.MultiSteps, the first update is zero."""
    opt = optax.MultiSteps(_opt(name, kwargs), every_k_schedule=4)
    params = jnp.array([1.0, 2.0], dtype=jnp.dtype(dtype))
    grads = jax.grad(lambda x: jnp.sum(x**2))(params)
    updates, _ = jax.jit(opt.update)(grads, jax.jit(opt.init)(params), params)
    chex.assert_trees_all_equal(updates, jnp.zeros_like(grads))


# ---------------------------------------------------------------- float64_test.py


@_parametrize
def test_mixed_dtype_input_outputs(name, kwargs):
    """float64_test.py::test_mixed_dtype_input_outputs: float32 and float64 leaves keep their dtypes."""
    with jax.enable_x64(True):
        params = (jnp.array([1.0, 2.0], jnp.float32), jnp.array([3.0, 4.0], jnp.float64))
        updates = (jnp.array([10.0, 21.0], jnp.float32), jnp.array([33.0, 42.0], jnp.float64))
        opt = _opt(name, kwargs)
        state = jax.jit(opt.init)(params)
        updates, new_state = jax.jit(opt.update)(updates, state, params=params)
        dtypes = lambda tree: jax.tree.map(lambda t: t.dtype, tree)  # noqa: E731
        assert dtypes(new_state) == dtypes(state)
        assert dtypes(optax.apply_updates(params, updates)) == dtypes(params)


# ---------------------------------------------------------------- sharding_test.py


@_parametrize
@pytest.mark.parametrize("with_sharding", [False, True], ids=["no sharding", "with a sharding"])
def test_init_with_abstract_input(name, kwargs, with_sharding):
    """sharding_test.py::test_init_with_abstract_input: init on a ShapeDtypeStruct gives concrete zeros
    with its shape, dtype and sharding (a 1-device sharding here; a mesh in test_optax_sharding.py)."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0]) if with_sharding else None
    params = jax.ShapeDtypeStruct(shape=(2, 4, 8), dtype=jnp.float32, sharding=sharding)
    state = _opt(name, kwargs).init(params)
    concrete = _opt(name, kwargs).init(jnp.zeros((2, 4, 8), jnp.float32))
    assert jax.tree.structure(state) == jax.tree.structure(concrete)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(concrete)):
        assert isinstance(got, jax.Array) and not isinstance(got, jax.core.Tracer)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got, want)
        if sharding is not None:
            assert got.sharding.device_set == sharding.device_set


# ---------------------------------------------------------------- transforms/_accumulation_test.py


def _dense_loss(params, data):
    return jnp.sum((data @ params["w"] + params["b"]) ** 2)


def _dense_params(dtype=jnp.float32):
    kw, _ = jax.random.split(jax.random.key(0))
    return {"w": (0.3 * jax.random.normal(kw, (7, 10))).astype(dtype), "b": jnp.zeros(10, dtype)}


@_parametrize
def test_multi_steps(name, kwargs):
    """_accumulation_test.py::test_multi_steps: parameters change only every k steps, and then the loss
    goes down; with the inner optimizer's own update of the mean gradient."""
    k_steps = 4
    data = jnp.ones([32, 7])
    # Optax's inner optimizer steps by 1e-4 (scale(-1e-4)); the same learning rate here.
    kwargs = {**kwargs, "learning_rate": 1e-4} if "learning_rate" in kwargs else kwargs
    ms_opt = optax.MultiSteps(_opt(name, kwargs), k_steps)
    params = _dense_params()
    opt_state = ms_opt.init(params)

    @jax.jit
    def train_step(data, opt_state, params):
        return ms_opt.update(jax.grad(_dense_loss)(params, data), opt_state, params)

    prev_loss = _dense_loss(params, data)
    for idx in range(3 * k_steps):
        updates, opt_state = train_step(data, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        new_loss = _dense_loss(new_params, data)
        if idx % k_steps < k_steps - 1:
            chex.assert_trees_all_equal(new_params, params)
            assert not ms_opt.has_updated(opt_state)
        else:
            assert new_loss < prev_loss
            assert ms_opt.has_updated(opt_state)
            prev_loss = new_loss
        params = new_params


@_parametrize
def test_multi_steps_mixed_precision(name, kwargs):
    """_accumulation_test.py::test_multi_steps_mixed_precision: MultiSteps' updates have the inner
    optimizer's dtypes, and the parameters keep theirs, for every mix of float32/float16/bfloat16.

    Dtypes are fixed when a step is traced, so the steps are traced (``jax.eval_shape``: what ``jax.jit``
    would compile, without compiling 18 programs per optimizer), the state carried abstractly."""
    k_steps = 4
    data = jnp.ones([32, 7])
    opt, ms_opt = _opt(name, kwargs), optax.MultiSteps(_opt(name, kwargs), k_steps)

    def train_step(data, state, params, update, upd_dtype):
        def step(data, state, params):
            grads = jax.tree.map(lambda x: x.astype(upd_dtype), jax.grad(_dense_loss)(params, data))
            return update(grads, state, params)

        return jax.eval_shape(step, data, state, params)

    dtypes = lambda tree: jax.tree.map(lambda x: x.dtype, tree)  # noqa: E731
    for upd_dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
        for param_dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
            params = _dense_params(param_dtype)
            x = data.astype(param_dtype)
            state, ms_state = jax.eval_shape(opt.init, params), jax.eval_shape(ms_opt.init, params)
            for _ in range(k_steps + 1):
                updates, state = train_step(x, state, params, opt.update, upd_dtype)
                ms_updates, ms_state = train_step(x, ms_state, params, ms_opt.update, upd_dtype)
                assert dtypes(updates) == dtypes(ms_updates), (upd_dtype, param_dtype)
                new_params = jax.eval_shape(optax.apply_updates, params, ms_updates)
                assert dtypes(new_params) == dtypes(params), (upd_dtype, param_dtype)
                params = new_params


# ---------------------------------------------------------------- transforms/_masking_test.py

MASK = {"a": True, "b": [False, True], "c": {"d": True, "e": (False, True)}}


def _mask_params():
    return jax.tree.map(jnp.asarray, {"a": 1.0, "b": [2.0, 3.0], "c": {"d": 4.0, "e": (5.0, 6.0)}})


@_parametrize
@pytest.mark.parametrize("use_fn", [False, True], ids=["mask", "mask_fn"])
def test_masked(name, kwargs, use_fn):
    """_masking_test.py::test_masked: masked-out leaves pass through, the others get the optimizer's update
    of them alone (scalar leaves), twice in a row (the second time without params where allowed)."""
    params = _mask_params()
    input_updates = jax.tree.map(lambda x: x / 10.0, params)
    mask_arg = (lambda _: MASK) if use_fn else MASK
    init_fn, update_fn = optax.masked(_opt(name, kwargs), mask_arg)
    state = jax.jit(init_fn)(params)
    chex.assert_trees_all_equal_structs(optax.tree.map_params(init_fn, lambda v: v, state), state)
    updates, state = jax.jit(update_fn)(input_updates, state, params)

    inner = _opt(name, kwargs)
    chosen = lambda tree: [x for x, m in zip(jax.tree.leaves(tree), jax.tree.leaves(MASK)) if m]  # noqa: E731
    want, _ = inner.update(chosen(input_updates), inner.init(chosen(params)), chosen(params))
    got_leaves = jax.tree.leaves(updates)
    chex.assert_trees_all_close(chosen(updates), want, rtol=1e-6)
    for got, given, m in zip(got_leaves, jax.tree.leaves(input_updates), jax.tree.leaves(MASK)):
        if not m:
            chex.assert_trees_all_equal(got, given)


@pytest.mark.parametrize("container", [list, tuple, dict])
@_parametrize
def test_masked_empty(name, kwargs, container):
    """_masking_test.py::test_empty: an empty tree."""
    init_fn, update_fn = optax.masked(_opt(name, kwargs), container())
    update_fn(container(), init_fn(container()))


@_parametrize
def test_masked_state_structure(name, kwargs):
    """_masking_test.py::test_masked_state_structure: masked-out leaves are MaskedNode in the inner state."""
    params = {"a": [jnp.ones(1), (jnp.ones(2), jnp.ones(3))], "b": {"c": jnp.ones(4), "d": jnp.ones(5)}}
    mask = {"a": [True, (True, False)], "b": False}
    state = jax.jit(optax.masked(_opt(name, kwargs), mask).init)(params)
    inner = state.inner_state[0]
    fields = ("mu", "trace", "sum_of_squares", "nu")
    full = next(getattr(inner, f) for f in fields if getattr(inner, f, None) is not None)
    masked_node = optax.transforms.MaskedNode()
    expected = {"a": [jnp.zeros(1), (jnp.zeros(2), masked_node)], "b": masked_node}
    assert jax.tree.structure(full, is_leaf=lambda x: isinstance(
        x, (optkit.FactoredSecondMoment, optkit.FullSecondMoment))) == jax.tree.structure(expected)


@_parametrize
def test_nested_mask(name, kwargs):
    """_masking_test.py::test_nested_mask: masked(masked(opt)) updates the leaves both masks select."""
    params = {
        "linear_1": {"w": jnp.full((1, 1), 0.5), "b": jnp.zeros(1)},
        "linear_2": {"w": jnp.full((1, 2), 0.5), "b": jnp.zeros(2)},
        "linear_3": {"w": jnp.full((2, 3), 0.5), "b": jnp.zeros(3)},
    }
    outer_mask = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)  # noqa: E731
    inner_mask = jax.tree.map(lambda _: True, params)
    inner_mask["linear_2"] = False
    init_fn, update_fn = optax.masked(optax.masked(_opt(name, kwargs), inner_mask), outer_mask)
    input_updates = jax.tree.map(jnp.ones_like, params)
    updates, _ = jax.jit(update_fn)(input_updates, jax.jit(init_fn)(params), params)
    inner = _opt(name, kwargs)
    chosen = {k: params[k]["w"] for k in ("linear_1", "linear_3")}
    want, _ = inner.update(jax.tree.map(jnp.ones_like, chosen), inner.init(chosen), chosen)
    for key in ("linear_1", "linear_3"):
        chex.assert_trees_all_close(updates[key]["w"], want[key], rtol=1e-6)
    for key, leaf in (("linear_2", "w"), ("linear_1", "b"), ("linear_2", "b"), ("linear_3", "b")):
        chex.assert_trees_all_equal(updates[key][leaf], input_updates[key][leaf])


# ---------------------------------------------------------------- transforms/_combining_test.py


@_parametrize
def test_partition(name, kwargs):
    """_combining_test.py::test_partition: each label's optimizer sees its own leaves only."""
    params = jax.tree.map(jnp.asarray, {"a1": 1.0, "b1": 2.0, "z1": {"a2": 3.0, "z2": {"c1": 4.0}}})
    labels = {"a1": "a", "b1": "b", "z1": {"a2": "a", "z2": {"c1": "c"}}}
    tx = optax.partition({"a": _opt(name, kwargs), "b": optax.ema(0.0), "c": optax.scale(2.0)}, labels)
    input_updates = jax.tree.map(lambda x: x / 10.0, params)
    updates, _ = jax.jit(tx.update)(input_updates, jax.jit(tx.init)(params), params)
    inner = _opt(name, kwargs)
    a_params = [params["a1"], params["z1"]["a2"]]
    want, _ = inner.update([input_updates["a1"], input_updates["z1"]["a2"]], inner.init(a_params), a_params)
    chex.assert_trees_all_close([updates["a1"], updates["z1"]["a2"]], want, rtol=1e-6)
    chex.assert_trees_all_close(updates["b1"], input_updates["b1"])
    chex.assert_trees_all_close(updates["z1"]["z2"]["c1"], 2.0 * input_updates["z1"]["z2"]["c1"])


@pytest.mark.parametrize("container", [list, tuple, dict])
@_parametrize
def test_partition_empty(name, kwargs, container):
    """_combining_test.py::test_empty."""
    init_fn, update_fn = optax.partition({0: _opt(name, kwargs)}, lambda _: 0)
    updates, _ = update_fn(container(), init_fn(container()))
    assert updates == container()


@_parametrize
def test_chain_with_extra_args(name, kwargs):
    """_combining_test.py::test_extra_args: in optax.chain, a transformation that needs a keyword
    argument gets it, and optkit's links ignore it (and any other)."""
    seen = []

    def update_with_loss(updates, state, params=None, *, loss, **extra_args):
        del params, extra_args
        seen.append(loss)
        return updates, state

    extra = optax.GradientTransformationExtraArgs(lambda params: (), update_with_loss)
    chained = optax.chain(_opt(name, kwargs), extra)
    assert isinstance(chained, optax.GradientTransformationExtraArgs)
    params = {"a": jnp.array([1.0, -2.0]), "b": jnp.array(2.0)}
    state = chained.init(params)
    updates, _ = chained.update(params, state, params, loss=1, ignored_kwarg="hi")
    plain = _opt(name, kwargs)
    want, _ = plain.update(params, plain.init(params), params)
    chex.assert_trees_all_close(updates, want, rtol=1e-6)
    assert seen == [1]


# ---------------------------------------------------------------- transforms/_conditionality_test.py


@_parametrize
def test_apply_if_finite(name, kwargs):
    """_conditionality_test.py::test_apply_if_finite: non-finite steps are skipped (parameters and state
    unchanged) until max_consecutive_errors, then applied; finite steps are the optimizer's own."""
    params = jnp.array(0.5)
    opt = optax.apply_if_finite(_opt(name, kwargs), 2)
    plain = _opt(name, kwargs)
    state, plain_state = opt.init(params), plain.init(params)

    def finite_step(params, state, plain_state):
        updates, state = opt.update(jnp.array(1.0), state, params)
        want, plain_state = plain.update(jnp.array(1.0), plain_state, params)
        chex.assert_trees_all_close(updates, want, rtol=1e-6)
        assert bool(state.last_finite)
        return optax.apply_updates(params, updates), state, plain_state

    params, state, plain_state = finite_step(params, state, plain_state)
    for _ in range(2):
        for step in range(2):
            updates, state = opt.update(jnp.array(jnp.nan), state, params)
            assert float(optax.apply_updates(params, updates)) == float(params)
            assert not bool(state.last_finite) and int(state.notfinite_count) == step + 1
        params, state, plain_state = finite_step(params, state, plain_state)
    updates, state = opt.update(jnp.array(jnp.nan), state, params)
    updates, state = opt.update(jnp.array(jnp.nan), state, params)
    updates, state = opt.update(jnp.array(jnp.nan), state, params)  # the third in a row is applied
    assert bool(jnp.isnan(optax.apply_updates(params, updates)))
    assert int(state.total_notfinite) == 7


# ---------------------------------------------------------------- tree_utils/_state_utils_test.py


@_parametrize
def test_tree_get_and_set_count(name, kwargs):
    """_state_utils_test.py::test_tree_get / test_tree_set: the step count is found and set by name, and
    a set count is the one the next update uses (jitted)."""
    params = jnp.array([1.0, 2.0, 3.0])
    opt = _opt(name, kwargs)
    state = opt.init(params)
    assert int(optax.tree.get(state, "count")) == 0
    _, state = opt.update(params, state, params)
    assert int(optax.tree.get(state, "count")) == 1
    moved = jax.jit(lambda s: optax.tree.set(s, count=jnp.asarray(41, jnp.int32)))(state)
    assert int(optax.tree.get(moved, "count")) == 41
    _, moved = jax.jit(opt.update)(params, moved, params)
    assert int(optax.tree.get(moved, "count")) == 42
    with pytest.raises(KeyError):
        optax.tree.set(state, ema=2.0)


@pytest.mark.parametrize("name", ["adagrad", "adam", "momentum", "adafactor"])
def test_tree_get_and_set_injected_hyperparameters(name):
    """_state_utils_test.py::test_tree_set ('modifying an injected hyperparam'): a learning rate set in
    the state is the one the next (jitted) update uses."""
    params = jnp.array([1.0, 2.0, 3.0])
    opt = optax.inject_hyperparams(getattr(optkit, name))(learning_rate=1.0)
    state = opt.init(params)
    assert float(optax.tree.get(state, "learning_rate")) == 1.0
    set_lr = jax.jit(lambda s, lr: optax.tree.set(s, learning_rate=lr))
    updates_one, _ = jax.jit(opt.update)(params, state, params)
    updates_half, state = jax.jit(opt.update)(params, set_lr(state, 0.5), params)
    assert float(optax.tree.get(state, "learning_rate")) == 0.5
    chex.assert_trees_all_close(updates_half, jax.tree.map(lambda u: 0.5 * u, updates_one), rtol=1e-6)


@_parametrize
def test_tree_map_params(name, kwargs):
    """_state_utils_test.py::test_adam: tree_map_params maps every state tree with the parameters' tree
    structure and leaves the rest (the count). Adafactor's statistics are such a tree, with a
    FactoredSecondMoment or FullSecondMoment node per parameter, so all their arrays are mapped, as
    Optax maps its own Adafactor's v_row and v_col trees."""
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4)}
    opt = _opt(name, kwargs)
    state = opt.init(params)
    mapped = optax.tree.map_params(opt, lambda v: v + 1, state, transform_non_params=lambda v: v)
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(mapped)[0], jax.tree.leaves(state)):
        if ".count" in jax.tree_util.keystr(path):
            chex.assert_trees_all_equal(got, want)
        else:
            chex.assert_trees_all_equal(got, want + 1)


# ---------------------------------------------------------------- scalar and empty trees


@_parametrize
@pytest.mark.parametrize("tree", [jnp.array(1.5), {"a": jnp.array(1.5)}, {}, [], ()],
                         ids=["scalar", "dict of a scalar", "empty dict", "empty list", "empty tuple"])
def test_scalar_and_empty_trees(name, kwargs, tree):
    """Scalars and empty trees, as Optax's tests use them (test_multi_steps_every_k_schedule, test_empty)."""
    opt = _opt(name, kwargs)
    state = jax.jit(opt.init)(tree)
    updates, state = jax.jit(opt.update)(tree, state, tree)
    assert jax.tree.structure(updates) == jax.tree.structure(tree)
    assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
    assert int(optax.tree.get(state, "count")) == 1


# ---------------------------------------------------------------------------
# optax/schedules/_inject_test.py: test_hyperparam_dtypes and test_hyperparam_default_dtype, over every
# optkit transformation with decay rates (b1=0.9, b2=0.95, as Optax's tests take them).

DECAY_FACTORIES = {
    "scale_by_dml_adam": (optkit.scale_by_dml_adam, dict(b1=0.9, b2=0.95)),
    "adam": (optkit.adam, dict(learning_rate=0.1, b1=0.9, b2=0.95)),
    "adafactor": (optkit.adafactor, dict(b1=0.9)),
    "scale_by_adafactor": (optkit.scale_by_adafactor, dict(b1=0.9)),
}


def _inject(factory, **kwargs):
    """optax.inject_hyperparams, with Adafactor's structural option static (it decides the state's shape)."""
    static = ("min_dim_size_to_factor",) if "factored_dims" in inspect.signature(factory).parameters else ()
    return optax.inject_hyperparams(factory, static_args=static, **kwargs)


@pytest.mark.parametrize("hyperparam_dtype, param_dtype, grad_dtype", [
    (jnp.bfloat16, jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float32, jnp.float32),
    (jnp.float32, jnp.bfloat16, jnp.bfloat16), (jnp.float32, jnp.float32, jnp.bfloat16),
    (jnp.float32, jnp.bfloat16, jnp.float32)])
@pytest.mark.parametrize("name", list(DECAY_FACTORIES))
def test_hyperparam_dtypes(name, hyperparam_dtype, param_dtype, grad_dtype):
    """The hyperparam_dtype override is honoured: bfloat16 decays (0.8984375, 0.94921875) are valid, and
    the update runs in float32 from their values."""
    factory, kwargs = DECAY_FACTORIES[name]
    optim = _inject(factory, hyperparam_dtype=hyperparam_dtype)(**kwargs)
    params = [jnp.ones((1, 2), dtype=param_dtype), jnp.ones(2, dtype=param_dtype), jnp.ones((1, 1, 1), param_dtype)]
    grads = jax.tree.map(lambda x: x.astype(grad_dtype), params)
    state = jax.jit(optim.init)(params)
    for key in kwargs:
        if key != "learning_rate":
            assert state.hyperparams[key].dtype == hyperparam_dtype
    updates, state = jax.jit(optim.update)(grads, state, params)
    for key in kwargs:
        if key != "learning_rate":
            assert state.hyperparams[key].dtype == hyperparam_dtype
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))
    # The same numbers as the decays' values given as float32 (what they are in bfloat16).
    values = {k: (jnp.asarray(v, hyperparam_dtype).astype(jnp.float32) if k != "learning_rate" else v)
              for k, v in kwargs.items()}
    want, _ = factory(**values).update(grads, factory(**values).init(params), params)
    for got, expected in zip(jax.tree.leaves(updates), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), rtol=1e-2)


@pytest.mark.parametrize("param_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("name", list(DECAY_FACTORIES))
def test_hyperparam_default_dtype(name, param_dtype):
    """The default hyperparameter dtype follows the parameters' (bfloat16 too), and explicit dtypes stay."""
    factory, kwargs = DECAY_FACTORIES[name]
    decays = [k for k in kwargs if k != "learning_rate"]
    params = [jnp.ones((1, 2), dtype=param_dtype), jnp.ones(2, dtype=param_dtype)]
    for given in (kwargs, {k: jnp.asarray(v) if k in decays else v for k, v in kwargs.items()}):
        optim = _inject(factory)(**given)
        state = jax.jit(optim.init)(params)
        assert all(state.hyperparams[k].dtype == param_dtype for k in decays)
        jax.jit(optim.update)(params, state, params)
    mixed = dict(kwargs, b1=jnp.array(0.9, dtype=jnp.float32))
    if "b2" in kwargs:
        mixed["b2"] = jnp.asarray(0.95, dtype=jnp.bfloat16)
    state = jax.jit(_inject(factory)(**mixed).init)(params)
    assert state.hyperparams["b1"].dtype == jnp.float32
    if "b2" in kwargs:
        assert state.hyperparams["b2"].dtype == jnp.bfloat16


@pytest.mark.parametrize("name", list(DECAY_FACTORIES))
def test_a_16_bit_decay_that_rounds_out_of_range_is_an_error_and_a_traced_one_gives_nan(name):
    """0.999 is 1.0 in bfloat16: refused when its value is known, NaN updates (never silent zeros) when traced."""
    factory, kwargs = DECAY_FACTORIES[name]
    key = "b2" if "b2" in kwargs else "b1"
    bad = dict(kwargs, **{key: 0.999})
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    optim = _inject(factory, hyperparam_dtype=jnp.bfloat16)(**bad)
    with pytest.raises(ValueError, match=f"{key} is the bfloat16 value 1.0, outside \\[0, 1\\)"):
        optim.update(params, optim.init(params), params)
    state = jax.jit(optim.init)(params)
    updates, _ = jax.jit(optim.update)(params, state, params)
    assert bool(jnp.all(jnp.isnan(updates["w"])))
