"""Train the transformer data- and model-parallel on 8 simulated devices: optkit.adafactor vs optkit.adam.

The character-level transformer of ``examples/transformer.py`` (the Adafactor
example's model, on the same text: Python's ``pydoc_data.topics``) is built
with Flax NNX sharding annotations (``nnx.with_partitioning``, the
Megatron-style table ``MEGATRON_PARTITIONING``) inside ``jax.set_mesh`` on a
2x4 mesh of CPU devices: batches are split along ``data``, kernels, embeddings
and the column-parallel biases along ``model``. JAX's SPMD partitioner does
all the distributed work; optkit's state follows the parameters' sharding:
``jax.jit(tx.init)(params)`` gives every full-size state leaf its parameter's
``NamedSharding`` and Adafactor's row/column statistics the parameter's
``PartitionSpec`` without the reduced axis.

The script trains the same model from the same weights and batches with each
optimizer and prints the per-device bytes of the parameters and of each
optimizer's state (the bytes that each device actually holds, summed over its
shards), the losses and the median step time.

The 8 devices are simulated on the host CPU: ``XLA_FLAGS`` gets
``--xla_force_host_platform_device_count=8`` before JAX starts (when the
flag is not there already); if JAX was started earlier with fewer devices, the
script runs itself again in a fresh process. On a machine with 8 accelerators
nothing is simulated: the same code runs on them.

Run from the repository root (about a minute on 2 CPU cores)::

    python examples/sharded_training.py
    python examples/sharded_training.py --steps 200 --d-model 256 --layers 4
"""

from __future__ import annotations

import os
import subprocess
import sys

NUM_DEVICES = 8
MESH_SHAPE = (2, 4)  # (data, model)
_FLAG = "--xla_force_host_platform_device_count"

if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}={NUM_DEVICES}".strip()

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tqdm import tqdm  # noqa: E402

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optkit  # noqa: E402
from examples.lm_adafactor import OUT_DIR, CharData, load_text  # noqa: E402
from examples.transformer import MEGATRON_PARTITIONING, Transformer, TransformerConfig, count_params  # noqa: E402


def devices() -> list:
    """The first 8 devices: the accelerators if there are 8, else (simulated) CPU devices."""
    if len(jax.devices()) >= NUM_DEVICES:
        return jax.devices()[:NUM_DEVICES]
    return jax.devices("cpu")[:NUM_DEVICES]


def per_device_bytes(tree) -> dict:
    """Bytes each device holds for the arrays of ``tree`` (its shards; a replicated array counts fully)."""
    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def logical_bytes(tree) -> int:
    """Bytes of one copy of every array of ``tree``."""
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def train(name, tx, graphdef, params, loss_fn, eval_loss, data, mesh, args):
    """Train ``params`` (donated) with ``tx`` on ``mesh``; returns a record of the run."""
    param_shardings = jax.tree.map(lambda a: a.sharding, params)
    opt_state = jax.jit(tx.init)(params)  # sharded like the parameters
    state_shardings = jax.tree.map(lambda a: a.sharding, opt_state)
    batch_sharding = NamedSharding(mesh, P("data", None))

    # With Auto mesh axes XLA chooses the step's output shardings; pinning them to the
    # inputs' keeps every step's layout that of the first (and lets donation reuse buffers).
    @functools.partial(jax.jit, donate_argnums=(0, 1),
                       out_shardings=(param_shardings, state_shardings, NamedSharding(mesh, P())))
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    record = {"name": name, "param_bytes": per_device_bytes(params), "state_bytes": per_device_bytes(opt_state),
              "state_logical_bytes": logical_bytes(opt_state)}
    batch_rng = np.random.default_rng(args.seed)  # the same batches for every optimizer
    losses, seconds = [], []
    for step in tqdm(range(args.steps), desc=name, unit="step"):
        x, y = (jax.device_put(a, batch_sharding) for a in data.batch(batch_rng, args.batch_size))
        start = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, x, y)
        losses.append(float(loss))  # waits for the step
        if step:  # the first step compiles
            seconds.append(time.perf_counter() - start)
    val = [data.batch(np.random.default_rng(1000 + i), args.batch_size, "val") for i in range(2)]
    record.update(
        losses=losses,
        val_loss=float(np.mean([float(eval_loss(params, *(jax.device_put(a, batch_sharding) for a in b)))
                                for b in val])),
        step_ms=1e3 * statistics.median(seconds) if seconds else float("nan"),
        params_kept_sharding=all(a.sharding == s for a, s in zip(jax.tree.leaves(params),
                                                                  jax.tree.leaves(param_shardings))),
        state_kept_sharding=all(a.sharding == s for a, s in zip(jax.tree.leaves(opt_state),
                                                                jax.tree.leaves(state_shardings))),
        params=params,
        opt_state=opt_state,
    )
    return record


def train_nnx(cfg, data, mesh, args):
    """The Flax NNX way: ``nnx.Optimizer(model, optkit.adafactor(), wrt=nnx.Param)`` on the partitioned
    model itself, stepped with ``nnx.jit``. Each state variable carries its parameter's sharding
    names (reduced by the factored axis for the row and column statistics)."""
    batch_sharding = NamedSharding(mesh, P("data", None))
    model = Transformer(cfg, rngs=nnx.Rngs(args.seed))  # inside jax.set_mesh: the annotations shard it
    optimizer = nnx.Optimizer(model, optkit.adafactor(), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    opt_state = nnx.as_pure(optimizer.opt_state)
    record = {"name": "nnx.Optimizer(optkit.adafactor())", "state_bytes": per_device_bytes(opt_state),
              "state_logical_bytes": logical_bytes(opt_state)}
    batch_rng = np.random.default_rng(args.seed)
    losses, seconds = [], []
    for step in tqdm(range(args.steps), desc=record["name"], unit="step"):
        x, y = (jax.device_put(a, batch_sharding) for a in data.batch(batch_rng, args.batch_size))
        start = time.perf_counter()
        losses.append(float(train_step(model, optimizer, x, y)))
        if step:
            seconds.append(time.perf_counter() - start)
    kernel = nnx.as_pure(optimizer.opt_state)[0].nu["blocks"][0]["mlp"]["up"]["kernel"]
    names = optimizer.opt_state[0].nu["blocks"][0]["mlp"]["up"]["kernel"].v_col.get_metadata()["out_sharding"]
    print(f"nnx.Optimizer: mlp_up kernel's column statistics {kernel.v_col.shape}, sharded "
          f"{kernel.v_col.sharding.spec}, metadata out_sharding={names}")
    record.update(losses=losses, step_ms=1e3 * statistics.median(seconds) if seconds else float("nan"))
    return record


def _rerun_with_simulated_devices(argv) -> None:
    """JAX started before the flag could take effect: run this script again in a fresh process."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{_FLAG}={NUM_DEVICES}"])
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "examples.sharded_training", *(sys.argv[1:] if argv is None else argv)]
    subprocess.run(command, cwd=root, env=env, check=True)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="training steps per optimizer")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch, split along 'data'")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    parser.add_argument("--adam-lr", type=float, default=2e-3, help="optkit.adam's learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    parser.add_argument("--out", default=OUT_DIR, help="folder for the PNG")
    args = parser.parse_args(argv)

    if len(devices()) < NUM_DEVICES:
        _rerun_with_simulated_devices(argv)  # it prints the tables; its runs stay in that process
        return []
    mesh = jax.make_mesh(MESH_SHAPE, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=devices())
    model_size = mesh.shape["model"]

    data = CharData(load_text(), args.seq_len)
    vocab = -(-len(data.chars) // model_size) * model_size  # the head's vocabulary axis is split along 'model'
    cfg = TransformerConfig(vocab_size=vocab, d_model=args.d_model, num_heads=args.heads, num_layers=args.layers,
                            max_len=args.seq_len, partitioning=MEGATRON_PARTITIONING)
    @jax.jit
    def init_params(key):
        """The model's parameters as plain arrays; nnx.with_partitioning gives each its NamedSharding."""
        return nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(key)), nnx.Param))

    def loss_fn(params, x, y):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    with jax.set_mesh(mesh):  # the mesh that nnx.with_partitioning's axis names refer to
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        key = jax.random.key(args.seed)
        params = init_params(key)
        print(f"mesh: {dict(mesh.shape)} on {len(mesh.devices.flat)} {mesh.devices.flat[0].platform} devices; "
              f"model: {count_params(params):,} parameters, vocabulary {len(data.chars)} padded to {vocab}")
        eval_loss = jax.jit(loss_fn)
        runs = []
        for name, tx in [("optkit.adafactor()", optkit.adafactor()),
                         (f"optkit.adam({args.adam_lr:g})", optkit.adam(args.adam_lr))]:
            # the same weights for each optimizer, made afresh: the steps donate them
            params = params if not runs else init_params(key)
            runs.append(train(name, tx, graphdef, params, loss_fn, eval_loss, data, mesh, args))
        nnx_run = train_nnx(cfg, data, mesh, args)
    param_bytes = runs[0]["param_bytes"]
    print(f"\n## Bytes per device ({MESH_SHAPE[0]}x{MESH_SHAPE[1]} mesh: data x model)\n")
    print("| tree | one copy (bytes) | per device, max (bytes) | per device, min (bytes) "
          "| per device / parameters per device |")
    print("|---|---|---|---|---|")
    print(f"| parameters | {logical_bytes(runs[0]['params']):,} | {max(param_bytes.values()):,} | "
          f"{min(param_bytes.values()):,} | 1.000 |")
    for run in runs:
        held = run["state_bytes"]
        print(f"| {run['name']} state | {run['state_logical_bytes']:,} | {max(held.values()):,} | "
              f"{min(held.values()):,} | {max(held.values()) / max(param_bytes.values()):.3f} |")

    print(f"\n## Training ({args.steps} steps, global batch {args.batch_size} x {args.seq_len} characters)\n")
    print("| optimizer | first loss | train loss (last 5 steps) | validation loss | step time (median ms) "
          "| shardings kept (params, state) |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        print(f"| {run['name']} | {run['losses'][0]:.3f} | {np.mean(run['losses'][-5:]):.3f} | "
              f"{run['val_loss']:.3f} | {run['step_ms']:.1f} | "
              f"{run['params_kept_sharding']}, {run['state_kept_sharding']} |")
    held = nnx_run["state_bytes"]
    print(f"| {nnx_run['name']} | {nnx_run['losses'][0]:.3f} | {np.mean(nnx_run['losses'][-5:]):.3f} | - | "
          f"{nnx_run['step_ms']:.1f} | state bytes per device {max(held.values()):,} |")
    plot(runs + [nnx_run], os.path.join(args.out, "sharded_training_loss.png"), mesh)
    return runs + [nnx_run]


def plot(runs, path: str, mesh) -> None:
    """Each run's training loss, with its optimizer-state bytes per device in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for run in runs:
        held = max(run["state_bytes"].values())
        ax.plot(run["losses"], label=f"{run['name']} (state {held:,} B/device)",
                ls="--" if run["name"].startswith("nnx") else "-")
    ax.set(xlabel="step", ylabel="training loss", title=f"data- and model-parallel on mesh {dict(mesh.shape)}")
    ax.xaxis.get_major_locator().set_params(integer=True)
    # Below the axes: inside them the legend covered the first steps (Adam's early spike).
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
