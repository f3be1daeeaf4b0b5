"""Bad input gets a clear error, at construction or trace time, naming the argument or path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optkit

P = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}

# (factory, kwargs, exception type, words the message must contain)
CONSTRUCTION_CASES = [
    (optkit.adam, dict(learning_rate=0.1, b1=1.0), ValueError, "b1 must be in [0, 1)"),
    (optkit.adam, dict(learning_rate=0.1, b1=-0.1), ValueError, "b1 must be in [0, 1)"),
    (optkit.adam, dict(learning_rate=0.1, b2=1.5), ValueError, "b2 must be in [0, 1)"),
    (optkit.adam, dict(learning_rate=-1e-3), ValueError, "learning_rate must be >= 0"),
    (optkit.adam, dict(learning_rate=0.1, eps=-1e-8), ValueError, "eps must be >= 0"),
    (optkit.adam, dict(learning_rate=0.1, norm_coefficient_post=1.0), ValueError,
     "norm_coefficient_post must be in [0, 1)"),
    (optkit.adam, dict(learning_rate=0.1, norm_coefficient=-0.1), ValueError, "norm_coefficient must be >= 0"),
    (optkit.adam, dict(learning_rate=float("nan")), ValueError, "learning_rate must be finite"),
    (optkit.adam, dict(learning_rate="0.1"), TypeError, "learning_rate must be a real number"),
    (optkit.adam, dict(learning_rate=jnp.ones(2)), TypeError, "learning_rate must be a scalar"),
    (optkit.adam, dict(learning_rate=0.1, mu_dtype=jnp.int32), TypeError, "mu_dtype must be a floating dtype"),
    (optkit.adagrad, dict(learning_rate=-0.1), ValueError, "learning_rate must be >= 0"),
    (optkit.adagrad, dict(learning_rate=0.1, eps=-1.0), ValueError, "eps must be >= 0"),
    (optkit.adagrad, dict(learning_rate=0.1, decay_factor=-0.5), ValueError, "decay_factor must be >= 0"),
    (optkit.adagrad, dict(learning_rate=0.1, initial_accumulator_value=-1.0), ValueError,
     "initial_accumulator_value must be >= 0"),
    (optkit.adagrad, dict(learning_rate=0.1, accumulator_dtype="int8"), TypeError, "accumulator_dtype"),
    (optkit.momentum, dict(learning_rate=-0.1), ValueError, "learning_rate must be >= 0"),
    (optkit.momentum, dict(learning_rate=0.1, alpha=-0.9), ValueError, "alpha must be >= 0"),
    (optkit.momentum, dict(learning_rate=0.1, beta=float("inf")), ValueError, "beta must be finite"),
    (optkit.momentum, dict(learning_rate=0.1, nesterov="yes"), TypeError, "nesterov must be a bool"),
]


@pytest.mark.parametrize("factory, kwargs, exc, words", CONSTRUCTION_CASES,
                         ids=[f"{c[0].__name__}-{'-'.join(c[1])}" for c in CONSTRUCTION_CASES])
def test_bad_hyperparameters(factory, kwargs, exc, words):
    with pytest.raises(exc) as info:
        factory(**kwargs)
    assert words in str(info.value)


FACTORIES = [
    lambda: optkit.adagrad(0.1),
    lambda: optkit.adam(0.1),
    lambda: optkit.momentum(0.1),
]


@pytest.mark.parametrize("factory", FACTORIES, ids=["adagrad", "adam", "momentum"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
class TestTrees:
    def test_grads_tree_differs_from_state(self, factory, jit):
        tx = factory()
        state = tx.init(P)
        update = jax.jit(tx.update) if jit else tx.update
        with pytest.raises(ValueError, match=r"does not match updates.*\['c'\]|\['c'\].*does not match"):
            update({"w": jnp.ones((2, 3)), "c": jnp.ones(3)}, state, None)

    def test_grads_shape_differs(self, factory, jit):
        tx = factory()
        state = tx.init(P)
        update = jax.jit(tx.update) if jit else tx.update
        with pytest.raises(ValueError, match=r"at \['w'\] has shape \(2, 3\)"):
            update({"w": jnp.ones((3, 2)), "b": jnp.ones(3)}, state)

    def test_params_tree_differs(self, factory, jit):
        tx = factory()
        state = tx.init(P)
        update = jax.jit(tx.update) if jit else tx.update
        with pytest.raises(ValueError, match=r"params does not match updates"):
            update(P, state, {"w": jnp.ones((2, 3))})

    def test_integer_grads(self, factory, jit):
        tx = factory()
        state = tx.init(P)
        update = jax.jit(tx.update) if jit else tx.update
        with pytest.raises(TypeError, match=r"updates leaf at \['b'\] must be a floating-point array, got dtype int32"):
            update({"w": jnp.ones((2, 3)), "b": jnp.ones(3, jnp.int32)}, state)

    def test_integer_params_at_init(self, factory, jit):
        tx = factory()
        init = jax.jit(tx.init) if jit else tx.init
        with pytest.raises(TypeError, match=r"params leaf at \['n'\] must be a floating-point array"):
            init({"w": jnp.ones(2), "n": jnp.arange(3)})


@pytest.mark.parametrize(
    "tx, words",
    [
        (optkit.adagrad(0.1, norm_coefficient=0.1), "norm_coefficient != 0"),
        (optkit.adam(0.1, norm_coefficient=0.1), "norm_coefficient != 0"),
        (optkit.adam(0.1, norm_coefficient_post=0.1), "norm_coefficient_post != 0"),
        (optkit.momentum(0.1, norm_coefficient=0.1), "norm_coefficient != 0"),
    ],
)
def test_params_none_where_needed(tx, words):
    state = tx.init(P)
    with pytest.raises(ValueError, match="params=None") as info:
        tx.update(P, state)
    assert words in str(info.value)


OP_CASES = [
    (lambda: optkit.ops.onnx_adagrad(jnp.ones(2), 0, [P["b"]], [P["b"]], [P["b"]]), ValueError,
     "R must be a scalar"),
    (lambda: optkit.ops.onnx_adagrad(0.1, 0.5, [P["b"]], [P["b"]], [P["b"]]), TypeError,
     "T (the step count) must be an integer"),
    (lambda: optkit.ops.onnx_adagrad(0.1, -1, [P["b"]], [P["b"]], [P["b"]]), ValueError,
     "T (the step count) must be >= 0"),
    (lambda: optkit.ops.onnx_adagrad(0.1, 0, [P["b"]], [P["b"]], [P["w"]]), ValueError,
     "H leaf at [0] has shape (2, 3) but X has shape (3,)"),
    (lambda: optkit.ops.onnx_adagrad(0.1, 0, [P["b"]], [P["b"], P["b"]], [P["b"]]), ValueError,
     "G does not match X"),
    (lambda: optkit.ops.onnx_adagrad(0.1, 0, [], [], []), ValueError, "X must hold at least one tensor"),
    (lambda: optkit.ops.onnx_adagrad(-0.1, 0, [P["b"]], [P["b"]], [P["b"]]), ValueError, "R must be >= 0"),
    (lambda: optkit.ops.onnx_adam(0.1, 0, [P["b"]], [P["b"]], [P["b"]], [P["b"]], alpha=1.0), ValueError,
     "alpha must be in [0, 1)"),
    (lambda: optkit.ops.onnx_momentum(0.1, 0, [P["b"]], [P["b"]], [P["b"]], alpha=0.9, beta=0.1,
                                      mode="heavy-ball", norm_coefficient=0.0), ValueError,
     "mode must be one of ['standard', 'nesterov']"),
    (lambda: optkit.ops.onnx_momentum(0.1, 0, [P["b"]], [P["b"]], [P["b"]], alpha=0.9, beta=0.1,
                                      mode="standard"), TypeError, "norm_coefficient"),
    (lambda: optkit.ops.dml_adam(P["b"], P["b"], P["b"], jnp.ones(3, jnp.int32), 1, learning_rate=0.1,
                                 beta1=0.9, beta2=0.99, epsilon=1e-8), TypeError,
     "G leaf at <root> must be a floating-point array"),
    (lambda: optkit.ops.dml_adam(P["b"], P["b"], P["b"], P["b"], np.ones(1, np.int32), learning_rate=0.1,
                                 beta1=0.9, beta2=0.99, epsilon=1e-8), ValueError, "T must be a scalar"),
]


@pytest.mark.parametrize("call, exc, words", OP_CASES, ids=[c[2][:30] for c in OP_CASES])
def test_bad_op_inputs(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)
