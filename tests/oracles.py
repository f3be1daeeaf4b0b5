"""Independent NumPy transcriptions of SPEC.md's formulas, written straight from the text.

These do not import optkit. Each takes and returns NumPy arrays and computes in
the dtype of its inputs (float64 in the exactness tests).
"""

from __future__ import annotations

import math

import numpy as np


def adagrad(R, T, X, G, H, *, decay_factor, epsilon, norm_coefficient):
    """SPEC 1, ONNX Adagrad, one tensor. Returns (X_new, H_new)."""
    r = R / (1 + T * decay_factor)
    G_regularized = norm_coefficient * X + G
    H_new = H + G_regularized * G_regularized
    H_adaptive = np.sqrt(H_new) + epsilon
    with np.errstate(invalid="ignore", divide="ignore"):
        X_new = X - r * G_regularized / H_adaptive
    # SPEC 1, Decision (0/0): an update of exactly 0 where G_reg and H_new are both 0.
    X_new = np.where((G_regularized == 0) & (H_new == 0), X, X_new)
    return X_new, H_new


def dml_adam(X, M, V, G, T, *, LearningRate, Beta1, Beta2, Epsilon):
    """SPEC 2, DirectML Adam. Returns (X, M, V). T = 0 uses Alpha = 1 (Decision (T))."""
    M = Beta1 * M + (1.0 - Beta1) * G
    V = Beta2 * V + (1.0 - Beta2) * G * G
    if T == 0:
        Alpha = 1.0
    else:
        Alpha = np.sqrt(1.0 - np.power(Beta2, T)) / (1.0 - np.power(Beta1, T))
    with np.errstate(invalid="ignore", divide="ignore"):
        step = LearningRate * Alpha * M / (np.sqrt(V) + Epsilon)
    step = np.where((M == 0) & (V == 0), 0.0, step)
    X = X - step
    return X, M, V


def onnx_adam(R, T, X, G, V, H, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    """SPEC 3, ONNX Adam, one tensor. Returns (X_new, V_new, H_new)."""
    G_reg = norm_coefficient * X + G
    V_new = alpha * V + (1 - alpha) * G_reg
    H_new = beta * H + (1 - beta) * G_reg * G_reg
    if T > 0:
        r_adj = R * np.sqrt(1 - beta**T) / (1 - alpha**T)
    else:
        r_adj = R
    with np.errstate(invalid="ignore", divide="ignore"):
        step = r_adj * V_new / (np.sqrt(H_new) + epsilon)
    step = np.where((V_new == 0) & (H_new == 0), 0.0, step)
    X_new = (1 - norm_coefficient_post) * (X - step)
    return X_new, V_new, H_new


def onnx_momentum(R, T, X, G, V, *, alpha, beta, mode, norm_coefficient):
    """SPEC 4, ONNX Momentum, one tensor. Returns (X_new, V_new)."""
    G_reg = norm_coefficient * X + G
    beta_adj = beta if T > 0 else 1
    V_new = alpha * V + beta_adj * G_reg
    if mode == "standard":
        X_new = X - R * V_new
    elif mode == "nesterov":
        X_new = X - R * (G_reg + alpha * V_new)
    else:
        raise ValueError(mode)
    return X_new, V_new


# ---------------------------------------------------------------------------
# SPEC 5: Adafactor


def oracle_axes(shape, factored_dims="last", min_dim=1):
    """The SPEC 5 rule for which axes are factored: (row axis, column axis) or None."""
    if len(shape) < 2:
        return None
    if factored_dims == "last":
        row, col = len(shape) - 2, len(shape) - 1
    else:  # the two largest; the second largest is the row axis; ties as numpy.argsort
        order = np.argsort(shape)
        row, col = int(order[-2]), int(order[-1])
    if min(shape[row], shape[col]) < max(min_dim, 1):
        return None
    return row, col


class PaperAdafactor:
    """Shazeer & Stern (2018), Algorithm 4 (matrices) and 5 (other tensors), in float64.

    A factored tensor is moved so that its (row, column) axes are last, and
    every leading index is one n x m matrix of the paper.
    """

    def __init__(self, params, *, lr=None, b1=None, decay_rate=0.8, eps1=1e-30, eps2=1e-3, d=1.0,
                 mps=True, wd=None, factored_dims="last", min_dim=1, factored=True):
        self.X = {k: np.array(v, np.float64) for k, v in params.items()}
        self.kw = dict(lr=lr, b1=b1, decay_rate=decay_rate, eps1=eps1, eps2=eps2, d=d, mps=mps, wd=wd)
        self.axes = {
            k: oracle_axes(np.shape(v), factored_dims, min_dim) if factored else None
            for k, v in self.X.items()
        }
        self.R, self.C, self.V, self.M = {}, {}, {}, {}
        self.t = 0

    def step(self, grads):
        """One update; returns the deltas X_t - X_{t-1}."""
        self.t += 1
        t, kw = self.t, self.kw
        deltas = {}
        for k, x in self.X.items():
            g = np.asarray(grads[k], np.float64)
            if kw["lr"] is None:
                rho = min(1e-2, 1 / np.sqrt(t))
            elif callable(kw["lr"]):
                rho = float(kw["lr"](t - 1))
            else:
                rho = kw["lr"]
            rms_x = np.sqrt(np.mean(x**2)) if x.size else 0.0
            alpha = max(kw["eps2"], rms_x) * rho if kw["mps"] else rho
            b2 = 1 - t ** (-kw["decay_rate"])
            if self.axes[k] is not None:
                row, col = self.axes[k]
                gm = np.moveaxis(g, (row, col), (-2, -1))  # (..., n, m)
                sq = gm**2 + kw["eps1"]
                ones_m = np.ones(gm.shape[-1])
                ones_n = np.ones(gm.shape[-2])
                self.R[k] = b2 * self.R.get(k, 0.0) + (1 - b2) * (sq @ ones_m)  # (..., n)
                self.C[k] = b2 * self.C.get(k, 0.0) + (1 - b2) * (ones_n @ sq)  # (..., m)
                denom = self.R[k] @ ones_n  # 1_n^T R_t
                Vm = self.R[k][..., :, None] * self.C[k][..., None, :] / denom[..., None, None]
                V = np.moveaxis(Vm, (-2, -1), (row, col))
            else:
                self.V[k] = b2 * self.V.get(k, 0.0) + (1 - b2) * (g**2 + kw["eps1"])
                V = self.V[k]
            with np.errstate(invalid="ignore", divide="ignore"):
                U = g / np.sqrt(V)
            U = np.where(V == 0, 0.0, U)  # only reachable with eps1 = 0
            if kw["d"] is not None and U.size:
                U = U / max(1.0, np.sqrt(np.mean(U**2)) / kw["d"])
            step = alpha * U
            if kw["b1"] is not None:
                self.M[k] = kw["b1"] * self.M.get(k, 0.0) + (1 - kw["b1"]) * step
                step = self.M[k]
            if kw["wd"] is not None:
                step = step + kw["wd"] * alpha * x
            self.X[k] = x - step
            deltas[k] = -step
        return deltas


# --------------------------------------------------------------------------- T5X's Adafactor
#
# An independent NumPy transcription of T5X's Adafactor, written from reading google-research/t5x,
# file t5x/adafactor.py at commit cc342d419ec3e3e9c4bf1df33c82330cafdc1e16 (2026-04-21):
# ``Adafactor._parse_rule``, ``_factored_dims``, ``init_param_state``, ``apply_param_gradient``,
# ``apply_gradient`` and ``set_param_axes``. Parameters are a flat dict from the "/"-joined path to an
# array (T5X's flatten_dict_string_keys); rules use the strings "row", "col", "batch", None; the
# (1,) placeholders T5X keeps for absent statistics are kept here too (as None), since they carry no
# numbers. Arithmetic in float32, as T5X runs it on float32 parameters.

T5X_ROW, T5X_COL, T5X_BATCH, T5X_NONE, T5X_HEURISTIC = "row", "col", "batch", None, "heuristic"

# standard_logical_factor_rules() of t5x/adafactor.py, in this file's vocabulary.
T5X_STANDARD_RULES = {
    "vocab": T5X_COL, "embed": T5X_ROW, "mlp": T5X_COL, "heads": T5X_COL, "kv": T5X_COL, "joined_kv": T5X_COL,
    "relpos_buckets": T5X_NONE, "layers": T5X_BATCH, "stack": T5X_BATCH, "q_wi_fused": T5X_COL,
    "o_wo_fused": T5X_COL, "multiquery_heads": T5X_COL, "kv_fused": T5X_COL, "layer_norm_scale": T5X_NONE,
    "mlp_activations": T5X_COL,
}


class T5XAdafactor:
    """T5X's ``Adafactor`` optimizer definition, step by step, on NumPy arrays."""

    def __init__(self, learning_rate, factored=True, multiply_by_parameter_scale=True, beta1=None, decay_rate=0.8,
                 step_offset=0, clipping_threshold=1.0, weight_decay_rate=None, min_dim_size_to_factor=128,
                 epsilon1=1e-30, epsilon2=1e-3, dtype_momentum=np.float32, factor_map=None,
                 logical_factor_rules=None, weight_decay_rate_lr_exponent=None, global_norm_clip_threshold=None,
                 max_parameter_scale=None, skip_nan_updates=False):
        if not factored and factor_map is not None:
            raise ValueError("factored is False but factor rules are given")
        self.hp = dict(learning_rate=learning_rate, factored=factored,
                       multiply_by_parameter_scale=multiply_by_parameter_scale, beta1=beta1, decay_rate=decay_rate,
                       step_offset=step_offset, clipping_threshold=clipping_threshold,
                       weight_decay_rate=weight_decay_rate, min_dim_size_to_factor=min_dim_size_to_factor,
                       epsilon1=epsilon1, epsilon2=epsilon2, logical_factor_rules=logical_factor_rules,
                       weight_decay_rate_lr_exponent=weight_decay_rate_lr_exponent,
                       global_norm_clip_threshold=global_norm_clip_threshold,
                       max_parameter_scale=max_parameter_scale, skip_nan_updates=skip_nan_updates)
        self.factor_map = factor_map  # list of (regex, rule) (HParamMap), or a dict path -> rule
        self.dtype_momentum = dtype_momentum

    # -- rules
    def _lookup(self, table, path):
        import re

        if isinstance(table, dict):
            return table[path]
        for pattern, value in table:
            if re.search(pattern, path):
                return value
        raise KeyError(path)

    def set_param_axes(self, param_logical_axes):
        """``param_logical_axes``: path -> tuple of logical names."""
        rules = self.hp["logical_factor_rules"]
        if rules is None:
            return
        table = {}
        for path, axes in param_logical_axes.items():
            roles = tuple(rules[a] for a in axes)
            if T5X_ROW in roles and T5X_COL in roles and T5X_NONE in roles:
                raise ValueError(f"incomplete adafactor spec {roles} for {axes}")
            if T5X_ROW not in roles or T5X_COL not in roles:
                roles = tuple(T5X_NONE if r in (T5X_ROW, T5X_COL) else r for r in roles)
            table[path] = roles
        self.factor_map = table

    def _rule(self, path):
        if not self.hp["factored"]:
            return None
        return self._lookup(self.factor_map, path) if self.factor_map else T5X_HEURISTIC

    @staticmethod
    def _parse_rule(rule, shape):
        """(averaging dims, factored dims: None, T5X_HEURISTIC or (row dims, col dims))."""
        ndim = len(shape)
        if rule is None:
            return tuple(range(ndim)), None
        if rule == T5X_HEURISTIC:
            if ndim > 2:
                raise ValueError(f"rank {ndim} needs an explicit rule")
            return tuple(range(ndim)), T5X_HEURISTIC
        if len(rule) != ndim:
            raise ValueError("rule of the wrong rank")
        rows = tuple(i for i, r in enumerate(rule) if r == T5X_ROW)
        cols = tuple(i for i, r in enumerate(rule) if r == T5X_COL)
        batch = tuple(i for i, r in enumerate(rule) if r == T5X_BATCH)
        averaging = tuple(i for i in range(ndim) if i not in batch)
        factored = None if (rows, cols) == ((), ()) else (rows, cols)
        if ndim <= 2 and not batch:  # the fall-back to the heuristic
            return tuple(range(ndim)), T5X_HEURISTIC
        return averaging, factored

    def _heuristic_dims(self, shape):
        if not self.hp["factored"] or len(shape) < 2:
            return None
        order = np.argsort(shape)
        if shape[order[-2]] < self.hp["min_dim_size_to_factor"]:
            return None
        return (int(order[-2]),), (int(order[-1]),)

    def _dims(self, path, shape):
        averaging, factored = self._parse_rule(self._rule(path), shape)
        if factored == T5X_HEURISTIC:
            factored = self._heuristic_dims(shape)
        return averaging, factored

    # -- state
    def init(self, params):
        state = {}
        for path, p in params.items():
            _, factored = self._dims(path, p.shape)
            s = dict(v_row=None, v_col=None, v=None, m=None)
            if factored is not None:
                rows, cols = factored
                s["v_row"] = np.zeros(np.delete(p.shape, cols), np.float32)
                s["v_col"] = np.zeros(np.delete(p.shape, rows), np.float32)
            else:
                s["v"] = np.zeros(p.shape, np.float32)
            if self.hp["beta1"] is not None:
                s["m"] = np.zeros(p.shape, self.dtype_momentum)
            state[path] = s
        return {"step": 0, "param_states": state}

    # -- one step
    def _param_step(self, step, p, s, g, path, learning_rate):
        hp = self.hp
        f32 = np.float32
        wd = hp["weight_decay_rate"]
        if hp["weight_decay_rate_lr_exponent"]:
            wd = (wd or 1.0) * learning_rate ** hp["weight_decay_rate_lr_exponent"]
        averaging, factored = self._dims(path, p.shape)
        g = g.astype(f32)
        t = f32(step - hp["step_offset"]) + f32(1)
        decay = f32(1) - t ** f32(-hp["decay_rate"])
        mixing = f32(1) - decay
        scale = f32(learning_rate)
        by_scale = hp["multiply_by_parameter_scale"]
        if not isinstance(by_scale, bool):
            by_scale = self._lookup(by_scale, path)
        if by_scale:
            param_scale = np.sqrt(np.mean(p * p, axis=averaging, keepdims=True))
            param_scale = np.maximum(param_scale, f32(hp["epsilon2"]))
            if hp["max_parameter_scale"] is not None:
                param_scale = np.minimum(param_scale, f32(hp["max_parameter_scale"]))
            scale = scale * param_scale
        g2 = g * g + f32(hp["epsilon1"])
        new = dict(v_row=None, v_col=None, v=None, m=None)
        if factored is not None:
            rows, cols = factored
            new["v_row"] = decay * s["v_row"] + mixing * np.mean(g2, axis=cols)
            new["v_col"] = decay * s["v_col"] + mixing * np.mean(g2, axis=rows)
            rows_in_v_row = tuple(d - sum(1 for e in cols if e < d) for d in rows)
            row_mean = np.mean(new["v_row"], axis=rows_in_v_row, keepdims=True)
            row_factor = (new["v_row"] / row_mean) ** f32(-0.5)
            col_factor = new["v_col"] ** f32(-0.5)
            y = g * np.expand_dims(row_factor, cols) * np.expand_dims(col_factor, rows)
        else:
            new["v"] = decay * s["v"] + mixing * g2
            y = g * new["v"] ** f32(-0.5)
        if hp["clipping_threshold"] is not None:
            y = y / np.maximum(f32(1), np.sqrt(np.mean(y * y, axis=averaging, keepdims=True))
                               / f32(hp["clipping_threshold"]))
        subtrahend = scale * y
        if hp["beta1"] is not None:
            m = f32(hp["beta1"]) * s["m"].astype(f32) + (f32(1) - f32(hp["beta1"])) * subtrahend
            subtrahend = m
            new["m"] = m.astype(self.dtype_momentum)
        new_p = ((f32(1) - f32(wd)) * p - subtrahend) if wd is not None else p - subtrahend
        if hp["skip_nan_updates"]:
            for k in new:
                if new[k] is not None:
                    new[k] = np.where(np.isnan(new[k]), s[k], new[k])
            new_p = np.where(np.isnan(new_p), p, new_p)
        return new_p.astype(p.dtype), new

    def apply(self, params, state, grads, learning_rate=None):
        """One ``apply_gradient``: new (params, state). ``learning_rate``: this step's, if scheduled."""
        lr = self.hp["learning_rate"] if learning_rate is None else learning_rate
        grads = dict(grads)
        threshold = self.hp["global_norm_clip_threshold"]
        if threshold:
            norm = np.float32(np.sqrt(np.sum([np.sum(np.square(g, dtype=np.float32)) for g in grads.values()])))
            factor = np.float32(threshold) * np.minimum(np.float32(1 / threshold), np.float32(1) / norm)
            grads = {k: g * factor for k, g in grads.items()}
        new_params, new_states = {}, {}
        for path, p in params.items():
            new_params[path], new_states[path] = self._param_step(
                state["step"], p, state["param_states"][path], grads[path], path, lr)
        return new_params, {"step": state["step"] + 1, "param_states": new_states}


def muon(X, G, M, *, lr, momentum, nesterov, weight_decay, ns_coefficients, ns_steps, eps, adjust_lr):
    """SPEC 8, Muon (torch.optim.Muon's algorithm) for one matrix, the iteration in the inputs' dtype.

    Returns (X_new, M_new).
    """
    M_new = M + (1 - momentum) * (G - M)
    U = G + momentum * (M_new - G) if nesterov else M_new
    a, b, c = ns_coefficients
    Y = U.T if U.shape[0] > U.shape[1] else U.copy()
    Y = Y / max(np.linalg.norm(Y), eps)
    for _ in range(ns_steps):
        S = Y @ Y.T
        S = b * S + c * (S @ S)
        Y = a * Y + S @ Y
    O = Y.T if U.shape[0] > U.shape[1] else Y
    A, B = X.shape
    ratio = np.sqrt(max(1.0, A / B)) if adjust_lr == "original" else 0.2 * np.sqrt(max(A, B))
    return X * (1 - lr * weight_decay) - lr * ratio * O, M_new


class ScheduleFreeAdamW:
    """SPEC 9, schedule-free AdamW, written from the text: Python floats for the step's scalars, NumPy leaves."""

    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, warmup_steps=0, r=0.0,
                 weight_lr_power=2.0):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, b1, b2, eps, weight_decay
        self.warmup, self.r, self.power = warmup_steps, r, weight_lr_power
        self.k, self.weight_sum, self.lr_max = 0, 0.0, 0.0

    def step(self, y, z, v, g):
        """One step of every leaf (dicts of arrays); returns (y, z, v)."""
        k = self.k
        lr = self.lr * ((k + 1) / self.warmup if k < self.warmup else 1.0)
        self.lr_max = max(self.lr_max, lr)
        weight = (k + 1) ** self.r * self.lr_max ** self.power
        self.weight_sum += weight
        c = weight / self.weight_sum if self.weight_sum else 0.0
        out_y, out_z, out_v = {}, {}, {}
        for n in y:
            out_v[n] = self.b2 * v[n] + (1 - self.b2) * g[n] * g[n]
            g_n = g[n] / (np.sqrt(out_v[n] / (1 - self.b2 ** (k + 1))) + self.eps) + self.wd * y[n]
            out_y[n] = y[n] + c * (z[n] - y[n]) + lr * (self.b1 * (1 - c) - 1) * g_n
            out_z[n] = z[n] - lr * g_n
        self.k += 1
        return out_y, out_z, out_v

    def eval_params(self, y, z):
        return {n: y[n] + (1 - 1 / self.b1) * (z[n] - y[n]) for n in y}


def quantize_nearest(x, code, block_size=256):
    """SPEC 10's nearest rounding, written from the text: per block of ``block_size`` (row-major, zero-padded),
    ``absmax = max|x|`` and each code the argmin of ``|x * (1 / absmax) - code|`` in float32 (ties: the lower
    index); a block of zeros gets codes 0. Returns (codes of x's size, absmax)."""
    flat = np.asarray(x, np.float32).reshape(-1)
    pad = np.concatenate([flat, np.zeros(-flat.size % block_size, np.float32)]).reshape(-1, block_size)
    absmax = np.abs(pad).max(axis=1)
    inverse = np.where(absmax > 0, np.float32(1) / np.where(absmax > 0, absmax, 1), 0).astype(np.float32)
    normed = pad * inverse[:, None]
    codes = np.abs(normed[..., None] - code[None, None, :]).argmin(axis=-1).astype(np.uint8)
    codes[absmax == 0] = 0
    return codes.reshape(-1)[:flat.size], absmax


def adam8bit_step(x, g, m, v, t, *, lr, b1, b2, eps, weight_decay, quantized):
    """SPEC 10, one step of one parameter in float32 (m, v already dequantized), t counted from 1.

    Returns (X_new, m, v) before the moments are quantized again.
    """
    f = np.float32
    m = m * f(b1) + f(1 - b1) * g
    v = v * f(b2) + f(1 - b2) * g * g
    c1, c2 = 1 - b1 ** t, math.sqrt(1 - b2 ** t)
    x = x * f(1 - lr * weight_decay) if weight_decay > 0 else x
    if quantized:
        return x + f(-lr / c1) * (m / (np.sqrt(v) / f(c2) + f(eps))), m, v
    return x + f(-lr * c2 / c1) * (m / (np.sqrt(v) + f(eps * c2))), m, v
