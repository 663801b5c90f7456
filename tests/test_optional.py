"""fastln as a bare ``pip install .`` leaves it: numpy, nothing else.

Each check runs in a subprocess where optional packages cannot be imported
(tests/_blocker.py puts a finder that refuses them first on sys.meta_path), so
a missing extra is tested on every run, whatever this environment holds.

1. With every optional package blocked, ``python -m fastln --quick`` passes,
   and so does every README example and docstring example that imports no
   optional package.
2. With each optional package blocked in turn, the self-check passes, every
   feature that does not need the package works (float64 and float32
   recurrent models forward, backward and step, float16 norms, fastln.dask
   without distributed, ...), and every feature that needs it raises an
   ImportError naming the package and the extra that installs it.
3. Every import of a package outside the standard library, in fastln/,
   bench/, examples/ and tests/, is of numpy, a first-party module, or
   a package that pyproject.toml declares in an extra, and ``[test]`` holds
   every extra's packages but ``[docs]``'s (the site's build tools) and the
   peers' (torch, which ``[torch]`` installs for fastln.torch).
   fastln/_optional.py names only declared extras.
"""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from _util import package_parent, started_ahead

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_blocker.py")

# the import name of each optional package -> its distribution on PyPI
DISTRIBUTIONS = {
    "ml_dtypes": "ml_dtypes", "onnx": "onnx", "onnxruntime": "onnxruntime",
    "dask": "dask", "distributed": "distributed", "threadpoolctl": "threadpoolctl",
    "matplotlib": "matplotlib", "sklearn": "scikit-learn", "tqdm": "tqdm",
    "starlette": "starlette", "uvicorn": "uvicorn", "httpx": "httpx",
    "picows": "picows", "uvloop": "uvloop", "openvino": "openvino",
    "prometheus_client": "prometheus_client", "redis": "redis",
    "pytest": "pytest", "hypothesis": "hypothesis", "mypy": "mypy", "Cython": "Cython",
    "sniffio": "httpx",   # httpx's own optional dependency, probed by the load test
}
# peers that fastln compares itself with or reads objects of, and never
# installs: torch is a multi-gigabyte wheel of its own build, which a user
# brings (the tests that need it skip without it, or fail under
# FASTLN_REQUIRE_TORCH=1); jax is an optional row of the benchmarks;
# torchaudio's predictor is what examples/emformer_predictor.py runs, where it
# imports (the tests read its source from the released wheel instead);
# onnxscript is torch's dynamo ONNX exporter, an optional row of bench/lstmp.py
PEERS = {"torch", "jax", "torchaudio", "onnxscript"}
REQUIRED = {"numpy"}
# SciPy, which other packages bring along, is blocked with the optional packages: fastln
# needs no BLAS library
OPTIONAL = sorted(set(DISTRIBUTIONS) - {"pytest", "hypothesis", "mypy", "Cython"} | PEERS
                  | {"scipy"})


def run_blocked(blocked, *args, timeout=300):
    """Runs ``python tests/_blocker.py BLOCKED ARGS`` on the fastln under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, BLOCKER, ",".join(blocked), *args], env=env,
                          cwd=package_parent(), capture_output=True, text=True,
                          timeout=timeout, check=False)


# ---- 1. nothing optional --------------------------------------------------------------

def test_main_job_runs_without_any_optional_package():
    r = run_blocked(OPTIONAL, "-m", "fastln", "--quick")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "self-check: PASS" in r.stdout


def _readme_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


def _imports_optional(code):
    tree = ast.parse(code)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    return bool(names & set(OPTIONAL))


# runs each README block with no optional import, then every docstring example
# of the public modules whose example code names no optional package; prints the
# count of each and any failure
_EXAMPLES = r"""
import doctest, importlib, io, re, sys
blocks, modules, optional = sys.argv[1:4]
ran = 0
for i, block in enumerate(eval(blocks)):
    try:
        exec(compile(block, f"README.md block {i}", "exec"), {"__name__": "readme"})
    except BaseException as e:
        print(f"FAIL README block {i}: {type(e).__name__}: {e}")
        print(block)
    ran += 1
print("README blocks", ran)
pattern = re.compile(r"\b(%s)\b" % "|".join(optional.split(",")))
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
count = 0
for name in modules.split(","):
    module = importlib.import_module(name)
    for test in doctest.DocTestFinder().find(module):
        if not test.examples or any(pattern.search(e.source) for e in test.examples):
            continue
        out = io.StringIO()
        result = runner.run(test, out=out.write)
        count += 1
        if result.failed:
            print("FAIL docstring", test.name)
            print(out.getvalue()[-3000:])
print("docstrings", count)
"""


def test_examples_run_without_any_optional_package():
    blocks = [b for b in _readme_blocks() if not _imports_optional(b)]
    assert blocks, "every README block needs an optional package"
    modules = ["fastln", "fastln._lib", "fastln._norms", "fastln._add_norms", "fastln.layers",
               "fastln.rnn", "fastln.rnn.functional", "fastln._threads", "fastln._memory",
               "fastln.reference", "fastln.rnn_reference"]
    r = run_blocked(OPTIONAL, "-c", _EXAMPLES, repr(blocks), ",".join(modules),
                    ",".join(OPTIONAL))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "FAIL" not in r.stdout, r.stdout[-6000:]
    assert f"README blocks {len(blocks)}" in r.stdout, r.stdout
    count = int(re.search(r"docstrings (\d+)", r.stdout).group(1))
    assert count >= 40, r.stdout   # most examples need nothing optional


# ---- 2. one package at a time ---------------------------------------------------------

# what works without each package, then what must raise ImportError naming it
_WORKS = r"""
import numpy as np, fastln
from fastln import rnn
from fastln.__main__ import self_check
ok, _ = self_check()
assert ok, "self-check failed"
x16 = np.linspace(-1, 1, 96, dtype=np.float16).reshape(3, 32)
assert fastln.layer_norm(x16).dtype == np.float16
for cls in (rnn.LNLSTM, rnn.LNGRU, rnn.LNRNN, rnn.LSTM, rnn.GRU, rnn.RNN):
    for dt in (np.float64, np.float32):
        m = cls(3, 5, num_layers=2, dtype=dt, seed=0)
        assert m.dtype == dt and all(p.dtype == dt for p in m.params.values())
        x = np.ones((4, 2, 3), dt)
        y, state = m.forward(x)
        assert y.dtype == dt, y.dtype
        dx, _ = m.backward(np.ones_like(y))
        assert dx.dtype == dt
        h, _ = m.step(x[0])
        assert np.allclose(h, y[0], rtol=1e-5, atol=1e-6)
        y2, _ = m.forward(x, cache=False)
        assert np.array_equal(y, y2)
print("WORKS")
"""

_NEEDS = {
    "ml_dtypes": [("bfloat16", "from fastln.rnn import LNLSTM; LNLSTM(2, 3).to('bfloat16')"),
                  ("bfloat16", "from fastln.rnn import GRU; GRU(2, 3, dtype='bfloat16')")],
    "onnx": [("onnx", "import fastln.rnn; fastln.rnn.from_onnx(b'')")],
    "dask": [("dask", "import fastln.dask"),
             ("dask", "import fastln; fastln.dask.layer_norm")],
    "picows": [("serve", "import fastln.serve; fastln.serve.StreamClient")],
    "redis": [("serve", "from fastln.serve.store import open_store; "
                        "open_store('redis://h:1/0', 'f', dtypes=['f4'], shape=(1,))")],
    "torch": [("torch", "import fastln.torch")],
}

_RAISES = r"""
import sys
package, extra, code = sys.argv[1:4]
try:
    exec(code)
except ImportError as e:
    message = str(e)
    assert package in message and f'fastln[{extra}]' in message, message
    print("RAISES", message)
else:
    raise AssertionError(f"{code!r} ran without {package}")
"""


def _without(package):
    """The runs with package blocked: _WORKS, then _RAISES for each of its _NEEDS."""
    return [run_blocked([package], "-c", _WORKS)] + [
        run_blocked([package], "-c", _RAISES, package, extra, code)
        for extra, code in _NEEDS.get(package, [])]


@pytest.fixture(scope="module")
def runs_without(request):
    """The selected packages' runs, started ahead two at a time."""
    with started_ahead(request, "test_each_optional_package_missing_in_turn", _without,
                       [(package, package) for package in OPTIONAL]) as futures:
        yield futures


@pytest.mark.parametrize("package", OPTIONAL)
def test_each_optional_package_missing_in_turn(package, runs_without):
    future = runs_without.pop(package, None)
    works, *raises = future.result() if future is not None else _without(package)
    assert works.returncode == 0 and "WORKS" in works.stdout, (
        works.stdout + works.stderr)[-4000:]
    for r in raises:
        assert r.returncode == 0 and "RAISES" in r.stdout, (r.stdout + r.stderr)[-3000:]


@pytest.mark.parametrize("package", ["picows", "starlette", "uvicorn", "prometheus_client"])
def test_fastln_serve_without_the_serve_extra_names_it(package):
    r = run_blocked([package], "-m", "fastln.serve", "--help")
    assert r.returncode == 1 and package in r.stderr and 'fastln[serve]' in r.stderr, (
        r.stdout + r.stderr)[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_dask_works_without_distributed():
    pytest.importorskip("dask.array")
    r = run_blocked(["distributed"], "-c", "import dask.array as da, numpy as np, fastln.dask\n"
                    "y = fastln.dask.layer_norm(da.ones((4, 8), chunks=(2, 8)))\n"
                    "assert np.allclose(y.compute(), 0)\nprint('OK')")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_import_fastln_raises_no_import_error_with_everything_blocked():
    r = run_blocked(OPTIONAL, "-c", "import fastln, fastln.rnn, fastln.layers, "
                    "fastln.reference, fastln.rnn_reference, fastln.serve; print('OK')")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---- 3. imports and extras ------------------------------------------------------------

def _pyproject():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _distribution(requirement):
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("-", "_")


def _first_party():
    """Module names that live in the repository: fastln, bench, and every
    .py file or package directory of the scanned folders."""
    names = {"fastln", "bench", "examples", "tests"}
    for folder in ("bench", "examples", "tests", "examples/c"):
        for path in glob.glob(os.path.join(ROOT, folder, "*")):
            names.add(os.path.splitext(os.path.basename(path))[0])
    return names


def _imported(path):
    """The top-level names a file imports or probes for (importorskip,
    require, import_module, find_spec of a string), outside ``if
    TYPE_CHECKING:`` blocks."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):   # imports for type checkers only never run
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            if func in ("importorskip", "require", "import_module", "find_spec", "_import"):
                names.add(node.args[0].value.split(".")[0])
    return names


def _scanned_files():
    files = []
    for folder in ("fastln", "bench", "examples", "tests"):
        files += glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
    return [f for f in files if os.sep + "build" + os.sep not in f]


def test_every_optional_import_maps_to_a_declared_extra():
    project = _pyproject()["project"]
    extras = {name: {_distribution(r) for r in reqs}
              for name, reqs in project["optional-dependencies"].items()}
    # [docs] holds the site's build tools, which no test or example imports; the
    # peers (torch, in [torch]) stay out of [test], whose tests skip without them
    declared = set().union(*(v for k, v in extras.items() if k not in ("test", "docs"))) \
        - PEERS
    first_party = _first_party()
    stdlib = set(sys.stdlib_module_names)
    unknown, undeclared = {}, {}
    for path in _scanned_files():
        for name in _imported(path):
            if name in stdlib or name in first_party or name in REQUIRED or name in PEERS:
                continue
            rel = os.path.relpath(path, ROOT)
            if name not in DISTRIBUTIONS:
                unknown.setdefault(name, rel)
                continue
            dist = _distribution(DISTRIBUTIONS[name])
            if dist not in extras["test"]:
                undeclared.setdefault(f"{name} (not in [test])", rel)
            if not rel.startswith("tests") and dist not in declared:
                undeclared.setdefault(f"{name} (in no feature extra)", rel)
    assert not unknown, f"imports of packages this test does not know: {unknown}"
    assert not undeclared, f"imports without a declared extra: {undeclared}"
    # [test] installs what every feature extra installs
    assert declared <= extras["test"], sorted(declared - extras["test"])
    # the package list of this test matches the extras: nothing stale
    assert {_distribution(d) for d in DISTRIBUTIONS.values()} <= extras["test"]


def test_import_errors_name_declared_extras():
    import fastln._optional as optional

    extras = _pyproject()["project"]["optional-dependencies"]
    for package, extra in optional.EXTRAS.items():
        assert extra in extras, extra
        assert any(_distribution(r) == package.lower() for r in extras[extra]), (package, extra)
        message = str(optional.missing(package, "a feature"))
        assert package in message and f'fastln[{extra}]' in message, message


def test_dtype_sentinels_are_never_compared_while_none():
    """NumPy reads ``dtype == None`` as ``dtype == float64``: a comparison
    with a sentinel that is None without its package goes through a helper
    that checks for None first."""
    pattern = re.compile(r"[=!]=\s*_BF16\b|\b_BF16\s*[=!]=")
    for path in glob.glob(os.path.join(ROOT, "fastln", "*.py")):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if pattern.search(line) and "is not None and" not in line:
                    raise AssertionError(f"{os.path.relpath(path, ROOT)}:{lineno}: {line.strip()}")


def test_torch_is_taken_through_the_fixture():
    """A test that needs torch takes the ``torch`` fixture of conftest.py, which
    skips without torch but fails under FASTLN_REQUIRE_TORCH=1; a module-level
    import or a bare importorskip would skip (or break collection) silently."""
    bad = []
    for path in glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py")):
        if os.path.basename(path) == "conftest.py":
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:   # module level: collection needs torch
            if isinstance(node, (ast.Import, ast.ImportFrom)) and "torch" in _imported_by(node):
                bad.append(f"{os.path.basename(path)}:{node.lineno} imports torch")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" \
                    and node.args and getattr(node.args[0], "value", "").startswith("torch"):
                bad.append(f"{os.path.basename(path)}:{node.lineno} importorskip(torch)")
    assert not bad, bad


def _imported_by(node):
    if isinstance(node, ast.Import):
        return {a.name.split(".")[0] for a in node.names}
    return {node.module.split(".")[0]} if node.module else set()
