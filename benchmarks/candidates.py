"""The candidates a benchmark case times: an optimizer by name, on a parameter tree, per leaf or as FlatParams;
steppers that run its jitted donated step (JAX) or PyTorch's fused optimizer on tensors of the same shapes."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optkit
from benchmarks.trees import flat_abstract, make_tree, nbytes

try:
    # PyTorch, when present, must start its thread pool before JAX's runtime does: imported
    # after JAX, its many-tensor steps ran 25-50x slower here (thread contention).
    import torch

    torch.ones(1).add_(1)
except ImportError:
    torch = None

__all__ = ["BYTES_MODEL", "optimizer", "Spec", "JaxStepper", "TorchStepper", "torch", "torch_available",
           "make_stepper"]

# Bytes per parameter a step must move at least (see benchmarks/run.py's notes).
BYTES_MODEL = {"adam": 28, "adagrad": 20, "adafactor": 12}


def _rho(count):
    """The Adafactor paper's relative step size as an Optax schedule (as benchmarks/adafactor.py)."""
    return jnp.minimum(1e-2, 1 / jnp.sqrt(count + 1.0))


def optimizer(name: str) -> optax.GradientTransformation:
    if name == "optkit.adam":
        return optkit.adam(1e-3)
    if name == "optax.adam":
        return optax.adam(1e-3)
    if name == "optkit.adagrad":
        return optkit.adagrad(1e-2)
    if name == "optax.adagrad":
        return optax.adagrad(1e-2)
    if name == "optkit.adafactor":
        # The configuration of optax.adafactor's: two largest axes, factored from 128.
        return optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128)
    if name == "optkit.adafactor paper":
        return optkit.adafactor()  # the last two axes: per leading index for the statistics, RMS over the leaf
    if name == "optkit.adafactor layers as batch":
        # Scanned layers: each [L, n, m] leaf's leading axis a batch axis (statistics, RMS and clipping per layer).
        return optkit.adafactor(factor_map=[(".*", ("batch", "row", "column"))])
    if name == "optax.adafactor":
        return optax.adafactor(learning_rate=_rho, min_dim_size_to_factor=128)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclass
class Spec:
    """One candidate of a case: an optimizer on a parameter tree, per leaf or as FlatParams."""

    label: str
    optimizer: str
    abstract: object  # tree of jax.ShapeDtypeStruct
    flat: bool = False
    torch: bool = False
    memory: bool = False  # measure peak RSS in a fresh process
    isolated: bool = False  # time in a process of its own (its compilation needs gigabytes)

    def to_json(self) -> dict:
        leaves = jax.tree.leaves(self.abstract)
        return {"label": self.label, "optimizer": self.optimizer, "flat": self.flat, "torch": self.torch,
                "shapes": [list(x.shape) for x in leaves]}

    @classmethod
    def from_json(cls, data: dict) -> Spec:
        abstract = {f"layer{i:05d}": jax.ShapeDtypeStruct(tuple(s), jnp.float32) for i, s in enumerate(data["shapes"])}
        return cls(data["label"], data["optimizer"], abstract, flat=data["flat"], torch=data["torch"])


class JaxStepper:
    """A jitted, donated step on the candidate's own parameters and state."""

    def __init__(self, spec: Spec):
        tx = optimizer(spec.optimizer)

        def step(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        self.jitted = jax.jit(step, donate_argnums=(0, 1))
        abstract = flat_abstract(spec.abstract) if spec.flat else spec.abstract
        self.params = make_tree(abstract, 0.0, 0.01)
        self.grads = make_tree(abstract, 0.5, 1.0)
        # Eager: a jitted init of 10000 leaves would be one more program of 20000 outputs to compile.
        self.state = tx.init(self.params)
        self.first_call_s = None

    def bytes(self) -> dict[str, int]:
        return {"params": nbytes(self.params), "grads": nbytes(self.grads), "state": nbytes(self.state)}

    def compiled(self):
        return self.jitted.lower(self.params, self.state, self.grads).compile()

    def __call__(self):
        self.params, self.state = self.jitted(self.params, self.state, self.grads)
        return self.params

    def reallocate(self):
        """Move parameters, state and gradients to new buffers; returns the old ones (free them after).

        A donated step runs in the same buffers for the whole run, and the same
        program ran up to 1.4x faster or slower depending on the memory those
        buffers landed in (optax.adam on 8192x4096: 14.9 to 21.4 ms in six
        allocations in one process). Timing over several allocations per
        candidate keeps that luck out of the ratios.
        """
        if len(jax.tree.leaves(self.grads)) > _REALLOCATE_MAX_LEAVES:
            return None
        old = (self.params, self.state, self.grads)
        self.params, self.state, self.grads = (jax.tree.map(lambda x: jnp.array(x, copy=True), t) for t in old)
        jax.block_until_ready((self.params, self.state, self.grads))
        return old


# Trees with more leaves keep their buffers (copying 10000 leaves one by one takes longer than the run).
_REALLOCATE_MAX_LEAVES = 1000


class TorchStepper:
    """``torch.optim.Adam``/``Adagrad`` with ``fused=True`` on tensors of the same shapes."""

    def __init__(self, spec: Spec):
        shapes = [tuple(x.shape) for x in jax.tree.leaves(spec.abstract)]
        self.params = []
        for k, shape in enumerate(shapes):
            n = int(np.prod(shape, dtype=np.int64))
            p = torch.nn.Parameter(0.01 * torch.sin(torch.arange(n, dtype=torch.float32) * 0.7071 + k).reshape(shape))
            p.grad = torch.sin(torch.arange(n, dtype=torch.float32) * 0.7071 + k + 0.5).reshape(shape)
            self.params.append(p)
        cls = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}[spec.optimizer.split(".")[1]]
        self.opt = cls(self.params, lr=1e-3, fused=True)
        self.first_call_s = None

    def __call__(self):
        self.opt.step()


def torch_available() -> bool:
    return torch is not None


def make_stepper(spec: Spec):
    return TorchStepper(spec) if spec.torch else JaxStepper(spec)
