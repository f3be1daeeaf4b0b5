"""Every test module that needs 8 CPU devices, run in one child process (tests/_devices.py).

Each such module reruns itself in a child of its own when run alone; in a run of the whole suite this test
runs them all in one child (one JAX start, one warm compile cache) and conftest.py deselects theirs.
"""

from __future__ import annotations

import os

from tests._devices import device_modules, has_devices, rerun_in_child

MODULES = device_modules()


def test_the_device_modules_are_found():
    names = {os.path.basename(m) for m in MODULES}
    assert {"test_sharding.py", "test_flax_sharding.py", "test_flax_scan.py", "test_optax_sharding.py",
            "test_jax_sharding.py"} <= names, names


if not has_devices():
    test_every_device_module_on_8_simulated_cpu_devices = rerun_in_child(*MODULES)
