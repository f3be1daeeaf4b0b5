"""optkit/ops.py: the spec operators against ONNX's own conformance cases, and what they share
(several tensors as any pytree, inputs not mutated). Each operator against its SPEC section's NumPy
transcription is tested beside its transformation (tests/optimizers/test_adagrad.py, test_adam.py,
test_momentum.py).

SPEC sections: 1 (Adagrad), 2 (DirectML Adam), 3 (ONNX Adam), 4 (Momentum).
"""

import chex
import jax
import numpy as np
import onnx
import pytest
from onnx.backend.test.case.node import collect_testcases

import optkit

_ONNX_OPS = ("Adagrad", "Adam", "Momentum")


def _onnx_cases():
    """ONNX's conformance cases for the training optimizers (all feed T = 0).

    ``collect_testcases`` keeps one global list, filled on first use; asking
    for all cases (never one op type) keeps it whole for other test modules.
    """
    cases = {}
    for case in collect_testcases():
        node = case.model.graph.node
        if len(node) == 1 and node[0].op_type in _ONNX_OPS and node[0].domain == "ai.onnx.preview.training":
            cases[case.name] = case
    return [cases[name] for name in sorted(cases)]


def _attributes(node):
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


@pytest.mark.parametrize("case", _onnx_cases(), ids=lambda c: c.name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_onnx_conformance_cases(case, jit):
    """SPEC, Conformance data: ONNX's expected outputs for its 7 optimizer test cases."""
    (node,) = case.model.graph.node
    attrs = _attributes(node)
    for inputs, expected in case.data_sets:
        R, T, *tensors = inputs
        if node.op_type == "Adagrad":
            n = len(tensors) // 3
            X, G, H = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
            fn = lambda R, T, X, G, H: optkit.ops.onnx_adagrad(R, T, X, G, H, **attrs)  # noqa: E731
            args = (R, T, X, G, H)
        elif node.op_type == "Adam":
            n = len(tensors) // 4
            X, G, V, H = (tensors[i * n : (i + 1) * n] for i in range(4))
            fn = lambda R, T, X, G, V, H: optkit.ops.onnx_adam(R, T, X, G, V, H, **attrs)  # noqa: E731
            args = (R, T, X, G, V, H)
        else:
            n = len(tensors) // 3
            X, G, V = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
            fn = lambda R, T, X, G, V: optkit.ops.onnx_momentum(R, T, X, G, V, **attrs)  # noqa: E731
            args = (R, T, X, G, V)
        if jit:
            fn = jax.jit(fn)
        outputs = jax.tree.leaves(fn(*args))
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            assert got.dtype == want.dtype
            # Stricter than ONNX's runner (rtol 1e-3): float32 rounding only.
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)






class OpsTest(chex.TestCase):
    """Several tensors at once, as ONNX's variadic inputs; inputs never mutated."""







    def test_dict_of_tensors_is_several_tensors(self):
        """A dict works as ONNX's variadic list: per-tensor results equal one-at-a-time calls."""
        rng = np.random.default_rng(5)
        tree = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
        grads = jax.tree.map(lambda x: x * 0.5, tree)
        acc = jax.tree.map(np.zeros_like, tree)
        X_new, _ = optkit.ops.onnx_adagrad(np.float32(0.1), 2, tree, grads, acc, decay_factor=0.1)
        for key in tree:
            (x_single,), _ = optkit.ops.onnx_adagrad(
                np.float32(0.1), 2, [tree[key]], [grads[key]], [acc[key]], decay_factor=0.1
            )
            np.testing.assert_array_equal(X_new[key], x_single)

    def test_inputs_are_not_mutated(self):
        rng = np.random.default_rng(6)
        X, G, V = ([rng.standard_normal(5).astype(np.float32)] for _ in range(3))
        H = [np.abs(rng.standard_normal(5)).astype(np.float32)]
        copies = [[a.copy() for a in t] for t in (X, G, V, H)]
        optkit.ops.onnx_adam(np.float32(0.1), 3, X, G, V, H)
        optkit.ops.onnx_momentum(np.float32(0.1), 3, X, G, V, alpha=0.9, beta=0.1, mode="nesterov",
                                 norm_coefficient=0.1)
        for orig, copy in zip((X, G, V, H), copies):
            np.testing.assert_array_equal(orig[0], copy[0])




