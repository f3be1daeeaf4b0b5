"""An exported ONNX model trained data-parallel on 8 simulated CPU devices equals the same training on one.

``optkit.onnx.to_jax``'s ``apply_fn`` on a 4x2 ``(data, model)`` mesh with the batch sharded over
``data`` and the parameters replicated, and ``OnnxModule`` in ``nnx.Optimizer`` on the same mesh
with the weight matrices sharded along ``model`` by a sharding rule: three jitted steps of ``optkit.adafactor`` and an
``optax.adamw`` chain give the one-device parameters (within 1e-5 relative, float32), and the parameters
keep their shardings. Runs in a child process with 8 devices when the suite has fewer (tests/_devices.py).
"""

from __future__ import annotations

import jax
import pytest

from tests._devices import has_devices, rerun_in_child
from tests.onnx.helpers import ONNX_TESTS

pytest.importorskip("onnx")

if not has_devices():
    test_onnx_jax_on_8_simulated_cpu_devices = rerun_in_child(__file__)

else:
    import contextlib
    import warnings

    import chex
    import jax.numpy as jnp
    import numpy as np
    import onnx
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import optkit
    import optkit.onnx

    MODEL = ONNX_TESTS / "models" / "torch_torchscript_mlp"
    OPTIMIZERS = {
        "optkit.adafactor": lambda: optkit.adafactor(1e-2),
        "optax.adamw chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
    }

    def _data():
        data = np.load(f"{MODEL}.npz")
        # The export's batch is fixed at 4: one row per device of the data axis.
        return onnx.load(f"{MODEL}.onnx"), data["input"], (data["output"] + 0.1).astype(np.float32)

    def _plain_steps(apply_fn, params, tx, x, y, steps=3, shardings=None):
        def loss(p, x, y):
            return jnp.mean((apply_fn(p, x) - y) ** 2)

        def step(p, state, x, y):
            grads = jax.grad(loss)(p, x, y)
            updates, state = tx.update(grads, state, p)
            return optax.apply_updates(p, updates), state

        step = jax.jit(step) if shardings is None else jax.jit(step, in_shardings=shardings)
        state = tx.init(params)
        for _ in range(steps):
            params, state = step(params, state, x, y)
        return params

    @pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
    def test_data_parallel_steps_equal_one_device(optimizer):
        model, x, y = _data()
        apply_fn, params = optkit.onnx.to_jax(model)
        want = _plain_steps(apply_fn, params, OPTIMIZERS[optimizer](), x, y)
        mesh = jax.make_mesh((4, 2), ("data", "model"))  # the parameters replicated over all 8 devices
        batch = NamedSharding(mesh, P("data"))
        replicated = NamedSharding(mesh, P())
        sharded_x, sharded_y = jax.device_put(x, batch), jax.device_put(y, batch)
        placed = jax.device_put(params, replicated)
        got = _plain_steps(apply_fn, placed, OPTIMIZERS[optimizer](), sharded_x, sharded_y,
                           shardings=(replicated, replicated, batch, batch))
        chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
        assert all(v.sharding.is_fully_replicated for v in got.values())

    def _rule(name, shape):
        """Weight matrices split along their last axis over ``model``; the rest replicated."""
        return (None, "model") if len(shape) == 2 and shape[-1] % 2 == 0 else None

    def _module_steps(model, rule, tx, mesh, x, y, steps=3):
        """``OnnxModule(model, sharding=rule)`` built under ``jax.set_mesh(mesh)`` and trained ``steps`` jitted
        ``nnx.Optimizer`` steps on the batch split over ``data``: ``(module, optimizer)``."""
        with jax.set_mesh(mesh):
            module = optkit.onnx.OnnxModule(model, sharding=rule)
            optimizer = nnx.Optimizer(module, tx, wrt=nnx.Param)
            batch = NamedSharding(mesh, P("data"))

            @nnx.jit
            def step(module, optimizer, x, y):
                grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(module)
                optimizer.update(module, grads)

            for _ in range(steps):
                step(module, optimizer, jax.device_put(x, batch), jax.device_put(y, batch))
        return module, optimizer

    @pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
    def test_onnx_module_on_a_data_model_mesh_equals_one_device(optimizer):
        model, x, y = _data()
        apply_fn, params = optkit.onnx.to_jax(model)
        want = _plain_steps(apply_fn, params, OPTIMIZERS[optimizer](), x, y)
        mesh = jax.make_mesh((4, 2), ("data", "model"))
        module, _ = _module_steps(model, _rule, OPTIMIZERS[optimizer](), mesh, x, y)
        got = {name: param[...] for name, param in module.params.items()}
        chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
        split = [name for name, value in got.items() if _rule(name, value.shape)]
        assert split, "the rule split no parameter"
        for name in split:
            assert got[name].sharding.spec == P(None, "model"), (name, got[name].sharding)

    @pytest.mark.parametrize("axis_types", ["explicit", "auto"])
    def test_onnx_module_fully_sharded_over_data_equals_one_device(axis_types):
        """FSDP: ``OnnxModule(model, sharding=optkit.fsdp_rule(mesh))`` splits each weight over ``data`` as the
        batch is, and its optimizer state follows; three ``nnx.Optimizer`` steps equal one device's. On the
        explicit mesh the module gathers each weight where it is used; on the Auto mesh XLA does."""
        model, x, y = _data()
        apply_fn, params = optkit.onnx.to_jax(model)
        want = _plain_steps(apply_fn, params, OPTIMIZERS["optkit.adafactor"](), x, y)
        kind = jax.sharding.AxisType.Explicit if axis_types == "explicit" else jax.sharding.AxisType.Auto
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
        module, optimizer_ = _module_steps(model, optkit.fsdp_rule(mesh), OPTIMIZERS["optkit.adafactor"](), mesh, x, y)
        got = {name: param[...] for name, param in module.params.items()}
        chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
        split = {name for name, value in got.items() if "data" in value.sharding.spec}
        # every weight matrix and the 32-wide bias; the 10-wide one is not divisible over 4 devices
        assert split == {name for name, value in got.items() if any(d % 4 == 0 for d in value.shape)}, split
        assert {name for name, value in got.items() if value.ndim == 2} <= split and len(split) < len(got)
        state = [leaf for leaf in jax.tree.leaves(nnx.state(optimizer_, nnx.optimizer.OptState))
                 if getattr(leaf, "ndim", 0) >= 1]
        assert any("data" in leaf.sharding.spec for leaf in state)  # the state follows the weights

    def test_a_transformer_with_an_embedding_lookup_trains_data_parallel_on_the_default_mesh():
        """A BERT exported by torch.onnx (dynamo): its token embedding is a Gather of int64 ids, which JAX's
        default (explicit) mesh axes require an output sharding for; under ``jax.set_mesh`` with the batch of
        ids sharded over ``data`` a jitted ``value_and_grad`` and Optax step equal one device's."""
        path = ONNX_TESTS / "models" / "torch_dynamo_bert"
        ids = np.load(f"{path}.npz")["input"]  # (2, 8) int64: one row per device of a 2-device data axis
        apply_fn, params = optkit.onnx.to_jax(f"{path}.onnx", untie=True)
        tx = optax.adamw(1e-3)

        def step(p, state, ids):
            value, grads = jax.value_and_grad(lambda p: jnp.mean(apply_fn(p, ids) ** 2))(p)
            updates, state = tx.update(grads, state, p)
            return optax.apply_updates(p, updates), state, value

        p1, _, v1 = jax.jit(step)(params, tx.init(params), ids)
        mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
        with jax.set_mesh(mesh):
            sharded = jax.device_put(ids, NamedSharding(mesh, P("data")))
            placed = jax.device_put(params, NamedSharding(mesh, P()))
            p2, _, v2 = jax.jit(step)(placed, tx.init(placed), sharded)
            out = jax.jit(apply_fn)(p2, sharded)
        np.testing.assert_allclose(float(v2), float(v1), rtol=1e-6)
        chex.assert_trees_all_close(p2, p1, rtol=1e-5, atol=1e-6)
        assert out.sharding.spec[0] == "data"  # the activations stay split by the batch

    @pytest.mark.parametrize("name, devices, stacked", [("torch_dynamo_bert", 2, False), ("torch_dynamo_bert", 2, True),
                                                        ("torch_torchscript_mlp", 4, False)])
    def test_apply_fn_gathers_fsdp_split_params_where_they_are_used(name, devices, stacked):
        """Issue 63, item 5: ``apply_fn`` given parameters split over ``data`` like the batch
        (``optkit.state_sharding(params, mesh, "data")``, FSDP) and no gather in the loss: each parameter is
        all-gathered where the model uses it (not an invalid spec of optkit's making: the Gather of a table split
        over ``data`` by ids split over ``data`` asked for ``P('data', None, 'data')``); the parameters stay split,
        and a jitted ``value_and_grad`` and SGD step equal one device's (SGD: Adam's normalization would magnify
        the rounding noise of gradients that are zero in exact arithmetic, as the attention keys' biases'). With
        ``stacked_params``, the scanned layers' stacked weights are split so (their layer axis where it divides)."""
        path = ONNX_TESTS / "models" / name
        x = np.load(f"{path}.npz")["input"]
        apply_fn, params = optkit.onnx.to_jax(f"{path}.onnx", untie=True, scan_layers=stacked, stacked_params=stacked)
        assert bool(apply_fn.stacked) is stacked
        tx = optax.sgd(0.1)

        def step(p, state, x):
            value, grads = jax.value_and_grad(lambda p: jnp.mean(apply_fn(p, x) ** 2))(p)
            updates, state = tx.update(grads, state, p)
            return optax.apply_updates(p, updates), state, value

        p1, _, v1 = jax.jit(step)(params, tx.init(params), x)
        mesh = jax.make_mesh((devices,), ("data",), devices=jax.devices()[:devices])
        with jax.set_mesh(mesh):
            split = jax.device_put(params, optkit.state_sharding(params, mesh, "data"))
            assert any("data" in leaf.sharding.spec for leaf in jax.tree.leaves(split))
            sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
            p2, _, v2 = jax.jit(step)(split, tx.init(split), sharded)
        np.testing.assert_allclose(float(v2), float(v1), rtol=1e-6)
        chex.assert_trees_all_close(p2, p1, rtol=1e-5, atol=1e-6)
        assert jax.tree.map(lambda a: a.sharding.spec, p2) == jax.tree.map(lambda a: a.sharding.spec, split)

    @pytest.mark.parametrize("name", ["genai/llama_int4/model", "optimized/ort_optimized_bert"])
    def test_onnx_runtimes_fused_operators_differentiate_data_parallel_on_the_default_mesh(name):
        """ONNX Runtime's fused operators gather by sharded ids too (GroupQueryAttention's rotary caches,
        EmbedLayerNormalization's tables): the builder's int4 LLaMA and the optimizer's BERT give one device's
        loss and gradients with their batch sharded over ``data`` of ``jax.make_mesh``'s default axes."""
        model = onnx.load(str(ONNX_TESTS / "models" / f"{name}.onnx"))
        apply_fn, params = optkit.onnx.to_jax(model)
        rng = np.random.default_rng(0)
        feeds = {}
        for value in model.graph.input:
            if value.name.startswith("past_key_values"):
                feeds[value.name] = np.zeros((2, 1, 0, 16), np.float32)
            elif value.name in ("attention_mask", "token_type_ids"):
                feeds[value.name] = np.full((2, 8), value.name == "attention_mask", np.int64)
            else:
                feeds[value.name] = rng.integers(3, 90, (2, 8)).astype(np.int64)

        def loss(p, f):
            out = apply_fn(p, f)
            return jnp.mean((out[0] if isinstance(out, tuple) else out) ** 2)

        want = jax.jit(jax.value_and_grad(loss))(params, feeds)
        mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
        with jax.set_mesh(mesh):
            sharded = {k: jax.device_put(v, NamedSharding(mesh, P("data"))) for k, v in feeds.items()}
            got = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, NamedSharding(mesh, P())), sharded)
        np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
        chex.assert_trees_all_close(got[1], want[1], rtol=1e-4, atol=1e-7)

    EXPORTS_ON_THE_DEFAULT_MESH = {  # the export, what it exercises under explicit mesh axes
        "torch_dynamo_gpt2": "a Reshape merging the sharded batch with the sequence",
        "torch_dynamo_vit": "a replicated class token concatenated to sharded patches",
        "torch_dynamo_whisper": "a batched MatMul of a sharded and a replicated operand",
        "optimum/llama_o3": "a Gather along the sharded axis",
        "torch_dynamo_gru": "a recurrent state that starts replicated",
        "torch_torchscript_detection": "TopK's sort of a sharded key",
        "sklearn/forest": "tree tables indexed by sharded rows",
    }

    def _feeds(apply_fn, data):
        rng = np.random.default_rng(0)
        feeds = {}
        for info in apply_fn.inputs:
            if info.name in data:
                feeds[info.name] = data[info.name]
            elif info.name.startswith("past_key_values"):  # (an empty cache: the first step)
                feeds[info.name] = np.zeros((2, info.shape[1], 0, info.shape[3]), np.float32)
            elif info.name == "attention_mask":
                feeds[info.name] = np.ones((2, 8), np.int64)
            elif "position" in info.name:
                feeds[info.name] = np.tile(np.arange(8), (2, 1))
            elif np.dtype(info.dtype).kind in "iu":  # token ids
                feeds[info.name] = rng.integers(3, 90, (2, 8)).astype(np.int64)
            else:
                shape = [d if isinstance(d, int) else 2 for d in info.shape]
                feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
        return feeds

    @pytest.mark.parametrize("name", sorted(EXPORTS_ON_THE_DEFAULT_MESH))
    def test_exported_models_differentiate_data_parallel_on_the_default_mesh(name):
        """Each export gives one device's loss and gradients with its batch sharded over ``data`` of
        ``jax.make_mesh``'s default (explicit) axes, under ``jax.set_mesh`` (GPT-2 also with its layers scanned
        and its arrays placed by ``NamedSharding`` alone, no mesh set, as examples/onnx_finetune_jax.py does)."""
        path = ONNX_TESTS / "models" / name
        for scan in (False, True) if name == "torch_dynamo_gpt2" else (None,):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the dynamo exporter's shared constants)
                apply_fn, params = optkit.onnx.to_jax(f"{path}.onnx", scan_layers=scan)
            assert bool(apply_fn._layers) is bool(scan)
            data = np.load(f"{path}.npz") if path.with_suffix(".npz").exists() else {}
            feeds = _feeds(apply_fn, data)

            def loss(p, f, apply_fn=apply_fn):
                out = apply_fn(p, f)
                out = out if isinstance(out, tuple) else (out,)
                return sum(jnp.mean(o ** 2) for o in out if jnp.issubdtype(o.dtype, jnp.floating))

            want = jax.jit(jax.value_and_grad(loss))(params, feeds)
            mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
            with jax.set_mesh(mesh) if not scan else contextlib.nullcontext():
                sharded = {k: jax.device_put(v, NamedSharding(mesh, P("data" if np.shape(v)[0] % 2 == 0 else None)))
                           for k, v in feeds.items()}
                got = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, NamedSharding(mesh, P())), sharded)
            np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
            chex.assert_trees_all_close(got[1], want[1], rtol=1e-4, atol=1e-6)

    @pytest.mark.parametrize("op", ["TfIdfVectorizer", "DeformConv", "sequences"])
    def test_this_rounds_operators_run_batch_sharded_on_the_default_mesh(op):
        """TfIdfVectorizer, DeformConv and a sequence pipeline (SplitToSequence, SequenceMap, ConcatFromSequence)
        on a batch sharded over 8 devices of jax.make_mesh's default (explicit) axes, under jax.jit: the values of
        one device, the batch's sharding kept."""
        from onnx import TensorProto, helper

        rng = np.random.default_rng(11)
        if op == "TfIdfVectorizer":
            node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TFIDF", min_gram_length=1,
                                    max_gram_length=2, max_skip_count=1, ngram_counts=[0, 3],
                                    pool_int64s=[4, 7, 9, 4, 7, 7, 9], ngram_indexes=[0, 1, 2, 3, 4],
                                    weights=[1.0, 2.0, 3.0, 4.0, 5.0])
            feeds = {"x": rng.choice([1, 4, 7, 9], size=(8, 11)).astype(np.int32)}
            types, out = {"x": TensorProto.INT32}, [8, 5]
        elif op == "DeformConv":
            node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], kernel_shape=[2, 2])
            feeds = {"x": rng.normal(size=(8, 2, 5, 5)), "w": rng.normal(size=(3, 2, 2, 2)),
                     "offset": rng.normal(size=(8, 8, 4, 4))}
            feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
            types, out = dict.fromkeys(feeds, TensorProto.FLOAT), [8, 3, 4, 4]
        else:
            node = None
            feeds = {"x": rng.normal(size=(8, 6)).astype(np.float32)}
            types, out = {"x": TensorProto.FLOAT}, [8, 6]
        if node is None:
            body = helper.make_graph([helper.make_node("Tanh", ["e"], ["t"])], "body",
                                     [helper.make_tensor_value_info("e", TensorProto.FLOAT, [8, 2])],
                                     [helper.make_tensor_value_info("t", TensorProto.FLOAT, [8, 2])])
            nodes = [helper.make_node("SplitToSequence", ["x", "two"], ["seq"], axis=1),
                     helper.make_node("SequenceMap", ["seq"], ["mapped"], body=body),
                     helper.make_node("ConcatFromSequence", ["mapped"], ["y"], axis=1)]
            inits = [onnx.numpy_helper.from_array(np.array(2, np.int64), "two")]
        else:
            nodes, inits = [node], []
        model = helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info(k, types[k], v.shape) for k, v in feeds.items()],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], initializer=inits),
            opset_imports=[helper.make_opsetid("", 22)])
        apply_fn, _ = optkit.onnx.to_jax(model, trainable=())
        want = apply_fn({}, *feeds.values())
        mesh = jax.make_mesh((8,), ("data",))
        with jax.set_mesh(mesh):
            sharded = [jax.device_put(v, NamedSharding(mesh, P("data") if k != "w" else P())) for k, v in feeds.items()]
            got = jax.jit(apply_fn)({}, *sharded)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
        assert got.sharding.spec[0] == "data"

    def test_a_depthwise_conv_differentiates_in_both_modes_on_jax_default_mesh():
        """The depthwise Conv's own derivative (its JVP's linear transposes) with the batch split over
        ``jax.make_mesh``'s default (explicit) axes: ``value_and_grad`` in the input and the weight, and ``jax.jvp``,
        equal one device's (float32 rounding)."""
        from onnx import TensorProto, helper

        rng = np.random.default_rng(0)
        x = rng.normal(size=(8, 16, 24, 24)).astype(np.float32)
        w = onnx.numpy_helper.from_array(rng.normal(size=(32, 1, 3, 3)).astype(np.float32), "w")
        conv = helper.make_node("Conv", ["x", "w"], ["y"], group=16, pads=[1] * 4, strides=[2, 2])
        graph = helper.make_graph([conv], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32, 12, 12])], [w])
        apply_fn, params = optkit.onnx.to_jax(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

        def loss(p, x):
            return jnp.sum(jnp.tanh(apply_fn(p, x)) ** 2)

        want = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, x)
        want_jvp = jax.jvp(lambda p: loss(p, x), (params,), (params,))[1]
        mesh = jax.make_mesh((8,), ("data",))
        with jax.set_mesh(mesh):
            sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
            got = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, sharded)
            got_jvp = jax.jvp(lambda p: loss(p, sharded), (params,), (params,))[1]
        for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=2e-5, atol=1e-5 * float(np.max(np.abs(h))))
        np.testing.assert_allclose(float(got_jvp), float(want_jvp), rtol=2e-5)
