"""Whole detectors as torch.onnx writes them, post-processing included, against ONNX Runtime.

The fixtures (tests/onnx/models/detectors, made by make_detectors.py with random weights): torchvision's SSD with
its SSDLite head, RetinaNet and Mask R-CNN (``RoiAlign``, masks pasted by a ``Loop``), and a YOLO-style detector
filtered by ``NonMaxSuppression``. Their output sizes depend on values (score thresholds, ``NonZero``, NMS), so
``prepare(...).run`` compiles them in segments around those nodes; the outputs equal the ones ONNX Runtime gave
at export. ``to_jax(model, outputs=[...])`` cuts a detector before its post-processing: the backbone and heads
alone are a JAX function that matches ONNX Runtime's values there and trains under ``jax.jit``.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("onnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import optkit  # noqa: E402
import optkit.onnx  # noqa: E402
from optkit.onnx._base.errors import ValueDependentError  # noqa: E402
from tests.onnx.helpers import ONNX_TESTS  # noqa: E402

HERE = ONNX_TESTS / "models" / "detectors"
VERSIONS = json.loads((HERE / "versions.json").read_text())
DETECTORS = sorted(VERSIONS["models"])


def _data(name):
    return np.load(HERE / f"{name}.npz")


def _assert_detections(got, data, x64):
    """Boxes to float32 rounding of their pixel scale, scores and masks to float32 rounding, labels exactly (int64
    with JAX's 64-bit mode on, int32 with it off: the documented dtype policy)."""
    want = [data[f"output:{i}"] for i in range(len([k for k in data.files if k.startswith("output:")]))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.dtype.kind == "i":
            assert g.dtype == (w.dtype if x64 else np.int32)
            np.testing.assert_array_equal(g, w)
        else:
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6 * max(1.0, float(np.max(np.abs(w)))))


@pytest.mark.parametrize("name", DETECTORS)
def test_a_whole_detector_runs_through_prepare_with_onnx_runtimes_detections(name):
    data = _data(name)
    assert any(op in VERSIONS["models"][name]["ops"] for op in ("NonMaxSuppression", "NonZero"))
    rep = optkit.onnx.prepare(str(HERE / f"{name}.onnx"))
    with warnings.catch_warnings():  # int64 narrowed to int32 with 64-bit mode off: the policy, not warned per node
        warnings.simplefilter("error", UserWarning)
        got = rep.run({"image": data["image"]})
    _assert_detections(got, data, x64=False)
    again = rep.run({"image": data["image"]})  # the segments compiled once, run again
    for g, h in zip(got, again):
        np.testing.assert_array_equal(g, h)


@pytest.mark.x64
@pytest.mark.parametrize("name", ["ssdlite", "yolo"])
def test_a_detector_gives_int64_labels_with_64_bit_mode_on(name):
    data = _data(name)
    got = optkit.onnx.prepare(str(HERE / f"{name}.onnx")).run({"image": data["image"]})
    _assert_detections(got, data, x64=True)


@pytest.mark.parametrize("name", ["ssdlite", "yolo"])
def test_to_jax_cut_before_the_post_processing_matches_onnx_runtime_and_trains(name):
    """``outputs=`` names the heads' values: the function stops there (no ``NonMaxSuppression`` or ``NonZero``
    left), gives ONNX Runtime's values, and three Adam steps under ``jax.jit`` lower a loss on them."""
    data = _data(name)
    heads = [key.split(":", 1)[1] for key in data.files if key.startswith("head:")]
    fn, params = optkit.onnx.to_jax(str(HERE / f"{name}.onnx"), outputs=heads)
    image = data["image"]
    for g, head in zip(fn(params, image), heads):
        w = data[f"head:{head}"]
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(w))))
    tx = optax.adam(1e-3)

    @jax.jit
    def step(p, state):
        loss, grads = jax.value_and_grad(lambda q: sum(jnp.mean(jnp.square(v)) for v in fn(q, image)))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss, grads

    p, state, losses = params, tx.init(params), []
    for _ in range(3):
        p, state, loss, grads = step(p, state)
        losses.append(float(loss))
    assert all(np.isfinite(losses)) and losses[2] < losses[0], losses
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))


def test_the_whole_detector_inside_jax_jit_names_the_value_dependent_node():
    fn, params = optkit.onnx.to_jax(str(HERE / "yolo.onnx"))
    with pytest.raises(ValueDependentError, match=r"node '[^']+' \(ai\.onnx::(NonZero|NonMaxSuppression).*prepare"):
        jax.jit(fn)(params, _data("yolo")["image"])


def test_outputs_must_be_values_of_the_main_graph():
    with pytest.raises(ValueError, match="neither graph outputs nor values a node of the main graph computes"):
        optkit.onnx.to_jax(str(HERE / "yolo.onnx"), outputs=["no such value"])
