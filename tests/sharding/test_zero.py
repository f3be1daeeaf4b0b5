"""ZeRO stage 1 (``optkit.state_sharding`` / ``optkit.shard_state``) and FSDP on 8 simulated CPU devices.

Three jitted steps with the batch sharded over ``data``, the state split over ``data`` (and, for FSDP, the
parameters too) give the one-device parameters (float32 rounding), for every optkit optimizer (schedule-free
AdamW; Muon beside Adam through ``optax.partition``), an ``optax.chain`` and ``optax.inject_hyperparams``, on a
mesh of JAX's default (explicit) axis types and on one of ``Auto`` axes; each device holds at most 1/8 of the
replicated state plus the leaves that cannot be split. Runs in a child process with 8 devices when the suite has
fewer (tests/_devices.py).
"""

from __future__ import annotations

import jax
import pytest

from tests._devices import has_devices, rerun_in_child

if not has_devices():
    test_zero_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import chex
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import optkit

    OPTIMIZERS = {
        "adam": lambda: optkit.adam(1e-2),
        "adagrad": lambda: optkit.adagrad(1e-1),
        "momentum": lambda: optkit.momentum(1e-2),
        "adafactor": lambda: optkit.adafactor(1e-2, b1=0.9),
        "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optkit.adam(1e-2)),
        "inject_hyperparams": lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=1e-2),
        # Muon on the matrices (each gathered whole for its orthogonalization), Adam on the vectors; the
        # float32 iteration, so that the one-device run is the reference to float32 rounding.
        "muon": lambda: optax.partition(
            {"muon": optkit.muon(1e-2, ns_dtype=jnp.float32), "adam": optkit.adam(1e-2)},
            lambda p: jax.tree.map(lambda a: "muon" if a.ndim == 2 else "adam", p)),
        "schedule_free_adamw": lambda: optkit.schedule_free_adamw(1e-2, warmup_steps=2, weight_decay=0.01),
        "adam8bit": lambda: optkit.adam8bit(1e-2, min_8bit_size=256),  # w1, w2 in 8 bits (8 and 2 blocks)
    }

    def _problem():
        rng = np.random.default_rng(0)
        params = {"w1": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
                  "b1": jnp.zeros(32, jnp.float32), "w2": jnp.asarray(rng.normal(size=(32, 16)), jnp.float32),
                  "b2": jnp.zeros(5, jnp.float32)}  # 5: not divisible by 8, stays whole
        x = jnp.asarray(rng.normal(size=(16, 64)), jnp.float32)
        y = jnp.asarray(rng.normal(size=(16, 16)), jnp.float32)
        return params, x, y

    def _loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2) + jnp.sum(p["b2"] ** 2)

    def _gathered(p):
        """FSDP: each split parameter gathered where it is used (an all-gather), as the step's own code does."""
        return jax.tree.map(lambda a: jax.sharding.reshard(a, P()), p)

    def _steps(tx, params, x, y, shardings=None, gather=False):
        def step(p, s, x, y):
            grads = jax.grad(lambda p: _loss(_gathered(p) if gather else p, x, y))(p)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        state = tx.init(params)
        if shardings is not None:
            params_sharding, state_of = shardings
            state = jax.device_put(state, state_of(state))
            step = jax.jit(step, out_shardings=(params_sharding, state_of(state)))
        else:
            step = jax.jit(step)
        for _ in range(3):
            params, state = step(params, state, x, y)
        return params, state

    def _bytes_per_device(tree):
        per = {}
        for leaf in jax.tree.leaves(tree):
            for shard in leaf.addressable_shards:
                per[shard.device] = per.get(shard.device, 0) + shard.data.nbytes
        return max(per.values())

    @pytest.mark.parametrize("axis_type", ["default", "auto"])
    @pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
    @pytest.mark.parametrize("fsdp", [False, True], ids=["zero1", "fsdp"])
    def test_split_state_steps_equal_one_device_and_hold_an_eighth(optimizer, axis_type, fsdp):
        params, x, y = _problem()
        tx = OPTIMIZERS[optimizer]()
        want, want_state = _steps(tx, params, x, y)
        types = {} if axis_type == "default" else {"axis_types": (AxisType.Auto,)}
        mesh = jax.make_mesh((8,), ("data",), **types)
        with jax.set_mesh(mesh):
            batch = NamedSharding(mesh, P("data"))
            placed = (optkit.shard_state(params, mesh) if fsdp
                      else jax.device_put(params, NamedSharding(mesh, P())))
            params_sharding = jax.tree.map(lambda a: a.sharding, placed)
            got, state = _steps(tx, placed, jax.device_put(x, batch), jax.device_put(y, batch),
                                shardings=(params_sharding, lambda s: optkit.state_sharding(s, mesh)),
                                gather=fsdp and axis_type == "default")
        chex.assert_trees_all_close(got, want, rtol=2e-5, atol=1e-6)
        chex.assert_trees_all_close(state, want_state, rtol=2e-5, atol=1e-6)
        assert jax.tree.map(lambda a: a.sharding.spec, got) == jax.tree.map(lambda s: s.spec, params_sharding)
        # Per device: at most an eighth of the state, plus the leaves no dimension of which 8 divides.
        whole = sum(a.nbytes for a in jax.tree.leaves(want_state))
        unsplit = sum(a.nbytes for a, s in zip(jax.tree.leaves(state), jax.tree.leaves(
            optkit.state_sharding(state, mesh))) if "data" not in jax.tree.leaves(tuple(s.spec))
            or a.ndim == 0)
        assert _bytes_per_device(state) <= whole / 8 + unsplit, (_bytes_per_device(state), whole, unsplit)

    def test_adafactor_splits_the_row_statistics_and_keeps_the_column_statistics():
        mesh = jax.make_mesh((8,), ("data",))
        state = optkit.adafactor(1e-2).init({"w": jnp.zeros((64, 32)), "v": jnp.zeros((3, 5))})
        shardings = optkit.state_sharding(state, mesh)
        factored = [s for s in jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, optkit.FactoredSecondMoment))
                    if isinstance(s, optkit.FactoredSecondMoment)]
        by_rows = {len(state_leaf.v_row): nu for state_leaf, nu in zip(
            [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optkit.FactoredSecondMoment))
             if isinstance(s, optkit.FactoredSecondMoment)], factored)}
        assert by_rows[64].v_row.spec == P("data") and by_rows[64].v_col.spec == P(None)
        assert by_rows[3].v_row.spec == P(None) and by_rows[3].v_col.spec == P(None)  # (3, 5): 8 divides neither
        with pytest.raises(ValueError, match=r"axis 'batch' is not an axis of the mesh; its axes are \['data'\]"):
            optkit.state_sharding(state, mesh, axis="batch")
