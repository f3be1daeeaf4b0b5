"""optkit.FlatParams: one buffer per dtype gives the per-leaf results, and bad input is named."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

import optkit
from tests.helpers import sin_grads


def _tree(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return {
        "dense": {"kernel": jnp.asarray(rng.standard_normal((4, 3)), dtype),
                  "bias": jnp.asarray(rng.standard_normal(3), dtype)},
        "scale": jnp.asarray(1.5, dtype),
        "empty": jnp.zeros((0, 2), dtype),
        "layers": [jnp.asarray(rng.standard_normal((2, 2, 2)), dtype) for _ in range(3)],
        # odd sizes put leaves at every alignment in the buffer
        "odd": [jnp.asarray(rng.standard_normal(int(n)), dtype) for n in rng.integers(1, 40, 8)],
    }


class LayoutTest(chex.TestCase):
    def test_round_trip_keeps_values_shapes_dtypes(self):
        tree = _tree()
        tree["half"] = jnp.arange(5, dtype=jnp.bfloat16)
        flat = optkit.FlatParams.from_tree(tree)
        assert [d.name for d in flat.dtypes] == ["float32", "bfloat16"]
        n_odd = sum(x.size for x in tree["odd"])
        assert [b.shape for b in flat.buffers] == [(12 + 3 + 1 + 0 + 24 + n_odd,), (5,)]
        assert flat.num_leaves == 16 and flat.size == 45 + n_odd
        assert flat.treedef == jax.tree.structure(tree)
        chex.assert_trees_all_equal(flat.to_tree(), tree)
        chex.assert_trees_all_equal_dtypes(flat.to_tree(), tree)
        float32_leaves = [np.ravel(x) for x in jax.tree.leaves(tree) if x.dtype == jnp.float32]
        np.testing.assert_array_equal(flat["float32"], np.concatenate(float32_leaves))

    def test_buffers_follow_leaf_order(self):
        tree = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0], [4.0]]), "c": jnp.array(5.0)}
        flat = optkit.FlatParams.from_tree(tree)
        np.testing.assert_array_equal(flat["float32"], [1.0, 2.0, 3.0, 4.0, 5.0])

    def test_float64_buffer(self):
        with jax.enable_x64(True):
            tree = {"w": jnp.ones(3, jnp.float64), "v": jnp.ones(2, jnp.float32)}
            flat = optkit.FlatParams.from_tree(tree)
            assert {d.name for d in flat.dtypes} == {"float64", "float32"}
            chex.assert_trees_all_equal(flat.to_tree(), tree)

    def test_to_tree_is_a_copy_not_a_view(self):
        """Donating the buffer later must not change arrays obtained from it."""
        flat = optkit.FlatParams.from_tree({"w": jnp.ones(64)})
        tree = flat.to_tree()
        jax.jit(lambda f: jax.tree.map(lambda b: b * 0, f), donate_argnums=0)(flat)
        np.testing.assert_array_equal(tree["w"], np.ones(64))

    def test_from_tree_does_not_alias_numpy_input(self):
        host = np.ones(64, np.float32)
        flat = optkit.FlatParams.from_tree({"w": host})
        jax.jit(lambda f: jax.tree.map(lambda b: b * 0, f), donate_argnums=0)(flat)
        np.testing.assert_array_equal(host, np.ones(64))

    @chex.variants(with_jit=True, without_jit=True)
    def test_inside_jit_and_pack(self):
        tree = _tree()
        flat = optkit.FlatParams.from_tree(tree)

        @self.variant
        def roundtrip(tree):
            packed = optkit.FlatParams.from_tree(tree)
            return packed, flat.pack(tree), packed.to_tree()

        packed, packed_like, back = roundtrip(tree)
        chex.assert_trees_all_equal(packed, flat)
        chex.assert_trees_all_equal(packed_like, flat)
        chex.assert_trees_all_equal(back, tree)

    def test_gradient_with_respect_to_flat_is_flat(self):
        tree = _tree()
        flat = optkit.FlatParams.from_tree(tree)

        def loss(p):
            return sum(jnp.sum(jnp.sin(x) * (i + 1)) for i, x in enumerate(jax.tree.leaves(p)))

        got = jax.jit(jax.grad(lambda f: loss(f.to_tree())))(flat)
        assert isinstance(got, optkit.FlatParams)
        chex.assert_trees_all_close(got, flat.pack(jax.grad(loss)(tree)), rtol=1e-6)
        # The transpose of the slicing is one concatenation, not one pad per leaf.
        hlo = jax.jit(jax.grad(lambda f: loss(f.to_tree()))).lower(flat).as_text()
        assert hlo.count("stablehlo.pad") == 0

    def test_jit_step_passes_one_array_per_dtype(self):
        flat = optkit.FlatParams.from_tree({f"w{i}": jnp.ones(4) for i in range(50)})
        tx = optkit.adam(1e-3)
        lowered = jax.jit(tx.update).lower(flat, tx.init(flat), flat)
        # grads, count, mu, nu, params: five inputs whatever the number of leaves.
        assert len(jax.tree.leaves(lowered.args_info)) == 5


OPTIMIZERS = {
    "adam": lambda: optkit.adam(0.05, norm_coefficient=0.01, norm_coefficient_post=0.001),
    "adam_default": lambda: optkit.adam(0.01),
    "adagrad": lambda: optkit.adagrad(0.1, decay_factor=0.1, norm_coefficient=0.01, eps=0.0),
    "momentum": lambda: optkit.momentum(0.1, 0.9, 0.5, nesterov=True, norm_coefficient=0.01),
    "schedule": lambda: optkit.adam(optax.linear_schedule(0.1, 0.01, 5)),
}


def _run(tx, params, steps, jit, flat):
    if flat:
        layout = optkit.FlatParams.from_tree(params)
        params = layout
    state = tx.init(params)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    for t in range(steps):
        tree = params.to_tree() if flat else params
        grads = sin_grads(tree, t)
        params, state = step(params, state, layout.pack(grads) if flat else grads)
    return (params.to_tree() if flat else params), state


class SameNumbersTest(chex.TestCase):
    @parameterized.parameters(*[(name, jit) for name in OPTIMIZERS for jit in (True, False)])
    def test_flat_equals_per_leaf_bit_for_bit(self, name, jit):
        tree = _tree()
        want, want_state = _run(OPTIMIZERS[name](), tree, 3, jit, flat=False)
        got, got_state = _run(OPTIMIZERS[name](), tree, 3, jit, flat=True)
        chex.assert_trees_all_equal(got, want)
        # The state holds the per-leaf state's arrays, concatenated.
        is_flat = lambda x: isinstance(x, optkit.FlatParams)  # noqa: E731
        got_state = jax.tree.map(lambda x: x.to_tree() if is_flat(x) else x, got_state, is_leaf=is_flat)
        chex.assert_trees_all_equal(got_state, want_state)

    def test_optax_adam_agrees_to_rounding(self):
        # Optax's own arithmetic is not bit-stable under a change of layout (XLA rounds its
        # bias-corrected moments differently across fusions); it agrees to a few ulp.
        want, _ = _run(optax.adam(0.01), _tree(), 3, True, flat=False)
        got, _ = _run(optax.adam(0.01), _tree(), 3, True, flat=True)
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)

    def test_float64_and_mixed_dtypes(self):
        with jax.enable_x64(True):
            tree = {"a": _tree(jnp.float64)["layers"], "b": jnp.linspace(-1, 1, 7, dtype=jnp.float32)}
            tx = lambda: optkit.adam(0.01, mu_dtype=jnp.float64)  # noqa: E731
            want, _ = _run(tx(), tree, 3, True, flat=False)
            got, state = _run(tx(), tree, 3, True, flat=True)
            chex.assert_trees_all_equal(got, want)
            assert [d.name for d in state[0].mu.dtypes] == ["float64", "float32"]
            assert state[0].mu["float32"].dtype == jnp.float64

    def test_global_norm_clipping_agrees_to_rounding(self):
        tx = lambda: optax.chain(optax.clip_by_global_norm(0.5), optkit.adam(0.05))  # noqa: E731
        want, _ = _run(tx(), _tree(), 3, True, flat=False)
        got, _ = _run(tx(), _tree(), 3, True, flat=True)
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)

    def test_inject_hyperparams(self):
        tx = lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=0.05, b1=0.8)  # noqa: E731
        want, _ = _run(tx(), _tree(), 3, True, flat=False)
        got, _ = _run(tx(), _tree(), 3, True, flat=True)
        chex.assert_trees_all_equal(got, want)


class ErrorsTest(chex.TestCase):
    def test_integer_leaf_is_named(self):
        with pytest.raises(TypeError, match=r"params leaf at \['step'\] must be a floating-point array"):
            optkit.FlatParams.from_tree({"w": jnp.ones(2), "step": jnp.arange(3)})

    def test_empty_tree(self):
        with pytest.raises(ValueError, match="at least one array leaf"):
            optkit.FlatParams.from_tree({})

    def test_pack_structure_shape_dtype(self):
        flat = optkit.FlatParams.from_tree({"w": jnp.ones((2, 3)), "b": jnp.ones(3)})
        with pytest.raises(ValueError, match=r"tree does not match the FlatParams layout"):
            flat.pack({"w": jnp.ones((2, 3))})
        with pytest.raises(ValueError, match=r"tree leaf at \['w'\] has shape \(3, 2\)"):
            flat.pack({"w": jnp.ones((3, 2)), "b": jnp.ones(3)})
        with pytest.raises(TypeError, match=r"tree leaf at \['b'\] has dtype bfloat16 but .* float32"):
            flat.pack({"w": jnp.ones((2, 3)), "b": jnp.ones(3, jnp.bfloat16)})

    def test_optimizer_state_of_another_layout_is_named(self):
        flat = optkit.FlatParams.from_tree({"w": jnp.ones(3)})
        other = optkit.FlatParams.from_tree({"v": jnp.ones(3)})
        tx = optkit.adam(0.1)
        with pytest.raises(ValueError, match="state.mu does not match updates"):
            tx.update(flat, tx.init(other), flat)

    def test_constructor_is_internal(self):
        with pytest.raises(TypeError, match="from_tree"):
            optkit.FlatParams([jnp.ones(2)], None)

    def test_missing_dtype_key(self):
        flat = optkit.FlatParams.from_tree({"w": jnp.ones(3)})
        with pytest.raises(KeyError, match="no bfloat16 buffer"):
            flat["bfloat16"]

    # A sharded leaf is refused: tests/sharding/test_sharding.py (it runs on 8 simulated devices).
