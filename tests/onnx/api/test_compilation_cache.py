"""JAX's persistent compilation cache, on by default for optkit's programs (optkit.onnx._run.cache): a second
process reads the first one's training step instead of compiling it (and apply_fn's exported forward and
backward instead of tracing the graph); the opt-out, a user's own directory and an
unwritable one are respected. Each case runs fresh Python processes, as users start them."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

MODELS = pathlib.Path(__file__).resolve().parents[1] / "models"

# argv: the model stem, or "" for no model: the cache's directory, JAX's setting and, with a model, the cache hits
# and misses of a to_jax training step (jax.monitoring's events).
_CHILD = """
import json, sys
import jax
events = {"hits": 0, "misses": 0}
def count(name, **kwargs):
    if name == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
    elif name == "/jax/compilation_cache/cache_misses":
        events["misses"] += 1
jax.monitoring.register_event_listener(count)
import logging
import jax.numpy as jnp, numpy as np, optax, optkit, optkit.onnx
row = {"warm": []}
class Warm(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("warm start"):
            row["warm"].append(record.getMessage())
logging.getLogger("optkit.onnx").addHandler(Warm())
logging.getLogger("optkit.onnx").setLevel(logging.INFO)
if sys.argv[1]:
    data = np.load(sys.argv[1] + ".npz")
    apply_fn, params = optkit.onnx.to_jax(sys.argv[1] + ".onnx")
    tx = optkit.adam(1e-3)

    @jax.jit
    def step(p, state, x):
        loss, grads = jax.value_and_grad(lambda q: jnp.sum(apply_fn(q, x) ** 2))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    row["loss"] = float(step(params, tx.init(params), data["input"])[2])
row.update(events, directory=optkit.onnx.compilation_cache(), jax_dir=jax.config.jax_compilation_cache_dir,
           max_size=jax.config.jax_compilation_cache_max_size)
print(json.dumps(row))
"""


def _child(tmp_path, stem: str = "", **env) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OPTKIT_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")}
    environ.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"), **env)
    out = subprocess.run([sys.executable, "-c", _CHILD, stem], capture_output=True, text=True, env=environ,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_the_first_ones_training_step_from_the_default_cache(tmp_path):
    stem = str(MODELS / "torch_torchscript_resnet18")
    first = _child(tmp_path, stem)
    import jax
    import jaxlib

    expected = tmp_path / "cache" / "optkit" / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"
    assert first["directory"] == first["jax_dir"] == str(expected)
    assert first["max_size"] == 2**30
    assert first["hits"] == 0 and first["misses"] >= 1
    written = [p for p in expected.rglob("*") if p.is_file()]
    assert written, "the first process wrote nothing"
    second = _child(tmp_path, stem)
    assert second["hits"] >= 1, second  # (the training step at least: it compiles for seconds)
    assert second["misses"] < first["misses"]
    assert second["loss"] == first["loss"]  # the same executable
    # apply_fn's forward and backward exported by the first process, read by the second (optkit.onnx._run.warm)
    assert [m.split(" in ")[0] for m in first["warm"]] == ["warm start: exported apply_fn's forward and backward"]
    assert len(second["warm"]) == 1 and "read from" in second["warm"][0], second["warm"]
    assert len(list((expected / "optkit-warm").glob("*.npz"))) == 1


@pytest.mark.parametrize("value", ["off", "0", "False", "no"])
def test_the_opt_out_leaves_jaxs_cache_off(tmp_path, value):
    row = _child(tmp_path, OPTKIT_COMPILATION_CACHE=value)
    assert row["directory"] is None and row["jax_dir"] is None
    assert not (tmp_path / "cache").exists()


def test_a_directory_of_ones_own_is_used_and_a_users_jax_setting_stands(tmp_path):
    mine = tmp_path / "mine"
    row = _child(tmp_path, OPTKIT_COMPILATION_CACHE=str(mine))
    assert row["directory"] == row["jax_dir"] == str(mine) and mine.is_dir()
    theirs = tmp_path / "theirs"
    row = _child(tmp_path, JAX_COMPILATION_CACHE_DIR=str(theirs), OPTKIT_COMPILATION_CACHE=str(mine))
    assert row["directory"] == row["jax_dir"] == str(theirs)
    assert row["max_size"] == -1  # JAX's default: the user's settings are not touched


def test_a_directory_that_cannot_be_written_leaves_the_cache_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    row = _child(tmp_path, OPTKIT_COMPILATION_CACHE=str(blocker / "cache"))
    assert row["directory"] is None and row["jax_dir"] is None


def test_the_command_line_says_what_the_cache_saved(tmp_path):
    """``optkit-onnx run`` prints the first call's stages: XLA's compile in the first process, the read from the
    cache in the second (the same model, inputs and options)."""
    environ = {**os.environ, "OPTKIT_COMPILATION_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "optkit.onnx", "run", str(MODELS / "torch_torchscript_resnet18.onnx"),
               "--repeat", "1"]
    first, second = (subprocess.run(command, capture_output=True, text=True, env=environ, timeout=600)
                     for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    stages = r"first call \d+\.\d+ s: trace \d+\.\d\d s, lower \d+\.\d\d s, {} \d+\.\d\d s, run \d+\.\d\d s;"
    assert re.search(stages.format("XLA compile"), first.stdout), first.stdout
    assert re.search(stages.format("read from the compilation cache"), second.stdout), second.stdout
    assert f"JAX's compilation cache: {tmp_path / 'cache'}" in second.stdout
