"""Where the test suite's time goes: a pytest plugin that records each test's JAX work, and its report.

Record (the README's test command, with the plugin loaded in every xdist worker)::

    python -m pytest -n 2 tests -p benchmarks.suite_time
    python -m benchmarks.suite_time            # the tables, from benchmarks/out/suite_time/

The quick tier (``-m "not slow"``) is chosen from such records (:func:`quick_tier`), of a run with the list of
cases it leaves out emptied first (``printf '' > tests/slow_cases.txt``, ``rm -rf benchmarks/out/suite_time``)::

    python -m pytest -n 2 -m "not slow" tests -p benchmarks.suite_time
    python -m benchmarks.suite_time --quick-tier 360 --write tests/slow_cases.txt

The plugin appends one JSON line per test to ``<dir>/<pid>.jsonl`` (``OPTKIT_SUITE_TIME_DIR``, default
``benchmarks/out/suite_time``; the report reads every file there, so empty it between runs): the test's
wall-clock and CPU seconds in its own process, and the seconds JAX reports through ``jax.monitoring`` for
XLA's backend compile (and how many programs), tracing to a jaxpr, lowering to StableHLO, and reads from the
persistent compilation cache. Work done in a child process the test starts (a docs block, the 8-device child)
counts as the test's wall time only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import sys
import time

import jax.monitoring
import pytest

from benchmarks._timing import markdown_table

DEFAULT_DIR = pathlib.Path(__file__).resolve().parent / "out" / "suite_time"
_DIR_ENV = "OPTKIT_SUITE_TIME_DIR"
# jax.monitoring's duration events, by the column they fill.
EVENTS = {
    "compile": "/jax/core/compile/backend_compile_duration",
    "trace": "/jax/core/compile/jaxpr_trace_duration",
    "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "cache_read": "/jax/compilation_cache/cache_retrieval_time_sec",
}
_COLUMNS = {event: column for column, event in EVENTS.items()}
_current: collections.Counter = collections.Counter()


def _listen(event: str, duration: float, **_) -> None:
    column = _COLUMNS.get(event)
    if column is not None:
        _current[column] += duration
        _current[f"{column}_n"] += 1


def pytest_configure(config) -> None:
    """Start listening to JAX's compile events in this pytest process (each xdist worker loads the plugin)."""
    jax.monitoring.register_event_duration_secs_listener(_listen)


def _record_file() -> pathlib.Path:
    folder = pathlib.Path(os.environ.get(_DIR_ENV) or DEFAULT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{os.getpid()}.jsonl"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Time one test (setup, call and teardown) and append its record."""
    _current.clear()
    start, cpu = time.perf_counter(), time.process_time()
    yield
    record = {"test": item.nodeid, "wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
              **_current}
    with open(_record_file(), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read(folder: pathlib.Path) -> list[dict]:
    """Every record under ``folder`` (one dict per test; missing columns are 0)."""
    records = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append(collections.defaultdict(float, json.loads(line)))
    return records


def _summed(records: list[dict], **labels) -> dict:
    """The records' numbers added up (a column no record has: 0), with ``tests`` their count, and ``labels``."""
    total: dict = collections.defaultdict(float, tests=len(records), **labels)
    for record in records:
        for key, value in record.items():
            if key != "test":
                total[key] += value
    return total


def by_module(records: list[dict]) -> list[dict]:
    """The records summed per test module, largest wall time first."""
    modules: dict[str, list[dict]] = collections.defaultdict(list)
    for record in records:
        modules[record["test"].split("::", 1)[0]].append(record)
    return sorted((_summed(group, module=module) for module, group in modules.items()), key=lambda row: -row["wall"])


def report(records: list[dict], top: int = 15) -> str:
    """Markdown: the totals, the ``top`` modules by wall time, and the ``top`` tests."""
    if not records:
        raise ValueError("no records: run the tests with -p benchmarks.suite_time first")
    total = _summed(records)
    lines = [f"{len(records)} tests: {total['wall']:.0f} s of test time summed over the workers, "
             f"{total['cpu']:.0f} s of CPU in the test processes, of which XLA's compile {total['compile']:.0f} s "
             f"({total['compile_n']:.0f} programs; {total['cache_read_n']:.0f} read back from the persistent cache "
             f"instead), tracing {total['trace']:.0f} s and lowering {total['lower']:.0f} s.", ""]
    rows = [[row["module"], row["tests"], f"{row['wall']:.0f}", f"{row['cpu']:.0f}", f"{row['compile']:.0f}",
             f"{row['compile_n']:.0f}", f"{row['trace']:.0f}", f"{row['lower']:.0f}"]
            for row in by_module(records)[:top]]
    lines.append(markdown_table(["module", "tests", "wall s", "CPU s", "compile s", "programs", "trace s",
                                 "lower s"], rows))
    lines.append("")
    slowest = sorted(records, key=lambda record: -record["wall"])[:top]
    lines.append(markdown_table(["test", "wall s", "compile s", "programs"],
                                [[record["test"], f"{record['wall']:.1f}", f"{record['compile']:.1f}",
                                  f"{record['compile_n']:.0f}"] for record in slowest]))
    return "\n".join(lines)


def _function(test_id: str) -> str:
    """A test's function: its id without the parameters (``path::name[params]`` -> ``path::name``)."""
    return test_id.split("[", 1)[0]


def quick_tier(records: list[dict], budget: float, cap: float) -> list[str]:
    """The tests to leave out of the quick tier (sorted ids) so that the recorded time of those kept sums to at most
    ``budget`` seconds (over the workers), measured, never guessed.

    Every test function keeps its cheapest case when that case takes at most ``cap`` seconds (a heavier one is
    left out when its module keeps another test: every module stays represented); then the other cases are kept,
    cheapest first, while the sum allows. A test the records do not hold (a new one) is never left out.

    Raises:
      ValueError: no records.
    """
    if not records:
        raise ValueError("no records: run the quick tier with -p benchmarks.suite_time first")
    by_function: dict[str, list[dict]] = collections.defaultdict(list)
    for record in records:
        by_function[_function(record["test"])].append(record)
    kept: set[str] = set()
    for cases in by_function.values():
        cheapest = min(cases, key=lambda record: record["wall"])
        if cheapest["wall"] <= cap:
            kept.add(cheapest["test"])
    modules = {record["test"].split("::", 1)[0] for record in records}
    for module in modules - {test.split("::", 1)[0] for test in kept}:  # each module keeps its cheapest test
        kept.add(min((r for r in records if r["test"].startswith(module + "::")), key=lambda r: r["wall"])["test"])
    total = sum(record["wall"] for record in records if record["test"] in kept)
    for record in sorted(records, key=lambda record: record["wall"]):
        if record["test"] not in kept and total + record["wall"] <= budget:
            kept.add(record["test"])
            total += record["wall"]
    return sorted(record["test"] for record in records if record["test"] not in kept)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Report where a recorded test run's time went.")
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=DEFAULT_DIR,
                        help=f"the plugin's records (default {DEFAULT_DIR})")
    parser.add_argument("--top", type=int, default=15, help="modules and tests to list (default 15)")
    parser.add_argument("--quick-tier", type=float, metavar="SECONDS",
                        help="from records of the quick tier: the tests to leave out of it so that the others sum "
                             "to SECONDS of test time over the workers (see quick_tier)")
    parser.add_argument("--cap", type=float, default=6.0,
                        help="with --quick-tier: a test function's cheapest case stays only if it takes at most "
                             "this many seconds (default 6)")
    parser.add_argument("--write", type=pathlib.Path, help="with --quick-tier: write the ids to this file")
    args = parser.parse_args(argv)
    try:
        records = read(args.folder)
        if args.quick_tier is None:
            print(report(records, args.top))
            return
        excluded = quick_tier(records, args.quick_tier, args.cap)
    except ValueError as error:
        sys.exit(f"suite_time: {error}")
    kept = [r for r in records if r["test"] not in set(excluded)]
    summary = (f"quick tier: {len(kept)} of {len(records)} recorded tests kept, {sum(r['wall'] for r in kept):.0f} "
               f"of {sum(r['wall'] for r in records):.0f} s; {len(excluded)} left out")
    if args.write:
        header = ("# Tests the quick tier (-m 'not slow') leaves out, chosen from measured times by\n"
                  f"# python -m benchmarks.suite_time --quick-tier {args.quick_tier:g} --cap {args.cap:g} "
                  f"--write {args.write}\n# ({summary}). tests/conftest.py marks each slow.\n")
        args.write.write_text(header + "".join(f"{test}\n" for test in excluded), encoding="utf-8")
    print(summary)


if __name__ == "__main__":
    main()
