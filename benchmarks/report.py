"""The benchmarks' report: the machine they ran on, and the markdown tables of a run's JSON results."""

from __future__ import annotations

import os
import platform
import statistics

import jax
import jaxlib
import numpy as np
import optax

import optkit
from benchmarks._timing import markdown_table
from benchmarks.candidates import torch, torch_available

__all__ = ["machine_info", "report"]


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import psutil

    versions = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "optax": optax.__version__, "optkit": optkit.__version__, "numpy": np.__version__}
    if torch_available():
        versions["torch"] = torch.__version__
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": jax.devices()[0].platform, "device": str(jax.devices()[0].device_kind),
            "versions": versions}



def _fmt(value, digits=3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def report(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"# optkit step benchmarks ({'quick' if meta['quick'] else 'full'})",
        "",
        f"{meta['date']}; {meta['machine']['cpu']}, {meta['machine']['cpu_count']} CPUs, "
        f"{meta['machine']['memory_gib']} GiB, {meta['machine']['platform']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["machine"]["versions"].items()),
        f"float32; jitted step, parameters and state donated; {meta['repeats']} interleaved rounds after "
        f"{meta['warmup']} warm-up; load average (1, 5, 15 min) at start {_load(meta['load_start'])}, "
        f"at end {_load(meta['load_end'])}. PyTorch: {meta['torch']}.",
        *(["", "Quick mode: sizes far too small for the goals to mean anything (a smoke test)."]
          if meta["quick"] else []),
        "",
        "## Step time",
        "",
    ]
    rows = []
    for case in results["cases"]:
        for c in case["candidates"]:
            if "error" in c:
                rows.append([case["title"], c["label"], "error", " ".join(c["error"]), "", "", ""])
                continue
            hlo = ""
            if "hlo_full_size_kernels" in c:
                hlo = f"{c['hlo_bytes_per_param']} B ({c['hlo_full_size_kernels']} kernels)"
            elif "hlo_bytes_per_param" in c:
                hlo = (f"{c['hlo_bytes_per_param']:.1f} B ({c['hlo_kernels']} kernels, "
                       f"{c['hlo_kernels_per_leaf']:.1f} a leaf)")
            elif "hlo_kernels_per_leaf" in c and c["n_leaves"] > 1:
                hlo = f"{c['hlo_kernels']} kernels, {c['hlo_kernels_per_leaf']:.1f} a leaf"
            elif "hlo_kernels" in c:
                hlo = f"{c['hlo_kernels']} kernels"
            first = f"{c['first_call_s']:.2f}"
            if c.get("first_call_fresh_s"):
                first += f" (fresh: {statistics.median(c['first_call_fresh_s']):.2f})"
            label = c["label"]
            if c.get("separate_process"):
                label += " (alone, own process)"
                hlo += f"; process peak RSS {c['process_peak_rss'] / 2**30:.1f} GiB"
            rows.append([case["title"], label, f"{c['median_ms']:.2f}", f"{c['min_ms']:.2f}-{c['max_ms']:.2f}",
                         first, f"{c['gbps']:.1f} ({c['bytes_per_param_model']} B)", hlo])
    lines.append(markdown_table(["case", "candidate", "median ms", "min-max ms", "first call s",
                                 "GB/s (model)", "HLO traffic/param"], rows))
    lines += ["", "## Ratios and goals", ""]
    rows = []
    for case in results["cases"]:
        for r in case["ratios"]:
            met = "" if r["met"] is None else ("met" if r["met"] else "**not met**")
            paired = "" if r.get("paired") is None else f"{r['paired']:.3f}"
            rows.append([case["title"], r["label"], f"{r['value']:.3f}", paired, r["goal_text"] or "-", met])
    lines.append(markdown_table(["case", "ratio", "value (of medians)", "median of per-round ratios", "goal", ""],
                                rows))
    mem_rows = []
    for case in results["cases"]:
        for m in case["memory"]:
            if "error" in m:
                mem_rows.append([case["title"], m["label"], "error", " ".join(m["error"]), "", "", ""])
                continue
            mem_rows.append([case["title"], m["label"], f"{m['total_bytes'] / 2**20:.1f}",
                             f"{(m['peak_anon_rss'] - m['baseline_anon_rss']) / 2**20:.1f}", f"{m['ratio']:.3f}",
                             f"{m['xla_temp_bytes'] / 2**20:.1f}", "met" if m["met"] else "**not met**"])
    if mem_rows:
        lines += ["", "## Peak memory of 20 donated steps (fresh process; goal <= 1.05)", ""]
        lines.append(markdown_table(["case", "candidate", "params+grads+state MiB", "peak - baseline RSS MiB",
                                     "ratio", "XLA temp MiB", ""], mem_rows))
    notes = [f"- {case['title']}: {case['note']}" for case in results["cases"] if case["note"]]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def _load(load) -> str:
    return ", ".join(f"{x:.2f}" for x in load)
