"""Recurrent layers: RNN, GRU and LSTM, each a ``lax.scan`` over the sequence.

Every attribute ONNX defines is implemented: ``direction`` (forward, reverse,
bidirectional), ``layout`` (0: sequence first, 1: batch first; from version
14), ``activations`` with ``activation_alpha``/``activation_beta``, ``clip``,
``hidden_size``, GRU's ``linear_before_reset`` and LSTM's ``input_forget``;
and every optional input: bias, ``sequence_lens``, initial states, LSTM's
peepholes. With ``sequence_lens``, a batch entry's state stops at its length,
its outputs beyond the length are 0, and the reverse direction starts at the
entry's last valid step (as ONNX Runtime runs it).

Gate layouts, as ONNX orders them in ``W``, ``R`` and ``B``: RNN one gate,
GRU ``z, r, h``, LSTM ``i, o, f, c`` (peepholes ``i, o, f``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from optkit.onnx._ops._common import aligned, sharded_like
from optkit.onnx._ops._registry import Family, NodeContext

OPS = Family("recurrent")

# name -> (function of x, alpha, beta; default alpha; default beta); alpha/beta None: not used
_ACTIVATIONS = {
    "Relu": (lambda x, a, b: jnp.maximum(x, 0), None, None),
    "Tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    "Sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), None, None),
    "Affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "LeakyRelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "ThresholdedRelu": (lambda x, a, b: jnp.where(x > a, x, 0), 1.0, None),
    "ScaledTanh": (lambda x, a, b: a * jnp.tanh(b * x), 1.0, 1.0),
    "HardSigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    "Elu": (lambda x, a, b: jnp.where(x >= 0, x, a * jnp.expm1(jnp.minimum(x, 0))), 1.0, None),
    "Softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "Softplus": (lambda x, a, b: jnp.logaddexp(x, 0), None, None),
}


def _activations(ctx: NodeContext, defaults: list[str], directions: int):
    """The activation functions per direction, with ``activation_alpha``/``beta`` consumed in order by
    those that take them (as ONNX Runtime reads them)."""
    names = ctx.attrs.get("activations") or defaults * directions
    if directions == 1 and names == defaults * 2:
        names = defaults  # RNN's schema default names two (Tanh, Tanh) whatever the direction
    if len(names) != len(defaults) * directions:
        raise ctx.error(f"activations {names} must name {len(defaults)} functions per direction "
                        f"({len(defaults) * directions} in all)")
    alphas = list(ctx.attrs.get("activation_alpha") or [])
    betas = list(ctx.attrs.get("activation_beta") or [])
    fns = []
    for name in names:
        match = {k.lower(): k for k in _ACTIVATIONS}.get(str(name).lower())
        if match is None:
            raise ctx.unsupported(f"activation {name!r} is not one ONNX defines ({', '.join(_ACTIVATIONS)})")
        fn, alpha_default, beta_default = _ACTIVATIONS[match]
        alpha = (alphas.pop(0) if alphas else alpha_default) if alpha_default is not None else None
        beta = (betas.pop(0) if betas else beta_default) if beta_default is not None else None
        fns.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    return [fns[i * len(defaults):(i + 1) * len(defaults)] for i in range(directions)]


def _reverse_valid(x, lengths):
    """``x`` [T, B, ...] with each batch entry's first ``lengths[b]`` steps reversed (the rest kept)."""
    steps = jnp.arange(jnp.shape(x)[0])[:, None]
    index = jnp.where(steps < lengths[None, :], lengths[None, :] - 1 - steps, steps)
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (jnp.ndim(x) - 2)), axis=0)


def _cell(kind, acts, p, x_proj, h, c, rb, _clip, linear_before_reset, input_forget):
    """One step of one direction: the new hidden (and cell) state. ``x_proj`` = X W^T + Wb."""
    f, g = acts[0], acts[-1]
    h_proj = h @ p["R"].T
    if kind == "RNN":
        return f(_clip(x_proj + h_proj + rb)), None
    if kind == "GRU":
        xz, xr, xh = jnp.split(x_proj, 3, axis=-1)
        hz, hr, hh = jnp.split(h_proj, 3, axis=-1)
        rbz, rbr, rbh = jnp.split(rb, 3, axis=-1)
        z = f(_clip(xz + hz + rbz))
        r = f(_clip(xr + hr + rbr))
        if linear_before_reset:
            cand = g(_clip(xh + r * (hh + rbh)))
        else:
            rh = jnp.split(p["R"], 3, axis=0)[2]
            cand = g(_clip(xh + (r * h) @ rh.T + rbh))
        return (1 - z) * cand + z * h, None
    hfn = acts[2]
    xi, xo, xf, xc = jnp.split(x_proj + h_proj + rb, 4, axis=-1)
    pi, po, pf = p["P"]
    i = f(_clip(xi + pi * c))
    fg = 1 - i if input_forget else f(_clip(xf + pf * c))
    c_new = fg * c + i * g(_clip(xc))
    o = f(_clip(xo + po * c_new))
    return o * hfn(c_new), c_new


@OPS.op("RNN", 7, 14, 22, params=("RNN", 1, ["Tanh"], 2))
@OPS.op("GRU", 7, 14, 22, params=("GRU", 3, ["Sigmoid", "Tanh"], 2))
@OPS.op("LSTM", 7, 14, 22, params=("LSTM", 4, ["Sigmoid", "Tanh", "Tanh"], 3))
def _recurrent(ctx, kind: str, gates: int, defaults: list[str], outputs: int):
    direction = ctx.attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.error(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    directions = 2 if direction == "bidirectional" else 1
    layout = int(ctx.attrs.get("layout", 0)) if ctx.version >= 14 else 0
    if layout not in (0, 1):
        raise ctx.error(f"layout must be 0 or 1, got {layout}")
    clip = ctx.attrs.get("clip")
    if clip is not None and not clip > 0:
        raise ctx.error(f"clip must be positive, got {clip}")
    acts = _activations(ctx, defaults, directions)
    linear_before_reset = bool(ctx.attrs.get("linear_before_reset", 0))
    input_forget = bool(ctx.attrs.get("input_forget", 0))

    def cell(d, p, x_proj, h, c, rb):
        return _cell(kind, acts[d], p, x_proj, h, c, rb, lambda v: v if clip is None else jnp.clip(v, -clip, clip),
                     linear_before_reset, input_forget)

    def recurrent(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, peepholes=None):
        if jnp.ndim(x) != 3:
            raise ctx.error(f"X must have rank 3, got shape {jnp.shape(x)}")
        if layout == 1:
            x = jnp.swapaxes(x, 0, 1)
        steps, batch, features = jnp.shape(x)
        hidden = ctx.attrs.get("hidden_size") or jnp.shape(r)[-1]
        want = {"W": (directions, gates * hidden, features), "R": (directions, gates * hidden, hidden),
                "B": (directions, 2 * gates * hidden), "initial_h": (directions, batch, hidden),
                "initial_c": (directions, batch, hidden), "P": (directions, 3 * hidden),
                "sequence_lens": (batch,)}
        given = {"W": w, "R": r, "B": b, "initial_h": initial_h, "initial_c": initial_c, "P": peepholes,
                 "sequence_lens": sequence_lens}
        for name, value in given.items():
            if value is not None and jnp.shape(value) != want[name]:
                raise ctx.error(f"{name} must have shape {want[name]}, got {jnp.shape(value)}")
        dtype = jnp.result_type(x)
        ctx.check_size((steps, directions, batch, hidden), dtype, "the output Y")
        zeros = jnp.zeros((directions, batch, hidden), dtype)
        h0 = zeros if initial_h is None else initial_h
        c0 = zeros if initial_c is None else initial_c
        bias = jnp.zeros((directions, 2 * gates * hidden), dtype) if b is None else b
        lengths = (jnp.full((batch,), steps, jnp.int32) if sequence_lens is None
                   else jnp.clip(jnp.asarray(sequence_lens).astype(jnp.int32), 0, steps))
        ys, hs, cs = [], [], []
        for d in range(directions):
            reverse = direction == "reverse" or d == 1
            p = {"R": r[d], "P": None if kind != "LSTM" else (
                jnp.split(peepholes[d], 3) if peepholes is not None else (jnp.zeros((hidden,), dtype),) * 3)}
            xd = _reverse_valid(x, lengths) if reverse else x
            wb, rb = jnp.split(bias[d], 2)
            x_proj = xd @ w[d].T + wb  # all steps at once, outside the loop

            def step(carry, inputs, d=d, p=p, rb=rb):
                h, c = carry
                xp, t = inputs
                h_new, c_new = cell(d, p, xp, h, c, rb)
                valid = (t < lengths)[:, None]
                h_new = jnp.where(valid, h_new, h)
                c_new = c if c_new is None else jnp.where(valid, c_new, c)
                return (sharded_like(h_new, h), sharded_like(c_new, c)), jnp.where(valid, h_new, 0)

            # (the initial state split as the batch is, under explicit mesh axes)
            h_init, c_init = aligned((x_proj[0], h0[d], c0[d]), skip=(1,))[1:]
            (h_last, c_last), y = lax.scan(step, (h_init, c_init), (x_proj, jnp.arange(steps)))
            ys.append(_reverse_valid(y, lengths) if reverse else y)
            hs.append(h_last)
            cs.append(c_last)
        y = jnp.stack(ys, axis=1).astype(dtype)  # [T, D, B, H]
        y_h, y_c = jnp.stack(hs).astype(dtype), jnp.stack(cs).astype(dtype)
        if layout == 1:
            y, y_h, y_c = jnp.transpose(y, (2, 0, 1, 3)), jnp.swapaxes(y_h, 0, 1), jnp.swapaxes(y_c, 0, 1)
        return (y, y_h, y_c)[:outputs]

    return recurrent
