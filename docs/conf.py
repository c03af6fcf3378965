"""Sphinx configuration: the guides (docs/*.md, MyST) and the API reference (docs/api/).

Built offline (no intersphinx) with ``make docs``; ``tests/test_sphinx_docs.py`` builds it with
warnings as errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from fedrec import __version__  # noqa: E402

project = "fedrec"
author = "the fedrec authors"
copyright = "2026, the fedrec authors"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "fedrec_sphinx",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# Guides (MyST, CommonMark with tables; no dollar math: a "$" is text). Links
# `[text](page.md#a-heading)` resolve to heading anchors.
myst_heading_anchors = 4

# API reference: docstrings in reStructuredText with Google/NumPy sections (napoleon).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
autodoc_inherit_docstrings = False
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
add_module_names = False
# The tables of contents list the pages' sections (a module each), not every object: an API page
# documents hundreds of them (and the build takes a third less time).
toc_object_entries = False

html_theme = "furo"
html_title = f"fedrec {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
