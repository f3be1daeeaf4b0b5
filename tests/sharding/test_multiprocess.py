"""Several processes: 2 localhost JAX processes x 4 CPU devices train, checkpoint and restore.

``examples/multihost.py`` starts two workers that join one cluster
(``jax.distributed.initialize``, coordinator on 127.0.0.1) and build a 2x4
``(data, model)`` mesh whose ``model`` axis spans both processes. Checked here,
against expectations computed in this process:

- the jitted, donated steps of ``optkit.adam`` and ``optkit.adafactor`` on
  parameters sharded along ``model`` equal the same steps on one device
  (within 1e-5 of each array's scale);
- the state is sharded like the parameters (Adafactor's statistics with the
  reduced axis dropped), as the workers report it;
- the Orbax checkpoint both processes wrote restores bit for bit onto a
  different mesh with 2 processes (checked by the workers) and onto one
  device in this single process;
- an exported ONNX model (``--onnx``: torch.onnx's MLP through
  ``optkit.onnx.to_jax``), trained data parallel with the batch split over
  both processes, equals the same steps on one device and restores;
- a worker that dies, or stalls, ends the run with an error and leaves no
  process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

ocp = pytest.importorskip("orbax.checkpoint")
pytest.importorskip("sklearn")

from examples import multihost  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def _launch(out: Path, *extra: str, fault: str | None = None, timeout: float = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    env.pop(multihost._FAULT, None)
    if fault:
        env[multihost._FAULT] = fault
    command = [sys.executable, str(ROOT / "examples" / "multihost.py"), "--steps", str(STEPS), "--out", str(out),
               *extra]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - start


def _leftovers(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (the run's unique output folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _one_device_run(name, onnx=False):
    tx = multihost.make_optimizer(name)
    start, loss, _, _ = multihost.model(onnx, 0)
    params = jax.tree.map(jax.numpy.asarray, start)
    state = tx.init(params)
    step = multihost.make_step(tx, loss)
    for x, y in multihost.batches(STEPS, multihost.BATCH):
        params, state, _ = step(params, state, x, y)
    return {"params": params, "opt_state": state}


def _expected_spec(key: str) -> list:
    """A state or parameter leaf's sharding, from its parameter's PartitionSpec in examples/multihost.py."""
    owners = [name for name in multihost.PARAMS if f"['{name}']" in key]
    if not owners:
        return []  # the step count: replicated
    shape, spec = multihost.PARAMS[owners[0]]
    spec = list(spec) + [None] * (len(shape) - len(spec))
    if key.endswith(".v_row"):
        del spec[1]  # a matrix's row statistics: its column axis is reduced
    elif key.endswith(".v_col"):
        del spec[0]
    return spec


def _check_equal_one_device(run, name, onnx=False):
    got = dict(np.load(run / f"trained_{name}.npz"))
    want = multihost.names_of(_one_device_run(name, onnx))
    assert set(got) == set(want)
    for key, w in want.items():
        g, w = got[key].astype(np.float64), np.asarray(w, np.float64)
        scale = max(np.max(np.abs(w), initial=0.0), np.finfo(np.float32).tiny)
        assert np.max(np.abs(g - w), initial=0.0) <= 1e-5 * scale, f"{name}: {key}"


def _check_sharded_like_the_parameters(run, name):
    specs = json.loads((run / f"shardings_{name}.json").read_text())
    assert any(".v_row" in key for key in specs) == (name == "adafactor")
    for key, spec in specs.items():
        ndim = len(_expected_spec(key))
        got = [tuple(e) if isinstance(e, list) else e for e in spec] + [None] * (ndim - len(spec))
        assert got == _expected_spec(key), f"{name}: {key}"


def _check_restores_on_one_device(run, name, onnx=False):
    tx = multihost.make_optimizer(name)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
              for k, v in multihost.model(onnx, 0)[0].items()}
    state = jax.eval_shape(tx.init, params)
    target = {"params": params,
              "opt_state": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), state)}
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(run / f"checkpoint_{name}", target)
    saved = dict(np.load(run / f"trained_{name}.npz"))
    for key, leaf in multihost.names_of(restored).items():
        np.testing.assert_array_equal(np.asarray(leaf), saved[key], err_msg=f"{name}: {key}")


def test_two_processes_train_checkpoint_and_restore(tmp_path):
    """One run (two processes) checked several ways: one test, so that pytest-xdist runs it once."""
    result, _ = _launch(tmp_path)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-10000:]
    assert "restored bit for bit onto mesh" in result.stdout  # the workers' own check, on another mesh
    assert "[Gloo]" not in result.stdout  # the per-peer connection lines only with --verbose
    assert not _leftovers(str(tmp_path))
    for name in multihost.OPTIMIZERS:
        _check_equal_one_device(tmp_path, name)
        _check_sharded_like_the_parameters(tmp_path, name)
        _check_restores_on_one_device(tmp_path, name)
    assert (tmp_path / "multihost_loss.png").stat().st_size > 0
    losses = np.load(tmp_path / "losses.npz")
    assert losses["adam"][-1] < losses["adam"][0]


def test_two_processes_train_an_exported_onnx_model_data_parallel_with_the_state_split_over_data(tmp_path):
    """The exported MLP data parallel over both processes' 8 devices, its optimizer state split over ``data``
    (ZeRO-1, ``--zero1``): the same parameters as one device, the checkpoint restored onto another mesh and onto
    one device, the parameters replicated and each state leaf that a dimension allows split over ``data``."""
    result, _ = _launch(tmp_path, "--onnx", "--zero1")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-10000:]
    assert "torch_torchscript_mlp.onnx, data parallel; optimizer state split over data (ZeRO-1)" in result.stdout
    assert "restored bit for bit onto mesh" in result.stdout
    assert not _leftovers(str(tmp_path))
    for name in multihost.OPTIMIZERS:
        _check_equal_one_device(tmp_path, name, onnx=True)
        _check_restores_on_one_device(tmp_path, name, onnx=True)
        specs = json.loads((tmp_path / f"shardings_{name}.json").read_text())
        params = {k: v for k, v in specs.items() if k.startswith("['params']")}
        state = {k: v for k, v in specs.items() if k.startswith("['opt_state']") and v}
        assert params and all(all(e is None for e in spec) for spec in params.values()), params  # replicated
        split = [k for k, spec in state.items() if "data" in spec]
        assert len(split) >= 3, state  # the moments (Adam) or the row statistics and vectors (Adafactor)
    losses = np.load(tmp_path / "losses.npz")
    assert losses["adafactor"][-1] < losses["adafactor"][0]


@pytest.mark.parametrize("fault", ["exit:1", "stall:1"])
def test_a_dead_or_stalled_worker_stops_the_run_and_leaves_no_process(tmp_path, fault):
    result, seconds = _launch(tmp_path, "--timeout", "20", fault=fault)
    assert result.returncode != 0
    assert ("exited with 3" in result.stderr) if fault.startswith("exit") else ("did not finish" in result.stderr)
    assert seconds < 60
    assert not _leftovers(str(tmp_path))


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
