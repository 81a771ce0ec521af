"""Sphinx configuration of the documentation site: the README's quick start, the report
(the chapters in this folder), an executed tutorial and the API reference.

Build (strict: any warning, such as a broken link, a missing figure or a failing tutorial
cell, fails the build):

    sphinx-build -W --keep-going -b html paper paper/_build/html

Needs the ``docs`` extra (``pip install -e '.[docs]'``). Math is typeset by a MathJax copy
bundled in the site (``sphinx-mathjax-offline``), so the site works without network access.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Document and execute the checkout being built, not whichever dca_theory is installed: autodoc
# imports from sys.path, the tutorial's kernel (a subprocess) from PYTHONPATH.
sys.path[:0] = [str(REPO), str(HERE / "_ext")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

project = "dca_theory"
author = "dca_theory contributors"
copyright = "the dca_theory contributors"

extensions = [
    "myst_nb",  # MyST Markdown for the report, and executes the tutorial notebook
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # the MathJax files copied into _static: no CDN
    "public_api",
]

exclude_patterns = ["_build", "_ext", "**/.ipynb_checkpoints"]
root_doc = "index"
html_theme = "furo"
html_title = "dca_theory"
html_static_path: list[str] = []

myst_enable_extensions = ["dollarmath", "amsmath"]
# $$...$$ inside a paragraph or list item is display math (as on GitHub), not two dollars
myst_dmath_double_inline = True
myst_heading_anchors = 3
# The 05_lm/*.md sections open with level-2 headings (they read as sections of chapter 5);
# as pages of their own that is intended, not a mistake.
suppress_warnings = ["myst.header"]

# The tutorial runs on every build, so a change of the package that breaks it fails the build:
# a failing cell is a warning that shows the cell's traceback, and -W makes it an error.
nb_execution_mode = "force"
nb_execution_raise_on_error = False
nb_execution_timeout = 300
nb_execution_show_tb = True

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
