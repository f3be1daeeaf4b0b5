# pyright: strict, reportMissingTypeStubs=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false, reportUnknownLambdaType=false
"""User code as the README writes it, type-checked in pyright's strict mode (tests/project/test_typing.py).

Not a test module: pyright reads it, nothing runs it. The rules switched off above report the
partially unknown types inside JAX and Optax themselves (``jax.Device``, Optax has no stubs), not
optkit's; every other strict check is on, assignability included: a FlatParams must be accepted
where Optax expects parameters and updates.
"""

import functools

import jax
import jax.numpy as jnp
import optax

import optkit


def loss(params: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
    return jnp.sum((batch @ params["w"] + params["b"]) ** 2)


params: dict[str, jax.Array] = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
flat = optkit.FlatParams.from_tree(params)
tx = optkit.adam(1e-3)
state = tx.init(flat)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(flat: optkit.FlatParams, state: optax.OptState, batch: jax.Array) -> tuple[optax.Params, optax.OptState]:
    grads = jax.grad(lambda f: loss(f.to_tree(), batch))(flat)
    updates, state = tx.update(grads, state, flat)
    return optax.apply_updates(flat, updates), state


new_flat, state = train_step(flat, state, jnp.ones((4, 3)))
buffer: jax.Array = flat["float32"]
names: list[str] = list(flat)

tree_state = optkit.adafactor().init(params)
tree_updates, tree_state = optkit.adafactor().update(params, tree_state, params)
new_params = optax.apply_updates(params, tree_updates)
