"""Types: optkit's public API is fully typed, and user code as the README writes it type-checks strictly.

``pyright --verifytypes optkit`` must report 100% of the public symbols with known types (and a
docstring for every public function), and ``tests/project/typecheck/user_code.py`` (FlatParams given to
``tx.init``, ``tx.update`` and ``optax.apply_updates``) must pass pyright's strict mode. pyright
runs from the repository with ``PYTHONPATH`` set, since the editable install's import hook is
invisible to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("pyright")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pyright(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "pyright", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_public_symbol_has_a_known_type_and_a_docstring():
    result = _pyright("--verifytypes", "optkit", "--ignoreexternal", "--outputjson")
    report = json.loads(result.stdout)
    completeness = report["typeCompleteness"]
    problems = [s["name"] for s in completeness["symbols"] if not s.get("isTypeKnown", True)]
    assert completeness["completenessScore"] == 1.0, problems
    assert completeness["missingFunctionDocStringCount"] == 0
    assert completeness["missingClassDocStringCount"] == 0


def test_readme_style_user_code_passes_strict_pyright():
    result = _pyright("--outputjson", "tests/project/typecheck/user_code.py")
    report = json.loads(result.stdout)
    errors = [f"{d['range']['start']['line'] + 1}: {d['message']}" for d in report["generalDiagnostics"]
              if d["severity"] == "error"]
    assert not errors, "\n".join(errors)


# Seconds to minutes each: left out of the quick check (python -m pytest -m 'not slow').
pytestmark = pytest.mark.slow
