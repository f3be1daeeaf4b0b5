"""Sharding: per-device optimizer-state bytes for the transformer tree on a 2x4 mesh, Adafactor vs Adam.

The parameter tree is ``examples/transformer.py``'s, sharded with its
Megatron-style table (``MEGATRON_PARTITIONING``: kernels and embeddings split
along ``model``, layer norms and row-parallel biases replicated) on a 2x4
(``data``, ``model``) mesh of simulated CPU devices. Nothing is allocated: the
parameters are ``jax.ShapeDtypeStruct``s with their ``NamedSharding``s, the
state's shapes come from ``jax.eval_shape(tx.init, params)`` and its
shardings from the compiled ``jax.jit(tx.init)``; a device's bytes are the
sizes of the blocks that ``Sharding.devices_indices_map`` gives it (a
replicated array counts fully on every device).

One table: per optimizer, the state's bytes (one copy, per device, and per
device over the parameters' per device), and the collectives of the compiled
update step (``tx.update`` and ``optax.apply_updates``, gradients sharded like
the parameters): how many all-reduces and their largest result, and any
all-gather, all-to-all or collective-permute (there should be none).
``optax.adam`` is there for comparison: its ``init`` makes constants, which
XLA replicates under ``jax.jit`` with ``Auto`` mesh axes.

Run from the repository root (it sets ``XLA_FLAGS`` for 8 CPU devices itself,
in a fresh process if JAX was started with fewer)::

    python -m benchmarks.sharding           # the example's model and GPT-2 small size, under a minute
    python -m benchmarks.sharding --quick   # the example's model only (seconds; CI smoke test)
    python -m benchmarks.sharding --zero    # replicated vs ZeRO-1 vs FSDP bytes per device (optkit.state_sharding)
    python -m benchmarks.sharding --zero --exported model.onnx   # and an exported model's parameters
"""

from __future__ import annotations

import os
import subprocess
import sys

NUM_DEVICES = 8
MESH_SHAPE = (2, 4)
_FLAG = "--xla_force_host_platform_device_count"

if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}={NUM_DEVICES}".strip()

import argparse  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import optkit  # noqa: E402
from benchmarks._timing import markdown_table  # noqa: E402
from examples.lm_adafactor import load_text  # noqa: E402
from examples.transformer import MEGATRON_PARTITIONING, Transformer, TransformerConfig, count_params  # noqa: E402


def contenders() -> dict[str, optax.GradientTransformation]:
    return {
        "optkit.adafactor()": optkit.adafactor(),
        "optkit.adafactor(b1=0.9)": optkit.adafactor(b1=0.9),
        "optkit.adafactor(largest, min 128)": optkit.adafactor(factored_dims="largest", min_dim_size_to_factor=128),
        "optkit.adam": optkit.adam(1e-3),
        "optax.adam (comparison; its jit init: one device)": optax.adam(1e-3),
    }


def sharded_params(cfg: TransformerConfig, mesh) -> dict:
    """The transformer's parameters as ShapeDtypeStructs with their NamedShardings on ``mesh``."""
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    abstract = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, a.sharding.spec)), abstract
    )


def bytes_per_device(shapes, shardings, devices) -> dict:
    """Bytes of the blocks each of ``devices`` holds, for arrays of ``shapes`` (ShapeDtypeStructs) and ``shardings``."""
    held = {device: 0 for device in devices}
    for shape, sharding in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)):
        for device, index in sharding.devices_indices_map(shape.shape).items():
            size = int(np.prod([len(range(*s.indices(n))) for s, n in zip(index, shape.shape)]))
            held[device] = held.get(device, 0) + size * shape.dtype.itemsize
    return held


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(",
    re.M,
)


def collectives(hlo: str) -> dict[str, list[int]]:
    """Element counts of the (largest) results of each kind of collective in compiled HLO text."""
    found: dict[str, list[int]] = {}
    for result_type, kind in _COLLECTIVE.findall(hlo):
        dims = re.findall(r"[a-z]\w*\[([\d,]*)\]", result_type)
        found.setdefault(kind, []).append(
            max(int(np.prod([int(d) for d in ds.split(",") if d] or [1])) for ds in dims)
        )
    return found


def state_rows(configs, mesh, with_update: bool = True):
    rows = []
    for label, cfg in configs.items():
        params = sharded_params(cfg, mesh)
        param_shardings = jax.tree.map(lambda a: a.sharding, params)
        param_bytes = bytes_per_device(params, param_shardings, mesh.devices.flat)
        one_copy = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
        rows.append([label, f"{count_params(params):,}", "parameters", f"{one_copy:,}",
                     f"{max(param_bytes.values()):,}", f"{min(param_bytes.values()):,}", "1.000", ""])
        for name, tx in contenders().items():
            shapes = jax.eval_shape(tx.init, params)
            shardings = jax.jit(tx.init).lower(params).compile().output_shardings
            held = bytes_per_device(shapes, shardings, mesh.devices.flat)
            one_copy = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(shapes))
            comms = ""
            on_mesh = all(s.device_set == set(mesh.devices.flat) for s in jax.tree.leaves(shardings))
            if not on_mesh:
                comms = "(state not on the mesh: no sharded update)"
            elif with_update:
                state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)

                def update(params, state, grads, tx=tx):
                    updates, state = tx.update(grads, state, params)
                    return optax.apply_updates(params, updates), state

                hlo = jax.jit(update, donate_argnums=(0, 1)).lower(params, state, params).compile().as_text()
                found = collectives(hlo)
                reduces = found.pop("all-reduce", [])
                comms = f"{len(reduces)} all-reduce (largest {max(reduces, default=0):,} elements)"
                comms += "".join(f", **{len(v)} {k}** (largest {max(v):,})" for k, v in found.items())
            rows.append([label, "", name, f"{one_copy:,}", f"{max(held.values()):,}", f"{min(held.values()):,}",
                         f"{max(held.values()) / max(param_bytes.values()):.3f}", comms])
    return rows


def zero_rows(configs, devices):
    """Per-device state bytes of optkit.adam, optkit.adafactor and optkit.momentum on an 8-device ``data`` mesh:
    parameters and state replicated (plain data parallelism), the state split by ``optkit.state_sharding``
    (ZeRO-1), and the parameters split too (FSDP); the collectives of the compiled ZeRO-1 update."""
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = []
    for label, cfg in configs.items():
        if isinstance(cfg, str):  # an exported ONNX model: to_jax's params
            import optkit.onnx as optkit_onnx

            shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in optkit_onnx.to_jax(cfg)[1].items()}
        else:
            with jax.set_mesh(mesh):
                model = nnx.eval_shape(lambda cfg=cfg: Transformer(cfg, rngs=nnx.Rngs(0)))
            shapes = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), shapes)
        param_bytes = max(bytes_per_device(params, jax.tree.map(lambda a: a.sharding, params), devices).values())
        for name, tx in (("optkit.adam", optkit.adam(1e-3)), ("optkit.adafactor", optkit.adafactor()),
                         ("optkit.momentum", optkit.momentum(1e-3))):
            state = jax.eval_shape(tx.init, params)
            whole = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(state))
            zero = optkit.state_sharding(state, mesh)
            held = max(bytes_per_device(state, zero, devices).values())
            fsdp_params = optkit.state_sharding(params, mesh)
            fsdp_param_bytes = max(bytes_per_device(params, fsdp_params, devices).values())
            split_state = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), state, zero)

            def update(p, st, g, tx=tx):
                updates, st = tx.update(g, st, p)
                return optax.apply_updates(p, updates), st

            hlo = jax.jit(update, out_shardings=(jax.tree.map(lambda a: a.sharding, params), zero)).lower(
                params, split_state, params).compile().as_text()
            found = collectives(hlo)
            comms = ", ".join(f"{len(v)} {k} (largest {max(v):,})" for k, v in sorted(found.items())) or "none"
            rows.append([label, name, f"{whole:,}", f"{whole:,}", f"{held:,}", f"{held / whole:.3f}",
                         f"{param_bytes:,} -> {fsdp_param_bytes:,}", comms])
    return rows


def _rerun_with_simulated_devices(argv) -> None:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{_FLAG}={NUM_DEVICES}"])
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "benchmarks.sharding", *(sys.argv[1:] if argv is None else argv)]
    subprocess.run(command, cwd=root, env=env, check=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the example's model only (seconds)")
    parser.add_argument("--zero", action="store_true", help="replicated vs ZeRO-1 vs FSDP bytes per device on an "
                                                            "8-device data mesh (optkit.state_sharding)")
    parser.add_argument("--exported", nargs="*", default=[], metavar="MODEL.onnx",
                        help="with --zero: also these exported ONNX models' parameters (optkit.onnx.to_jax), e.g. "
                             "a DistilBERT written by torch.onnx")
    args = parser.parse_args(argv)
    try:
        cpu = jax.devices("cpu")
    except RuntimeError:
        cpu = []
    if len(cpu) < NUM_DEVICES:
        _rerun_with_simulated_devices(argv)
        return
    if args.zero:
        configs = {"example (d=128, 2 layers)": TransformerConfig(vocab_size=96, d_model=128, num_layers=2,
                                                                  max_len=64)}
        if not args.quick:
            configs["GPT-2 small size (d=768, 12 layers)"] = TransformerConfig(
                vocab_size=256, d_model=768, num_heads=12, num_layers=12, max_len=1024)
        for path in args.exported:
            configs[f"exported: {os.path.basename(path)}"] = path
        print(f"## ZeRO-1 and FSDP: optimizer state per device on {NUM_DEVICES} simulated devices, one 'data' axis "
              f"(jax {jax.__version__})\n")
        print(markdown_table(
            ["model", "optimizer", "state bytes (one copy)", "replicated: per device", "ZeRO-1: per device (max)",
             "ZeRO-1 / replicated", "FSDP parameters per device (replicated -> split)",
             "collectives in the compiled ZeRO-1 update"],
            zero_rows(configs, cpu[:NUM_DEVICES])))
        return
    mesh = jax.make_mesh(MESH_SHAPE, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=cpu[:NUM_DEVICES])
    model_size = mesh.shape["model"]
    vocab = -(-len(set(load_text())) // model_size) * model_size  # examples/sharded_training.py's padding
    configs = {
        "example (d=128, 2 layers)": TransformerConfig(vocab_size=vocab, d_model=128, num_layers=2, max_len=64,
                                                       partitioning=MEGATRON_PARTITIONING),
    }
    if not args.quick:
        configs["GPT-2 small size (d=768, 12 layers)"] = TransformerConfig(
            vocab_size=256, d_model=768, num_heads=12, num_layers=12, max_len=1024, partitioning=MEGATRON_PARTITIONING
        )
    print(f"## Optimizer state per device, {MESH_SHAPE[0]}x{MESH_SHAPE[1]} mesh (data x model), "
          f"transformer parameters sharded Megatron-style along 'model' (jax {jax.__version__}, "
          f"optax {optax.__version__}, {NUM_DEVICES} simulated CPU devices)\n")
    print(markdown_table(
        ["model", "parameters", "tree", "bytes (one copy)", "bytes per device (max)", "bytes per device (min)",
         "per device / parameters per device", "collectives in the compiled update"],
        state_rows(configs, mesh, with_update=True),
    ))


if __name__ == "__main__":
    main()
