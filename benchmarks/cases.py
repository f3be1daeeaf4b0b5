"""The benchmark cases: which candidates are timed together, and the ratios (with their goals) reported."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from benchmarks.candidates import Spec
from benchmarks.trees import abstract_leaves, gpt_tree, nparams, transformer_tree

__all__ = ["Ratio", "Case", "build_cases"]


@dataclass
class Ratio:
    """``numerator / denominator`` of two candidates' medians (or first calls), with a goal."""

    label: str
    numerator: str
    denominator: str | None  # None: the numerator's own first-call time in seconds
    goal: float | None
    goal_text: str = ""
    first_call: bool = False  # the ratio of first calls, each the median of fresh processes


@dataclass
class Case:
    name: str
    title: str
    algorithm: str  # the algorithm the case is about
    specs: list[Spec]
    ratios: list[Ratio] = field(default_factory=list)
    note: str = ""


def build_cases(quick: bool, with_torch: bool, skip_slow: bool = False) -> list[Case]:
    big = 1 << 20 if quick else 1 << 26
    # (leaves, leaf size, goal for FlatParams / one leaf, goal for its first call in s)
    many = [(200, 1024, 1.2, None), (500, 64, 2.0, 10.0)] if quick else [
        (1000, 16384, 1.2, None), (10000, 1024, 2.0, 10.0)]
    matrix = (512, 512) if quick else (8192, 8192)

    def one(n):
        return {"x": jax.ShapeDtypeStruct((n,), jnp.float32)}

    label_big = f"{big >> 20}M"
    cases = []
    for algo in ("adam", "adagrad"):
        specs = [Spec(f"optkit.{algo}", f"optkit.{algo}", one(big), memory=True),
                 Spec(f"optax.{algo}", f"optax.{algo}", one(big), memory=not quick)]
        if with_torch:
            specs.append(Spec(f"torch {algo} fused", f"torch.{algo}", one(big), torch=True))
        ratios = [Ratio(f"optkit.{algo} / optax.{algo}", f"optkit.{algo}", f"optax.{algo}", 0.7, "<= 0.7")]
        if with_torch:
            ratios.append(Ratio(f"optkit.{algo} / torch fused", f"optkit.{algo}", f"torch {algo} fused", None))
        cases.append(Case(f"{algo}_1x{label_big}", f"{algo.capitalize()}, one {label_big} leaf", algo, specs, ratios))

    for count, size, limit, first_call_limit in many:
        tree = abstract_leaves(count, (size,))
        same = one(count * size)
        # Per leaf, 10000 leaves take minutes and about 13 GiB to compile (XLA:CPU, one program
        # holding 30000 kernels): each such candidate is timed alone in a process of its own,
        # and has no memory run. Quick mode sends one small one there to test the path.
        slow = count >= 10000
        specs = [
            Spec("optkit.adam FlatParams", "optkit.adam", tree, flat=True, memory=True),
            Spec("optkit.adam per leaf", "optkit.adam", tree, memory=not slow, isolated=slow),
            Spec("optax.adam per leaf", "optax.adam", tree, memory=not slow and not quick,
                 isolated=slow or (quick and size == 64)),
            Spec("optkit.adam one leaf, same size", "optkit.adam", same),
            Spec("optax.adam one leaf, same size", "optax.adam", same),
        ]
        if slow and skip_slow:
            specs = [s for s in specs if "per leaf" not in s.label]
        if with_torch:
            specs.append(Spec("torch adam fused", "torch.adam", tree, torch=True))
        labels = {s.label for s in specs}
        ratios = [
            Ratio("FlatParams / one leaf", "optkit.adam FlatParams", "optkit.adam one leaf, same size", limit,
                  f"<= {limit}"),
            Ratio("FlatParams / optax per leaf", "optkit.adam FlatParams", "optax.adam per leaf", None),
            Ratio("optkit per leaf / one leaf (default path)", "optkit.adam per leaf",
                  "optkit.adam one leaf, same size", None),
            Ratio("optax per leaf / one leaf", "optax.adam per leaf", "optax.adam one leaf, same size", None),
        ]
        if first_call_limit is not None:
            ratios.append(Ratio("FlatParams first call (s)", "optkit.adam FlatParams", None, first_call_limit,
                                f"< {first_call_limit:g} s"))
        ratios.append(Ratio("optkit per leaf first call (s)", "optkit.adam per leaf", None, None))
        ratios.append(Ratio("optax per leaf first call (s)", "optax.adam per leaf", None, None))
        if with_torch:
            ratios.append(Ratio("FlatParams / torch fused", "optkit.adam FlatParams", "torch adam fused", None))
        ratios = [r for r in ratios if r.numerator in labels and (r.denominator is None or r.denominator in labels)]
        note = ""
        if slow:
            note = ("per-leaf candidates timed alone, each in a process of its own (compiling them takes minutes "
                    "and gigabytes), so not interleaved with the others")
        cases.append(Case(f"adam_{count}x{size}", f"Adam, {count} leaves x {size}", "adam", specs, ratios, note))

    # Adafactor against Adam on one large matrix (goal 0.8, aim 0.75).
    shape = (512, 256) if quick else (8192, 4096)
    m = {"w": jax.ShapeDtypeStruct(shape, jnp.float32)}
    specs = [Spec("optkit.adafactor", "optkit.adafactor", m), Spec("optax.adam", "optax.adam", m)]
    ratios = [Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 0.8, "<= 0.8 (aim 0.75)")]
    cases.append(Case(f"adafactor_{shape[0]}x{shape[1]}", f"Adafactor, {shape[0]}x{shape[1]}", "adafactor",
                      specs, ratios))
    tree = gpt_tree(quick)
    specs = [Spec("optkit.adafactor", "optkit.adafactor", tree), Spec("optax.adam", "optax.adam", tree)]
    ratios = [Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 0.8, "<= 0.8"),
              Ratio("first call: optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", 2.0,
                    "<= 2.0 (aim 1.5)", first_call=True)]
    cases.append(Case("gpt", "GPT-style parameter tree", "adafactor", specs, ratios,
                      f"{len(jax.tree.leaves(tree))} leaves, {nparams(tree):,} parameters"))

    m = {"w": jax.ShapeDtypeStruct(matrix, jnp.float32)}
    specs = [Spec("optkit.adafactor", "optkit.adafactor", m, memory=True),
             Spec("optax.adafactor", "optax.adafactor", m, memory=True),
             Spec("optax.adam", "optax.adam", m)]
    ratios = [Ratio("optkit.adafactor / optax.adafactor", "optkit.adafactor", "optax.adafactor", None),
              Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam", None)]
    cases.append(Case(f"adafactor_{matrix[0]}x{matrix[1]}", f"Adafactor, {matrix[0]}x{matrix[1]}",
                      "adafactor", specs, ratios))

    # Scanned layers: a 12-layer MLP stack as [12, 768, 3072] + [12, 3072, 768], with and without the batch
    # rule, beside the same layers as 24 separate leaves (the cost of per-slice statistics: goal <= 1.1).
    layers, d, f = (2, 64, 256) if quick else (12, 768, 3072)
    stacked = {"wi": jax.ShapeDtypeStruct((layers, d, f), jnp.float32),
               "wo": jax.ShapeDtypeStruct((layers, f, d), jnp.float32)}
    separate = {f"{k}{i}": jax.ShapeDtypeStruct(s.shape[1:], jnp.float32) for k, s in stacked.items()
                for i in range(layers)}
    specs = [Spec("optkit.adafactor layers as batch", "optkit.adafactor layers as batch", stacked, memory=True),
             Spec("optkit.adafactor stacked, no rule", "optkit.adafactor paper", stacked, memory=True),
             Spec("optkit.adafactor separate layers", "optkit.adafactor paper", separate),
             Spec("optax.adafactor stacked", "optax.adafactor", stacked),
             Spec("optax.adafactor separate layers", "optax.adafactor", separate)]
    ratios = [Ratio("per-layer rule / no rule (stacked)", "optkit.adafactor layers as batch",
                    "optkit.adafactor stacked, no rule", 1.1, "<= 1.1"),
              Ratio("per-layer rule (stacked) / separate layers", "optkit.adafactor layers as batch",
                    "optkit.adafactor separate layers", None),
              Ratio("per-layer rule / optax.adafactor stacked", "optkit.adafactor layers as batch",
                    "optax.adafactor stacked", None),
              Ratio("per-layer rule / optax.adafactor separate", "optkit.adafactor layers as batch",
                    "optax.adafactor separate layers", None),
              Ratio("first call: per-layer rule / separate layers", "optkit.adafactor layers as batch",
                    "optkit.adafactor separate layers", None, first_call=True),
              Ratio("first call: per-layer rule / no rule", "optkit.adafactor layers as batch",
                    "optkit.adafactor stacked, no rule", None, first_call=True)]
    cases.append(Case("stacked_layers", f"Scanned layers, {layers} x [{d}x{f} + {f}x{d}]", "adafactor", specs,
                      ratios, f"{nparams(stacked):,} parameters"))

    tree, source = transformer_tree(quick)
    specs = [Spec("optkit.adafactor", "optkit.adafactor", tree, memory=True),
             Spec("optax.adafactor", "optax.adafactor", tree),
             Spec("optkit.adam FlatParams", "optkit.adam", tree, flat=True, memory=True),
             Spec("optkit.adam per leaf", "optkit.adam", tree, memory=True),
             Spec("optax.adam per leaf", "optax.adam", tree)]
    ratios = [Ratio("optkit.adafactor / optax.adafactor", "optkit.adafactor", "optax.adafactor", None),
              Ratio("optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam per leaf", 0.8, "<= 0.8"),
              Ratio("first call: optkit.adafactor / optax.adam", "optkit.adafactor", "optax.adam per leaf",
                    2.0, "<= 2.0 (aim 1.5)", first_call=True),
              Ratio("optkit.adam FlatParams / per leaf", "optkit.adam FlatParams", "optkit.adam per leaf", None),
              Ratio("optkit.adam per leaf / optax.adam", "optkit.adam per leaf", "optax.adam per leaf", None)]
    note = f"tree: {source}; {len(jax.tree.leaves(tree))} leaves, {nparams(tree):,} parameters"
    cases.append(Case("transformer", "Transformer parameter tree", "adafactor", specs, ratios, note))
    return cases
