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
    "sphinx-mathjax-offline",  # MathJax shipped with the pages: formulas render without a network
    "myst_nb",
    "optkit_docs",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_generated", "jupyter_execute", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
root_doc = "index"

# autodoc: public names only (the API page lists them from __all__), Google-style docstrings.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
# The type aliases optkit's signatures use, shown by their names instead of expanded into unions.
autodoc_type_aliases = {
    "ArrayLike": "jax.typing.ArrayLike",
    "DTypeLike": "jax.typing.DTypeLike",
    "chex.ArrayTree": "chex.ArrayTree",
    "optax.ScalarOrSchedule": "optax.ScalarOrSchedule",
    "optax.Updates": "optax.Updates",
    "optax.GradientTransformation": "optax.GradientTransformation",
}
autodoc_default_options: dict[str, bool] = {}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # a class's Attributes section: fields, not objects indexed a second time

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

# Cross-references are checked (sphinx-build -n -W in CI). The build is offline, so the inventories of
# JAX, Optax, chex, Flax, NumPy, ONNX and the standard library cannot be fetched: references to their
# names (and only theirs) are not resolved, and are listed here instead of failing the build.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"'?(jax|jaxlib|optax|chex|flax|numpy|np|onnx|google\.protobuf|ml_dtypes)(\..*)?'?"),
    (r"py:.*", r"(collections\.abc|typing|os|io|types|dataclasses|pathlib)\..*"),
    (r"py:.*", r"(Array|ArrayLike|DTypeLike|PyTreeDef|Tracer|Device|Sharding|NamedSharding|PartitionSpec)"),
    (r"py:.*", r"(IO|Callable|Mapping|Sequence|Iterable|Iterator|NamedTuple|Any)"),
    # internal types of optkit.onnx's load pipeline in BackendRep's signature (made by optkit.onnx.prepare)
    (r"py:class", r"(Converted|Limits)"),
]
