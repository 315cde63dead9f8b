"""Sphinx configuration of flatmem's documentation (scripts/check-docs.sh builds it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "flatmem"
author = "the flatmem authors"
release = "0.2.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "plain_docstrings"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "alabaster"

# Anchors for headings down to ###, so that a guide can link to a section (page.md#a-section).
# (The figures are the benchmarks' own files in bench/, referenced as ../../bench/*.png.)
myst_heading_anchors = 3

# Autodoc imports the installed packages: flatmem (its SWIG module and the
# library), flatmem.torch (torch) and flatmem.jax (flatmem_jax and jax).
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}

# Doxygen's HTML of the C API (scripts/check-docs.sh runs doxygen first) is copied
# into the site as capi/.
_doxygen_html = os.environ.get("FLATMEM_DOXYGEN_HTML")
html_extra_path = [_doxygen_html] if _doxygen_html else []
