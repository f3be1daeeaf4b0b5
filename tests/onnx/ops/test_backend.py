"""ONNX's own backend test cases, run by ONNX's test runner through ``optkit.onnx.Backend``.

SPEC "Conformance data": the 7 training-operator node cases (Adagrad, Adam,
Momentum, SPEC 1, 3, 4) and the 2 Gradient model cases (SPEC 6), plus every
other case of ONNX's node, pytorch-converted, pytorch-operator and simple kinds
that optkit runs: ``tests/onnx/onnx_backend_cases.txt``, written by
``python -m benchmarks.onnx_conformance --write-cases``, which also counts the
cases optkit refuses (operators and types it does not run) and finds none that
fail. Each listed case runs here, so a case that stops passing, or that an
operator change makes refused, fails the suite. The runner compares dtypes
exactly and values with the case's tolerances (rtol 1e-3, atol 1e-7 by default).

Every case runs as ONNX's runner calls a backend, ``prepare(model).run(inputs)`` with the default options:
compiled (``jax.jit``), and where output sizes depend on values (NonZero, Unique, Compress,
NonMaxSuppression, a Loop with a computed condition and scan outputs), as compiled segments around those nodes.
"""

import re

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402
import onnx.backend.test.loader  # noqa: E402

import optkit.onnx  # noqa: E402
from optkit.onnx._load.files import ORT_DEFAULT_DOMAIN_OPS  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

# ONNX's INT64 and DOUBLE as ONNX's own types: these tests run as a caller with JAX's 64-bit mode on.
pytestmark = pytest.mark.x64

CASES = tuple(line.strip() for line in (ONNX_TESTS / "onnx_backend_cases.txt").read_text()
              .splitlines() if line.strip() and not line.startswith("#"))
TRAINING = r"^test_(adagrad|adam|momentum|nesterov_momentum|gradient_of_add)\w*_cpu$"
_WANTED = {f"{name}_cpu" for name in CASES}


def _only_included(test_cases):
    """Keep the listed cases (dropping the others, CUDA variants included), so the report lists them."""
    kept = {}
    for case_name, case in test_cases.items():
        for attr in list(vars(case)):
            if attr.startswith("test_") and attr not in _WANTED:
                delattr(case, attr)
        if any(attr.startswith("test_") for attr in vars(case)):
            kept[case_name] = case
    return kept


backend_test = onnx.backend.test.BackendTest(optkit.onnx.Backend, __name__)
backend_test.include(r"^test_\w+_cpu$")
_CASES = _only_included(backend_test.test_cases)
_SELECTED = sorted(attr for case in _CASES.values() for attr in vars(case)
                   if attr.startswith("test_") and attr.endswith("_cpu"))
globals().update(_CASES)


def _operators_of(case) -> set[str]:
    model = case.model if case.model is not None else onnx.load(f"{case.model_dir}/model.onnx")
    return {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}


def test_selection():
    """Every listed case is selected; they hold the 9 training cases (SPEC "Conformance data"), every
    pytorch-converted case, and a case of every ai.onnx operator in the table that ONNX has one for."""
    assert set(_SELECTED) == _WANTED and len(CASES) > 1250
    training = [name for name in _SELECTED if re.match(TRAINING, name)]
    assert sorted(training) == [
        "test_adagrad_cpu", "test_adagrad_multiple_cpu", "test_adam_cpu", "test_adam_multiple_cpu",
        "test_gradient_of_add_and_mul_cpu", "test_gradient_of_add_cpu", "test_momentum_cpu",
        "test_momentum_multiple_cpu", "test_nesterov_momentum_cpu",
    ]
    listed = set(CASES)
    every = [case for kind in ("node", "pytorch-converted", "pytorch-operator", "simple")
             for case in onnx.backend.test.loader.load_model_tests(kind=kind)]
    assert {c.name for c in every if c.kind == "pytorch-converted"} <= listed
    covered = set().union(*(_operators_of(c) for c in every if c.name in listed))
    # (ONNX Runtime's default-domain extensions have no ONNX cases: tests/onnx/ops/test_contrib.py runs them.)
    table = {op for domain, op, _ in optkit.onnx.supported_ops() if domain == ""} - ORT_DEFAULT_DOMAIN_OPS
    # ONNX's cases of the random operators compute their expected values with NumPy's generator (skipped by the
    # conformance harness); tests/onnx/ops/test_versions.py checks their distributions and seeds instead.
    random = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial"}
    # Optional's one ONNX case (loop16_seq_none) returns a sequence ONNX's runner cannot compare (skipped by the
    # harness); tests/onnx/ops/test_sequences.py runs Optional against ONNX Runtime instead.
    assert table - random - {"Optional"} <= covered, sorted(table - random - {"Optional"} - covered)
