"""optkit/_src/schedule_free.py: optkit.schedule_free_adamw and schedule_free_eval_params against
schedulefree.AdamWScheduleFree's own runs (schedulefree 1.4.1 on torch 2.13.0, committed by
benchmarks/optimizer_references.py) in float64 and float32, against SPEC 9's NumPy transcription
(tests/oracles.py), and beside optax.contrib.schedule_free_adamw; jitted and not, in inject_hyperparams and
nnx.Optimizer. Its sharded runs are in tests/sharding/test_zero.py (8 simulated devices)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

import optkit
from tests import oracles, reference_runs

VALUES = reference_runs.data("schedule_free")
CASES = reference_runs.cases("schedule_free")
STEPS = 10
# float32 against the reference's float32 run (its step scalars are Python floats, optkit's float32), 10 steps:
# measured 5.7e-6 relative to |reference| + 1e-3 on this machine.
FLOAT32_RTOL = 2e-5


def _worst(case, key, params):
    return max(float(np.max(np.abs(np.asarray(params[n]) - VALUES[f"{case}/{key}/{n}"][-1])
                            / (np.abs(VALUES[f"{case}/{key}/{n}"][-1]) + 1e-3))) for n in params)


class ScheduleFreeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters([case for case in CASES if CASES[case]["dtype"] == "float64"])
    def test_float64_equals_the_reference_train_and_eval_params(self, case):
        with jax.enable_x64(True):
            tx = optkit.schedule_free_adamw(**CASES[case]["kwargs"])
            trajectory, state = reference_runs.run(tx, VALUES, jnp.float64, STEPS, step=self.variant)
            for t, params in enumerate(trajectory):
                evaluated = optkit.schedule_free_eval_params(state, params) if t == STEPS else None
                for name, value in params.items():
                    np.testing.assert_allclose(np.asarray(value), VALUES[f"{case}/traj/{name}"][t], rtol=1e-13,
                                               atol=1e-15, err_msg=f"{case} step {t} {name}")
            for name, value in evaluated.items():
                np.testing.assert_allclose(np.asarray(value), VALUES[f"{case}/eval/{name}"][-1], rtol=1e-13,
                                           atol=1e-15)
                np.testing.assert_allclose(np.asarray(state[0].z[name]), VALUES[f"{case}/z/{name}"], rtol=1e-13,
                                           atol=1e-15)
                np.testing.assert_allclose(np.asarray(state[0].nu[name]), VALUES[f"{case}/nu/{name}"],
                                           rtol=1e-13, atol=1e-18)

    @chex.variants(with_jit=True, without_jit=True)
    def test_float32_within_the_measured_bound_of_the_reference(self):
        tx = optkit.schedule_free_adamw(**CASES["f32_warmup"]["kwargs"])
        trajectory, state = reference_runs.run(tx, VALUES, jnp.float32, STEPS, step=self.variant)
        assert _worst("f32_warmup", "traj", trajectory[-1]) < FLOAT32_RTOL
        assert _worst("f32_warmup", "eval", optkit.schedule_free_eval_params(state, trajectory[-1])) < FLOAT32_RTOL


@settings(max_examples=20, deadline=None)
@given(warmup=st.integers(0, 4), r=st.sampled_from([0.0, 0.5, 2.0]), power=st.sampled_from([0.0, 1.0, 2.0]),
       weight_decay=st.sampled_from([0.0, 0.1]), seed=st.integers(0, 2**16))
def test_steps_equal_the_numpy_transcription_of_spec_9(warmup, r, power, weight_decay, seed):
    rng = np.random.default_rng(seed)
    y = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=4)}
    grads = [{n: rng.normal(size=v.shape) for n, v in y.items()} for _ in range(6)]
    oracle = oracles.ScheduleFreeAdamW(0.05, b1=0.85, b2=0.95, eps=1e-6, weight_decay=weight_decay,
                                       warmup_steps=warmup, r=r, weight_lr_power=power)
    with jax.enable_x64(True):
        tx = optkit.schedule_free_adamw(0.05, 0.85, 0.95, 1e-6, weight_decay, warmup_steps=warmup, r=r,
                                        weight_lr_power=power)
        params = {n: jnp.asarray(v) for n, v in y.items()}
        state = tx.init(params)
        z, v = dict(y), {n: np.zeros_like(a) for n, a in y.items()}
        for g in grads:
            updates, state = jax.jit(tx.update)({n: jnp.asarray(a) for n, a in g.items()}, state, params)
            params = optax.apply_updates(params, updates)
            y, z, v = oracle.step(y, z, v, g)
        for n in y:
            np.testing.assert_allclose(np.asarray(params[n]), y[n], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(np.asarray(state[0].z[n]), z[n], rtol=1e-12, atol=1e-14)
        evaluated = optkit.schedule_free_eval_params(state, params)
        for n, want in oracle.eval_params(y, z).items():
            np.testing.assert_allclose(np.asarray(evaluated[n]), want, rtol=1e-12, atol=1e-14)


def test_optax_contrib_differs_only_by_rounding_where_it_has_the_same_algorithm():
    """Without ``r`` and warmup, Optax's form (x recomputed from y and z, divided by b1) is the same algorithm:
    it equals optkit's to float64 rounding, not bit for bit."""
    with jax.enable_x64(True):
        kwargs = CASES["f64_default"]["kwargs"]
        ours, _ = reference_runs.run(optkit.schedule_free_adamw(**kwargs), VALUES, jnp.float64, STEPS)
        theirs, _ = reference_runs.run(optax.contrib.schedule_free_adamw(**kwargs), VALUES, jnp.float64, STEPS)
        chex.assert_trees_all_close(ours[-1], theirs[-1], rtol=1e-12, atol=1e-14)


def test_chain_and_inject_hyperparams_under_jit_equal_the_plain_optimizer():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    runs = []
    for tx in (optkit.schedule_free_adamw(0.01, warmup_steps=2, weight_decay=0.1),
               optax.chain(optax.identity(), optkit.schedule_free_adamw(0.01, warmup_steps=2, weight_decay=0.1)),
               optax.inject_hyperparams(optkit.schedule_free_adamw)(0.01, warmup_steps=2, weight_decay=0.1)):
        state, p = tx.init(params), params
        for _ in range(3):
            updates, state = jax.jit(tx.update)(jax.tree.map(jnp.sin, p), state, p)
            p = optax.apply_updates(p, updates)
        runs.append((p, optkit.schedule_free_eval_params(state, p)))  # the state found inside chain's tuple
    chex.assert_trees_all_close(runs[0], runs[1], rtol=1e-6)
    chex.assert_trees_all_close(runs[0], runs[2], rtol=1e-6)


def test_nnx_optimizer_trains_y_and_eval_params_keep_the_boxes():
    model, optimizer, params, state = reference_runs.nnx_optimizer_equals_functional(
        lambda: optkit.schedule_free_adamw(0.05), 3, 2)
    nnx = pytest.importorskip("flax.nnx")
    evaluated = optkit.schedule_free_eval_params(optimizer.opt_state, nnx.state(model, nnx.Param))
    assert isinstance(evaluated["kernel"], nnx.Param)
    np.testing.assert_allclose(np.asarray(evaluated["kernel"][...]),
                               np.asarray(optkit.schedule_free_eval_params(state, params)["kernel"]), rtol=1e-6)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"learning_rate": -1.0}, ValueError, "learning_rate must be >= 0"),
    ({"learning_rate": 0.1, "b1": 0.0}, ValueError, r"b1 must be in \(0, 1\)"),
    ({"learning_rate": 0.1, "b2": 1.0}, ValueError, r"b2 must be in \[0, 1\)"),
    ({"learning_rate": 0.1, "r": -1.0}, ValueError, "r must be >= 0"),
    ({"learning_rate": 0.1, "warmup_steps": 2.5}, TypeError, "warmup_steps"),
    ({"learning_rate": 0.1, "warmup_steps": -1}, ValueError, "warmup_steps"),
])
def test_bad_hyperparameters_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        optkit.schedule_free_adamw(**kwargs)


def test_params_are_required_and_eval_params_need_the_state():
    params = {"w": jnp.ones(3)}
    tx = optkit.schedule_free_adamw(0.1)
    with pytest.raises(ValueError, match="params=None"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="must hold one ScheduleFreeAdamWState"):
        optkit.schedule_free_eval_params(optax.adam(0.1).init(params), params)
    with pytest.raises(ValueError, match="params"):
        optkit.schedule_free_eval_params(tx.init(params), {"v": jnp.ones(3)})
