"""Write the bit-identity snapshot: ``python -m tests.project.snapshot.make [--out PATH]``.

Runs every case of :mod:`tests.project.snapshot.cases` and saves their arrays, with the
revision, the JAX version and the CPU they were computed on, to
``tests/project/snapshot/float64_results.npz``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT = HERE / "float64_results.npz"


def machine() -> dict:
    """What the numbers depend on besides the code: JAX, jaxlib, NumPy and the CPU's vector units."""
    import jax
    import jaxlib

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    vector = sorted(f for f in flags.split() if f.startswith(("avx", "fma", "sse4")))
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": np.__version__,
            "machine": __import__("platform").machine(), "cpu_flags": vector}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from tests.project.snapshot.cases import all_cases

    arrays: dict[str, np.ndarray] = {}
    start = time.time()
    count = 0
    for name, fn in all_cases():
        for key, value in fn().items():
            arrays[f"{name}|{key}"] = np.asarray(value)
        count += 1
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE).stdout.strip()
    meta = {"revision": revision, "cases": count, **machine()}
    arrays["__meta__"] = np.asarray(json.dumps(meta))
    np.savez_compressed(args.out, **arrays)
    print(f"{count} cases, {len(arrays) - 1} arrays in {time.time() - start:.0f} s -> {args.out} "
          f"({args.out.stat().st_size / 1e6:.2f} MB); {meta}", file=sys.stderr)


if __name__ == "__main__":
    main()
