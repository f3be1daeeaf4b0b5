"""optkit.onnx on hostile files, round 5: a few hundred mutants of the committed fixtures each end in a run or a
documented error naming the node, input or tensor (issue 63).

The fuzzer is :mod:`benchmarks.fuzz` (its slow form: ``python -m benchmarks.fuzz --count 3000``): every committed
fixture (both torch.onnx exporters, jax2onnx, ONNX Runtime's optimizer and quantizers, Optimum, the GenAI builder's
folders, skl2onnx), mutated in each of its kinds (bit flips, truncation, extreme attribute values, com.microsoft
attributes, retyped inputs and initializers, initializer dims changed without the data, swapped operators, huge
declared shapes, renamed inputs, external data pointing outside the directory, deep nesting, nodes wrapped in
endless or huge Loops), run by ``prepare(path).run`` on random inputs in a worker process under a 60 s and 8 GiB
bound. Seeded: the same mutants at every run.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402

from benchmarks import fuzz  # noqa: E402

SHARDS, PER_SHARD = 4, 50


def test_every_mutation_kind_applies_to_some_fixture_and_changes_it():
    files = fuzz.fixtures()
    assert len(files) >= 50  # every exporter's and tool's files
    for kind, mutate in fuzz.KINDS.items():
        changed = 0
        for path in files[::3]:
            data = path.read_bytes()
            mutated = mutate(data, onnx.load_model_from_string(data), random.Random(0))
            changed += mutated is not None and mutated != data
        assert changed, kind


def test_the_mutants_are_seeded_and_cover_every_fixture_and_kind():
    jobs = fuzz.mutants(SHARDS * PER_SHARD, seed=0)
    assert jobs == fuzz.mutants(SHARDS * PER_SHARD, seed=0)
    assert {path for path, _, _ in jobs} == set(fuzz.fixtures())
    assert {kind for _, kind, _ in jobs} == set(fuzz.KINDS)


@pytest.mark.parametrize("message, error, documented, outcome", [
    ("node 'mm0' (ai.onnx::MatMul-13, opset 17): shapes", "ValueError", True, "refused"),
    ("input 'x' has shape (2,), expected (3,)", "ValueError", True, "refused"),
    ("dot_general requires contracting dimensions to have the same shape", "TypeError", True, "undocumented"),
    ("node 'a' ...", "KeyError", False, "undocumented"),
    ("", None, True, "ran"),
    ("out of memory", "MemoryError", False, "memory"),
])
def test_outcomes_are_classified_by_type_and_by_what_the_message_names(message, error, documented, outcome):
    assert fuzz.classify("bit_flips", error, message, documented) == outcome
    if error is None:
        assert fuzz.classify("external_escape", error, message, documented) == "escaped"


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_a_few_hundred_mutants_end_in_a_run_or_a_documented_error(shard):
    jobs = fuzz.mutants(SHARDS * PER_SHARD, seed=0)[shard::SHARDS]
    results = fuzz.run_mutants(jobs, timeout=60, memory_gib=8)
    bad = [r for r in results if r["outcome"] not in ("ran", "refused")]
    assert len(results) >= PER_SHARD * 0.8  # (a kind that changes nothing in a fixture is skipped)
    assert not bad, "\n".join(f"{r['outcome']}: {r['fixture']} {r['kind']} seed {r['seed']}: {r.get('type')}: "
                              f"{r['message'][:300]}" for r in bad)
