"""Documentation that runs as written: README's code, docstring examples, the examples' options, packaging.

- every ```python block of README.md runs as written, each in a fresh interpreter from the
  repository root (a block that needs several devices sets them itself);
- every docstring example in the package is a doctest that passes;
- SPEC.md ships inside the wheel (the docstrings cite it), and ``import optkit.onnx`` without the
  ``onnx`` package names the extra to install;
- every example takes ``--help``, and the examples that train share one option vocabulary
  (``--steps``, ``--batch-size``, ``--seed``, ``--out``);
- CHANGELOG.md has a released section and link references, and cites no internal issue numbers.

The documentation site itself is built by ``.ci/run`` (``sphinx-build -W``), which also runs the
notebook.
"""

from __future__ import annotations

import doctest
import glob
import importlib
import inspect
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import optkit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)


def _env() -> dict[str, str]:
    """A user's environment: no pytest or device-count settings (the suite's compile flags kept, tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "XLA_FLAGS"))}
    if "xla_llvm_disable_expensive_passes" in os.environ.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = "--xla_llvm_disable_expensive_passes=true --xla_backend_optimization_level=1"
    return env


def test_the_readme_keeps_its_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_as_written(index, tmp_path):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(BLOCKS[index])
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                            timeout=600)
    output = result.stdout[-2000:] + result.stderr[-4000:]
    assert result.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{output}"


MODULES = ["optkit"] + sorted(m.name for m in pkgutil.walk_packages(optkit.__path__, "optkit."))


DOC_PAGES = sorted(p for p in os.listdir(os.path.join(ROOT, "docs")) if p.endswith(".md")
                   and re.search(r"^```python\n", open(os.path.join(ROOT, "docs", p), encoding="utf-8").read(), re.M))


@pytest.mark.parametrize("page", DOC_PAGES)
def test_docs_page_python_blocks_run_as_written(page, tmp_path):
    """Each ```python block of a docs page, in order, in one fresh interpreter (the page's reader)."""
    text = open(os.path.join(ROOT, "docs", page), encoding="utf-8").read()
    code = "\n\n".join(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M))
    if "onnx" in code:
        pytest.importorskip("onnx")
    if "flax" in code:
        pytest.importorskip("flax")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=_env())
    assert result.returncode == 0, f"docs/{page}:\n{result.stderr[-3000:]}"


def test_the_docs_have_python_blocks_to_run():
    assert {"index.md", "getting-started.md", "gradient.md", "onnx.md"} <= set(DOC_PAGES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_are_doctests_that_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples fail"


def test_every_public_function_has_a_docstring_example():
    import optkit.onnx
    import optkit.ops

    missing = []
    for module in (optkit, optkit.ops, optkit.onnx):
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and ">>>" not in (obj.__doc__ or ""):
                if not isinstance(obj, type) or not hasattr(obj, "_fields"):  # NamedTuple states: attributes only
                    missing.append(f"{module.__name__}.{name}")
    exempt = {"optkit.onnx.UnsupportedOpError", "optkit.onnx.TensorTooLargeError", "optkit.onnx.InputInfo",
              "optkit.onnx.Backend", "optkit.ops.OnnxAdagradOutputs", "optkit.ops.OnnxAdamOutputs",
              "optkit.ops.DmlAdamOutputs", "optkit.ops.OnnxMomentumOutputs", "optkit.GraphNode",
              "optkit.GradientNode"}
    assert not [m for m in missing if m not in exempt], missing


def test_spec_ships_with_the_package(tmp_path):
    spec = importlib.resources.files("optkit") / "SPEC.md"
    text = spec.read_text(encoding="utf-8")
    for section in range(1, 7):
        assert re.search(rf"^## {section}\. ", text, re.M), section
    assert "seeds/" not in text
    source = _copy_of_the_checkout(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = glob.glob(str(tmp_path / "optkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "optkit/SPEC.md" in names and "optkit/py.typed" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Programming Language :: Python :: 3.11" in metadata and "Project-URL: Source" in metadata
    assert "Project-URL: Issues" in metadata


def _copy_of_the_checkout(target):
    """The checkout's files (not its virtual environments and build outputs), to build from without
    writing into the checkout (setuptools leaves build/ beside the sources)."""
    ignore = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "_build", "_generated", "jupyter_execute",
                                    "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "out")
    return shutil.copytree(ROOT, target, ignore=ignore)


def test_the_source_distribution_ships_the_package_and_no_uncollectable_tests(tmp_path):
    import tarfile

    source = _copy_of_the_checkout(tmp_path / "src")
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; import sys; "
                    f"b.build_sdist({str(tmp_path)!r})"], cwd=source, check=True, capture_output=True, timeout=300)
    (sdist,) = glob.glob(str(tmp_path / "optkit-*.tar.gz"))
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    assert "optkit/SPEC.md" in names and "optkit/onnx/_ops/nn.py" in names and "LICENSE" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    assert not os.path.exists(os.path.join(ROOT, "build", "lib", "optkit"))


def test_import_optkit_onnx_without_onnx_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['onnx'] = None  # as if the onnx package were not installed\n"
        "import optkit  # optkit itself does not need onnx\n"
        "try:\n"
        "    import optkit.onnx\n"
        "except ImportError as err:\n"
        "    assert 'pip install \"optkit[onnx]\"' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), check=True, timeout=120)


EXAMPLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py"))
                  if not os.path.basename(p).startswith("_"))
TRAINING = {"quickstart.py", "lm_adafactor.py", "lm_scanned.py", "onnx_training.py", "sharded_training.py",
            "multihost.py"}


_HELP = """
import contextlib, io, json, os, runpy, sys
results = {}
here = [entry for entry in sys.path if entry in ("", os.getcwd())]
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    # as `python examples/NAME.py` runs it: its own folder first, the current directory not importable
    sys.path[:] = [os.path.dirname(os.path.abspath(path))] + [e for e in sys.path if e not in here]
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        del sys.modules[name]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
    results[path] = [code, out.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def example_helps():
    """``python examples/<name>.py --help`` of every example, as scripts (the repository root not on the path), in
    one fresh interpreter."""
    paths = [os.path.join("examples", example) for example in EXAMPLES]
    result = subprocess.run([sys.executable, "-c", _HELP, *paths], cwd=ROOT, env=_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {os.path.basename(path): value for path, value in json.loads(result.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_takes_help_and_the_shared_options(example, example_helps):
    code, text = example_helps[example]
    assert code == 0 and text.startswith("usage:"), text
    if example in TRAINING:
        for option in ("--steps", "--batch-size", "--seed", "--out"):
            assert option in text, f"{example} has no {option}"
        assert "--batch " not in text


def test_changelog_has_a_release_and_no_internal_issue_numbers():
    text = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    assert re.search(r"^## \[0\.1\.0\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert re.search(r"^\[0\.1\.0\]: https://", text, re.M) and re.search(r"^\[Unreleased\]: https://", text, re.M)
    assert not re.search(r"\b[Ii]ssues? #?\d+", text), re.search(r"\b[Ii]ssues? #?\d+", text)


def test_the_api_reference_renders_every_public_name_as_html(tmp_path):
    """The docs as a reader gets them: every public name of optkit, optkit.ops and optkit.onnx rendered
    (signature, parameters, example), with its own anchor and in objects.inv; no page shows
    reStructuredText source (autodoc output in a MyST page must go through eval-rst) or an unresolved
    cross-reference (-n -W)."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")
    import html as html_module

    from sphinx.util.inventory import InventoryFile

    import optkit.onnx
    import optkit.ops

    out = tmp_path / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-q", "-b", "html",
                             "-D", "nb_execution_mode=off", os.path.join(ROOT, "docs"), str(out)],
                            capture_output=True, text=True, timeout=600, env=_env())
    assert result.returncode == 0, result.stderr[-4000:]
    with open(out / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    documented = {name for entries in inventory.values() for name in entries}
    api = (out / "api.html").read_text(encoding="utf-8")
    for module in (optkit, optkit.ops, optkit.onnx):
        for name in module.__all__:
            if name.startswith("__") or inspect.ismodule(getattr(module, name)):
                continue
            qualified = f"{module.__name__}.{name}"
            assert qualified in documented, f"{qualified} is not in objects.inv"
            assert f'id="{qualified}"' in api, f"{qualified} has no anchor on the API page"
    raw = re.compile(r"\.\. (py:)?(auto)?(function|class|data|rubric)::|^\s*:param |:no-index:|```\{", re.M)
    for page in out.glob("*.html"):
        text = html_module.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        found = raw.search(text)
        assert found is None, f"{page.name} shows raw reStructuredText: {text[found.start() - 80:found.end() + 80]!r}"
    # Formulas are typeset (MathJax, shipped with the pages), not left as code.
    assert 'class="math' in (out / "adagrad.html").read_text(encoding="utf-8")
    assert (out / "_static" / "mathjax").is_dir()


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
