"""Every optkit optimizer under ``jax.sharding`` on 8 simulated CPU devices (DESIGN: "shards with jax.sharding").

What is checked, for each optimizer and the options that change its state's
layout, on a 2x4 (``data``, ``model``) mesh with parameters sharded along
``model`` (row-, column- and vector-sharded leaves, a rank-3 leaf, a
replicated vector and a scalar) and batches along ``data``:

- ``jax.jit(tx.init)`` and ``tx.init`` give every full-size state leaf its
  parameter's ``NamedSharding``, Adafactor's row/column statistics the
  parameter's ``PartitionSpec`` without the reduced axis, scalars replicated;
  no full-size leaf of a sharded parameter is replicated;
- 10 jitted, donated training steps give the one-device result within 1e-6
  relative (float32), keep the parameters' and the state's shardings; with
  ``Auto`` axes XLA chooses a step's output shardings, so a replicated bias
  whose gradient comes out sharded is kept replicated by the README's recipe
  (``out_shardings`` from the parameters and ``jax.jit(tx.init)``);
- the compiled update has no all-gather, all-to-all or collective-permute and
  all-reduces only of statistics (never of a full-size array), and Adafactor's
  CPU loop over row blocks is not taken for a sharded leaf (it would gather it);
- with ``Explicit`` mesh axes the shardings are part of the types:
  ``jax.eval_shape(tx.init, params)`` carries them, and updates keep them;
- the abstract state and ``jax.jit(tx.init)``'s compiled output shardings
  restore an Orbax checkpoint straight into sharded state.

The module runs on 8 simulated CPU devices, in a child process when the
suite has fewer (tests/_devices.py).
"""

from __future__ import annotations

import re

import jax
import pytest

from tests._devices import NUM_DEVICES, has_devices, rerun_in_child

if not has_devices():
    test_sharding_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import optkit
    from optkit._src import sharding as sharding_module

    CPU = jax.devices("cpu")
    AXES = ("data", "model")

    def make_mesh(kind=AxisType.Auto):
        return jax.make_mesh((2, 4), AXES, axis_types=(kind, kind), devices=CPU[:NUM_DEVICES])

    # name: (shape, PartitionSpec); Megatron-style layers along "model".
    PARAMS = {
        "col": ((8, 16), P(None, "model")),  # column-parallel kernel (qkv, mlp_up)
        "vec": ((16,), P("model")),  # its bias
        "row": ((16, 8), P("model", None)),  # row-parallel kernel (attn_out, mlp_down)
        "bias": ((8,), P()),  # replicated
        "stack": ((2, 16, 8), P(None, "model", None)),  # rank 3: sharded row axis, a leading axis
        "gain": ((), P()),  # a scalar parameter
    }
    BATCH = 16

    # name: (optimizer factory, factored_dims of its Adafactor state or None)
    OPTIMIZERS = {
        "adagrad": (lambda: optkit.adagrad(0.1), None),
        "adagrad(decay, norm, initial)": (
            lambda: optkit.adagrad(0.1, decay_factor=0.1, norm_coefficient=0.01, initial_accumulator_value=0.1),
            None,
        ),
        "adam": (lambda: optkit.adam(1e-2), None),
        "adam(norm coefficients, bfloat16 mu)": (
            lambda: optkit.adam(1e-2, norm_coefficient=0.01, norm_coefficient_post=1e-3, mu_dtype=jnp.bfloat16),
            None,
        ),
        "adam(inject_hyperparams)": (lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=1e-2), None),
        "momentum": (lambda: optkit.momentum(0.1), None),
        "momentum(nesterov, beta, norm)": (
            lambda: optkit.momentum(0.1, 0.9, 0.5, nesterov=True, norm_coefficient=0.01),
            None,
        ),
        "adafactor": (lambda: optkit.adafactor(), "last"),
        "adafactor(b1, weight decay, learning rate)": (
            lambda: optkit.adafactor(1e-2, b1=0.9, weight_decay_rate=0.01),
            "last",
        ),
        "adafactor(factored=False)": (lambda: optkit.adafactor(factored=False), "last"),
        "adafactor(largest, min 10)": (
            lambda: optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=10),
            "largest",
        ),
        "adafactor(no clipping, no parameter scale, float32 nu)": (
            lambda: optkit.adafactor(
                clipping_threshold=None, multiply_by_parameter_scale=False, nu_dtype=jnp.float32
            ),
            "last",
        ),
        "scale_by_factored_rms": (
            lambda: optax.chain(optkit.scale_by_factored_rms(), optax.clip_by_block_rms(1.0), optax.scale(-1e-2)),
            "last",
        ),
    }

    def param_shardings(mesh):
        return {name: NamedSharding(mesh, spec) for name, (_, spec) in PARAMS.items()}

    def initial_params():
        keys = jax.random.split(jax.random.key(0), len(PARAMS))
        params = {name: 0.5 * jax.random.normal(k, shape) for k, (name, (shape, _)) in zip(keys, PARAMS.items())}
        params["gain"] = jnp.float32(1.0)
        return params

    def place(tree, shardings):
        return jax.tree.map(jax.device_put, tree, shardings)

    def on_one_device(tree):
        return jax.tree.map(lambda a: jax.device_put(a, CPU[0]), tree)

    def batches(count):
        for i in range(count):
            kx, kt = jax.random.split(jax.random.key(100 + i))
            yield jax.random.normal(kx, (BATCH, 8)), jax.random.normal(kt, (BATCH, 8))

    def loss_fn(params, x, t):
        h = jnp.tanh(x @ params["col"] + params["vec"] + params.get("vec_replicated", 0.0))
        y = params["gain"] * (h @ params["row"]) + params["bias"]
        z = jnp.einsum("bi,kij->bkj", h, params["stack"])
        # the scalar's own term keeps its gradient well above the rounding of the batch sums
        return jnp.mean((y - t) ** 2) + 0.1 * jnp.mean(jnp.tanh(z) * y[:, None, :]) + (params["gain"] - 2.0) ** 2

    def make_step(tx, **jit_kwargs):
        def step(params, state, x, t):
            grads = jax.grad(loss_fn)(params, x, t)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return jax.jit(step, donate_argnums=(0, 1), **jit_kwargs)

    def padded(spec: P, ndim: int) -> tuple:
        """The spec's entry for every axis (a short spec leaves the last axes unsharded)."""
        return tuple(spec) + (None,) * (ndim - len(spec))

    def spec_without(spec: P, ndim: int, axis: int) -> P:
        entries = list(padded(spec, ndim))
        del entries[axis]
        return P(*entries)

    def expected_shardings(state, mesh, factored_dims):
        """The sharding each state leaf must have (issue 6, point 1), from the parameters' own."""
        shardings = param_shardings(mesh)

        def leaf(path, value):
            names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey) and k.key in PARAMS]
            if not names:  # count, injected hyperparameters: scalars
                assert np.ndim(value) == 0, path
                return NamedSharding(mesh, P())
            shape, spec = PARAMS[names[-1]]
            last = path[-1]
            if isinstance(last, jax.tree_util.GetAttrKey) and last.name in ("v_row", "v_col"):
                row, col = optkit.factored_axes(shape, factored_dims=factored_dims)
                dropped = col if last.name == "v_row" else row
                assert value.shape == shape[:dropped] + shape[dropped + 1 :], path
                return NamedSharding(mesh, spec_without(spec, len(shape), dropped))
            assert value.shape == shape, path  # a full-size leaf
            return shardings[names[-1]]

        return jax.tree_util.tree_map_with_path(leaf, state)

    def assert_shardings(tree, expected, *, where, on_mesh=True):
        """Leaf by leaf: the same devices and the same partitioning as expected."""
        got = jax.tree_util.tree_flatten_with_path(tree)[0]
        want = jax.tree.leaves(expected)
        assert len(got) == len(want)
        for (path, leaf), sharding in zip(got, want):
            name = f"{where}{jax.tree_util.keystr(path)}"
            if not on_mesh and np.ndim(leaf) == 0:  # eager init: a scalar on one device, replicated
                assert leaf.sharding.is_fully_replicated, name
                continue
            assert leaf.sharding.is_equivalent_to(sharding, np.ndim(leaf)), (
                f"{name}: {leaf.sharding} but the parameters' sharding gives {sharding}"
            )
            if np.ndim(leaf) and leaf.size > 1 and not sharding.is_fully_replicated:
                assert not leaf.sharding.is_fully_replicated, f"{name} is replicated"

    def assert_close(got, want, rtol=1e-6, where=""):
        """|got - want| <= rtol * max|want| per leaf (float32: the leaf's own scale, not per element)."""
        for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            scale = max(np.max(np.abs(w), initial=0.0), np.finfo(np.float32).tiny)
            err = np.max(np.abs(g - w), initial=0.0) / scale
            assert err <= rtol, f"{where}{jax.tree_util.keystr(path)}: relative difference {err:.3g} > {rtol}"

    @pytest.mark.parametrize("name", list(OPTIMIZERS))
    def test_eager_init_state_sharded_like_params(name):
        """``tx.init(params)`` outside jit (``jax.jit(tx.init)`` is checked with the steps below)."""
        make_tx, factored_dims = OPTIMIZERS[name]
        mesh = make_mesh()
        state = make_tx().init(place(initial_params(), param_shardings(mesh)))
        assert_shardings(state, expected_shardings(state, mesh, factored_dims), where="state", on_mesh=False)

    # Every optimizer with its defaults or the options that change its state (compiling takes the time).
    STEP_CASES = [name for name in OPTIMIZERS if name not in ("adagrad", "momentum", "adam(inject_hyperparams)")]

    @pytest.mark.parametrize("name", STEP_CASES)
    def test_ten_steps_equal_one_device(name):
        make_tx, factored_dims = OPTIMIZERS[name]
        tx = make_tx()
        mesh = make_mesh()
        p_shardings = param_shardings(mesh)
        data_sharding = NamedSharding(mesh, P("data", None))

        params = on_one_device(initial_params())
        state = tx.init(params)
        step = make_step(tx)
        for x, t in batches(10):
            params, state = step(params, state, *on_one_device((x, t)))
        want_params, want_state = params, state

        params = place(initial_params(), p_shardings)
        state = jax.jit(tx.init)(params)
        expected = expected_shardings(state, mesh, factored_dims)
        assert_shardings(state, expected, where="jax.jit(tx.init)(params)")
        step = make_step(tx)
        for x, t in batches(10):
            params, state = step(params, state, *place((x, t), (data_sharding, data_sharding)))
            assert_shardings(params, p_shardings, where="params")
            assert_shardings(state, expected, where="state")
        assert_close(params, want_params, where="params")
        assert_close(state, want_state, where="state")

    @pytest.mark.parametrize("name", ["adafactor(b1, weight decay, learning rate)"])
    def test_pinned_out_shardings_keep_an_unannotated_bias_replicated(name):
        """With Auto axes XLA picks the step's output shardings, and a replicated bias whose gradient
        comes out sharded (a column-parallel layer's, unannotated) would come back sharded, with its
        state. The README's recipe pins them: out_shardings from the parameters and jax.jit(tx.init)."""
        make_tx, factored_dims = OPTIMIZERS[name]
        tx = make_tx()
        mesh = make_mesh()
        shardings = {**param_shardings(mesh), "vec_replicated": NamedSharding(mesh, P())}
        def start():  # fresh arrays: the steps donate theirs
            return {**initial_params(), "vec_replicated": jnp.linspace(-1.0, 1.0, 16)}

        data_sharding = NamedSharding(mesh, P("data", None))
        params = on_one_device(start())
        state = tx.init(params)
        step = make_step(tx)
        for x, t in batches(10):
            params, state = step(params, state, *on_one_device((x, t)))
        want = params, state

        params = place(start(), shardings)
        state = jax.jit(tx.init)(params)
        state_shardings = jax.tree.map(lambda a: a.sharding, state)
        assert state_shardings[0].mu["vec_replicated"].is_fully_replicated
        step = make_step(tx, out_shardings=(shardings, state_shardings))
        for x, t in batches(10):
            params, state = step(params, state, *place((x, t), (data_sharding, data_sharding)))
        assert_shardings(params, shardings, where="params")
        assert_shardings(state, state_shardings, where="state")
        assert_close((params, state), want)

    _COLLECTIVE = re.compile(
        r"^\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)"
        r"(?:-start)?\(",
        re.M,
    )

    def collectives(hlo: str) -> list[tuple[str, int]]:
        """(kind, largest element count among its results) for every collective in the compiled HLO."""
        out = []
        for result_type, kind in _COLLECTIVE.findall(hlo):
            dims = re.findall(r"[a-z]\w*\[([\d,]*)\]", result_type)
            out.append((kind, max(int(np.prod([int(d) for d in ds.split(",") if d] or [1])) for ds in dims)))
        return out

    # One of each element-wise state (they cannot need communication unless misplaced), every Adafactor layout.
    HLO_CASES = ["adagrad", "adam(norm coefficients, bfloat16 mu)", "momentum(nesterov, beta, norm)"]
    HLO_CASES += ["adafactor", "adafactor(b1, weight decay, learning rate)", "adafactor(factored=False)",
                  "adafactor(largest, min 10)"]

    @pytest.mark.parametrize("name", HLO_CASES)
    def test_compiled_update_communicates_statistics_only(name):
        tx = OPTIMIZERS[name][0]()
        mesh = make_mesh()
        shardings = param_shardings(mesh)
        params = place(initial_params(), shardings)
        grads = place(jax.grad(loss_fn)(initial_params(), *next(batches(1))), shardings)
        state = jax.jit(tx.init)(params)

        def update(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        hlo = jax.jit(update, donate_argnums=(0, 1)).lower(params, state, grads).compile().as_text()
        smallest_matrix = min(int(np.prod(shape)) for shape, _ in PARAMS.values() if len(shape) >= 2)
        found = collectives(hlo)
        for kind, size in found:
            assert kind == "all-reduce", f"{kind} of {size} elements in the compiled update"
            # row/column statistics and RMS sums: at most 2 x 16 elements here
            assert size < smallest_matrix, f"all-reduce of {size} elements (a full-size array?)"
        if OPTIMIZERS[name][1] is not None:  # Adafactor: RMS over sharded leaves needs XLA's all-reduces
            assert found

    @pytest.mark.parametrize("spec", [P("model", None), P(None, "model"), P(("data", "model"), None)])
    def test_wide_sharded_leaf_skips_the_cpu_row_block_loop(spec):
        """Adafactor's CPU loop (wide or large leaves) slices G along its rows; a sharded leaf takes reductions."""
        shape = (64, 8192)  # wider than the loop's 6144 columns, several blocks of rows
        tx = optkit.adafactor()
        key_p, key_g = jax.random.split(jax.random.key(1))
        params, grads = jax.random.normal(key_p, shape), jax.random.normal(key_g, shape)

        def update(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        one = on_one_device((params, grads))
        one_state = tx.init(one[0])
        one_hlo = jax.jit(update).lower(one[0], one_state, one[1]).compile().as_text()
        assert " while(" in one_hlo  # one device: the loop (tests/optimizers/test_adafactor.py checks its numbers)
        want = jax.jit(update)(one[0], one_state, one[1])

        sharding = NamedSharding(make_mesh(), spec)
        p, g = place((params, grads), (sharding, sharding))
        state = jax.jit(tx.init)(p)
        compiled = jax.jit(update).lower(p, state, g).compile()
        hlo = compiled.as_text()
        assert " while(" not in hlo
        for kind, size in collectives(hlo):
            assert kind == "all-reduce" and size <= 8192, (kind, size)
        got = compiled(p, state, g)
        assert_close(got, want)
        assert got[0].sharding.is_equivalent_to(sharding, 2)

    def test_may_be_split():
        mesh = make_mesh()
        explicit = make_mesh(AxisType.Explicit)
        x = jnp.ones((8, 16))
        seen = {}

        def probe(name):
            def f(a):
                seen[name] = sharding_module.may_be_split(a)
                return a

            return f

        assert not sharding_module.may_be_split(x)
        assert sharding_module.may_be_split(jax.device_put(x, NamedSharding(mesh, P(None, "model"))))
        assert not sharding_module.may_be_split(jax.device_put(x, NamedSharding(mesh, P())))
        jax.jit(probe("one device"))(x)
        jax.jit(probe("auto, replicated"))(jax.device_put(x, NamedSharding(mesh, P())))  # XLA may still split it
        jax.jit(probe("explicit, replicated"))(jax.device_put(x, NamedSharding(explicit, P())))
        jax.jit(probe("explicit, sharded"))(jax.device_put(x, NamedSharding(explicit, P("model"))))
        assert seen == {
            "one device": False,
            "auto, replicated": True,
            "explicit, replicated": False,
            "explicit, sharded": True,
        }

    # ------------------------------------------------------------ Explicit axes: shardings in the types

    EXPLICIT_CASES = ["adam(norm coefficients, bfloat16 mu)", "adafactor(b1, weight decay, learning rate)"]

    @pytest.mark.parametrize("name", EXPLICIT_CASES)
    def test_explicit_axes_shardings_are_types(name):
        make_tx, factored_dims = OPTIMIZERS[name]
        tx = make_tx()
        mesh = make_mesh(AxisType.Explicit)
        shardings = param_shardings(mesh)
        params = place(initial_params(), shardings)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params)
        typed = jax.eval_shape(tx.init, abstract)
        expected = expected_shardings(typed, mesh, factored_dims)
        for (path, leaf), want in zip(jax.tree_util.tree_flatten_with_path(typed)[0], jax.tree.leaves(expected)):
            if np.ndim(leaf):  # scalars are made without a mesh: no sharding in their type
                assert leaf.sharding.mesh.shape == mesh.shape, path
                assert padded(leaf.sharding.spec, leaf.ndim) == padded(want.spec, leaf.ndim), path

        state = jax.jit(tx.init)(params)  # no jax.set_mesh needed: the state depends on the parameters
        assert_shardings(state, expected, where="state")
        one_device_grads = [jax.grad(loss_fn)(initial_params(), x, t) for x, t in batches(3)]

        def update(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        want_params, want_state = on_one_device(initial_params()), jax.jit(tx.init)(on_one_device(initial_params()))
        for g in one_device_grads:
            want_params, want_state = jax.jit(update)(want_params, want_state, g)
        with jax.set_mesh(mesh):
            types = jax.tree.map(jax.typeof, (params, state))
            for g in one_device_grads:
                g = place(g, shardings)
                params, state = jax.jit(update)(params, state, g)
                assert jax.tree.map(jax.typeof, (params, state)) == types
        assert_close(params, want_params, where="params")
        assert_close(state, want_state, where="state")

    # ------------------------------------------------------------ checkpoints

    def test_checkpoint_restores_straight_into_sharded_state(tmp_path):
        import orbax.checkpoint as ocp

        tx = optkit.adafactor(b1=0.9)
        mesh = make_mesh()
        shardings = param_shardings(mesh)
        params = place(initial_params(), shardings)
        state = jax.jit(tx.init)(params)
        step = make_step(tx)
        data_sharding = NamedSharding(mesh, P("data", None))
        for x, t in batches(2):
            params, state = step(params, state, *place((x, t), (data_sharding, data_sharding)))
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(tmp_path / "state", state)

        # Abstract: shapes from jax.eval_shape, shardings from the compiled init; nothing allocated.
        abstract_params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                       params, shardings)
        shapes = jax.eval_shape(tx.init, abstract_params)
        out_shardings = jax.jit(tx.init).lower(abstract_params).compile().output_shardings
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, out_shardings)
        assert_shardings(target, expected_shardings(shapes, mesh, "last"), where="target")
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(tmp_path / "state", target)
        assert_shardings(restored, expected_shardings(shapes, mesh, "last"), where="restored")
        chex_equal = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), restored, state)
        assert all(jax.tree.leaves(chex_equal))

    def test_flat_params_refuse_a_sharded_leaf():
        # FlatParams keeps one buffer per dtype on one device: a leaf sharded over several is refused
        # by name (the per-leaf default is the path for sharded parameters); its 8 devices hold a
        # shard along "model" and a replica along "data".
        sharded = jax.device_put(jnp.ones(8), NamedSharding(make_mesh(), P("model")))
        with pytest.raises(ValueError, match=r"leaf at \['w'\] is sharded over 8 devices"):
            optkit.FlatParams.from_tree({"w": sharded, "b": jnp.ones(2)})


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
