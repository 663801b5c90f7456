"""README.md and docs/ stay true.

* Every python block of README.md runs as written. A block with an
  ``if __name__ == "__main__":`` guard (the dask cluster) runs as a script of
  its own in a subprocess, as a user would run it; the others run in this
  process. A block that imports a package that is not installed is skipped
  (torch: through the ``torch`` fixture, so FASTLN_REQUIRE_TORCH=1 fails; the
  other packages fail under CI=1, which installs them).
* The C example's Makefile compiles every C source of the core (a dry run).
* The Markdown pages link only to files that exist in the repository, and
  point nowhere outside it.
"""
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
    [os.path.join(ROOT, "bench", "README.md"), os.path.join(ROOT, "bench", "RESULTS.md")]


def _blocks():
    if not os.path.exists(README):
        return []
    with open(README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


def _imports(block):
    """The top-level packages a block imports."""
    names = set()
    for line in block.splitlines():
        m = re.match(r"\s*import\s+(.+)", line)
        if m:
            names.update(part.split()[0].split(".")[0] for part in m.group(1).split(","))
        m = re.match(r"\s*from\s+(\S+)\s+import\b", line)
        if m:
            names.add(m.group(1).split(".")[0])
            if m.group(1) == "dask.distributed":   # a module of dask that needs distributed
                names.add("distributed")
    return names


def _require(block, request):
    for name in sorted(_imports(block)):
        if name == "torch":
            if importlib.util.find_spec("torch") is None:
                # a skip, or a failure under FASTLN_REQUIRE_TORCH=1
                request.getfixturevalue("torch")
        elif importlib.util.find_spec(name) is None:
            if os.environ.get("CI"):
                pytest.fail(f"the block needs {name}, which CI installs")
            pytest.skip(f"the block needs {name}, which is not installed")


@pytest.mark.skipif(not os.path.exists(README), reason="README.md not next to tests/")
def test_readme_has_python_blocks():
    assert _blocks(), "README.md has no python block"


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.splitlines()[0][:40])
def test_readme_block_runs(block, request, tmp_path):
    _require(block, request)
    if re.search(r"^if __name__ == .__main__.:", block, re.MULTILINE):
        script = tmp_path / "readme_block.py"
        script.write_text(block, encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        run = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env,
                             capture_output=True, text=True, timeout=600, check=False)
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    else:
        exec(compile(block, "README.md", "exec"), {})  # noqa: S102 (the README's own code)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_c_makefile_builds_every_core_source():
    makefile = os.path.join(ROOT, "examples", "c", "Makefile")
    if not os.path.exists(makefile):
        pytest.skip("examples/c/Makefile not in this checkout")
    run = subprocess.run(["make", "-n", "-B", "-C", os.path.dirname(makefile)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    for path in glob.glob(os.path.join(ROOT, "src_c", "*.c")):
        assert f"src_c/{os.path.basename(path)}" in run.stdout, path
    assert "normalize.c" in run.stdout


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
