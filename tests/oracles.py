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
