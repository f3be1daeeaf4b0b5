# ruff: noqa: E501  (the audit table keeps one bad input per line)
"""Validation audit: every public function, its bad inputs, the error each gets (the one table of them).

``TABLE`` is the audit: one row per bad input, with the public function it is
given to, the exception type and words the message must contain. Update-time
rows run eagerly and under ``jax.jit`` (the checks run at trace time). The
property tests at the end draw random hyperparameters and trees: nothing but
the documented ``ValueError``/``TypeError`` may escape, and wherever the SPEC
formula (the NumPy float64 oracles) is finite and representable in float32,
optkit's float32 result is finite too.

Hyperparameters that are tracers (``optax.inject_hyperparams`` under
``jax.jit``) are not range-checked: the last rows of the table show that, as
the docstrings say.
"""

from __future__ import annotations

import collections
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optkit
from tests import oracles

pytest.importorskip("onnx")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import optkit.onnx  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS, onnx_model  # noqa: E402
from tests.onnx.helpers import onnx_info as _info  # noqa: E402

P = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
B = jnp.ones(3)
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)

ALIASES = {
    "adagrad": lambda **kw: optkit.adagrad(0.1, **kw),
    "adam": lambda **kw: optkit.adam(0.1, **kw),
    "momentum": lambda **kw: optkit.momentum(0.1, **kw),
    "adafactor": lambda **kw: optkit.adafactor(**kw),
    "scale_by_onnx_adagrad": lambda **kw: optkit.scale_by_onnx_adagrad(**kw),
    "scale_by_dml_adam": lambda **kw: optkit.scale_by_dml_adam(**kw),
    "scale_by_onnx_momentum": lambda **kw: optkit.scale_by_onnx_momentum(**kw),
    "scale_by_adafactor": lambda **kw: optkit.scale_by_adafactor(**kw),
    "scale_by_factored_rms": lambda **kw: optkit.scale_by_factored_rms(**kw),
}


def _call(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)


class _Update:
    """``tx.update(grads, state, params)`` for the transformation ``name``, run eagerly and jitted."""

    def __init__(self, name, grads, params=P, state="init", **kw):
        self.name, self.grads, self.params, self.state, self.kw = name, grads, params, state, kw

    def __call__(self, transform):
        tx = ALIASES[self.name](**self.kw)
        state = tx.init(P) if isinstance(self.state, str) else self.state
        return transform(tx.update)(self.grads, state, self.params)


_update = _Update


def _init(name, params):
    return lambda: ALIASES[name]().init(params)


def _gemm_model():
    """logits = Gemm(x, W, b): an inference model with two initializers."""
    return _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"])], [_info("x", TensorProto.FLOAT, ["N", 3])],
                  [_info("y", TensorProto.FLOAT, ["N", 2])],
                  initializers=[onnx.numpy_helper.from_array(np.zeros((3, 2), np.float32), "W"),
                                onnx.numpy_helper.from_array(np.zeros(2, np.float32), "b")])


def _model(nodes, inputs, outputs, opsets=(("", 17),), initializers=()):
    return onnx_model(nodes, inputs, outputs, initializers, opsets)


def _relu(shape=(3,), elem_type=TensorProto.FLOAT):
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", elem_type, shape)],
                  [_info("y", elem_type, shape)])


def _graph():
    g = optkit.Graph(["x"])
    g.add(jnp.sin, ["x"], ["y"], name="sin")
    return g


def _graph_with_gradient():
    g = _graph()
    g.add_gradient(xs=["x"], y="y", outputs=["dy"])
    return g


def _other_state(name):
    """Another optimizer's first state, in a chain of the right length for ``name``."""
    other = optkit.adagrad(0.1) if name != "adagrad" else optkit.adam(0.1)
    return (other.init(P)[0],)


# ---------------------------------------------------------------------------
# The table: (public function, case id, thunk, exception, words in the message).
# A thunk that takes one argument is an update-time case run eagerly and jitted.

TABLE = []


def row(function, case, thunk, exc, words):
    TABLE.append((function, case, thunk, exc, words))


# Hyperparameters of the transformations (construction time).
for name, kw, exc, words in [
    ("adagrad", dict(eps=-1.0), ValueError, "eps must be >= 0, got -1.0"),
    ("adagrad", dict(eps=float("nan")), ValueError, "eps must be finite, got nan"),
    ("adagrad", dict(decay_factor=-0.5), ValueError, "decay_factor must be >= 0"),
    ("adagrad", dict(norm_coefficient=float("inf")), ValueError, "norm_coefficient must be finite"),
    ("adagrad", dict(initial_accumulator_value=-1.0), ValueError, "initial_accumulator_value must be >= 0"),
    ("adagrad", dict(accumulator_dtype=jnp.int32), TypeError, "accumulator_dtype must be a floating dtype"),
    ("adagrad", dict(eps=None), TypeError, "eps must be a number, got None"),
    ("adagrad", dict(eps="1e-6"), TypeError, "eps must be a real number, got '1e-6'"),
    ("adagrad", dict(eps=jnp.ones(2)), TypeError, "eps must be a scalar"),
    ("adam", dict(b1=1.0), ValueError, "b1 must be in [0, 1), got 1.0"),
    ("adam", dict(b1=-0.1), ValueError, "b1 must be in [0, 1)"),
    ("adam", dict(b2=1.5), ValueError, "b2 must be in [0, 1), got 1.5"),
    ("adam", dict(b2=True), ValueError, "b2 must be in [0, 1), got 1.0"),
    ("adam", dict(eps=-1e-8), ValueError, "eps must be >= 0"),
    ("adam", dict(norm_coefficient=-0.1), ValueError, "norm_coefficient must be >= 0"),
    ("adam", dict(norm_coefficient_post=1.0), ValueError, "norm_coefficient_post must be in [0, 1)"),
    ("adam", dict(mu_dtype="int8"), TypeError, "mu_dtype must be a floating dtype or None, got int8"),
    ("adam", dict(nu_dtype="bogus"), TypeError, "nu_dtype must be a floating dtype or None, got 'bogus'"),
    ("adam", dict(nu_dtype=jnp.complex64), TypeError, "nu_dtype must be a floating dtype or None"),
    ("adam", dict(b1=np.float32("nan")), ValueError, "b1 must be finite, got nan"),
    ("adam", dict(b1=1 + 2j), TypeError, "b1 must be a real number"),
    ("momentum", dict(alpha=-0.9), ValueError, "alpha must be >= 0, got -0.9"),
    ("momentum", dict(beta=float("inf")), ValueError, "beta must be finite, got inf"),
    ("momentum", dict(nesterov="yes"), TypeError, "nesterov must be a bool, got 'yes'"),
    ("momentum", dict(nesterov=1), TypeError, "nesterov must be a bool, got 1"),
    ("momentum", dict(norm_coefficient=-1.0), ValueError, "norm_coefficient must be >= 0"),
    ("momentum", dict(accumulator_dtype=int), TypeError, "accumulator_dtype must be a floating dtype"),
    ("adafactor", dict(b1=1.0), ValueError, "b1 must be in [0, 1), got 1.0"),
    ("adafactor", dict(decay_rate=0.0), ValueError, "decay_rate must be > 0, got 0.0"),
    ("adafactor", dict(eps1=-1e-30), ValueError, "eps1 must be >= 0"),
    ("adafactor", dict(eps2=float("nan")), ValueError, "eps2 must be finite"),
    ("adafactor", dict(clipping_threshold=0.0), ValueError, "clipping_threshold must be > 0, got 0.0"),
    ("adafactor", dict(learning_rate=-1.0), ValueError, "learning_rate must be >= 0, got -1.0"),
    ("adafactor", dict(weight_decay_rate=-1.0), ValueError, "weight_decay_rate must be >= 0"),
    ("adafactor", dict(factored_dims="first"), ValueError, "factored_dims must be one of ['last', 'largest']"),
    ("adafactor", dict(factored_dims=None), ValueError, "factored_dims must be one of"),
    ("adafactor", dict(min_dim_size_to_factor=0), ValueError, "min_dim_size_to_factor must be >= 1"),
    ("adafactor", dict(min_dim_size_to_factor=2.0), TypeError, "min_dim_size_to_factor must be an integer"),
    ("adafactor", dict(multiply_by_parameter_scale="yes"), TypeError,
     "multiply_by_parameter_scale must be a bool"),
    ("adafactor", dict(factored=1), TypeError, "factored must be a bool, got 1"),
    ("adafactor", dict(mu_dtype=jnp.int8), TypeError, "mu_dtype must be a floating dtype"),
    ("scale_by_onnx_adagrad", dict(eps=-1.0), ValueError, "eps must be >= 0"),
    ("scale_by_dml_adam", dict(b1=2.0), ValueError, "b1 must be in [0, 1)"),
    ("scale_by_onnx_momentum", dict(alpha=float("nan")), ValueError, "alpha must be finite"),
    ("scale_by_adafactor", dict(clipping_threshold=-1.0), ValueError, "clipping_threshold must be > 0"),
    ("scale_by_factored_rms", dict(decay_rate=-0.8), ValueError, "decay_rate must be > 0"),
    ("scale_by_factored_rms", dict(nu_dtype=jnp.int32), TypeError, "nu_dtype must be a floating dtype"),
]:
    row(name, "-".join(f"{k}={v!r}" for k, v in kw.items()), _call(ALIASES[name], **kw), exc, words)

# T5X's Adafactor (tests/optimizers/test_t5x_adafactor.py has the factor-rule table).
for case, thunk, exc, words in [
    ("no learning rate", _call(optkit.t5x_adafactor, None), ValueError, "learning_rate is required"),
    ("beta1=1.0", _call(optkit.t5x_adafactor, 0.1, beta1=1.0), ValueError, "beta1 must be in [0, 1)"),
    ("step_offset=0.5", _call(optkit.t5x_adafactor, 0.1, step_offset=0.5), TypeError, "step_offset must be an integer"),
    ("epsilon1=-1", _call(optkit.t5x_adafactor, 0.1, epsilon1=-1.0), ValueError, "epsilon1 must be >= 0"),
    ("rank 3 without a rule", lambda: optkit.t5x_adafactor(0.1).init({"w": jnp.ones((2, 3, 4))}), ValueError,
     "'w' of shape"),
]:
    row("t5x_adafactor", case, thunk, exc, words)

for name, lr, exc, words in [
    ("adagrad", -0.1, ValueError, "learning_rate must be >= 0, got -0.1"),
    ("adagrad", "0.1", TypeError, "learning_rate must be a real number, got '0.1'"),
    ("adam", None, TypeError, "learning_rate must be a number, got None"),
    ("adam", [0.1], TypeError, "learning_rate must be a real number, got [0.1]"),
    ("adam", jnp.ones(2), TypeError, "learning_rate must be a scalar: expected a scalar, got an array of shape (2,)"),
    ("adam", float("nan"), ValueError, "learning_rate must be finite, got nan"),
    ("momentum", float("-inf"), ValueError, "learning_rate must be finite, got -inf"),
    ("momentum", 1 + 1j, TypeError, "learning_rate must be a real number"),
]:
    factory = {"adagrad": optkit.adagrad, "adam": optkit.adam, "momentum": optkit.momentum}[name]
    row(name, f"learning_rate={lr!r}", _call(factory, lr), exc, words)

# factored_axes
for case, args, kw, exc, words in [
    ("shape=None", (None,), {}, TypeError, "shape must be a sequence of non-negative integers, got None"),
    ("shape='ab'", ("ab",), {}, TypeError, "shape must be a sequence of non-negative integers, got 'ab'"),
    ("negative dim", ((3, -4),), {}, ValueError, "got -4 in (3, -4)"),
    ("float dim", ((3, 4.0),), {}, TypeError, "got the entry 4.0 in (3, 4.0)"),
    ("factored_dims", ((3, 4),), dict(factored_dims="first"), ValueError, "factored_dims must be one of"),
    ("min_dim=0", ((3, 4),), dict(min_dim_size_to_factor=0), ValueError, "min_dim_size_to_factor must be >= 1"),
    ("factored='no'", ((3, 4),), dict(factored="no"), TypeError, "factored must be a bool"),
]:
    row("factored_axes", case, _call(optkit.factored_axes, *args, **kw), exc, words)

# muon and its iteration
MATRIX = {"w": jnp.ones((2, 3))}
for case, thunk, exc, words in [
    ("momentum=-1", _call(optkit.muon, 0.1, momentum=-1.0), ValueError, "momentum must be >= 0, got -1.0"),
    ("weight_decay=nan", _call(optkit.muon, 0.1, weight_decay=float("nan")), ValueError, "weight_decay must be finite"),
    ("adjust_lr='none'", _call(optkit.muon, 0.1, adjust_lr="none"), ValueError, "adjust_lr must be one of ['original', 'match_rms_adamw']"),
    ("ns_steps=100", _call(optkit.muon, 0.1, ns_steps=100), ValueError, "ns_steps must be in [0, 100)"),
    ("ns_coefficients of 2", _call(optkit.muon, 0.1, ns_coefficients=(1.0, 2.0)), ValueError, "ns_coefficients must be three numbers"),
    ("learning_rate='x'", _call(optkit.muon, "x"), TypeError, "learning_rate must be a real number"),
    ("init: a vector", lambda: optkit.muon(0.1).init({"b": jnp.ones(3)}), ValueError, "muon: params['b'] has shape (3,)"),
    ("init: integer leaf", lambda: optkit.muon(0.1).init({"n": jnp.ones((2, 2), jnp.int32)}), TypeError, "params leaf at ['n'] must be a floating-point array"),
    ("update: params=None with weight decay", lambda: optkit.muon(0.1).update(MATRIX, optkit.muon(0.1).init(MATRIX)), ValueError, "muon: params=None, but"),
    ("update: grads of another shape", lambda: optkit.muon(0.1).update({"w": jnp.ones((3, 2))}, optkit.muon(0.1).init(MATRIX), MATRIX), ValueError, "['w']"),
    ("update: state=(None,)", lambda: optkit.muon(0.1).update(MATRIX, (None,), MATRIX), TypeError, "muon: state must be the ScaleByMuonState"),
]:
    row("muon", case, thunk, exc, words)
for case, thunk, exc, words in [
    ("a vector", _call(optkit.newton_schulz, jnp.ones(3)), ValueError, "update must be a 2-D matrix, got shape (3,)"),
    ("ns_steps=-1", _call(optkit.newton_schulz, jnp.ones((2, 2)), ns_steps=-1), ValueError, "ns_steps must be in [0, 100)"),
    ("ns_steps=True", _call(optkit.newton_schulz, jnp.ones((2, 2)), ns_steps=True), TypeError, "ns_steps must be an int"),
    ("ns_coefficients=None", _call(optkit.newton_schulz, jnp.ones((2, 2)), ns_coefficients=None), ValueError, "ns_coefficients must be three numbers"),
]:
    row("newton_schulz", case, thunk, exc, words)

# schedule-free AdamW and its evaluation parameters
SF = {"w": jnp.ones((2, 3))}
for case, thunk, exc, words in [
    ("b1=1", _call(optkit.schedule_free_adamw, 0.1, b1=1.0), ValueError, "b1 must be in (0, 1), got 1.0"),
    ("b2=-0.1", _call(optkit.schedule_free_adamw, 0.1, b2=-0.1), ValueError, "b2 must be in [0, 1), got -0.1"),
    ("weight_lr_power=inf", _call(optkit.schedule_free_adamw, 0.1, weight_lr_power=float("inf")), ValueError, "weight_lr_power must be finite"),
    ("warmup_steps=1.5", _call(optkit.schedule_free_adamw, 0.1, warmup_steps=1.5), TypeError, "warmup_steps (the step count) must be an integer scalar"),
    ("init: integer leaf", lambda: optkit.schedule_free_adamw(0.1).init({"n": jnp.ones(2, jnp.int32)}), TypeError, "params leaf at ['n'] must be a floating-point array"),
    ("update: params=None", lambda: optkit.schedule_free_adamw(0.1).update(SF, optkit.schedule_free_adamw(0.1).init(SF)), ValueError, "schedule_free_adamw: params=None"),
    ("update: state=(None,)", lambda: optkit.schedule_free_adamw(0.1).update(SF, (None,), SF), TypeError, "must be the ScheduleFreeAdamWState"),
]:
    row("schedule_free_adamw", case, thunk, exc, words)
for case, thunk, exc, words in [
    ("another optimizer's state", _call(optkit.schedule_free_eval_params, optax.adam(0.1).init(SF), SF), ValueError, "state must hold one ScheduleFreeAdamWState"),
    ("two states", _call(optkit.schedule_free_eval_params, [optkit.schedule_free_adamw(0.1).init(SF)] * 2, SF), ValueError, "found 2"),
    ("params of other keys", _call(optkit.schedule_free_eval_params, optkit.schedule_free_adamw(0.1).init(SF), {"v": jnp.ones((2, 3))}), ValueError, "params"),
    ("params of another shape", _call(optkit.schedule_free_eval_params, optkit.schedule_free_adamw(0.1).init(SF), {"w": jnp.ones((3, 2))}), ValueError, "shape (3, 2) against z of shape (2, 3)"),
]:
    row("schedule_free_eval_params", case, thunk, exc, words)

# 8-bit Adam and its quantization
Q = {"w": jnp.ones((64, 80))}
for case, thunk, exc, words in [
    ("rounding='floor'", _call(optkit.adam8bit, 0.1, rounding="floor"), ValueError, "rounding must be one of ['nearest', 'table']"),
    ("block_size=0", _call(optkit.adam8bit, 0.1, block_size=0), ValueError, "block_size must be an int >= 1, got 0"),
    ("min_8bit_size=1.5", _call(optkit.adam8bit, 0.1, min_8bit_size=1.5), ValueError, "min_8bit_size must be an int >= 0, got 1.5"),
    ("b1=1", _call(optkit.adam8bit, 0.1, b1=1.0), ValueError, "b1 must be in [0, 1), got 1.0"),
    ("init: integer leaf", lambda: optkit.adam8bit(0.1).init({"n": jnp.ones(2, jnp.int32)}), TypeError, "params leaf at ['n'] must be a floating-point array"),
    ("update: grads of another shape", lambda: optkit.adam8bit(0.1).update({"w": jnp.ones((64, 64))}, optkit.adam8bit(0.1).init(Q)), ValueError, "adam8bit: state.mu['w'] has codes (20, 256)"),
    ("update: params=None with weight decay", lambda: optkit.adam8bit(0.1, weight_decay=0.1).update(Q, optkit.adam8bit(0.1).init(Q)), ValueError, "adam8bit: params=None"),
    ("update: state=(None,)", lambda: optkit.adam8bit(0.1).update(Q, (None,)), TypeError, "must be the ScaleByAdam8bitState"),
]:
    row("adam8bit", case, thunk, exc, words)
for fn, case, thunk, exc, words in [
    ("quantize_blockwise", "rounding='up'", _call(optkit.quantize_blockwise, jnp.ones(3), rounding="up"), ValueError, "rounding must be one of"),
    ("quantize_blockwise", "block_size=0", _call(optkit.quantize_blockwise, jnp.ones(3), block_size=0), ValueError, "block_size must be a positive int, got 0"),
    ("quantize_blockwise", "integer x", _call(optkit.quantize_blockwise, jnp.ones(3, jnp.int32)), TypeError, "x must be a floating array, got dtype int32"),
    ("quantize_blockwise", "signed='yes'", _call(optkit.quantize_blockwise, jnp.ones(3), signed="yes"), TypeError, "signed must be a bool"),
    ("dequantize_blockwise", "shape too large", _call(optkit.dequantize_blockwise, optkit.quantize_blockwise(jnp.ones(3), block_size=4), (5,)), ValueError, "do not hold an array of shape (5,)"),
    ("dequantize_blockwise", "an array, not a moment", _call(optkit.dequantize_blockwise, jnp.ones(3), (3,)), TypeError, "moment must be a QuantizedMoment"),
    ("dequantize_blockwise", "shape=None", _call(optkit.dequantize_blockwise, optkit.quantize_blockwise(jnp.ones(3)), None), TypeError, "shape must be a sequence of non-negative integers"),
    ("dynamic_map", "signed='yes'", _call(optkit.dynamic_map, "yes"), TypeError, "signed must be a bool, got 'yes'"),
    ("dynamic_map", "signed=1", _call(optkit.dynamic_map, 1), TypeError, "signed must be a bool, got 1"),
    ("dynamic_map", "signed=None", _call(optkit.dynamic_map, None), TypeError, "signed must be a bool, got None"),
]:
    row(fn, case, thunk, exc, words)

# init and update of every transformation
for name in ALIASES:
    row(name, "init: integer leaf", _init(name, {"a": jnp.ones(2), "n": jnp.arange(3)}),
        TypeError, "params leaf at ['n'] must be a floating-point array, got dtype int32")
    row(name, "init: Python int leaf", _init(name, [1.0, 2]),
        TypeError, "params leaf at [1] must be a floating-point array, got the Python int 2")
    row(name, "init: string leaf", _init(name, {"s": "x"}),
        TypeError, "params leaf at ['s'] must be a floating-point array, got str")
    row(name, "init: complex leaf", _init(name, {"c": jnp.ones(2, jnp.complex64)}),
        TypeError, "params leaf at ['c'] must be a floating-point array, got dtype complex64")
    row(name, "update: bool grads", _update(name, {"w": P["w"], "b": jnp.ones(3, bool)}),
        TypeError, "updates leaf at ['b'] must be a floating-point array, got dtype bool")
    row(name, "update: grads with an extra key",
        _update(name, {"w": P["w"], "b": B, "c": B}), ValueError, "does not match updates")
    row(name, "update: grads missing a key", _update(name, {"w": P["w"]}), ValueError,
        "does not match updates: leaf 0 is at ['b']")
    row(name, "update: grads nested deeper", _update(name, {"w": P["w"], "b": {"x": B}}), ValueError,
        "but at ['b']['x'] in updates")
    row(name, "update: grads as a list", _update(name, [P["w"], B]), ValueError, "but at [0] in updates")
    row(name, "update: Python float grad for an array", _update(name, {"w": P["w"], "b": 1.0}), ValueError,
        "['b']")
    row(name, "update: transposed grad", _update(name, {"w": jnp.ones((3, 2)), "b": B}), ValueError,
        "['w']")
    if name == "scale_by_factored_rms":
        continue  # it does not read params (as optax.scale_by_factored_rms)
    row(name, "update: params shape", _update(name, P, params={"w": P["w"], "b": jnp.ones(4)}), ValueError,
        "params leaf at ['b'] has shape (4,) but updates has shape (3,) there")
    row(name, "update: params tree", _update(name, P, params={"w": P["w"]}), ValueError,
        "params does not match updates")
    row(name, "update: integer params", _update(name, P, params={"w": P["w"], "b": jnp.ones(3, jnp.int32)}),
        TypeError, "params leaf at ['b'] must be a floating-point array, got dtype int32")
    row(name, "update: state of other params",
        _update(name, P, state=ALIASES[name]().init({"w": jnp.ones((3, 2)), "b": B})), ValueError, "['w']")

for name in ("adagrad", "adam", "momentum"):
    row(name, "update: another optimizer's state", _update(name, P, state=_other_state(name)),
        TypeError, "state must be the")
for name, cls in [("scale_by_onnx_adagrad", "ScaleByOnnxAdagradState"), ("scale_by_dml_adam", "ScaleByDmlAdamState"),
                  ("scale_by_onnx_momentum", "ScaleByOnnxMomentumState"),
                  ("scale_by_adafactor", "ScaleByAdafactorState"), ("scale_by_factored_rms", "ScaleByFactoredRmsState")]:
    row(name, "update: state=None", _update(name, P, state=None), TypeError,
        f"{name}: state must be the {cls} that its init returned")
    row(name, "update: state as a dict", _update(name, P, state={"count": 0}), TypeError, "got dict")
row("adam", "update: state=None (optax.chain's own check)", _update("adam", P, state=None), TypeError,
    "object of type 'NoneType' has no len()")

# params=None where the algorithm needs them
for name, kw, words in [
    ("adagrad", dict(norm_coefficient=0.1), "params=None, but norm_coefficient != 0 needs the parameters"),
    ("adam", dict(norm_coefficient=0.1), "norm_coefficient != 0"),
    ("adam", dict(norm_coefficient_post=0.1), "norm_coefficient_post != 0"),
    ("momentum", dict(norm_coefficient=0.1), "norm_coefficient != 0"),
    ("adafactor", dict(), "multiply_by_parameter_scale=True"),
    ("adafactor", dict(multiply_by_parameter_scale=False, weight_decay_rate=0.1), "weight_decay_rate != 0"),
    ("scale_by_dml_adam", dict(norm_coefficient=0.1), "scale_by_dml_adam: params=None"),
]:
    row(name, f"params=None with {kw}", _update(name, P, params=None, **kw), ValueError, words)
row("adafactor", "b1 set but state made without it",
    _update("adafactor", P, state=(optkit.adafactor().init(P)[0], optax.EmptyState()), b1=0.9),
    ValueError, "state.mu is None but b1 is set")



def _with_count(name, count):
    """``name``'s initial state with its step count replaced (a corrupt or edited checkpoint)."""
    state = ALIASES[name]().init(P)
    if not hasattr(state, "_fields"):  # an optax.chain: a plain tuple
        return (state[0]._replace(count=count), *state[1:])
    return state._replace(count=count)


for name in ALIASES:
    row(name, "update: negative count (eager: the value is known)",
        lambda name=name: ALIASES[name]().update(P, _with_count(name, jnp.asarray(-5)), P),
        ValueError, "state.count (the number of updates made so far) must be >= 0, got -5")
    row(name, "update: float count", _update(name, P, state=_with_count(name, jnp.asarray(3.0))),
        TypeError, "state.count (the number of updates made so far) must be an integer scalar, got an array of dtype float32")
    row(name, "update: count of rank 1", _update(name, P, state=_with_count(name, jnp.zeros(2, jnp.int32))),
        ValueError, "state.count (the number of updates made so far) must be a scalar, got shape (2,)")
for name in ("adafactor", "scale_by_adafactor", "scale_by_factored_rms"):
    transformation = "scale_by_factored_rms" if name == "scale_by_factored_rms" else "scale_by_adafactor"
    row(name, "init: FlatParams", _init(name, optkit.FlatParams.from_tree(P)), TypeError,
        f"{transformation}: got an optkit.FlatParams")
    row(name, "update: FlatParams gradients", _update(name, optkit.FlatParams.from_tree(P), params=None,
                                                      multiply_by_parameter_scale=False) if name != "scale_by_factored_rms"
        else _update(name, optkit.FlatParams.from_tree(P)), TypeError, "Give it the per-leaf tree (flat.to_tree()")
P16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), P)
row("adam", "inject_hyperparams: bfloat16 parameters round the default b2 = 0.999 to 1.0",
    lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=0.1).init(P16),
    ValueError, "b2 is the bfloat16 value 1.0, outside [0, 1): a decay rate near 1 rounds to 1.0 in bfloat16")
row("adam", "inject_hyperparams: bfloat16 b2 = 0.999 rounds to 1.0",
    lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=0.1, b1=jnp.float32(0.9)).init(P16),
    ValueError, "or hyperparam_dtype=jnp.float32 to optax.inject_hyperparams")
row("adam", "inject_hyperparams: a dtype taken for a schedule",
    lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=0.1, mu_dtype=jnp.float32).init(P),
    TypeError, "pass static_args=('mu_dtype',)")

# Traced hyperparameters are not range-checked (documented): no error, by design.
row("adam", "inject_hyperparams: concrete b1 out of range at init",
    lambda: optax.inject_hyperparams(optkit.adam)(learning_rate=0.1, b1=1.5).init(P),
    ValueError, "b1 must be in [0, 1), got 1.5")

# The spec ops (optkit.ops)
A, D, AM, M = optkit.ops.onnx_adagrad, optkit.ops.dml_adam, optkit.ops.onnx_adam, optkit.ops.onnx_momentum
MK = dict(alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
DK = dict(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8)
for fn, case, thunk, exc, words in [
    ("onnx_adagrad", "R rank 1", _call(A, jnp.ones(2), 0, [B], [B], [B]), ValueError, "R must be a scalar (shape ()), got shape (2,)"),
    ("onnx_adagrad", "R rank 2", _call(A, jnp.ones((1, 1)), 0, [B], [B], [B]), ValueError, "got shape (1, 1)"),
    ("onnx_adagrad", "R Python int", _call(A, 1, 0, [B], [B], [B]), TypeError, "R must be a floating-point scalar, got dtype int32"),
    ("onnx_adagrad", "R None", _call(A, None, 0, [B], [B], [B]), TypeError, "R must be a floating-point scalar, got None"),
    ("onnx_adagrad", "R string", _call(A, "0.1", 0, [B], [B], [B]), TypeError, "R must be a floating-point scalar, got '0.1'"),
    ("onnx_adagrad", "R negative", _call(A, -0.1, 0, [B], [B], [B]), ValueError, "R must be >= 0, got -0.1"),
    ("onnx_adagrad", "R NaN", _call(A, jnp.float32(np.nan), 0, [B], [B], [B]), ValueError, "R must be finite, got nan"),
    ("onnx_adagrad", "T float", _call(A, 0.1, 0.5, [B], [B], [B]), TypeError, "T (the step count) must be an integer scalar, got dtype float32"),
    ("onnx_adagrad", "T bool", _call(A, 0.1, True, [B], [B], [B]), TypeError, "got dtype bool"),
    ("onnx_adagrad", "T None", _call(A, 0.1, None, [B], [B], [B]), TypeError, "T must be an integer scalar (the step count), got None"),
    ("onnx_adagrad", "T string", _call(A, 0.1, "0", [B], [B], [B]), TypeError, "T must be an integer scalar (the step count), got '0'"),
    ("onnx_adagrad", "T negative", _call(A, 0.1, -1, [B], [B], [B]), ValueError, "T (the step count) must be >= 0, got -1"),
    ("onnx_adagrad", "T rank 1", _call(A, 0.1, jnp.zeros(1, jnp.int32), [B], [B], [B]), ValueError, "T must be a scalar (shape ()), got shape (1,)"),
    ("onnx_adagrad", "T beyond int32", _call(A, 0.1, 2**40, [B], [B], [B]), ValueError, "does not fit JAX's default integer type"),
    ("onnx_adagrad", "X None", _call(A, 0.1, 0, None, [B], [B]), ValueError, "X must hold at least one tensor, got None"),
    ("onnx_adagrad", "X empty list", _call(A, 0.1, 0, [], [], []), ValueError, "X must hold at least one tensor, got []"),
    ("onnx_adagrad", "X integer", _call(A, 0.1, 0, [jnp.ones(3, jnp.int32)], [B], [B]), TypeError, "X leaf at [0] must be a floating-point array, got dtype int32"),
    ("onnx_adagrad", "H integer", _call(A, 0.1, 0, [B], [B], [jnp.ones(3, jnp.int32)]), TypeError, "H leaf at [0] must be a floating-point array"),
    ("onnx_adagrad", "G shape", _call(A, 0.1, 0, [B], [jnp.ones(4)], [B]), ValueError, "G leaf at [0] has shape (4,) but X has shape (3,) there"),
    ("onnx_adagrad", "G rank", _call(A, 0.1, 0, [B], [jnp.ones((3, 1))], [B]), ValueError, "G leaf at [0] has shape (3, 1)"),
    ("onnx_adagrad", "G None", _call(A, 0.1, 0, [B], None, [B]), ValueError, "G does not match X: G has 0 leaves and X has 1"),
    ("onnx_adagrad", "G extra tensor", _call(A, 0.1, 0, [B], [B, B], [B]), ValueError, "G does not match X"),
    ("onnx_adagrad", "H bare array vs list", _call(A, 0.1, 0, [B], [B], B), ValueError, "H does not match X"),
    ("onnx_adagrad", "epsilon negative", _call(A, 0.1, 0, [B], [B], [B], epsilon=-1.0), ValueError, "epsilon must be >= 0"),
    ("onnx_adagrad", "decay_factor NaN", _call(A, 0.1, 0, [B], [B], [B], decay_factor=np.nan), ValueError, "decay_factor must be finite"),
    ("onnx_adagrad", "norm_coefficient string", _call(A, 0.1, 0, [B], [B], [B], norm_coefficient="0"), TypeError, "norm_coefficient must be a real number"),
    ("onnx_adam", "alpha = 1", _call(AM, 0.1, 1, [B], [B], [B], [B], alpha=1.0), ValueError, "alpha must be in [0, 1)"),
    ("onnx_adam", "beta negative", _call(AM, 0.1, 1, [B], [B], [B], [B], beta=-0.1), ValueError, "beta must be in [0, 1)"),
    ("onnx_adam", "norm_coefficient_post = 1", _call(AM, 0.1, 1, [B], [B], [B], [B], norm_coefficient_post=1.0), ValueError, "norm_coefficient_post must be in [0, 1)"),
    ("onnx_adam", "R rank 1", _call(AM, jnp.ones(1), 1, [B], [B], [B], [B]), ValueError, "R must be a scalar"),
    ("onnx_adam", "V dict vs list", _call(AM, 0.1, 1, [B], [B], {"a": B}, [B]), ValueError, "V does not match X"),
    ("onnx_adam", "H shape", _call(AM, 0.1, 1, [B], [B], [B], [jnp.ones(2)]), ValueError, "H leaf at [0] has shape (2,)"),
    ("onnx_adam", "T float", _call(AM, 0.1, 1.0, [B], [B], [B], [B]), TypeError, "T (the step count) must be an integer"),
    ("dml_adam", "G integer", _call(D, B, B, B, jnp.ones(3, jnp.int32), 1, **DK), TypeError, "G leaf at <root> must be a floating-point array"),
    ("dml_adam", "T rank 1", _call(D, B, B, B, B, np.ones(1, np.int32), **DK), ValueError, "T must be a scalar"),
    ("dml_adam", "T negative", _call(D, B, B, B, B, -1, **DK), ValueError, "T (the step count) must be >= 0, got -1"),
    ("dml_adam", "learning_rate string", _call(D, B, B, B, B, 1, **{**DK, "learning_rate": "x"}), TypeError, "learning_rate must be a real number"),
    ("dml_adam", "beta1 = 1", _call(D, B, B, B, B, 1, **{**DK, "beta1": 1.0}), ValueError, "beta1 must be in [0, 1)"),
    ("dml_adam", "beta2 NaN", _call(D, B, B, B, B, 1, **{**DK, "beta2": np.nan}), ValueError, "beta2 must be finite"),
    ("dml_adam", "epsilon missing", _call(D, B, B, B, B, 1, learning_rate=0.1, beta1=0.9, beta2=0.999), TypeError, "missing 1 required keyword-only argument: 'epsilon'"),
    ("dml_adam", "M shape", _call(D, B, jnp.ones(2), B, B, 1, **DK), ValueError, "M leaf at <root> has shape (2,) but X has shape (3,) there"),
    ("dml_adam", "V dict vs array", _call(D, B, B, {"a": B}, B, 1, **DK), ValueError, "V does not match X: leaf 0 is at ['a'] in V but at <root> in X"),
    ("onnx_momentum", "mode unknown", _call(M, 0.1, 0, [B], [B], [B], **{**MK, "mode": "heavy-ball"}), ValueError, "mode must be one of ['standard', 'nesterov'], got 'heavy-ball'"),
    ("onnx_momentum", "mode capitalized", _call(M, 0.1, 0, [B], [B], [B], **{**MK, "mode": "Nesterov"}), ValueError, "got 'Nesterov'"),
    ("onnx_momentum", "mode None", _call(M, 0.1, 0, [B], [B], [B], **{**MK, "mode": None}), ValueError, "got None"),
    ("onnx_momentum", "norm_coefficient missing", _call(M, 0.1, 0, [B], [B], [B], alpha=0.9, beta=1.0, mode="standard"), TypeError, "norm_coefficient"),
    ("onnx_momentum", "alpha negative", _call(M, 0.1, 0, [B], [B], [B], **{**MK, "alpha": -1.0}), ValueError, "alpha must be >= 0"),
    ("onnx_momentum", "V shape", _call(M, 0.1, 0, [B], [B], [jnp.ones(2)], **MK), ValueError, "V leaf at [0] has shape (2,)"),
    ("onnx_momentum", "X empty", _call(M, 0.1, 0, [], [], [], **MK), ValueError, "X must hold at least one tensor"),
    ("onnx_momentum", "R negative", _call(M, -1.0, 0, [B], [B], [B], **MK), ValueError, "R must be >= 0"),
]:
    row(fn, case, thunk, exc, words)

# optkit.gradient


def _f(W, X):
    return jnp.sum(W * X)


for case, thunk, exc, words in [
    ("fun None", _call(optkit.gradient, None, ["W"]), TypeError, "fun must be callable, got None"),
    ("xs None", _call(optkit.gradient, _f, None), TypeError, "xs must be a sequence of tensor names, got None"),
    ("xs a string", _call(optkit.gradient, _f, "W"), TypeError, "write ['W']"),
    ("xs empty", _call(optkit.gradient, _f, []), ValueError, "xs must name at least one tensor"),
    ("xs [None]", _call(optkit.gradient, _f, [None]), TypeError, "xs must hold non-empty strings, got None"),
    ("xs ['']", _call(optkit.gradient, _f, [""]), ValueError, "xs must hold non-empty strings, got ''"),
    ("xs repeated", _call(optkit.gradient, _f, ["W", "W"]), ValueError, "xs names the tensor 'W' twice"),
    ("zs None", _call(optkit.gradient, _f, ["W"], None), TypeError, "zs must be a sequence of tensor names, got None"),
    ("in xs and zs", _call(optkit.gradient, _f, ["W"], ["W"]), ValueError, "'W' is in both xs and zs"),
    ("y not a name", _call(optkit.gradient, _f, ["W"], ["X"], y=5), TypeError, "y must be a non-empty tensor name, got 5"),
    ("name not a parameter", _call(optkit.gradient, _f, ["W"], ["Q"]), ValueError, "'Q' (in zs) is not an input of fun"),
    ("parameter not named", _call(optkit.gradient, _f, ["W"]), ValueError, "fun needs the input 'X', which is in neither xs nor zs"),
    ("positional-only fun", _call(optkit.gradient, jnp.sin, ["x"]), ValueError, "its positional-only parameters ['x'] cannot be"),
    ("call: wrong count", lambda: optkit.gradient(_f, ["W"], ["X"])(1.0), ValueError, "expected 2 values, one per tensor of xs + zs"),
    ("call: int x", lambda: optkit.gradient(_f, ["W"], ["X"])(1, 2.0), ValueError, "xs tensor 'W' leaf at <root> must be a floating-point array, got the Python int 1"),
    ("call: int32 array x", lambda: optkit.gradient(_f, ["W"], ["X"])(jnp.ones(2, jnp.int32), 2.0), ValueError, "got dtype int32; Gradient differentiates floating-point tensors only"),
    ("call: bool x", lambda: optkit.gradient(_f, ["W"], ["X"])(jnp.ones(2, bool), 2.0), ValueError, "got dtype bool"),
    ("call: complex x", lambda: optkit.gradient(_f, ["W"], ["X"])(jnp.ones(2, jnp.complex64), 2.0), ValueError, "got dtype complex64"),
    ("call: string x", lambda: optkit.gradient(_f, ["W"], ["X"])("a", 2.0), ValueError, "got str"),
    ("call: None x", lambda: optkit.gradient(_f, ["W"], ["X"])(None, 2.0), ValueError, "xs tensor 'W' was fed None, which holds no array"),
    ("call: y None", lambda: optkit.gradient(lambda W: None, ["W"])(1.0), ValueError, "y tensor 'y' is None, which holds no array"),
    ("call: integer y", lambda: optkit.gradient(lambda W, n: n, ["W"], ["n"])(1.0, jnp.ones(2, jnp.int32)), ValueError, "y tensor 'y' leaf at <root> must be a floating-point array, got dtype int32"),
    ("call: y not returned", lambda: optkit.gradient(lambda W: {"a": W}, ["W"], y="Z")(1.0), ValueError, "y 'Z' is not computed by fun"),
    ("call: mapping without y", lambda: optkit.gradient(lambda W: {"a": W}, ["W"])(1.0), ValueError, "pass y=<name>"),
    ("call: y named, array returned", lambda: optkit.gradient(lambda W: W, ["W"], y="a")(1.0), ValueError, "fun returned y itself"),
]:
    row("gradient", case, thunk, exc, words)

# optkit.Graph


def _graph_op(method, *args, **kwargs):
    return lambda: getattr(_graph(), method)(*args, **kwargs)


for case, thunk, exc, words in [
    ("inputs None", _call(optkit.Graph, None), TypeError, "inputs must be a sequence of tensor names, got None"),
    ("inputs a string", _call(optkit.Graph, "x"), TypeError, "write ['x']"),
    ("inputs [1]", _call(optkit.Graph, [1]), TypeError, "inputs must hold non-empty strings, got 1"),
    ("input spec 5", _call(optkit.Graph, {"x": 5}), TypeError, "graph input 'x': expected None, a (shape, dtype) pair"),
    ("input dtype bogus", _call(optkit.Graph, {"x": ((2,), "bogus")}), TypeError, "graph input 'x': dtype must be a NumPy/JAX dtype, got 'bogus'"),
    ("input negative dim", _call(optkit.Graph, {"x": ((-1,), "float32")}), ValueError, "graph input 'x': shape must be a sequence of non-negative integers and None (free dimensions), got -1 in (-1,)"),
    ("input float dim", _call(optkit.Graph, {"x": ((2.5,), "float32")}), TypeError, "got the entry 2.5 in (2.5,)"),
    ("input shape 5", _call(optkit.Graph, {"x": (5, "float32")}), TypeError, "graph input 'x': shape must be a sequence"),
    ("outputs a string", _call(optkit.Graph, ["x"], outputs="y"), TypeError, "write ['y']"),
    ("initializers a list", _call(optkit.Graph, ["x"], initializers=[1]), TypeError, "initializers must be a mapping from tensor names to constant tensors, got list"),
    ("initializer name 1", _call(optkit.Graph, ["x"], initializers={1: 2}), TypeError, "initializer name must be a non-empty string, got 1"),
    ("input declared twice", _call(optkit.Graph, ["x", "x"]), ValueError, "inputs names the tensor 'x' twice"),
    ("add: fn None", _graph_op("add", None, ["x"], ["z"]), TypeError, "fn must be callable, got None"),
    ("add: inputs None", _graph_op("add", jnp.sin, None, ["z"]), TypeError, "inputs must be a sequence of tensor names, got None"),
    ("add: outputs None", _graph_op("add", jnp.sin, ["x"], None), TypeError, "outputs must be a sequence of tensor names, got None"),
    ("add: outputs []", _graph_op("add", jnp.sin, ["x"], []), ValueError, "outputs must name at least one tensor"),
    ("add: input 1", _graph_op("add", jnp.sin, [1], ["z"]), TypeError, "inputs must hold strings, got 1"),
    ("add: output redefined", _graph_op("add", jnp.cos, ["x"], ["y"]), ValueError, "tensor 'y' (output of node 'cos#1') is already the output of node 'sin'"),
    ("add: output is an input", _graph_op("add", jnp.cos, ["y"], ["x"]), ValueError, "is already a graph input"),
    ("add_gradient: xs None", _graph_op("add_gradient", xs=None, y="y"), TypeError, "xs must be a sequence of tensor names, got None"),
    ("add_gradient: y None", _graph_op("add_gradient", xs=["x"], y=None), ValueError, "y (the name of the tensor to differentiate) is required"),
    ("add_gradient: y 5", _graph_op("add_gradient", xs=["x"], y=5), TypeError, "y must be a non-empty tensor name, got 5"),
    ("add_gradient: inputs short", _graph_op("add_gradient", xs=["x"], zs=["q"], y="y", inputs=["x"]), ValueError, "needs 2 inputs, got 1"),
    ("add_gradient: outputs long", _graph_op("add_gradient", xs=["x"], y="y", outputs=["a", "b"]), ValueError, "one output per tensor of xs"),
    ("evaluate: feeds None", _graph_op("evaluate", None), TypeError, "feeds must be a mapping from tensor names to values, got NoneType"),
    ("evaluate: feeds list", _graph_op("evaluate", [1.0]), TypeError, "got list; as_function() takes positional values"),
    ("evaluate: unknown feed", _graph_op("evaluate", {"q": 1.0}), ValueError, "feed 'q' is not a graph input"),
    ("evaluate: feeding a node output", _graph_op("evaluate", {"x": 1.0, "y": 1.0}), ValueError, "feed 'y' is the output of node 'sin'"),
    ("evaluate: unknown output", _graph_op("evaluate", {"x": 1.0}, ["nowhere"]), ValueError, "output 'nowhere' is not a graph input"),
    ("evaluate: outputs 5", _graph_op("evaluate", {"x": 1.0}, 5), TypeError, "outputs must be a sequence of tensor names, got 5"),
    ("evaluate: input not fed", _graph_op("evaluate", {}), ValueError, "graph input 'x' is needed for the outputs ['y'] but was not fed"),
    ("evaluate: declared shape", lambda: optkit.Graph({"x": ((None, 3), "float32")}).evaluate({"x": jnp.ones((2, 2))}, "x"), ValueError, "graph input 'x' is declared with shape (?, 3), fed shape (2, 2)"),
    ("evaluate: declared dtype", lambda: optkit.Graph({"x": ((2,), "float32")}).evaluate({"x": jnp.ones(2, jnp.int32)}, "x"), ValueError, "graph input 'x' is declared float32, fed int32"),
    ("evaluate: int fed to a Gradient's xs", lambda: _graph_with_gradient().evaluate({"x": jnp.arange(3)}, "dy"), ValueError, "xs tensor 'x' leaf at <root> must be a floating-point array, got dtype int32"),
    ("as_function: inputs a string", _graph_op("as_function", "x"), TypeError, "write ['x']"),
    ("as_function: output 5", _graph_op("as_function", ["x"], [5]), TypeError, "outputs must hold non-empty strings, got 5"),
    ("as_function: wrong count", lambda: _graph().as_function(["x"], "y")(1.0, 2.0), ValueError, "expected 1 values, one per input ['x'], got 2"),
    ("validate: undefined input", lambda: _undefined_graph().validate(), ValueError, "reads the tensor 'ghost'"),
    ("validate: cycle", lambda: _cyclic_graph().validate(), ValueError, "the graph has a cycle through tensor"),
    ("validate: gradient through itself", lambda: _self_gradient_graph().validate(), ValueError, "differentiates through its own output"),
    ("validate: xs not independent", lambda: _dependent_xs_graph().validate(), ValueError, "xs and zs must be independent (SPEC 6)"),
    ("validate: xs+zs do not determine y", lambda: _undetermined_graph().validate(), ValueError, "xs and zs must determine y (SPEC 6): add 'w' to zs"),
]:
    row("Graph", case, thunk, exc, words)



_FLAT = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
for case, thunk, exc, words in [
    ("from_tree: None", lambda: optkit.FlatParams.from_tree(None), ValueError, "needs at least one array leaf, got None"),
    ("from_tree: empty dict", lambda: optkit.FlatParams.from_tree({}), ValueError, "needs at least one array leaf"),
    ("from_tree: string leaf", lambda: optkit.FlatParams.from_tree({"w": "abc"}), TypeError, "params leaf at ['w'] must be a floating-point array, got str"),
    ("from_tree: int leaf", lambda: optkit.FlatParams.from_tree({"w": jnp.ones(2), "step": jnp.arange(3)}), TypeError, "params leaf at ['step'] must be a floating-point array, got dtype int32"),
    ("from_tree: complex leaf", lambda: optkit.FlatParams.from_tree({"w": jnp.ones(2, jnp.complex64)}), TypeError, "params leaf at ['w'] must be a floating-point array, got dtype complex64"),
    ("constructor called directly", lambda: optkit.FlatParams([jnp.ones(2)], None), TypeError, "from_tree"),
    ("pack: None", lambda: optkit.FlatParams.from_tree(_FLAT).pack(None), ValueError, "tree does not match the FlatParams layout: tree has 0 leaves"),
    ("pack: missing leaf", lambda: optkit.FlatParams.from_tree(_FLAT).pack({"w": jnp.ones((2, 3))}), ValueError, "tree does not match the FlatParams layout"),
    ("pack: wrong shape", lambda: optkit.FlatParams.from_tree(_FLAT).pack({"w": jnp.ones((3, 2)), "b": jnp.ones(3)}), ValueError, "tree leaf at ['w'] has shape (3, 2)"),
    ("pack: wrong dtype", lambda: optkit.FlatParams.from_tree(_FLAT).pack({"w": jnp.ones((2, 3)), "b": jnp.ones(3, jnp.int32)}), TypeError, "tree leaf at ['b'] has dtype int32 but the FlatParams layout stores float32 there"),
    ("[]: absent dtype", lambda: optkit.FlatParams.from_tree(_FLAT)["bfloat16"], KeyError, "no bfloat16 buffer; this FlatParams has ['float32']"),
    ("[]: not a dtype", lambda: optkit.FlatParams.from_tree(_FLAT)[5], KeyError, "indexed by dtype (e.g. 'float32'), got 5"),
    ("adam update: state of another layout", lambda: optkit.adam(0.1).update(optkit.FlatParams.from_tree(_FLAT), optkit.adam(0.1).init(optkit.FlatParams.from_tree({"v": jnp.ones(9)})), optkit.FlatParams.from_tree(_FLAT)), ValueError, "state.mu does not match updates"),
]:
    row("FlatParams", case, thunk, exc, words)

def _undefined_graph():
    g = optkit.Graph(["x"])
    g.add(jnp.sin, ["ghost"], ["y"], name="s")
    return g


def _cyclic_graph():
    g = optkit.Graph(["x"])
    g.add(jnp.add, ["x", "c"], ["a"], name="A")
    g.add(jnp.sin, ["a"], ["b"], name="B")
    g.add(jnp.cos, ["b"], ["c"], name="C")
    return g


def _self_gradient_graph():
    g = optkit.Graph(["x"])
    g.add(jnp.add, ["x", "d"], ["y"], name="A")
    g.add_gradient(xs=["x"], y="y", outputs=["d"], name="G")
    return g


def _dependent_xs_graph():
    g = _graph()
    g.add(jnp.cos, ["y"], ["z"], name="cos")
    g.add_gradient(xs=["x", "y"], y="z")
    return g


def _undetermined_graph():
    g = optkit.Graph(["x", "w"])
    g.add(jnp.multiply, ["x", "w"], ["y"], name="mul")
    g.add_gradient(xs=["x"], y="y")
    return g


# optkit.onnx


def _adam_node_model(n_inputs=6):
    names = ["R", "T", "X", "G", "V", "H"][:n_inputs]
    node = helper.make_node("Adam", names, ["X_new", "V_new", "H_new"], domain="ai.onnx.preview.training")
    infos = [_info(n, TensorProto.INT64 if n == "T" else TensorProto.FLOAT, [] if n in "RT" else [2]) for n in names]
    return _model([node], infos, [_info(o, TensorProto.FLOAT, [2]) for o in ("X_new", "V_new", "H_new")],
                  opsets=(("", 17), ("ai.onnx.preview.training", 1)))


def _bad_utf8_model():
    model = _model([helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X_new", "V_new"],
                                     domain="ai.onnx.preview.training", alpha=0.9, beta=1.0,
                                     norm_coefficient=0.0, mode="standard")],
                   [_info(n, TensorProto.INT64 if n == "T" else TensorProto.FLOAT, [] if n in "RT" else [2])
                    for n in "RTXGV"], [_info(o, TensorProto.FLOAT, [2]) for o in ("X_new", "V_new")],
                   opsets=(("", 17), ("ai.onnx.preview.training", 1)))
    data = model.SerializeToString()
    return data.replace(b"standard", b"st\xe9ndard")  # same length, not UTF-8


def _huge_output_model():
    """Two small initializers whose broadcast sum would be 2^38 float32 elements (1 TiB)."""
    n = 1 << 19
    a = onnx.numpy_helper.from_array(np.ones((n, 1), np.float32), "a")
    b = onnx.numpy_helper.from_array(np.ones((1, n), np.float32), "b")
    return _model([helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                  [], [_info("y", TensorProto.FLOAT, [])], initializers=[a, b])


for fn, case, thunk, exc, words in [
    ("load_model", "not bytes", _call(optkit.onnx.load_model, 42), TypeError, "model must be an onnx.ModelProto, bytes, a path or a binary file object, got int"),
    ("load_model", "garbage bytes", _call(optkit.onnx.load_model, b"garbage bytes"), ValueError, "malformed ONNX model bytes"),
    ("load_model", "empty bytes", _call(optkit.onnx.load_model, b""), ValueError, "parses as a ModelProto without a graph"),
    ("load_model", "truncated model", lambda: optkit.onnx.load_model(_relu().SerializeToString()[:-7]), ValueError, "malformed ONNX model bytes"),
    ("load_model", "missing file", _call(optkit.onnx.load_model, "/nonexistent/model.onnx"), FileNotFoundError, "no ONNX model file at"),
    ("load_model", "text file object", lambda: optkit.onnx.load_model(__import__("io").StringIO("x")), TypeError, "opened in binary mode"),
    ("load_model", "checker: undefined input", lambda: optkit.onnx.load_model(_model([helper.make_node("Relu", ["q"], ["y"])], [_info("x", TensorProto.FLOAT, [3])], [_info("y", TensorProto.FLOAT, [3])])), ValueError, "onnx.checker rejects"),
    ("load_model", "cycle", lambda: optkit.onnx.load_model(_model([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])], [], [_info("a", TensorProto.FLOAT, [3])])), ValueError, "must be topologically sorted"),
    ("to_graph", "non-UTF-8 attribute", lambda: optkit.onnx.to_graph(_bad_utf8_model()), ValueError, "attribute 'mode' is not valid UTF-8 text"),
    ("to_graph", "unknown domain not imported", lambda: optkit.onnx.to_graph(_model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")], [_info("x", TensorProto.FLOAT, [3])], [_info("y", TensorProto.FLOAT, [3])])), ValueError, "node 'Foo#0' (com.example::Foo): the model does not import the domain 'com.example'"),
    ("to_graph", "unknown domain imported", lambda: optkit.onnx.to_graph(_model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")], [_info("x", TensorProto.FLOAT, [3])], [_info("y", TensorProto.FLOAT, [3])], opsets=(("", 17), ("com.example", 1)))), optkit.onnx.UnsupportedOpError, "optkit runs no operator of domain 'com.example'"),
    ("to_graph", "unsupported operator", lambda: optkit.onnx.to_graph(_model([helper.make_node("FlexAttention", ["x"], ["y"])], [_info("x", TensorProto.FLOAT, [3])], [_info("y", TensorProto.FLOAT, [3])])), optkit.onnx.UnsupportedOpError, "unsupported operator FlexAttention (domain 'ai.onnx', opset 17)"),
    ("to_graph", "declared input 10**12", lambda: optkit.onnx.to_graph(_relu((10**6, 10**6))), optkit.onnx.TensorTooLargeError, "graph input 'x' has shape (1000000, 1000000): 1e+12 elements of float32, 4e+12 bytes, more than optkit.onnx's limit"),
    ("to_graph", "declared dimension above 2**31 - 1", lambda: optkit.onnx.to_graph(_relu((2**31,))), optkit.onnx.TensorTooLargeError, "graph input 'x' has shape (2147483648,): the dimension 2147483648 is above optkit.onnx's bound of 2147483647"),
    ("to_graph", "declared output 10**12", lambda: optkit.onnx.to_graph(_model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", TensorProto.FLOAT, ["N"])], [_info("y", TensorProto.FLOAT, [10**6, 10**6])])), optkit.onnx.TensorTooLargeError, "graph output 'y' has shape (1000000, 1000000)"),
    ("to_graph", "negative declared dim", lambda: optkit.onnx.to_graph(_relu((-5,))), ValueError, "graph input 'x' declares the negative dimension -5"),
    ("to_graph", "unsupported element type", lambda: optkit.onnx.to_graph(_relu((3,), TensorProto.COMPLEX64)), optkit.onnx.UnsupportedOpError, "graph input 'x' has element type COMPLEX64"),
    ("to_graph", "Adam with 5 inputs", lambda: optkit.onnx.to_graph(_adam_node_model(5)), ValueError, "expects 2 + 4*n inputs"),
    ("prepare", "bad device", lambda: optkit.onnx.prepare(_relu(), "TPU"), ValueError, "device must be 'CPU' or 'CUDA[:index]', got 'TPU'"),
    ("prepare", "device not a string", lambda: optkit.onnx.prepare(_relu(), 0), TypeError, "device must be a string"),
    ("prepare", "garbage bytes", _call(optkit.onnx.prepare, b"\x08\x07"), ValueError, "malformed ONNX model bytes"),
    ("run_model", "oversized node output (folded)", lambda: optkit.onnx.run_model(_huge_output_model(), []), optkit.onnx.TensorTooLargeError, "output 'c' has shape (524288, 524288): 2.749e+11 elements of float32"),
    ("run_model", "Python int beyond the input's type", lambda: optkit.onnx.run_model(_relu((3,), TensorProto.INT32), [[2**40, 0, 0]]), ValueError, "the Python value 1099511627776 does not fit"),
    ("prepare", "max_tensor_bytes 0", lambda: optkit.onnx.prepare(_relu(), max_tensor_bytes=0), ValueError, "max_tensor_bytes must be a positive integer, got 0"),
    ("prepare", "max_gradient_depth 17", lambda: optkit.onnx.prepare(_relu(), max_gradient_depth=17), ValueError, "max_gradient_depth must be an integer from 1 to 16"),
    ("load_model", "a directory", _call(optkit.onnx.load_model, "/"), ValueError, "'/' is a directory, not an ONNX model file"),
    ("load_model", "base_dir with a path", _call(optkit.onnx.load_model, "/nonexistent/model.onnx", base_dir="/"), TypeError, "base_dir is for a model given without a path"),
    ("load_model", "base_dir not a directory", lambda: optkit.onnx.load_model(_relu(), base_dir="/nonexistent"), ValueError, "base_dir '/nonexistent' is not a directory"),
    ("default_max_tensor_bytes", "a string device", _call(optkit.onnx.default_max_tensor_bytes, "cpu"), TypeError, "device must be a jax.Device or None, got 'cpu'"),
    ("default_max_tensor_bytes", "an int device", _call(optkit.onnx.default_max_tensor_bytes, 0), TypeError, "device must be a jax.Device or None, got 0"),
    ("default_max_tensor_bytes", "a list of devices", _call(optkit.onnx.default_max_tensor_bytes, [None]), TypeError, "device must be a jax.Device or None"),
    ("run_model", "wrong dtype feed", lambda: optkit.onnx.run_model(_relu(), [np.ones(3)]), TypeError, "graph input 'x' is declared float32, fed float64"),
    ("run_model", "wrong shape feed", lambda: optkit.onnx.run_model(_relu(), [np.ones(4, np.float32)]), ValueError, "graph input 'x' is declared with shape (3), fed shape (4,)"),
    ("run_model", "missing feed", lambda: optkit.onnx.run_model(_relu(), []), ValueError, "graph inputs ['x'] are not fed"),
    ("run_model", "too many feeds", lambda: optkit.onnx.run_model(_relu(), [np.ones(3, np.float32)] * 2), ValueError, "got 2 values but the model has 1 inputs"),
    ("run_model", "unknown feed name", lambda: optkit.onnx.run_model(_relu(), {"q": np.ones(3, np.float32)}), ValueError, "feed 'q' is not a graph input"),
    ("run_model", "string feed", lambda: optkit.onnx.run_model(_relu(), ["abc"]), TypeError, "feed a NumPy or JAX array, got str"),
    ("run_model", "float feed for an int input", lambda: optkit.onnx.run_model(_relu((3,), TensorProto.INT32), [[1.5, 2.0, 3.0]]), TypeError, "cannot feed the Python value"),
    ("run_node", "input count", lambda: optkit.onnx.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [np.ones(2)]), ValueError, "node Add has 2 inputs ['a', 'b'], got 1 values"),
    ("run_node", "unsupported operator", lambda: optkit.onnx.run_node(helper.make_node("FlexAttention", ["a"], ["c"]), [np.ones(2, np.float32)]), optkit.onnx.UnsupportedOpError, "unsupported operator FlexAttention"),
    ("run_node", "Momentum without mode", lambda: optkit.onnx.run_node(helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X2", "V2"], domain="ai.onnx.preview.training", alpha=0.9, beta=1.0, norm_coefficient=0.0), [np.float32(0.1), np.int64(0), *[np.ones(2, np.float32)] * 3]), ValueError, "'mode' is missing"),
    ("make_training_model", "unknown loss", lambda: optkit.onnx.make_training_model(_gemm_model(), loss="hinge"), ValueError, "loss must be one of"),
    ("make_training_model", "unknown optimizer", lambda: optkit.onnx.make_training_model(_gemm_model(), optimizer="sgd"), ValueError, "optimizer must be one of"),
    ("make_training_model", "trainable not an initializer", lambda: optkit.onnx.make_training_model(_gemm_model(), trainable=["x"]), ValueError, "'x' is not an initializer"),
    ("make_training_model", "unknown output", lambda: optkit.onnx.make_training_model(_gemm_model(), output="z"), ValueError, "output 'z' is not a graph output"),
    ("to_jax", "garbage bytes", lambda: optkit.onnx.to_jax(b"garbage"), ValueError, "malformed ONNX model bytes"),
    ("to_jax", "stacked_params not a bool", lambda: optkit.onnx.to_jax(_gemm_model(), stacked_params="yes"), TypeError, "stacked_params must be True, False or None"),
    ("to_jax", "stacked_params without a scan", lambda: optkit.onnx.to_jax(_gemm_model(), scan_layers=False, stacked_params=True), ValueError, "needs scan_layers=True"),
    ("to_jax", "trainable not an initializer", lambda: optkit.onnx.to_jax(_gemm_model(), trainable=["x"]), ValueError, "trainable name 'x' is not an initializer"),
    ("to_jax", "mistyped trainable name", lambda: optkit.onnx.to_jax(_gemm_model(), trainable=["Wx"]), ValueError, "is not an initializer of the model; did you mean 'W'?"),
    ("to_jax", "unknown output", lambda: optkit.onnx.to_jax(_gemm_model(), outputs="z"), ValueError, "outputs ['z'] are neither graph outputs nor values"),
    ("to_jax", "params missing", lambda: optkit.onnx.to_jax(_gemm_model())[0]({}, np.ones((1, 3), np.float32)), ValueError, "params lacks ['W', 'b']"),
    ("to_jax", "input dtype", lambda: (lambda f, p: f(p, np.ones((1, 3))))(*optkit.onnx.to_jax(_gemm_model())), TypeError, "'x' is declared float32, fed float64"),
    ("with_initializers", "unknown name", lambda: optkit.onnx.with_initializers(_gemm_model(), {"x": np.ones(2)}), ValueError, "'x' is not an initializer"),
    ("with_initializers", "wrong shape", lambda: optkit.onnx.with_initializers(_gemm_model(), {"W": np.ones(2)}), ValueError, "has shape [3, 2]"),
    ("with_initializers", "not a mapping", lambda: optkit.onnx.with_initializers(_gemm_model(), [("W", 1)]), TypeError, "values must map initializer names to arrays, got list"),
    ("adapter_input_names", "lora not a LoRA", lambda: optkit.onnx.adapter_input_names(_gemm_model(), 4), TypeError, "lora must be an optkit.onnx.LoRA"),
    ("adapter_input_names", "targets match nothing", lambda: optkit.onnx.adapter_input_names(_gemm_model(), optkit.onnx.LoRA(2, targets=["*q_proj*"])), ValueError, "match no weight"),
    ("adapter_input_names", "model not a model", lambda: optkit.onnx.adapter_input_names(3, optkit.onnx.LoRA(2)), TypeError, "model must be an onnx.ModelProto"),
    ("with_adapter_inputs", "lora not a LoRA", lambda: optkit.onnx.with_adapter_inputs(_gemm_model(), {"rank": 2}), TypeError, "lora must be an optkit.onnx.LoRA"),
    ("with_adapter_inputs", "optkit's LoRA nodes", lambda: optkit.onnx.with_adapter_inputs(optkit.onnx.to_jax(_gemm_model(), lora=optkit.onnx.LoRA(1))[0].model, optkit.onnx.LoRA(1)), ValueError, "holds optkit's LoRA nodes"),
    ("with_adapter_inputs", "targets match nothing", lambda: optkit.onnx.with_adapter_inputs(_gemm_model(), optkit.onnx.LoRA(2, targets=["*v_proj*"])), ValueError, "match no weight"),
    ("export_adapters", "params not adapters", lambda: optkit.onnx.export_adapters(_gemm_model(), {"W": np.ones((3, 2))}, optkit.onnx.LoRA(1), "a.onnx_adapter"), ValueError, "which are not adapters"),
    ("export_adapters", "an adapter without its pair", lambda: optkit.onnx.export_adapters(_gemm_model(), {"W.lora_A": np.ones((3, 1))}, optkit.onnx.LoRA(1), "a.onnx_adapter"), ValueError, "needs both 'W.lora_A' and 'W.lora_B'"),
    ("export_adapters", "another rank", lambda: optkit.onnx.export_adapters(_gemm_model(), {"W.lora_A": np.ones((3, 1)), "W.lora_B": np.ones((1, 2))}, optkit.onnx.LoRA(2), "a.onnx_adapter"), ValueError, "rank 2 on 'W' needs (3, 2)"),
    ("export_adapters", "params not a mapping", lambda: optkit.onnx.export_adapters(_gemm_model(), [1], optkit.onnx.LoRA(1), "a.onnx_adapter"), TypeError, "params must map initializer names to arrays"),
    ("export_adapters", "no such directory", lambda: optkit.onnx.export_adapters(_gemm_model(), {}, optkit.onnx.LoRA(1), "/nonexistent-dir/a.onnx_adapter"), FileNotFoundError, "its directory does not exist"),
    ("with_adapter_inputs_folder", "not a GenAI folder", lambda: optkit.onnx.with_adapter_inputs_folder("/nonexistent-dir", "/nonexistent-out", optkit.onnx.LoRA(1)), FileNotFoundError, "has no genai_config.json"),
    ("with_adapter_inputs_folder", "lora not a LoRA", lambda: optkit.onnx.with_adapter_inputs_folder(".", "out", None), TypeError, "targets), got NoneType"),
    ("with_adapter_inputs_folder", "out is the folder", lambda: optkit.onnx.with_adapter_inputs_folder(ONNX_TESTS / "models" / "genai" / "llama_fp32", ONNX_TESTS / "models" / "genai" / "llama_fp32", optkit.onnx.LoRA(1)), ValueError, "another folder"),
    ("Backend", "run_model garbage", lambda: optkit.onnx.Backend.run_model(b"garbage", []), ValueError, "malformed ONNX model bytes"),
    ("Backend", "prepare on a bad device", lambda: optkit.onnx.Backend.prepare(_relu(), "CUDA:x"), ValueError, "device must be 'CPU' or 'CUDA[:index]', got 'CUDA:x'"),
    ("Backend", "run_node kwargs", lambda: optkit.onnx.Backend.prepare(_relu()).run([np.ones(3, np.float32)], bogus=1), TypeError, "unexpected keyword arguments ['bogus']"),
    ("register_op", "an operator optkit runs", lambda: optkit.onnx.register_op("", "Relu", np.tanh), ValueError, "ai.onnx::Relu is one of optkit's own operators"),
    ("register_op", "since_version 0", lambda: optkit.onnx.register_op("com.x", "Y", np.tanh, since_version=0), ValueError, "since_version must be an integer >= 1, got 0"),
    ("register_op", "fn not callable", lambda: optkit.onnx.register_op("com.x", "Y", 3), TypeError, "fn must be callable, got int"),
    ("register_op", "empty op_type", lambda: optkit.onnx.register_op("com.x", "", np.tanh), ValueError, "op_type a non-empty string"),
    ("register_op", "negative static input", lambda: optkit.onnx.register_op("com.x", "Y", np.tanh, static_inputs=(-1,)), ValueError, "static_inputs must be input positions"),
    ("unregister_op", "Relu", lambda: optkit.onnx.unregister_op("", "Relu"), ValueError, "ai.onnx::Relu is one of optkit's own operators"),
    ("unregister_op", "ai.onnx Gemm", lambda: optkit.onnx.unregister_op("ai.onnx", "Gemm"), ValueError, "ai.onnx::Gemm is one of optkit's own operators"),
    ("unregister_op", "training Adam", lambda: optkit.onnx.unregister_op("ai.onnx.preview.training", "Adam"), ValueError, "ai.onnx.preview.training::Adam is one of optkit's own operators"),
    ("state_sharding", "mesh not a Mesh", lambda: optkit.state_sharding({"w": np.ones(8)}, "data"), TypeError, "mesh must be a jax.sharding.Mesh"),
    ("state_sharding", "axis not in the mesh", lambda: optkit.state_sharding({"w": np.ones(8)}, jax.make_mesh((1,), ("data",)), axis="model"), ValueError, "axis 'model' is not an axis of the mesh; its axes are ['data']"),
    ("state_sharding", "mesh given as devices", lambda: optkit.state_sharding({"w": np.ones(8)}, jax.devices()), TypeError, "mesh must be a jax.sharding.Mesh (jax.make_mesh(...)), got list"),
    ("shard_state", "mesh not a Mesh", lambda: optkit.shard_state({"w": np.ones(8)}, None), TypeError, "mesh must be a jax.sharding.Mesh"),
    ("shard_state", "axis not in the mesh", lambda: optkit.shard_state({"w": np.ones(8)}, jax.make_mesh((1,), ("data",)), axis="x"), ValueError, "axis 'x' is not an axis of the mesh"),
    ("shard_state", "mesh given as a tuple", lambda: optkit.shard_state({"w": np.ones(8)}, (1,)), TypeError, "got tuple"),
    ("fsdp_rule", "mesh not a Mesh", lambda: optkit.fsdp_rule("data"), TypeError, "mesh must be a jax.sharding.Mesh"),
    ("fsdp_rule", "axis not in the mesh", lambda: optkit.fsdp_rule(jax.make_mesh((1,), ("data",)), axis="fsdp"), ValueError, "axis 'fsdp' is not an axis of the mesh; its axes are ['data']"),
    ("fsdp_rule", "mesh given as devices", lambda: optkit.fsdp_rule(jax.devices()), TypeError, "got list"),
    ("next_feeds", "not a training graph", lambda: optkit.onnx.next_feeds(_gemm_model(), [np.ones(2)]), ValueError, "not a training graph of make_training_model"),
    ("next_feeds", "too few outputs", lambda: optkit.onnx.next_feeds(optkit.onnx.make_training_model(_gemm_model(), loss="mean_squared_error"), [np.ones(2)]), ValueError, "outputs has 1 values; the training graph has 7 outputs"),
    ("next_feeds", "a mapping without a name", lambda: optkit.onnx.next_feeds(optkit.onnx.make_training_model(_gemm_model(), loss="mean_squared_error"), {"loss": 1.0}), ValueError, "outputs lacks the graph outputs"),
]:
    row(fn, case, thunk, exc, words)


def _is_update_case(thunk):
    return isinstance(thunk, _Update)


@pytest.mark.parametrize("function, case, thunk, exc, words",
                         TABLE, ids=[f"{r[0]}: {r[1]}" for r in TABLE])
def test_bad_input_gets_the_documented_error(function, case, thunk, exc, words):
    transforms = [lambda f: f, jax.jit] if _is_update_case(thunk) else [None]
    for transform in transforms:
        with pytest.raises(exc) as info:
            thunk(transform) if transform is not None else thunk()
        assert words in str(info.value), f"{function} / {case}: {info.value}"
        assert info.type is exc, f"{function} / {case}: {info.type.__name__}, not {exc.__name__}"


PUBLIC = (
    [n for n in optkit.__all__ if inspect.isfunction(getattr(optkit, n)) and n != "t5x_standard_logical_factor_rules"]
    + ["Graph", "FlatParams"]
    + [n for n in optkit.ops.__all__ if inspect.isfunction(getattr(optkit.ops, n))]
    + [n for n in optkit.onnx.__all__ if inspect.isfunction(getattr(optkit.onnx, n))
       and n not in ("supported_ops", "compilation_cache")]
    + ["Backend"]
)


def test_every_public_function_is_audited():
    """The table covers every public function (``supported_ops``, ``compilation_cache`` and
    ``t5x_standard_logical_factor_rules`` take no input; the environment ``compilation_cache`` reads is tested in
    tests/onnx/api/test_compilation_cache.py)."""
    counts = collections.Counter(r[0] for r in TABLE)
    missing = [name for name in PUBLIC if counts[name] == 0]
    assert not missing, f"no bad inputs in the table for {missing}"
    assert all(counts[name] >= 3 for name in PUBLIC), counts


def test_traced_hyperparameters_are_not_range_checked():
    """Documented: under optax.inject_hyperparams and jax.jit, a traced b1 = 1.5 is not checked."""
    tx = optax.inject_hyperparams(optkit.adam)(learning_rate=0.1, b1=0.9)
    state = tx.init(P)
    state.hyperparams["b1"] = jnp.asarray(1.5)
    updates, _ = jax.jit(tx.update)(P, state, P)  # no error: the value is a tracer here
    assert all(u.shape == p.shape for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(P)))


# ---------------------------------------------------------------------------
# Properties: random hyperparameters and trees


def _any_number():
    return st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=32),
        st.sampled_from([0.0, -0.0, 1.0, 1 - 1e-8, 1e-30, -1e-30, 2.0, -1.0]),
        st.integers(-3, 3), st.booleans(), st.none(), st.just("0.1"), st.just(jnp.ones(2)),
    )


FACTORY_ARGS = {
    optkit.adagrad: ["learning_rate", "decay_factor", "norm_coefficient", "eps", "initial_accumulator_value"],
    optkit.adam: ["learning_rate", "b1", "b2", "eps", "norm_coefficient", "norm_coefficient_post"],
    optkit.momentum: ["learning_rate", "alpha", "beta", "norm_coefficient"],
    optkit.adafactor: ["learning_rate", "b1", "decay_rate", "eps1", "eps2", "clipping_threshold",
                       "weight_decay_rate"],
}


@settings(max_examples=60)
@given(factory=st.sampled_from(list(FACTORY_ARGS)), data=st.data())
def test_random_hyperparameters_raise_only_documented_errors(factory, data):
    names = FACTORY_ARGS[factory]
    kwargs = {n: data.draw(_any_number(), label=n) for n in data.draw(st.sets(st.sampled_from(names), min_size=1))}
    if "learning_rate" not in kwargs and factory is not optkit.adafactor:
        kwargs["learning_rate"] = 0.1
    try:
        tx = factory(**kwargs)
    except (TypeError, ValueError) as err:
        named = [n for n in kwargs if n in str(err)]
        assert named, f"{err!r} names none of {list(kwargs)}"
        return
    params = {"w": jnp.ones((2, 3)), "b": jnp.full(3, 0.5)}
    state = tx.init(params)
    updates, _ = tx.update(jax.tree.map(lambda p: p * 0.3, params), state, params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)


def _trees():
    leaf = st.sampled_from([jnp.ones(3), jnp.ones((2, 2)), jnp.ones(3, jnp.int32), 1.0, 1, None, "x",
                            jnp.ones(3, jnp.bfloat16), np.ones(2)])
    return st.recursive(leaf, lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from("abc"), children, max_size=3),
        st.tuples(children, children)), max_leaves=5)


@settings(max_examples=40)
@given(name=st.sampled_from(["adagrad", "adam", "momentum", "adafactor"]), grads=_trees(), params=_trees())
def test_random_trees_raise_only_documented_errors(name, grads, params):
    tx = ALIASES[name]()
    reference = {"a": jnp.ones(3), "b": [jnp.ones((2, 2))]}
    state = tx.init(reference)
    try:
        tx.update(grads, state, params)
    except (TypeError, ValueError):
        pass
    try:
        tx.init(params)
    except (TypeError, ValueError):
        pass


def _values(draw, n, lo, hi):
    """Magnitudes 10^[lo, hi] with random signs, and some zeros."""
    exps = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    signs = draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0, 1.0]), min_size=n, max_size=n))
    mant = draw(st.lists(st.floats(1.0, 9.9), min_size=n, max_size=n))
    return np.array([s * m * 10.0**e for s, m, e in zip(signs, mant, exps)])


def _representable(*arrays):
    return all(np.all(np.isfinite(a)) and np.all(np.abs(a) < F32_MAX / 4) for a in arrays)


def _no_underflowing_square(*arrays):
    return all(not np.any((a != 0) & (np.abs(a) < np.sqrt(F32_TINY) * 10)) for a in arrays)


@settings(max_examples=40)
@given(which=st.sampled_from(["adagrad", "adam", "momentum"]), data=st.data())
def test_finite_wherever_the_spec_is_finite(which, data):
    """Random hyperparameters (edges included: 0, 1 - 1e-8) and values over 10^[-12, 12]:
    wherever the float64 SPEC formula and its state are finite in float32, so is optkit's
    float32 result (SPEC 1, 2, 4; SPEC 1 Decision (0/0))."""
    n, steps = 5, 3
    x0 = _values(data.draw, n, -12, 12)
    grads = [_values(data.draw, n, -12, 12) for _ in range(steps)]
    lr = data.draw(st.sampled_from([0.0, 1e-8, 0.1, 10.0]))
    nc = data.draw(st.sampled_from([0.0, 1e-3, 1.0]))
    x, states, squares = x0.copy(), [], []
    with np.errstate(all="ignore"):
        if which == "adagrad":
            eps = data.draw(st.sampled_from([0.0, 1e-30, 1e-8, 1e-6, 1.0]))
            decay = data.draw(st.sampled_from([0.0, 1e-3, 1e3]))
            tx = optkit.adagrad(lr, decay_factor=decay, norm_coefficient=nc, eps=eps)
            h = np.zeros(n)
            for t, g in enumerate(grads):
                squares.append(nc * x + g)
                x, h = oracles.adagrad(lr, t, x, g, h, decay_factor=decay, epsilon=eps, norm_coefficient=nc)
                states.append(h)
        elif which == "adam":
            b1 = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1 - 1e-8]))
            b2 = data.draw(st.sampled_from([0.0, 0.999, 1 - 1e-8]))
            eps = data.draw(st.sampled_from([0.0, 1e-8, 1.0]))
            tx = optkit.adam(lr, b1, b2, eps, norm_coefficient=nc)
            m, v = np.zeros(n), np.zeros(n)
            for t, g in enumerate(grads):
                squares.append(np.sqrt(1 - b2) * (nc * x + g))
                x, m, v = oracles.onnx_adam(lr, t + 1, x, g, m, v, alpha=b1, beta=b2, epsilon=eps,
                                            norm_coefficient=nc, norm_coefficient_post=0.0)
                # the update before the learning rate is itself a float32 value
                states += [m, v, (x - x0) / max(lr, 1e-30)]
        else:
            alpha = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.5]))
            beta = data.draw(st.sampled_from([0.0, 0.1, 1.0]))
            nesterov = data.draw(st.booleans())
            tx = optkit.momentum(lr, alpha, beta, nesterov=nesterov, norm_coefficient=nc)
            v = np.zeros(n)
            for t, g in enumerate(grads):
                x, v = oracles.onnx_momentum(lr, t, x, g, v, alpha=alpha, beta=beta,
                                             mode="nesterov" if nesterov else "standard", norm_coefficient=nc)
                states.append(v)
    spec_finite = _representable(x, *states) and _no_underflowing_square(*squares)
    p = jnp.asarray(x0, jnp.float32)
    state = tx.init(p)
    for g in grads:
        u, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
        p = optax.apply_updates(p, u)
    if spec_finite:
        assert np.all(np.isfinite(np.asarray(p))), (x, np.asarray(p))
