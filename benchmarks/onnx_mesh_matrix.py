"""Every exported model of tests/onnx/models, data parallel on 8 simulated CPU devices, against one device.

For each fixture (torch.onnx's both exporters, jax2onnx, ONNX Runtime's optimizer and quantizers, Optimum,
onnxruntime-genai's builder, skl2onnx): ``optkit.onnx.to_jax`` (``scan_layers=True``), the loss ``sum(mean(out **
2))`` over its floating outputs and its ``jax.value_and_grad`` under ``jax.jit`` on one device, then on a 2 x 4
``(data, model)`` mesh of all 8 devices, once with ``AxisType.Explicit`` axes (``jax.make_mesh``'s default) and
once with ``AxisType.Auto``, under ``jax.set_mesh``: the feeds' batch (the fixtures' batch of 2) sharded over
``data``, the parameters replicated. A row says ``ok`` when the largest difference of the loss and gradients is at
most 1e-4 of the largest gradient (2e-3 for float16 weights: their own rounding), and the error otherwise.

Feeds: the fixture's recorded inputs where its ``.npz`` has them; else token ids in [3, 90), an all-ones attention
mask, positions 0..7, zero token types, an empty KV cache (a cross-attention cache of 8 positions), normal floats
(symbolic dimensions: batch 2, others 8).
Run from the repository root (it sets ``XLA_FLAGS`` for 8 CPU devices itself)::

    python -m benchmarks.onnx_mesh_matrix                      # every fixture (a few minutes on 2 cores)
    python -m benchmarks.onnx_mesh_matrix torch_dynamo_gpt2    # some, by path under tests/onnx/models
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import argparse  # noqa: E402
import pathlib  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

MODELS = pathlib.Path(__file__).resolve().parent.parent / "tests" / "onnx" / "models"


def fixtures() -> list[str]:
    found = [*MODELS.glob("*.onnx"), *MODELS.glob("*/*.onnx"), *MODELS.glob("*/*/model.onnx")]
    return sorted(str(p.relative_to(MODELS))[:-len(".onnx")] for p in found)


def feeds_for(apply_fn, data) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for info in apply_fn.inputs:
        dims = list(info.shape or ())
        if info.name in data:
            feeds[info.name] = data[info.name]
        elif info.name.startswith("past"):  # an empty self-attention cache; a cross-attention one of 8 positions
            feeds[info.name] = np.zeros([2, dims[1] if isinstance(dims[1], int) else 1, 8 if "encoder" in info.name
                                         else 0, dims[3] if isinstance(dims[3], int) else 16], np.float32)
        elif "attention_mask" in info.name:
            feeds[info.name] = np.ones((2, 8), np.int64)
        elif "token_type" in info.name:
            feeds[info.name] = np.zeros((2, 8), np.int64)
        elif "position" in info.name:
            feeds[info.name] = np.tile(np.arange(8), (2, 1))
        elif np.dtype(info.dtype).kind in "iu":
            feeds[info.name] = rng.integers(3, 90, (2, 8)).astype(np.int64)
        else:
            shape = [d if isinstance(d, int) else (2 if i == 0 else 8) for i, d in enumerate(dims)]
            feeds[info.name] = (rng.standard_normal(shape).astype(info.dtype) if np.dtype(info.dtype).kind == "f"
                                else np.zeros(shape, info.dtype))
    return feeds


def row(name: str) -> list[str]:
    import optkit.onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_fn, params = optkit.onnx.to_jax(str(MODELS / f"{name}.onnx"), scan_layers=True)
    npz = MODELS / f"{name}.npz"
    feeds = feeds_for(apply_fn, np.load(npz) if npz.exists() else {})

    # a boolean input (Optimum's use_cache_branch) is closed over, as a caller does: the If picks its branch
    flags = {k: v for k, v in feeds.items() if np.asarray(v).dtype == bool}
    feeds = {k: v for k, v in feeds.items() if k not in flags}

    def loss(p, f):
        out = apply_fn(p, {**f, **flags})
        out = out if isinstance(out, tuple) else (out,)
        return sum(jnp.mean(o.astype(jnp.float32) ** 2) for o in out if jnp.issubdtype(o.dtype, jnp.floating))

    try:
        want = jax.jit(jax.value_and_grad(loss))(params, feeds)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the feeds this script makes do not fit
        return [name, "", f"not run: one device raised {type(err).__name__}: {str(err).splitlines()[0][:120]}", ""]
    scale = max([1e-30, *(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want))])
    half = any(jnp.dtype(v.dtype) == jnp.float16 for v in jax.tree.leaves(params))
    tolerance = 2e-3 if half else 1e-4  # (float16 sums of another order differ by their own rounding)
    cells = []
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
        try:
            with jax.set_mesh(mesh):
                sharded = {k: jax.device_put(v, NamedSharding(mesh, P("data" if np.ndim(v) and np.shape(v)[0] % 2 == 0
                                                                          and np.shape(v)[0] else None)))
                           for k, v in feeds.items()}
                got = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, NamedSharding(mesh, P())), sharded)
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
            cells.append(f"{'ok' if err <= tolerance * scale else 'DIFF'} ({err / scale:.1e})")
        except Exception as e:  # noqa: BLE001 - the row says what failed
            cells.append(f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return [name, "scanned" if apply_fn._layers else "", *cells]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="paths under tests/onnx/models without .onnx (default: all)")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, {len(jax.devices())} devices; difference / largest gradient\n")
    print("| export | layers | explicit axes (default) | auto axes |")
    print("|---|---|---|---|")
    for name in args.models or fixtures():
        print("| " + " | ".join(row(name)) + " |", flush=True)


if __name__ == "__main__":
    main()
