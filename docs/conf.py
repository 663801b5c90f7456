"""Sphinx configuration of fastln's documentation site.

Build it from the repository root, after ``pip install .`` (autodoc imports
the compiled fastln)::

    pip install ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html

The pages are MyST markdown (myst_parser) and, under reference/, reStructuredText
for autosummary, which writes a page per public name into reference/generated/
from the numpydoc docstrings. The C reference is generated from the public
headers by the local extension _ext/c_reference.py. Nothing is fetched from
the network (no intersphinx, no remote images or fonts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))

import fastln  # noqa: E402  (after the path set-up above, like every Sphinx conf)

project = "fastln"
author = "the fastln developers"
copyright = "2026, the fastln developers"
version = release = fastln.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx_copybutton",
    "c_reference",
]

root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_templates", "_ext"]
templates_path = ["_templates"]

# MyST: anchors for headings down to ###, so links like design.md#numerics resolve
myst_heading_anchors = 3

# autosummary writes reference/generated/*.rst; autodoc reads the docstrings,
# whose numpydoc "Parameters" sections carry the types
autosummary_generate = True
autodoc_typehints = "none"
autodoc_preserve_defaults = True     # defaults as written: np.float32, not <class ...>
add_module_names = False
# fastln.torch's reference needs torch only to import the module: where torch
# is missing (the docs extra does not install it), autodoc stands in for it
try:
    import torch  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["torch"]
numpydoc_show_class_members = False   # the class template lists the methods itself
numpydoc_xref_param_type = False

# quotes and ellipses only: "--" stays two hyphens, as the command lines' options
# in the docstrings (fastln.serve's --ws-port, --max-frame) are written
smartquotes_action = "qe"

html_theme = "pydata_sphinx_theme"
html_title = f"fastln {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
html_copy_source = False

# the copy button leaves prompts and console output out of what it copies
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
