"""optkit/_src/momentum.py: optkit.momentum over 120 steps and ops.onnx_momentum, against SPEC 4's NumPy
transcription (tests/oracles.py) in float32 and float64, jitted and not; and optax.sgd where they coincide."""

import chex
import jax
import numpy as np
import optax
from absl.testing import parameterized

import optkit
from tests import oracles
from tests.trajectories import MOMENTUM_CONFIGS, _random_tensors, _run_optkit, check_spec_operator, check_trajectory
from tests.trajectories import SHAPES_OPS as SHAPES


class MomentumTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(config=MOMENTUM_CONFIGS, dtype=[np.float32, np.float64])
    def test_momentum(self, config, dtype):
        lr = 0.05
        cfg = dict(alpha=0.9, beta=1.0, nesterov=False, norm_coefficient=0.0) | config

        def leaf(x, g, moments, t):
            x, v = oracles.onnx_momentum(
                lr, t, x, g, moments[0], alpha=cfg["alpha"], beta=cfg["beta"],
                mode="nesterov" if cfg["nesterov"] else "standard", norm_coefficient=cfg["norm_coefficient"],
            )
            return x, (v,)

        check_trajectory(lambda: optkit.momentum(lr, **config), leaf, lambda p: (np.zeros_like(p),), ["trace"],
                         dtype, self.variant)

    @chex.variants(with_jit=True, without_jit=True)
    def test_momentum_equals_optax_sgd(self):
        with jax.enable_x64(True):
            for nesterov in (False, True):
                got, _ = _run_optkit(optkit.momentum(0.05, 0.9, nesterov=nesterov), np.float64, self.variant, 60)
                want, _ = _run_optkit(optax.sgd(0.05, momentum=0.9, nesterov=nesterov), np.float64,
                                      self.variant, 60)
                chex.assert_trees_all_close(got, want, rtol=1e-12, atol=1e-13)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(T=[0, 1, 4], mode=["standard", "nesterov"])
    def test_onnx_momentum_float64(self, T, mode):
        rng = np.random.default_rng(30 + T)
        X, G, V = (_random_tensors(rng, SHAPES, np.float64) for _ in range(3))
        attrs = dict(alpha=0.9, beta=0.3, mode=mode, norm_coefficient=0.01)
        check_spec_operator(self.variant, lambda R, T, X, G, V: optkit.ops.onnx_momentum(R, T, X, G, V, **attrs),
                            lambda R, T, x, g, v: oracles.onnx_momentum(float(R), int(T), x, g, v, **attrs),
                            [X, G, V], (np.float64(0.1), np.int64(T)))
