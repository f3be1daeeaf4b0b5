"""Independent NumPy transcriptions of SPEC.md's formulas, written straight from the text.

These do not import optkit. Each takes and returns NumPy arrays and computes in
the dtype of its inputs (float64 in the exactness tests).
"""

from __future__ import annotations

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
