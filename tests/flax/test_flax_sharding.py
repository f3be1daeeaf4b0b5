"""Sharded Flax models: ``nnx.Optimizer`` on a partitioned NNX model and a linen ``TrainState``.

On a 2x4 (``data``, ``model``) mesh with ``Auto`` axes, a model whose
parameters carry ``nnx.with_partitioning`` annotations (column- and
row-parallel kernels, a sharded bias, a stacked ``[layers, d0, d1]`` kernel, a
parameter with Flax's ``optimizer_sharding``, a replicated vector) is built
under ``jax.set_mesh``, and for every optimizer:

- ``nnx.Optimizer`` builds (``optax.adafactor`` fails here: its statistics
  inherit the rank-2 annotation), and every state array follows its parameter:
  full-size state has the parameter's sharding (its ``optimizer_sharding``
  where set), a factored statistic the parameter's with the reduced axis
  dropped; the state variables' metadata (``out_sharding``) is reduced the
  same way (asserted on the metadata, not only on the arrays);
- 10 ``nnx.jit`` steps equal the one-device run within 1e-5, and no state
  array that keeps a sharded axis of its parameter is fully replicated.

The same for a linen ``TrainState`` on ``nn.with_partitioning`` parameters,
built and stepped under ``jax.jit`` with the shardings ``nn.get_sharding``
reads off its abstract state. Runs on 8 simulated CPU devices
(tests/_devices.py).
"""

from __future__ import annotations

import jax
import pytest

from tests._devices import has_devices, rerun_in_child

if not has_devices():
    test_flax_sharding_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import linen as nn
    from flax import nnx
    from flax.training import train_state
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import optkit

    STEPS = 10
    CPU = jax.devices("cpu")

    def make_mesh():
        return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=CPU[:8])

    # name: (optimizer, factored_dims of its Adafactor state or None)
    OPTIMIZERS = {
        "adagrad": (lambda: optkit.adagrad(0.1, decay_factor=0.1, norm_coefficient=0.01), None),
        "adam": (lambda: optkit.adam(1e-2, norm_coefficient=0.01), None),
        "momentum": (lambda: optkit.momentum(0.05, 0.9, nesterov=True), None),
        "adafactor": (lambda: optkit.adafactor(), "last"),
        "adafactor(largest, b1)": (lambda: optkit.adafactor(b1=0.9, factored_dims="largest"), "largest"),
        "adafactor(factored=False)": (lambda: optkit.adafactor(factored=False), "last"),
        "chain(clip, adafactor)": (
            lambda: optax.chain(optax.clip_by_global_norm(1.0), optkit.adafactor(1e-2, weight_decay_rate=0.01)),
            "last"),
    }

    # name: (shape, sharding names, optimizer_sharding or None)
    PARAMS = {
        "up": ((16, 32), (None, "model"), None),  # column-parallel
        "up_bias": ((32,), ("model",), None),
        "down": ((32, 16), ("model", None), ("model", "data")),  # row-parallel; its state also along data
        "stack": ((2, 32, 16), (None, "model", None), None),  # stacked layers
        "gain": ((16,), (None,), None),  # replicated
    }

    class Net(nnx.Module):
        def __init__(self, rngs):
            for name, (shape, names, optimizer_sharding) in PARAMS.items():
                extra = {} if optimizer_sharding is None else {"optimizer_sharding": optimizer_sharding}
                init = nnx.initializers.normal(0.3) if name != "gain" else nnx.initializers.ones
                value = nnx.with_partitioning(init, names, **extra)(rngs.params(), shape)
                setattr(self, name, nnx.Param(value))

        def __call__(self, x):
            h = jnp.tanh(x @ self.up + self.up_bias)
            z = jnp.einsum("bi,lio->bo", h, self.stack)
            return (h @ self.down + z) * self.gain

    def batch(i):
        kx, ky = jax.random.split(jax.random.key(100 + i))
        return jax.random.normal(kx, (8, 16)), jax.random.normal(ky, (8, 16))

    def loss(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    def train(model, optimizer, shard_batch=lambda v: v):
        @nnx.jit
        def step(model, optimizer, x, y):
            optimizer.update(model, nnx.grad(loss)(model, x, y))

        for i in range(STEPS):
            step(model, optimizer, *map(shard_batch, batch(i)))
        return nnx.to_pure_dict(nnx.state(model, nnx.Param)), nnx.as_pure(optimizer.opt_state)

    def one_device_run(make_tx):
        with nnx.use_eager_sharding(False):  # the annotations stay metadata: one device
            model = Net(nnx.Rngs(0))
        return train(model, nnx.Optimizer(model, make_tx(), wrt=nnx.Param))

    def assert_close(got, want, rtol=1e-5, where=""):
        """|got - want| <= rtol * max|want| per leaf (float32 sums reordered across shards)."""
        got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
        assert len(got_leaves) == len(jax.tree.leaves(want))
        for (path, g), w in zip(got_leaves, jax.tree.leaves(want)):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            scale = max(np.max(np.abs(w), initial=0.0), np.finfo(np.float32).tiny)
            err = np.max(np.abs(g - w), initial=0.0) / scale
            assert err <= rtol, f"{where}{jax.tree_util.keystr(path)}: relative difference {err:.3g} > {rtol}"

    def padded(names, ndim):
        return tuple(names) + (None,) * (ndim - len(names))

    def expected_names(path, value, factored_dims):
        """The sharding names a state leaf must carry, from its parameter's own."""
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        owner = [k for k in keys if k in PARAMS]
        if not owner:
            return ()  # count, step, injected hyperparameters: scalars
        shape, names, optimizer_sharding = PARAMS[owner[-1]]
        names = padded(optimizer_sharding or names, len(shape))
        field = keys[-1]
        if field in ("v_row", "v_col"):
            row, col = optkit.factored_axes(shape, factored_dims=factored_dims)
            dropped = col if field == "v_row" else row
            return names[:dropped] + names[dropped + 1:]
        return names

    def assert_state_follows_params(opt_state, factored_dims, mesh, *, check_metadata):
        variables = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
        checked = 0
        for path, variable in variables:
            where = jax.tree_util.keystr(path)
            value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
            want = expected_names(path, value, factored_dims)
            if not want:
                continue
            checked += 1
            got_spec = padded(value.sharding.spec, value.ndim)
            assert value.sharding.is_equivalent_to(NamedSharding(mesh, P(*want)), value.ndim), (
                f"{where}: {got_spec}, expected {want}")
            if any(want):
                assert not value.sharding.is_fully_replicated, f"{where} is replicated"
            if check_metadata:
                assert padded(variable.get_metadata()["out_sharding"], value.ndim) == want, (
                    f"{where}: metadata {variable.get_metadata()['out_sharding']}, expected {want}")
        assert checked >= len(PARAMS)

    @pytest.mark.parametrize("name", list(OPTIMIZERS))
    def test_nnx_optimizer_on_a_partitioned_model(name):
        make_tx, factored_dims = OPTIMIZERS[name]
        want_params, want_state = one_device_run(make_tx)
        mesh = make_mesh()
        data = NamedSharding(mesh, P("data", None))
        with jax.set_mesh(mesh):
            model = Net(nnx.Rngs(0))
            optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
            assert_state_follows_params(optimizer.opt_state, factored_dims, mesh, check_metadata=True)
            params, state = train(model, optimizer, lambda v: jax.device_put(v, data))
            # XLA (Auto axes) may add a sharding to an axis the annotation left free, to state and
            # parameter alike; what must hold is that no sharded axis of a parameter is lost.
            for (path, leaf) in jax.tree_util.tree_flatten_with_path(state)[0]:
                names = expected_names(path, leaf, factored_dims)
                got = padded(leaf.sharding.spec, leaf.ndim)
                for axis, name_ in enumerate(names):
                    if name_ is not None:
                        assert got[axis] == name_, f"{jax.tree_util.keystr(path)}: {got}, expected {names}"
        assert_close(params, want_params, where="params")
        assert_close(state, want_state, where="state")

    def test_optax_adafactor_fails_where_optkit_builds():
        """The failure this module guards against, seen with optax's own Adafactor (if it still fails)."""
        with jax.set_mesh(make_mesh()):
            model = Net(nnx.Rngs(0))
            try:
                nnx.Optimizer(model, optax.adafactor(1e-2, min_dim_size_to_factor=1), wrt=nnx.Param)
            except ValueError as err:
                assert "rank" in str(err)
            nnx.Optimizer(model, optkit.adafactor(), wrt=nnx.Param)

    # ------------------------------------------------------------ linen TrainState

    class LinenNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            ki = nn.initializers.lecun_normal()
            h = nn.Dense(32, kernel_init=nn.with_partitioning(ki, (None, "model")),
                         bias_init=nn.with_partitioning(nn.initializers.zeros, ("model",)))(x)
            h = jnp.tanh(h)
            return nn.Dense(16, kernel_init=nn.with_partitioning(ki, ("model", None)))(h)

    @pytest.mark.parametrize("name", ["adam", "adafactor", "adafactor(largest, b1)"])
    def test_linen_train_state_under_jit_with_shardings(name):
        make_tx, _ = OPTIMIZERS[name]
        model = LinenNet()

        def create(key):
            params = model.init(key, jnp.ones((1, 16)))["params"]
            return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=make_tx())

        def step(state, x, y):
            grads = jax.grad(lambda p: jnp.mean((state.apply_fn({"params": p}, x) - y) ** 2))(state.params)
            return state.apply_gradients(grads=grads)

        mesh = make_mesh()
        abstract = jax.eval_shape(create, jax.random.key(0))
        shardings = nn.get_sharding(abstract, mesh)  # reads every box: the state's must fit its arrays
        state = jax.jit(create, out_shardings=shardings)(jax.random.key(0))
        data = NamedSharding(mesh, P("data", None))
        sharded_step = jax.jit(step, in_shardings=(shardings, data, data), out_shardings=shardings)
        plain = jax.jit(create)(jax.random.key(0))
        for i in range(STEPS):
            x, y = batch(i)
            state = sharded_step(state, jax.device_put(x, data), jax.device_put(y, data))
            plain = jax.jit(step)(plain, x, y)
        specs = nn.get_partition_spec(state.opt_state)
        leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(state.opt_state))[0]
        for (path, leaf), spec in zip(leaves, jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))):
            where = jax.tree_util.keystr(path)
            assert len(spec) in (0, leaf.ndim), f"{where}: {spec} for shape {leaf.shape}"
            assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim), where
            if any(s is not None for s in spec):
                assert not leaf.sharding.is_fully_replicated, where
        assert_close(nn.unbox((state.params, state.opt_state)), nn.unbox((plain.params, plain.opt_state)))


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
