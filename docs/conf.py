"""Sphinx configuration of optkit's documentation site (``sphinx-build -W docs docs/_build/html``).

Everything is built offline: no intersphinx, the notebook's data come from
scikit-learn, and the pages generated from the package (the API reference from
the public ``__all__`` lists, the ONNX operator table from
``optkit.onnx.supported_ops()``, the SPEC sections) are written by
``_ext/optkit_docs.py`` when the build starts.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's optkit, also without an install
sys.path.insert(0, os.path.join(HERE, "_ext"))

import optkit  # noqa: E402

project = "optkit"
author = "The optkit authors"
copyright = "2026, The optkit authors"  # noqa: A001
release = optkit.__version__
version = optkit.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
    "optkit_docs",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_generated", "jupyter_execute", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
root_doc = "index"

# autodoc: public names only (the API page lists them from __all__), Google-style docstrings.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# The notebook runs at every build (on the CPU here; on whatever devices the reader has).
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True

html_theme = "furo"
html_title = f"optkit {release}"
html_static_path: list[str] = []

suppress_warnings = ["myst.header"]
