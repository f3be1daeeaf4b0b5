"""Run test modules on 8 simulated CPU devices, in a child process when this one has fewer.

XLA reads ``--xla_force_host_platform_device_count`` once, when JAX starts its
CPU backend, and the rest of the suite runs on one device. A module that
needs a mesh calls :func:`has_devices`; when this process has too few CPU
devices, the module defines only ``rerun_in_child(__file__)``'s test, which
runs the module again in a fresh ``python -m pytest`` with the flag set (and
fails with the child's report), and the module's real tests run there.

When the whole suite runs, ``tests/sharding/test_simulated_devices.py`` runs every such
module in one child instead (one JAX start and one warm compile cache for all:
76 s against 132 s for the five apart, on 2 cores), and conftest.py
deselects the modules' own child tests.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import pytest

NUM_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"
_CHILD = "OPTKIT_SHARDING_SUBPROCESS"


def _cpu_device_count() -> int:
    try:
        return len(jax.devices("cpu"))
    except RuntimeError:  # no CPU backend in JAX_PLATFORMS
        return 0


def has_devices() -> bool:
    """True when this process has the 8 CPU devices (raises in a child that did not get them)."""
    if _cpu_device_count() >= NUM_DEVICES:
        return True
    if os.environ.get(_CHILD):
        raise RuntimeError(f"{_FLAG}={NUM_DEVICES} in XLA_FLAGS did not give {NUM_DEVICES} CPU devices")
    return False


def device_modules() -> list[str]:
    """The test modules that rerun themselves on 8 simulated devices (their source calls ``rerun_in_child``)."""
    here = pathlib.Path(__file__).resolve().parent
    return [str(path) for path in sorted(here.rglob("test_*.py"))
            if "rerun_in_child(__file__)" in path.read_text(encoding="utf-8")]


def rerun_in_child(*module_files: str):
    """A test that runs ``module_files`` in one child pytest with 8 simulated CPU devices."""

    def test_on_8_simulated_cpu_devices():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{_FLAG}={NUM_DEVICES}"])
        env["JAX_PLATFORMS"] = "cpu"
        env[_CHILD] = "1"
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        command = [sys.executable, "-m", "pytest", *map(os.path.abspath, module_files), "-q", "-rfE",
                   "-p", "no:cacheprovider"]
        result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        report = result.stdout + result.stderr
        if result.returncode != 0 or " passed" not in report:
            names = ", ".join(map(os.path.basename, module_files))
            pytest.fail(f"{names} failed on {NUM_DEVICES} simulated CPU devices:\n{report[-20000:]}")

    test_on_8_simulated_cpu_devices.reruns_in_child = tuple(map(os.path.realpath, module_files))
    # A child of 8 devices is never part of the quick tier (-m "not slow"): it starts JAX again and compiles for
    # a mesh (the whole suite's child is its longest test).
    return pytest.mark.slow(test_on_8_simulated_cpu_devices)
