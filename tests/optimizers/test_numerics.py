"""optkit/_src/numerics.py: the compute dtype, ``1 - b^t`` near b = 1, the guarded quotient, leaf maps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from optkit._src import numerics


@pytest.mark.parametrize("dtypes, want", [
    ((), jnp.float32), ((jnp.bfloat16,), jnp.float32), ((jnp.float16, jnp.bfloat16), jnp.float32),
    ((jnp.float32, None), jnp.float32), ((jnp.float64,), jnp.float64),
])
def test_compute_dtype_is_at_least_float32(dtypes, want):
    with jax.enable_x64(True):
        assert numerics.compute_dtype(*dtypes) == jnp.dtype(want)


@given(one_minus_b=st.floats(1e-12, 0.5), t=st.integers(1, 10**6))
def test_one_minus_power_keeps_relative_accuracy_near_one(one_minus_b, t):
    """``1 - b^t`` from ``1 - b``: float32 within a few ulp of the exact value (computed in float64 via
    log1p/expm1), where ``1 - b**t`` written out would round b to 1."""
    b = 1 - one_minus_b  # a double: 1 - b is exact in it
    exact = -np.expm1(t * np.log1p(-(1 - b)))
    got = float(numerics.one_minus_power(b, jnp.float32(t), jnp.float32))
    assert abs(got - exact) <= 4 * np.finfo(np.float32).eps * exact


def test_guarded_ratio_is_zero_only_for_zero_over_zero():
    num = jnp.array([0.0, 1.0, 0.0, 2.0])
    root = jnp.array([0.0, 0.0, 3.0, 4.0])
    np.testing.assert_array_equal(numerics.guarded_ratio(num, root, 0.0), [0.0, np.inf, 0.0, 0.5])
    # with a positive eps there is nothing to guard: exactly num / (root + eps)
    np.testing.assert_array_equal(numerics.guarded_ratio(num, root, 1.0), num / (root + 1.0))


def test_map_leaves_applies_a_multi_output_formula_per_leaf():
    tree = {"a": jnp.ones(2), "b": [jnp.zeros(3), 2.0]}
    other = {"a": jnp.full(2, 3.0), "b": [jnp.ones(3), 1.0]}
    total, product, absent = numerics.map_leaves(lambda x, y, z: (x + y, x * y, z), 3, tree, other, None)
    np.testing.assert_array_equal(total["a"], [4.0, 4.0])
    np.testing.assert_array_equal(product["b"][0], [0.0, 0.0, 0.0])
    assert float(total["b"][1]) == 3.0 and absent == {"a": None, "b": [None, None]}
    assert numerics.map_leaves(lambda x: (x, x), 2, {}) == ({}, {})
