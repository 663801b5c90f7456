"""README.md and docs/ stay true.

(tests/test_docs.py runs the python blocks of README.md and docs/.)

* The Markdown pages link only to files that exist in the repository, and
  point nowhere outside it.
* The README's int8 line states the int8 model's error against the float
  model in its own snippet: the snippet, run, keeps every |y8 - y| under the
  bound the comment gives, and the bound is not loose (the largest error is
  at least a tenth of it).
"""
import glob
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)) + \
    [os.path.join(ROOT, "bench", "README.md"), os.path.join(ROOT, "bench", "RESULTS.md")]


def _links(text):
    """The targets of Markdown links and images, without anchors."""
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#")[0]


@pytest.mark.parametrize("page", [p for p in PAGES if os.path.exists(p)],
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_page_links_stay_in_the_repository(page):
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for target in _links(text):
        path = os.path.normpath(os.path.join(os.path.dirname(page), target))
        assert path.startswith(ROOT + os.sep), f"{target} points outside the repository"
        assert os.path.exists(path), f"{target}: no such file"
    for outside in ("DESIGN.md", "../shared", "/work/"):
        assert outside not in text, f"{os.path.relpath(page, ROOT)} mentions {outside}"


def test_readme_int8_error_is_what_its_comment_says(monkeypatch):
    with open(README, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)
    block = next(b for b in blocks if "quantize(m)" in b)
    bound = float(re.search(r"# every \|y8 - y\| < ([0-9.e+-]+) here", block).group(1))
    monkeypatch.chdir(ROOT)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    error = float(np.abs(namespace["y8"] - namespace["y"]).max())
    assert bound / 10 <= error < bound, (error, bound)
