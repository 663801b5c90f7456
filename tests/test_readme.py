"""README.md stays true: its python blocks (the API tours) run as written."""
import importlib.util
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _blocks():
    if not os.path.exists(README):
        return []
    with open(README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.skipif(not os.path.exists(README), reason="README.md not next to tests/")
def test_readme_has_python_blocks():
    assert _blocks(), "README.md has no python block"


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.splitlines()[0][:40])
def test_api_tour_runs(block, request):
    if "torch" in block and importlib.util.find_spec("torch") is None:
        request.getfixturevalue("torch")   # a skip, or a failure under FASTLN_REQUIRE_TORCH=1
    exec(compile(block, "README.md", "exec"), {})
