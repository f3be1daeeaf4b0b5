"""Every optimizer where Flax users call it: ``nnx.Optimizer`` (jitted and eager) and linen's ``TrainState``.

The reference is the same steps done by hand: ``tx.init`` and ``tx.update`` on
the parameters as a plain dict (``nnx.to_pure_dict``). What Flax adds is what
it does to the state between steps: ``nnx.Optimizer`` wraps every state array
in an ``nnx.Variable`` and writes the new state back with ``nnx.update``, and
linen keeps ``nn.Partitioned`` boxes around parameters, gradients and state.
Sharded models are in tests/flax/test_flax_sharding.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optkit

nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")
serialization = pytest.importorskip("flax.serialization")
train_state = pytest.importorskip("flax.training.train_state")

STEPS = 10

# Every optimizer, every Adafactor state layout (factored over the last two axes or the two largest,
# partly or not at all, with and without b1), and inside optax.chain.
OPTIMIZERS = {
    "adagrad": lambda: optkit.adagrad(0.1, decay_factor=0.1, norm_coefficient=0.01),
    "adam": lambda: optkit.adam(1e-2, norm_coefficient=0.01, norm_coefficient_post=1e-3),
    "momentum": lambda: optkit.momentum(0.1, 0.9, 0.5, nesterov=True, norm_coefficient=0.01),
    "adafactor": lambda: optkit.adafactor(),
    "adafactor(b1)": lambda: optkit.adafactor(b1=0.9),
    "adafactor(largest, b1, weight decay)": lambda: optkit.adafactor(
        1e-2, b1=0.9, weight_decay_rate=0.01, factored_dims="largest"),
    "adafactor(factored=False)": lambda: optkit.adafactor(factored=False),
    "adafactor(min_dim_size_to_factor=5)": lambda: optkit.adafactor(min_dim_size_to_factor=5),
    "chain(clip, adafactor)": lambda: optax.chain(optax.clip_by_global_norm(1.0), optkit.adafactor(b1=0.5)),
    "chain(scale_by_factored_rms)": lambda: optax.chain(
        optkit.scale_by_factored_rms(), optax.clip_by_block_rms(1.0), optax.scale(-1e-2)),
    "chain(clip, adam)": lambda: optax.chain(optax.clip_by_global_norm(1.0), optkit.adam(1e-2)),
    "inject_hyperparams(adam)": lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=1e-2),
}


class Net(nnx.Module):
    """A matrix, a vector, a rank-3 tensor (factored per leading index) and a scalar parameter."""

    def __init__(self, rngs):
        self.inner = nnx.Linear(6, 8, rngs=rngs)  # kernel (6, 8): factored; bias (8,)
        self.stack = nnx.Param(0.3 * jax.random.normal(rngs.params(), (2, 8, 4)))
        self.gain = nnx.Param(jnp.float32(1.5))
        self.out = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        h = jnp.tanh(self.inner(x))
        z = jnp.einsum("bi,lio->bo", h, self.stack) * self.gain
        return self.out(z)


def _batch(i):
    kx, ky = jax.random.split(jax.random.key(100 + i))
    return jax.random.normal(kx, (5, 6)), jax.random.normal(ky, (5, 3))


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def _pure_run(make_tx, jit):
    """The reference: tx.init / tx.update on the parameters as a plain dict."""
    graphdef, params = nnx.split(Net(nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)
    tx = make_tx()
    state = tx.init(params)

    def step(params, state, x, y):
        grads = jax.grad(lambda p: _loss(nnx.merge(graphdef, nnx.State(p)), x, y))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    for i in range(STEPS):
        params, state = step(params, state, *_batch(i))
    return params, state


def _nnx_run(make_tx, jit):
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)

    def step(model, optimizer, x, y):
        grads = nnx.grad(_loss)(model, x, y)
        optimizer.update(model, grads)

    step = nnx.jit(step) if jit else step
    for i in range(STEPS):
        step(model, optimizer, *_batch(i))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param)), optimizer


def _assert_close(got, want, rtol, where):
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), where
    for (path, g), w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=1e-7,
                                   err_msg=f"{where}{jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("jit", [True, False], ids=["nnx.jit", "eager"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_nnx_optimizer_equals_tx_update_on_pure_dicts(name, jit):
    want_params, want_state = _pure_run(OPTIMIZERS[name], jit)
    params, optimizer = _nnx_run(OPTIMIZERS[name], jit)
    _assert_close(params, want_params, 1e-6, "params")
    # The state nnx.Optimizer holds: Variables around the same arrays, in the same places.
    state = nnx.as_pure(optimizer.opt_state)
    _assert_close(state, want_state, 1e-6, "opt_state")
    assert int(optimizer.step[...]) == STEPS


def test_nnx_optimizer_keeps_adafactor_state_structure_across_steps():
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optkit.adafactor(b1=0.9), wrt=nnx.Param)
    structure = jax.tree.structure(optimizer.opt_state)
    for i in range(3):
        optimizer.update(model, nnx.grad(_loss)(model, *_batch(i)))
        assert jax.tree.structure(optimizer.opt_state) == structure
    nu = nnx.as_pure(optimizer.opt_state)[0].nu
    assert isinstance(nu["inner"]["kernel"], optkit.FactoredSecondMoment)
    assert isinstance(nu["inner"]["bias"], optkit.FullSecondMoment)
    assert nu["stack"].v_row.shape == (2, 8) and nu["stack"].v_col.shape == (2, 4)


@pytest.mark.parametrize("name", ["adafactor", "adafactor(b1)", "chain(scale_by_factored_rms)", "adam"])
def test_state_as_plain_dicts_from_flax_serialization(name):
    """``flax.serialization.to_state_dict`` without a target gives dicts for every NamedTuple; the
    update reads them and writes the new state in the same form."""
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones(4)}
    grads = {"w": jnp.cos(params["w"]), "b": jnp.sin(params["b"])}
    tx = OPTIMIZERS[name]()
    state = tx.init(params)
    want_updates, want_state = tx.update(grads, state, params)
    as_dicts = serialization.to_state_dict(state)
    inner = as_dicts["0"]
    assert isinstance(inner, dict) and not isinstance(inner, tuple)
    # optax.chain's own state is a tuple: the chain needs its tuple back, each link may be a dict.
    as_dicts = tuple(as_dicts[str(i)] for i in range(len(state)))
    updates, new_state = jax.jit(tx.update)(grads, as_dicts, params)
    _assert_close(updates, want_updates, 1e-6, "updates")
    # A state mapping is read as the state NamedTuple; the statistics keep the form they were given.
    assert type(new_state[0]) is type(state[0])
    if "nu" in as_dicts[0]:
        assert jax.tree.structure(new_state[0].nu) == jax.tree.structure(as_dicts[0]["nu"])
    _assert_close(serialization.to_state_dict(new_state), serialization.to_state_dict(want_state), 1e-6, "state")


def test_adafactor_state_errors_name_the_optimizer_and_the_leaf():
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4)}
    tx = optkit.scale_by_adafactor()
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    missing = state._replace(nu={"w": {"v_row": state.nu["w"].v_row}, "b": state.nu["b"]})
    with pytest.raises(ValueError, match=r"scale_by_adafactor: state.nu at \['w'\] does not match.*found \['v_row'\]"):
        tx.update(grads, missing, params)
    other = state._replace(nu={"w": state.nu["w"], "c": state.nu["b"]})
    with pytest.raises(ValueError, match=r"scale_by_adafactor: state.nu does not match updates: leaf 0 is at \['c'\]"):
        tx.update(grads, other, params)
    wrong_shape = state._replace(nu={"w": {"v": jnp.ones((3, 4))}, "b": {"v": jnp.ones(5)}})
    with pytest.raises(ValueError, match=r"scale_by_adafactor: state.nu at \['b'\]: v has shape \(5,\)"):
        tx.update(grads, wrong_shape, params)
    with pytest.raises(ValueError, match=r"scale_by_factored_rms: state.nu at \['w'\]"):
        optkit.scale_by_factored_rms().update(grads, optkit.scale_by_factored_rms().init(
            {"w": jnp.ones((4, 3)), "b": jnp.ones(4)}), params)


# ---------------------------------------------------------------- linen TrainState


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model"))
        h = jnp.tanh(nn.Dense(8, kernel_init=kernel, bias_init=nn.with_partitioning(
            nn.initializers.zeros, ("model",)))(x))
        return nn.Dense(3, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), ("model", None)))(h)


@pytest.mark.parametrize("name", ["adam", "adafactor", "adafactor(largest, b1, weight decay)"])
def test_linen_train_state_with_partitioned_boxes(name):
    """``TrainState.create`` on ``nn.Partitioned`` parameters, jitted ``apply_gradients``: the same
    numbers as the unboxed run, and every state box names the axes of its own array."""
    model = LinenNet()
    boxed = model.init(jax.random.key(0), jnp.ones((1, 6)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=boxed, tx=OPTIMIZERS[name]())

    @jax.jit
    def step(state, x, y):
        grads = jax.grad(lambda p: jnp.mean((state.apply_fn({"params": p}, x) - y) ** 2))(state.params)
        return state.apply_gradients(grads=grads)

    plain = train_state.TrainState.create(apply_fn=model.apply, params=nn.unbox(boxed), tx=OPTIMIZERS[name]())
    for i in range(STEPS):
        state, plain = step(state, *_batch(i)), step(plain, *_batch(i))
    _assert_close(nn.unbox(state.params), plain.params, 1e-6, "params")
    _assert_close(nn.unbox(state.opt_state), plain.opt_state, 1e-6, "opt_state")
    specs = nn.get_partition_spec(state.opt_state)
    for (path, spec), leaf in zip(jax.tree_util.tree_flatten_with_path(specs)[0], jax.tree.leaves(state.opt_state)):
        assert len(spec) in (0, np.ndim(leaf)), f"{jax.tree_util.keystr(path)}: {spec} for shape {np.shape(leaf)}"
