"""Bit identity: optkit computes the numbers it computed when the snapshot was written.

``tests/project/snapshot/float64_results.npz`` holds every case of
:mod:`tests.project.snapshot.cases` (every optimizer's trajectory in float64 and float32,
jitted, eager, injected and flat; every spec operator; Graph and Gradient cases;
every ONNX backend test case optkit.onnx ran) as computed at the revision it
names (``python -m tests.project.snapshot.make``). A refactoring must reproduce them bit
for bit. On another JAX version or another CPU (XLA:CPU vectorizes reductions by
the CPU's vector width) the comparison is to a few units in the last place
instead, and says so.

A case the snapshot recorded as refused (an operator optkit.onnx did not run
then) may run now; every case that ran must give the same arrays.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import pathlib
import re
import warnings

import numpy as np
import pytest

from tests.project.snapshot.cases import all_cases
from tests.project.snapshot.make import machine

SNAPSHOT = pathlib.Path(__file__).resolve().parent / "snapshot" / "float64_results.npz"
_DATA = np.load(SNAPSHOT)
META = json.loads(str(_DATA["__meta__"]))
WANT: dict[str, dict[str, np.ndarray]] = collections.defaultdict(dict)
for _key in _DATA.files:
    if _key != "__meta__":
        _case, _, _field = _key.partition("|")
        WANT[_case][_field] = _DATA[_key]
CASES = dict(all_cases())
# State leaves the snapshot has that are gone on purpose, and why (every other array must be there).
REMOVED = {
    r"^(adagrad|adam|momentum)\.schedule\.\w+\|state\[1\]\.count$":
        "the alias's state is (ScaleBy...State,): the learning rate is applied inside the one transformation, "
        "so optax.scale_by_learning_rate's own copy of the step count is gone",
}
SAME_MACHINE = {k: META[k] for k in ("jax", "jaxlib", "cpu_flags")} == {
    k: v for k, v in machine().items() if k in ("jax", "jaxlib", "cpu_flags")}


def test_the_snapshot_covers_every_kind_of_case():
    prefixes = collections.Counter(name.split(".")[0] for name in WANT)
    assert {"adagrad", "adam", "momentum", "adafactor", "factored_rms", "ops", "graph", "gradient", "onnx"} <= set(
        prefixes)
    ran = [name for name, fields in WANT.items() if name.startswith("onnx.") and "refused" not in fields]
    assert len(ran) >= 680, len(ran)


def _assert_identical(name: str, field: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{name} {field}: {got.dtype}{got.shape} != snapshot {want.dtype}{want.shape}")
    if got.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {field}")
        return
    if SAME_MACHINE:
        same = got.tobytes() == want.tobytes()
        if not same:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            raise AssertionError(f"{name} {field}: not bit-identical to the snapshot ({META['revision']}); "
                                 f"largest difference {np.nanmax(diff):.3g}")
        return
    # Another JAX or CPU: a few units in the last place.
    eps = np.finfo(want.dtype).eps
    np.testing.assert_allclose(got, want, rtol=16 * eps, atol=16 * eps * max(1.0, float(np.nanmax(np.abs(want)))
                                                                            if want.size else 1.0),
                               err_msg=f"{name} {field} (compared to rounding: snapshot from {META})")


@pytest.mark.parametrize("name", sorted(WANT))
def test_same_numbers_as_the_snapshot(name):
    want = WANT[name]
    if name.startswith("onnx.") and importlib.util.find_spec("onnx") is None:
        pytest.skip("the onnx extra is not installed")
    assert name in CASES, f"case {name} of the snapshot no longer exists in tests/project/snapshot/cases.py"
    if "refused" in want:
        return  # not run by the snapshot's revision: nothing to compare (tests/onnx/ops/test_backend.py runs it now)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = CASES[name]()
    removed = {f for f in want if f not in got and any(re.match(p, f"{name}|{f}") for p in REMOVED)}
    assert sorted(got) == sorted(set(want) - removed), f"{name}: outputs {sorted(got)} != snapshot {sorted(want)}"
    for field, value in want.items():
        if field in removed:
            continue
        _assert_identical(name, field, np.asarray(got[field]), value)


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
