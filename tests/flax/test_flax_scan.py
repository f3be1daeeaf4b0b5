"""Scanned layers in Flax train exactly like unrolled ones under Adafactor with factor rules (SPEC 5b).

- NNX: blocks made by ``nnx.vmap(..., transform_metadata={nnx.PARTITION_NAME:
  "layers"})`` and run by ``nnx.scan`` (parameters ``[layers, ...]``), in
  ``nnx.Optimizer(model, optkit.adafactor(logical_factor_rules=...))``, with
  no other argument: the names come from the parameters' metadata. 8 jitted
  steps equal the same blocks kept separate within 2e-5; the same for
  ``optkit.t5x_adafactor``.
- The same model sharded on a 2x4 mesh (``layers`` on ``data``, ``mlp`` on
  ``model``): the statistics keep the parameter's sharding without the
  reduced axes, the batch axis keeps its own, and the numbers equal the
  one-device run.
- linen: a ``TrainState`` whose parameters ``nn.scan`` stacked with logical
  partitioning reads the names from the boxes.

Runs on 8 simulated CPU devices (tests/_devices.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("flax")

from tests._devices import has_devices, rerun_in_child  # noqa: E402

if not has_devices():
    test_flax_scan_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import linen as nn
    from flax import nnx
    from flax.core import spmd
    from flax.training import train_state
    from jax.sharding import PartitionSpec as P

    import optkit

    D, H, L = 16, 32, 4
    RULES = optkit.t5x_standard_logical_factor_rules()
    MESH_RULES = [("layers", "data"), ("embed", None), ("mlp", "model"), ("vocab", None)]

    def _init(names, init=None):
        return nnx.with_partitioning(init or nnx.initializers.lecun_normal(), names)

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(D, H, kernel_init=_init(("embed", "mlp")),
                                 bias_init=_init(("mlp",), nnx.initializers.zeros_init()), rngs=rngs)
            self.down = nnx.Linear(H, D, kernel_init=_init(("mlp", "embed")), use_bias=False, rngs=rngs)

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x)))

    class Scanned(nnx.Module):
        def __init__(self, seed):
            @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
            def make(key):
                return Block(nnx.Rngs(key))

            self.blocks = make(jax.random.split(jax.random.key(seed), L))
            self.head = nnx.Linear(D, 1, kernel_init=_init(("embed", "vocab")), use_bias=False,
                                   rngs=nnx.Rngs(seed + 1))

        def __call__(self, x):
            @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry,
                      transform_metadata={nnx.PARTITION_NAME: "layers"})
            def run(block, x):
                return x + block(x)

            return self.head(run(self.blocks, x))

    class Unrolled(nnx.Module):
        def __init__(self, scanned: Scanned):
            self.blocks = nnx.List([Block(nnx.Rngs(i)) for i in range(L)])
            self.head = nnx.Linear(D, 1, kernel_init=_init(("embed", "vocab")), use_bias=False, rngs=nnx.Rngs(0))
            for i, block in enumerate(self.blocks):  # the scanned model's weights, layer by layer
                block.up.kernel[...] = scanned.blocks.up.kernel[...][i]
                block.up.bias[...] = scanned.blocks.up.bias[...][i]
                block.down.kernel[...] = scanned.blocks.down.kernel[...][i]
            self.head.kernel[...] = scanned.head.kernel[...]

        def __call__(self, x):
            for block in self.blocks:
                x = x + block(x)
            return self.head(x)

    def _train(model, tx, steps=8):
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        rng = np.random.default_rng(0)
        losses = []
        for _ in range(steps):
            x = jnp.asarray(rng.standard_normal((8, D)), jnp.float32)
            y = jnp.asarray(rng.standard_normal((8, 1)), jnp.float32)
            losses.append(float(step(model, optimizer, x, y)))
        return optimizer, losses

    def _build(sharded=False):
        if not sharded:
            with nnx.use_eager_sharding(False):
                scanned = Scanned(0)
                return scanned, Unrolled(scanned)
        scanned = Scanned(0)
        return scanned, None

    TXS = {
        "adafactor": lambda: optkit.adafactor(b1=0.9, learning_rate=1e-2, logical_factor_rules=RULES),
        "t5x_adafactor": lambda: optkit.t5x_adafactor(1e-2, beta1=0.9, min_dim_size_to_factor=1,
                                                      logical_factor_rules=RULES),
    }

    def _assert_same(scanned, unrolled):
        for i, block in enumerate(unrolled.blocks):
            for got, want in ((scanned.blocks.up.kernel[...][i], block.up.kernel[...]),
                              (scanned.blocks.up.bias[...][i], block.up.bias[...]),
                              (scanned.blocks.down.kernel[...][i], block.down.kernel[...])):
                want = np.asarray(want)
                np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
        np.testing.assert_allclose(scanned.head.kernel[...], unrolled.head.kernel[...], rtol=2e-5, atol=1e-7)

    @pytest.mark.parametrize("name", list(TXS))
    def test_nnx_scanned_blocks_train_as_unrolled_ones(name):
        scanned, unrolled = _build()
        optimizer, losses_scanned = _train(scanned, TXS[name]())
        _, losses_unrolled = _train(unrolled, TXS[name]())
        np.testing.assert_allclose(losses_scanned, losses_unrolled, rtol=2e-5)
        _assert_same(scanned, unrolled)
        nu = optimizer.opt_state[0].nu
        assert type(nu["blocks"]["up"]["kernel"]).roles == ("batch", "row", "column")  # from the metadata
        assert nu["blocks"]["up"]["kernel"].v_row.shape == (L, D)
        assert nu["blocks"]["up"]["kernel"].v_col.shape == (L, H)
        assert type(nu["blocks"]["up"]["bias"]).roles == ("batch", "none")

    def test_nnx_without_rules_stacked_blocks_train_differently():
        """The test above can fail: without the rules the stacked kernels share RMS(X) and RMS(U)."""
        scanned, unrolled = _build()
        _train(scanned, optkit.adafactor(b1=0.9, learning_rate=1e-2))
        _train(unrolled, optkit.adafactor(b1=0.9, learning_rate=1e-2))
        with pytest.raises(AssertionError):
            _assert_same(scanned, unrolled)

    @pytest.mark.parametrize("name", list(TXS))
    def test_nnx_scanned_and_sharded(name):
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        with jax.set_mesh(mesh), spmd.logical_axis_rules(MESH_RULES):
            model = Scanned(0)
            # nnx.vmap adds the "layers" name but leaves the new axis unsharded: place every parameter as its
            # names say, the layers on "data".
            for _, variable in nnx.iter_graph(model):
                if isinstance(variable, nnx.Param):
                    spec = P(*(dict(MESH_RULES)[n] for n in variable.get_metadata()["out_sharding"]))
                    variable.set_value(jax.device_put(variable[...], jax.sharding.NamedSharding(mesh, spec)))
            assert model.blocks.up.kernel[...].sharding.spec == P("data", None, "model")
            optimizer, losses = _train(model, TXS[name]())
        node = optimizer.opt_state[0].nu["blocks"]["up"]["kernel"]

        def placed(a, *spec):
            return a.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P(*spec)), a.ndim)

        assert placed(node.v_row[...], "data", None)          # mlp (the columns) dropped, the layers kept
        assert placed(node.v_col[...], "data", "model")       # embed (the rows) dropped
        assert placed(optimizer.opt_state[0].mu["blocks"]["up"]["kernel"][...], "data", None, "model")
        reference, _ = _build()
        _, want = _train(reference, TXS[name]())
        np.testing.assert_allclose(losses, want, rtol=2e-5)
        np.testing.assert_allclose(np.asarray(model.blocks.up.kernel[...]), np.asarray(reference.blocks.up.kernel[...]),
                                   rtol=2e-5, atol=1e-6)

    class LinenBlock(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.Dense(H, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                     ("embed", "mlp")), use_bias=False)(x)
            return x + nn.Dense(D, kernel_init=nn.with_logical_partitioning(
                nn.initializers.lecun_normal(), ("mlp", "embed")), use_bias=False)(jax.nn.relu(h)), None

    class LinenScanned(nn.Module):
        @nn.compact
        def __call__(self, x):
            x, _ = nn.scan(LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=L,
                           metadata_params={nn.PARTITION_NAME: "layers"})()(x, None)
            return x.sum(-1)

    def test_linen_train_state_reads_the_names_from_the_boxes():
        model = LinenScanned()
        x = jnp.ones((4, D))
        params = model.init(jax.random.key(0), x)["params"]
        names = jax.tree.map(lambda b: b.names, params, is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
        unboxed = nn.unbox(params)
        boxed_state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                                    tx=optkit.adafactor(logical_factor_rules=RULES))
        plain_state = train_state.TrainState.create(apply_fn=model.apply, params=unboxed, tx=optkit.adafactor(
            logical_factor_rules=RULES, param_logical_axes=names))

        @jax.jit
        def step(state):
            grads = jax.grad(lambda p: jnp.mean(state.apply_fn({"params": p}, x) ** 2))(state.params)
            return state.apply_gradients(grads=grads)

        for _ in range(3):
            boxed_state, plain_state = step(boxed_state), step(plain_state)
        kernel = jax.tree.leaves(nn.unbox(boxed_state.params))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), kernel,
                     jax.tree.leaves(plain_state.params))
        nodes = jax.tree.leaves(boxed_state.opt_state[0].nu,
                                is_leaf=lambda n: isinstance(n, optkit.FactoredSecondMoment))
        assert {type(n).roles for n in nodes} == {("batch", "row", "column"), ("batch", "column", "row")}


# Seconds each, in a child process with 8 devices: left out of the quick check.
pytestmark = pytest.mark.slow
