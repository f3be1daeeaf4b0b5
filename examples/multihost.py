"""Train on several hosts at once: 2 localhost processes x 4 CPU devices, one mesh across both.

A TPU slice is several hosts, each with its own devices and its own Python
process running the same program. This script makes that on one machine: it
starts ``--processes`` copies of itself on localhost (the *workers*), each
with ``--devices-per-process`` simulated CPU devices, and they join one JAX
cluster with ``jax.distributed.initialize`` (coordinator on 127.0.0.1). On a
real cluster each host runs the worker part and nothing is simulated.

Each worker builds a ``(data, model)`` mesh over all 8 devices whose ``model``
axis spans both processes, creates a 64-256-10 MLP's parameters sharded
along ``model`` (each process materializes only its own shards), and trains it
on scikit-learn's digits, the batch split along ``data``, with
``optkit.adam`` and then ``optkit.adafactor``: jitted, donated steps whose
output shardings are pinned to the parameters' and the state's. optkit needs
nothing for this: its state follows the parameters' shardings (Adafactor's
row and column statistics with the reduced axis dropped), and XLA inserts
the communication, across processes too.

At the end every worker saves the trained parameters and optimizer state with
Orbax (each process writes its own shards), restores them onto a different
mesh (``model`` inside each process), checks that the restored arrays are the
saved ones bit for bit, and process 0 writes the gathered arrays (``.npz``),
the checkpoints and a loss plot to ``--out``.

The launcher reserves the coordinator's port for the whole run, shortens
JAX's initialization, heartbeat and collective timeouts, and kills every
worker as soon as one fails, or all of them after ``--timeout`` seconds, so a
dead or stalled worker never leaves processes behind.

With ``--onnx`` the model is instead the MLP that torch.onnx exported
(``tests/onnx/models/torch_torchscript_mlp.onnx``, 64-32-10), made a JAX function by
:func:`optkit.onnx.to_jax`: data parallel, its parameters replicated and the
batch split over all 8 devices of both processes. With ``--zero1`` the optimizer
state is split over the ``data`` axis as well (ZeRO stage 1,
:func:`optkit.state_sharding`): with replicated parameters each device then holds
a fraction of Adam's moments instead of all of them, and the step's pinned output
shardings keep it so; the checkpoint restores onto the other mesh the same way.

Run from the repository root (about 30 s on 2 CPU cores)::

    python examples/multihost.py
    python examples/multihost.py --steps 20 --out /tmp/multihost
    python examples/multihost.py --onnx       # the exported ONNX model, data parallel
    python examples/multihost.py --onnx --zero1   # ... with the optimizer state split over data
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "multihost")
OPTIMIZERS = ("adam", "adafactor")
# name: (shape, PartitionSpec entries); Megatron-style: the hidden layer is split along "model".
PARAMS = {
    "w1": ((64, 256), (None, "model")),
    "b1": ((256,), ("model",)),
    "w2": ((256, 10), ("model", None)),
    "b2": ((10,), ()),
}
BATCH = 32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONNX_MODEL = os.path.join(ROOT, "tests", "onnx", "models", "torch_torchscript_mlp.onnx")  # 64 -> 32 -> 10, torch.onnx
_FAULT = "OPTKIT_MULTIHOST_FAULT"  # tests: "exit:<process>" or "stall:<process>"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="training steps per optimizer (default 8)")
    parser.add_argument("--batch-size", type=int, default=BATCH, help=f"global batch size (default {BATCH})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial parameters (default 0)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default examples/out/multihost)")
    parser.add_argument("--processes", type=int, default=2, help="number of localhost processes (default 2)")
    parser.add_argument("--devices-per-process", type=int, default=4, help="CPU devices per process (default 4)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds before every worker is killed (default 300)")
    parser.add_argument("--onnx", action="store_true",
                        help=f"train the exported ONNX MLP ({os.path.relpath(ONNX_MODEL, ROOT)}) through "
                             "optkit.onnx.to_jax, data parallel, instead of the sharded MLP")
    parser.add_argument("--zero1", action="store_true",
                        help="split the optimizer state over the data axis (ZeRO-1: optkit.state_sharding) "
                             "instead of sharding it like the parameters")
    parser.add_argument("--verbose", action="store_true",
                        help="show the collectives library's connection lines ([Gloo] ...) too")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------ the launcher


def reserve_port() -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket on a free loopback port.

    JAX's coordinator (gRPC) binds with SO_REUSEPORT, so it can bind this
    port while the socket holds it; holding it for the whole run keeps a
    concurrent job from being handed the same "free" port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _kill(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.wait()


def _forward(stream, verbose: bool) -> None:
    """Copy a worker's stdout to ours, without Gloo's per-peer connection lines unless ``verbose``."""
    for line in iter(stream.readline, b""):
        if verbose or not line.startswith(b"[Gloo]"):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
    stream.close()


def launch(args, argv) -> int:
    """Start the workers and wait for all of them; 0 if every worker succeeded."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f and "collective_timeout" not in f]
    # A collective whose peer died or stalls fails after 60 s instead of hanging.
    flags += [f"--xla_force_host_platform_device_count={args.devices_per_process}",
              "--xla_cpu_collective_timeout_seconds=60"]
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    with reserve_port() as sock:
        port = sock.getsockname()[1]
        command = [sys.executable, os.path.abspath(__file__), *argv, "--port", str(port)]
        procs, forwarders = [], []
        try:
            for i in range(args.processes):
                procs.append(subprocess.Popen([*command, "--worker", str(i)], env=env, start_new_session=True,
                                              stdout=subprocess.PIPE))
                forwarders.append(threading.Thread(target=_forward, args=(procs[-1].stdout, args.verbose),
                                                   daemon=True))
                forwarders[-1].start()
            deadline = time.monotonic() + args.timeout
            while True:
                codes = [proc.poll() for proc in procs]
                failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    print(f"worker {failed[0][0]} exited with {failed[0][1]}: stopping the others", file=sys.stderr)
                    return 1
                if all(c == 0 for c in codes):
                    return 0
                if time.monotonic() > deadline:
                    print(f"the workers did not finish in {args.timeout:g} s: stopping them", file=sys.stderr)
                    return 1
                time.sleep(0.05)
        finally:
            _kill(procs)
            for thread in forwarders:
                thread.join(timeout=5)


# ------------------------------------------------------------------ the model (also the tests' one-device reference)


def initial_params(seed: int):
    """The MLP's parameters as NumPy arrays (the same on every process)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) / np.sqrt(shape[0]) if len(shape) == 2 else np.zeros(shape))
            .astype(np.float32) for name, (shape, _) in PARAMS.items()}


def loss_fn(params, x, y):
    import jax
    import jax.numpy as jnp
    import optax

    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def onnx_model():
    """``(apply_fn, params)`` of the exported MLP by :func:`optkit.onnx.to_jax`, its batch size left free
    (the export fixed it at 4); ``params`` are NumPy arrays, the same on every process."""
    import numpy as np

    import optkit.onnx

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from examples.onnx_finetune import any_batch

    apply_fn, params = optkit.onnx.to_jax(any_batch(optkit.onnx.load_model(ONNX_MODEL)))
    return apply_fn, {name: np.asarray(value) for name, value in params.items()}


def model(onnx: bool, seed: int):
    """``(initial parameters, loss_fn, {name: PartitionSpec entries}, batch PartitionSpec entries)``.

    The MLP: its hidden layer split along ``model``, the batch along ``data``.
    The exported ONNX MLP: data parallel, every parameter replicated and the
    batch split over both axes (all 8 devices, across the processes)."""
    if not onnx:
        return initial_params(seed), loss_fn, {name: spec for name, (_, spec) in PARAMS.items()}, ("data",)
    import jax.numpy as jnp
    import optax

    apply_fn, params = onnx_model()

    def onnx_loss(p, x, y):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y))

    return params, onnx_loss, {name: () for name in params}, (("data", "model"),)


def batches(steps: int, batch_size: int):
    """The same ``steps`` digits batches on every process: scaled 8x8 images and labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(1).permutation(len(x))
    for i in range(steps):
        idx = order[(i * batch_size) % len(x):][:batch_size]
        yield x[idx], y[idx].astype(np.int32)


def make_optimizer(name: str):
    import optkit

    return {"adam": lambda: optkit.adam(1e-2), "adafactor": lambda: optkit.adafactor(1e-2)}[name]()


def make_step(tx, loss=loss_fn, **jit_kwargs):
    import jax
    import optax

    def step(params, state, x, y):
        loss_value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss_value

    return jax.jit(step, donate_argnums=(0, 1), **jit_kwargs)


def names_of(tree) -> dict:
    """``{keystr(path): leaf}`` for every leaf: how the gathered arrays are saved."""
    import jax

    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ------------------------------------------------------------------ the worker


def worker(args) -> None:
    import jax

    fault = os.environ.get(_FAULT, "")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        coordinator_bind_address=f"127.0.0.1:{args.port}",  # not every interface
        num_processes=args.processes,
        process_id=args.worker,
        initialization_timeout=60,
        heartbeat_timeout_seconds=30,
        shutdown_timeout_seconds=30,
    )
    if fault == f"exit:{args.worker}":
        os._exit(3)
    if fault == f"stall:{args.worker}":
        time.sleep(3600)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import AxisType, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from tqdm import tqdm

    import optkit

    me = jax.process_index()
    main = me == 0
    out = os.path.abspath(args.out)
    devices = np.array(jax.devices())  # process 0's devices, then process 1's
    # (data, model) with model across the processes: each row holds devices of every process.
    mesh = Mesh(devices.reshape(-1, args.processes).T, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    # The mesh checkpoints are restored onto: the model axis inside each process.
    other = Mesh(devices.reshape(args.processes, -1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    start, objective, specs, batch_spec = model(args.onnx, args.seed)
    param_shardings = {name: NamedSharding(mesh, P(*spec)) for name, spec in specs.items()}
    data_sharding = NamedSharding(mesh, P(*batch_spec))
    replicated = NamedSharding(mesh, P())

    def global_array(value, sharding):
        """A global array from a value every process holds whole; each places only its own shards."""
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def gather(tree, on=mesh):
        """Every array whole on every process (read locally as addressable_data(0))."""
        tree = jax.block_until_ready(jax.jit(lambda t: t, out_shardings=NamedSharding(on, P()))(tree))
        return jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), tree)

    data = list(batches(args.steps, args.batch_size))
    losses = {}
    if main:
        print(f"{jax.process_count()} processes, {len(jax.devices())} devices, mesh {dict(mesh.shape)}; "
              f"the model axis spans processes {sorted({d.process_index for d in mesh.devices[0]})}; "
              + (f"the exported {os.path.basename(ONNX_MODEL)}, data parallel" if args.onnx else "an MLP")
              + ("; optimizer state split over data (ZeRO-1)" if args.zero1 else ""))
    for name in OPTIMIZERS:
        tx = make_optimizer(name)
        params = {k: global_array(v, param_shardings[k]) for k, v in start.items()}
        state = jax.jit(tx.init)(params)
        if args.zero1:  # ZeRO-1: each state leaf split over "data" too, where a dimension allows it
            state = jax.jit(lambda s: s, out_shardings=optkit.state_sharding(state, mesh, "data"))(state)
        shardings = jax.tree.map(lambda a: a.sharding, (params, state))
        step = make_step(tx, objective, out_shardings=(*shardings, replicated))
        losses[name] = []
        for x, y in tqdm(data, desc=f"{name} (process {me})", disable=not main, ncols=80):
            params, state, loss = step(params, state, global_array(x, data_sharding), global_array(y, data_sharding))
            losses[name].append(float(np.asarray(loss.addressable_data(0))))
        trained = {"params": params, "opt_state": state}
        gathered = gather(trained)

        # Orbax: every process writes its own shards; then restore onto another mesh and compare.
        path = os.path.join(out, f"checkpoint_{name}")
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path, trained, force=True)
            checkpointer.wait_until_finished()
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=NamedSharding(other, a.sharding.spec)), trained)
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(path, target)
        same = jax.tree.map(np.array_equal, gather(restored, other), gathered)
        if not all(jax.tree.leaves(same)):
            raise AssertionError(f"{name}: the checkpoint restored onto mesh {dict(other.shape)} differs")
        if main:
            np.savez(os.path.join(out, f"trained_{name}.npz"), **names_of(gathered))
            specs = {k: [list(e) if isinstance(e, tuple) else e for e in a.sharding.spec]
                     for k, a in names_of(trained).items()}
            with open(os.path.join(out, f"shardings_{name}.json"), "w") as f:
                json.dump(specs, f, indent=1)
            print(f"{name}: loss {losses[name][0]:.4f} -> {losses[name][-1]:.4f}; checkpoint saved by "
                  f"{jax.process_count()} processes and restored bit for bit onto mesh {dict(other.shape)}")
    if main:
        np.savez(os.path.join(out, "losses.npz"), **{k: np.array(v) for k, v in losses.items()})
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, values in losses.items():
            ax.plot(values, label=f"optkit.{name}")
        ax.set(xlabel="step", ylabel="training loss", title=f"{jax.process_count()} processes, mesh "
               f"{dict(mesh.shape)}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "multihost_loss.png"), dpi=100)
        print(f"wrote {out}")
    jax.distributed.shutdown()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker is None:
        os.makedirs(args.out, exist_ok=True)
        return launch(args, argv)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
