"""Shared pytest configuration: hypothesis profiles sized for a 2-core CI machine."""


import atexit
import os
import shutil
import tempfile

# XLA:CPU compiles the suite's thousands of small programs (XLA's compile is about two thirds of the suite's CPU time:
# 1359 s of backend compile in 11,671 programs, measured with jax.monitoring) with LLVM's expensive optimization
# passes off (--xla_llvm_disable_expensive_passes) and LLVM at -O1 instead of -O2 (--xla_backend_optimization_level=1):
# the same HLO passes, compiled faster: ONNX's backend cases 104 -> 91 s on 2 cores with the first, the exported-model
# modules (test_jax, test_models) 189 -> 167 s with the second. The numbers: on the Intel CPU the snapshot was written
# on, tests/project/test_snapshot.py's cases bit for bit; on an AMD EPYC (AVX-512), of the snapshot cases' 4508 arrays
# computed with and without the two flags, every float64 array is bit-identical and 26 float32 ones differ (reductions
# of ONNX's cases run op by op: pools, ReduceSum/Mean/Prod/L1, LayerNormalization's function body, a 1-D x 3-D MatMul,
# RoiAlign, SoftmaxCrossEntropyLoss) by at most 1.4 units in the last place of the array's largest value, well inside
# every test's tolerance. Not used, because they change float64 results: -O0 (124 s against 167 s; the Adafactor
# schedule case of the snapshot) and XLA's older fusion emitters (--xla_cpu_use_fusion_emitters=false: 22-38% less
# compile time on the exported models; 211 of the 4508 arrays change, Adafactor's float64 factored moments among them,
# by up to 3 units in the last place). Set before JAX starts its CPU backend; child processes inherit it. A caller's
# own XLA_FLAGS are kept.
COMPILE_FLAGS = "--xla_llvm_disable_expensive_passes=true --xla_backend_optimization_level=1"
if "xla_llvm_disable_expensive_passes" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {COMPILE_FLAGS}".strip()

# One persistent XLA compilation cache for the run (JAX's own, jax_compilation_cache_dir), shared by the xdist workers:
# a program that one test compiled is read back by the next test that compiles the same HLO (an exported model run by
# several modules, one optimizer's step on the same shapes). Measured on 2 cores: tests/optimizers 164 -> 150 s, the
# exported-model modules (test_models, test_jax, test_cli, test_lora) 223 -> 204 s. The child processes that tests
# start (examples, docs blocks, several processes, the 8-device child) compile without it: mostly new programs there,
# and no gain was measured (the 8-device child took 168-191 s in runs with and without it). Removed when the process
# that made it exits.
_CACHE = "OPTKIT_TESTS_XLA_CACHE"
# optkit turns JAX's cache on in the user's cache directory (optkit.onnx.compilation_cache): not from the suite, whose
# processes use the run's cache above and whose children compile without one (tests/onnx/api/test_compilation_cache.py
# starts its own, with the default).
os.environ.setdefault("OPTKIT_COMPILATION_CACHE", "off")
if _CACHE not in os.environ and not os.environ.get("OPTKIT_SHARDING_SUBPROCESS"):
    os.environ[_CACHE] = tempfile.mkdtemp(prefix="optkit-tests-xla-cache-")
    atexit.register(shutil.rmtree, os.environ[_CACHE], True)

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

if os.environ.get(_CACHE) and not os.environ.get("OPTKIT_SHARDING_SUBPROCESS"):
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# JAX traces and compiles on first call, so a single example can take far longer
# than hypothesis's default deadline; examples are few but each is a real check.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _reruns(item) -> tuple:
    return getattr(getattr(item, "function", None), "reruns_in_child", ())


# The longest tests (a child process each, 15-140 s), started first: with pytest-xdist's work stealing, a long test
# left to the end keeps one worker busy while the other has nothing left (longest-processing-time-first order).
LONGEST_FIRST = ("tests/sharding/test_simulated_devices.py", "tests/sharding/test_multiprocess.py",
                 "tests/project/test_examples.py", "tests/project/test_benchmarks.py")


# The quick tier (-m "not slow") leaves out, besides the modules marked slow, the cases listed here: chosen from
# measured times (benchmarks.suite_time --quick-tier) so that it runs in minutes with every test function that
# can stay represented by its cheapest case; the whole suite runs them all.
SLOW_CASES = frozenset(line.strip() for line in open(os.path.join(os.path.dirname(__file__), "slow_cases.txt"),
                                                       encoding="utf-8") if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In a run that collects tests/sharding/test_simulated_devices.py's one child for every 8-device module, drop the
    modules' own child tests (tests/_devices.py), which would run the same tests again; then put the longest tests
    first (:data:`LONGEST_FIRST`). Before ``-m`` selects, the cases of :data:`SLOW_CASES` are marked slow."""
    for item in items:
        if item.nodeid in SLOW_CASES:
            item.add_marker(pytest.mark.slow)
    everything = [item for item in items if len(_reruns(item)) > 1]
    covered = {module for item in everything for module in _reruns(item)}
    dropped = [item for item in items if len(_reruns(item)) == 1 and _reruns(item)[0] in covered]
    if dropped:
        items[:] = [item for item in items if item not in dropped]
        config.hook.pytest_deselected(items=dropped)

    def rank(item):
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order


@pytest.fixture(autouse=True)
def _x64_marked(request):
    """A test marked ``x64`` (ONNX's INT64 and DOUBLE as ONNX's own types) runs as a caller with JAX's 64-bit
    mode on; every other test runs in JAX's default mode, as users do."""
    if request.node.get_closest_marker("x64") is None:
        yield
        return
    with jax.enable_x64(True):
        yield



@pytest.fixture
def fresh_compiles():
    """Within the test, every compile is XLA's own (the run's persistent compilation cache is not read or written)."""
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
