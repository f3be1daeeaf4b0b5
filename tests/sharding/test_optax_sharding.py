"""Optax's sharding tests over every optkit optimizer, on 8 simulated CPU devices.

Ported (our own code) from Optax v0.2.8 (commit
107e9ad20ca62bcbee1a8c016daab71c690a678c), ``optax/_src/sharding_test.py``:
``test_init_with_abstract_input`` (here with a mesh sharding: the state is
concrete zeros placed with the parameters' sharding, Adafactor's statistics
with the reduced axis dropped), ``test_state_sharding_type_init_match_update``
and ``test_state_sharding_type_preserved_with_jit`` (with ``Explicit`` mesh
axes, shardings are part of the types: ``init`` and ``update``, jitted or not,
give the same types). The parameters are Optax's: float16 zeros of shape
(2, 8, 4) sharded ``P(None, "x")`` over an 8-device mesh. Runs in a child
process when the suite has fewer devices (tests/_devices.py).
"""

from __future__ import annotations

import jax
import pytest

from tests._devices import has_devices, rerun_in_child

if not has_devices():
    test_optax_sharding_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import chex
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import optkit

    # Every optimizer at Optax's learning rate of 1.0, and Adafactor in its factoring modes.
    OPTIMIZERS = {
        "adagrad": lambda: optkit.adagrad(1.0),
        "adam": lambda: optkit.adam(1.0),
        "momentum": lambda: optkit.momentum(1.0),
        "momentum(nesterov)": lambda: optkit.momentum(1.0, nesterov=True),
        "adafactor": lambda: optkit.adafactor(),
        "adafactor(b1, largest)": lambda: optkit.adafactor(b1=0.9, factored_dims="largest"),
        "adafactor(factored=False)": lambda: optkit.adafactor(factored=False),
    }

    def explicit_mesh():
        return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,),
                             devices=jax.devices("cpu")[:8])

    @pytest.mark.parametrize("name", list(OPTIMIZERS))
    def test_init_with_abstract_input_on_a_mesh(name):
        mesh = explicit_mesh()
        sharding = NamedSharding(mesh, P(None, "x"))
        tx = OPTIMIZERS[name]()
        state = tx.init(jax.ShapeDtypeStruct((2, 8, 4), jnp.float32, sharding=sharding))
        with jax.set_mesh(mesh):
            want = tx.init(jnp.zeros((2, 8, 4), jnp.float32, out_sharding=sharding))
        assert jax.tree.structure(state) == jax.tree.structure(want)
        for (path, got), ref in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(want)):
            assert isinstance(got, jax.Array) and not isinstance(got, jax.core.Tracer)
            np.testing.assert_array_equal(got, ref)
            where = jax.tree_util.keystr(path)
            if got.ndim == 0:  # the count, made outside any mesh: replicated on the default device
                assert got.sharding.is_fully_replicated, where
                continue
            assert got.sharding.is_equivalent_to(ref.sharding, got.ndim), where
            if ".v_col" in where and "largest" not in name:  # (2, 4): the sharded row axis is reduced
                assert got.sharding.is_fully_replicated, where
            elif got.ndim and got.shape[-2:] != (2, 4) and ".v_row" not in where:
                assert not got.sharding.is_fully_replicated, where

    @pytest.mark.parametrize("name", list(OPTIMIZERS))
    def test_state_sharding_type_init_match_update(name):
        mesh = explicit_mesh()
        tx = OPTIMIZERS[name]()
        with jax.set_mesh(mesh):
            params = jnp.zeros((2, 8, 4), dtype=jnp.float16, out_sharding=NamedSharding(mesh, P(None, "x")))
            state0 = tx.init(params)
            _, state1 = tx.update(params, state0, params)
            chex.assert_trees_all_equal(jax.tree.map(jax.typeof, state0), jax.tree.map(jax.typeof, state1))

    @pytest.mark.parametrize("name", list(OPTIMIZERS))
    def test_state_sharding_type_preserved_with_jit(name):
        mesh = explicit_mesh()
        tx = OPTIMIZERS[name]()
        with jax.set_mesh(mesh):
            params = jnp.zeros((2, 8, 4), dtype=jnp.float16, out_sharding=NamedSharding(mesh, P(None, "x")))
            state0 = tx.init(params)
            state1 = jax.jit(tx.init)(params)
            chex.assert_trees_all_equal(jax.tree.map(jax.typeof, state0), jax.tree.map(jax.typeof, state1))
            _, state2 = tx.update(params, state0, params)
            _, state3 = jax.jit(tx.update)(params, state0, params)
            chex.assert_trees_all_equal(jax.tree.map(jax.typeof, state2), jax.tree.map(jax.typeof, state3))


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
