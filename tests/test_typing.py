"""Typing: the stubs of the compiled modules (fastln/*.pyi) and the py.typed marker.

* ``python -m mypy.stubtest fastln`` checks every stub against the built
  module (names, parameters, defaults) and the pure-Python modules against
  themselves; it must find nothing beyond tests/stubtest_allowlist.txt.
* mypy on a snippet of correct user code passes, and on a snippet of wrong
  code reports exactly the errors marked in it: the stubs are in use.
* An installed fastln ships the stubs and py.typed.

mypy is a test dependency: under CI (the environment variable CI set) a
missing mypy fails these tests; elsewhere they are skipped.

Which fastln is checked: the one these tests imported. Run from the repo root
(as CI does), that is the checkout's fastln/, which shadows an installed copy;
mypy and the runtime import in stubtest see the same copy because they run in
the directory above it (mypy searches the working directory before
site-packages, like ``python -m``). Under CI, where a regular (not editable)
install of the checkout exists too (``pip install ".[test]"``), stubtest
checks that one as well: it is what users get. (Elsewhere an installed copy
may be older than the checkout, and is left alone.)
"""
import importlib.metadata
import importlib.util
import os
import re
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import fastln

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "stubtest_allowlist.txt"

# the compiled modules of fastln/, each with its stub (fastln.rnn._engine has one too)
COMPILED = ("_lib", "_rows", "_norms", "_add_norms")

# submodules that need an optional dependency to import: stubtest cannot check
# them without it (their allowlist entries are then replaced by the module's)
OPTIONAL_MODULES = {"dask": "dask", "torch": "torch"}

# mypy configuration for stubtest (written to a temporary file).
STUBTEST_CONFIG = """\
[mypy]
cache_dir = {cache_dir}

# Optional dependencies, imported only where present; not analyzed where
# present either (dask alone would double the run time).
[mypy-ml_dtypes.*,dask.*,onnx.*,onnxruntime.*,torch.*,jax,jax.*]
ignore_missing_imports = True
follow_imports = skip
"""

# mypy configuration for the snippets: errors inside fastln itself are not
# the snippets' (mypy hides them for an installed package anyway).
SNIPPET_CONFIG = """\
[mypy]
cache_dir = {cache_dir}
[mypy-fastln.*]
follow_imports = silent
[mypy-ml_dtypes.*,dask.*,onnx.*,onnxruntime.*,torch.*,jax,jax.*]
ignore_missing_imports = True
follow_imports = skip
"""


@pytest.fixture(scope="module")
def require_mypy():
    """mypy, or a skip (a failure under CI, where it is a test dependency)."""
    if os.environ.get("CI"):
        try:
            import mypy.stubtest  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install
            pytest.fail(f"CI is set but mypy cannot be imported: {exc!r} "
                        "(it is in the test extra: pip install '.[test]')")
    else:
        pytest.importorskip("mypy.stubtest")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One mypy cache for the module (stubtest fills it, the snippets reuse it)."""
    return tmp_path_factory.mktemp("mypy_cache")


def _site_dirs():
    paths = sysconfig.get_paths()
    dirs = {Path(paths[k]).resolve() for k in ("purelib", "platlib")}
    if site.ENABLE_USER_SITE:
        dirs.add(Path(site.getusersitepackages()).resolve())
    return dirs


def _installed_dist():
    """fastln's distribution in site-packages, or None. (Searched there only:
    ``pip install .`` also leaves a fastln.egg-info in the checkout, which
    importlib.metadata finds first when run from the repo root.)"""
    dists = importlib.metadata.distributions(
        name="fastln", path=[str(d) for d in sorted(_site_dirs()) if d.is_dir()])
    return next(iter(dists), None)


def _imported():
    """(package dir, working directory) for the fastln these tests imported."""
    pkg = Path(fastln.__file__).resolve().parent
    root = pkg.parent
    # an installed copy is found from anywhere; mypy must not search
    # site-packages as a working directory (it would check it as user code)
    return pkg, (None if root in _site_dirs() else root)


def _installed():
    """The package dir of a regular (not editable) installed fastln, or None."""
    dist = _installed_dist()
    if dist is None:
        return None
    init = Path(dist.locate_file("fastln/__init__.py"))
    return init.parent.resolve() if init.is_file() else None


def _targets():
    # outside CI an installed copy may be older than the checkout: only CI,
    # which installs this checkout, checks it
    targets = ["imported"]
    installed = _installed() if os.environ.get("CI") else None
    if installed is not None and installed != _imported()[0]:
        targets.append("installed")
    return targets


def _run(cmd, cwd, env=None, timeout=600):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _setting(target, tmp_path):
    """(package dir, working directory, environment) for stubtest/mypy on target."""
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    if target == "imported":
        pkg, cwd = _imported()
    else:
        pkg, cwd = _installed(), None
        env.pop("PYTHONPATH", None)   # nothing may shadow site-packages
    if cwd is None:
        cwd = tmp_path / "cwd"
        cwd.mkdir()
    # the runtime side must import the same copy
    r = _run([sys.executable, "-c", "import fastln; print(fastln.__file__)"], cwd, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(r.stdout.strip()).resolve().parent == pkg, (r.stdout, pkg)
    return pkg, cwd, env


def _allowlist(pkg, tmp_path):
    """tests/stubtest_allowlist.txt, adapted to the optional dependencies present."""
    lines = ALLOWLIST.read_text().splitlines()
    for sub, dep in OPTIONAL_MODULES.items():
        present = (pkg / (sub + ".py")).exists() or (pkg / sub / "__init__.py").exists()
        if present and importlib.util.find_spec(dep) is None:
            name = re.escape("fastln." + sub)
            lines = [ln for ln in lines if not ln.strip().startswith(name)]
            lines.append(f"{name}(\\..+)?  # needs {dep}, which is not installed")
    path = tmp_path / "allowlist.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("target", _targets())
def test_stubtest(target, tmp_path, cache_dir, require_mypy):
    pkg, cwd, env = _setting(target, tmp_path)
    assert all((pkg / f"{name}.pyi").is_file() for name in COMPILED), pkg
    assert (pkg / "py.typed").is_file(), pkg
    config = tmp_path / "mypy.ini"
    config.write_text(STUBTEST_CONFIG.replace("{cache_dir}", str(cache_dir)))
    cmd = [sys.executable, "-m", "mypy.stubtest", "fastln",
           "--mypy-config-file", str(config),
           "--allowlist", str(_allowlist(pkg, tmp_path))]
    r = _run(cmd, cwd, env)
    output = r.stdout + r.stderr
    print(output)
    assert r.returncode == 0, f"stubtest on {pkg} (cwd {cwd}) failed:\n{output}"
    # the package's modules, the compiled one among them, were checked
    m = re.search(r"Success: no issues found in (\d+) modules", output)
    assert m and int(m.group(1)) >= 5, output


def test_stub_defaults_match_runtime():
    """Default values in the compiled modules' stubs are the modules' (stubtest
    skips the defaults of overloaded functions)."""
    pkg, _ = _imported()
    checked = 0
    for name in COMPILED:
        checked += _check_defaults(pkg / f"{name}.pyi", importlib.import_module(f"fastln.{name}"))
    assert checked >= 30, checked


def _check_defaults(stub, module):
    """Asserts the defaults of stub's functions are module's; returns how many it checked."""
    import ast
    import inspect

    tree = ast.parse(stub.read_text())
    checked = 0
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = inspect.signature(getattr(module, fn.name)).parameters
        args = fn.args
        pairs = list(zip(args.args[len(args.args) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            if isinstance(default, ast.Constant) and default.value is Ellipsis:
                continue
            want = params[arg.arg].default
            got = ast.literal_eval(default)
            assert type(got) is type(want) and got == want, (fn.name, arg.arg, got, want)
            checked += 1
    return checked


def _mypy(code, tmp_path, cache_dir):
    """mypy --strict on a snippet; (return code, output, error lines as (line, code))."""
    _, cwd, env = _setting("imported", tmp_path)
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(code))
    config = tmp_path / "mypy.ini"
    config.write_text(SNIPPET_CONFIG.replace("{cache_dir}", str(cache_dir)))
    r = _run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(config),
              "--show-error-codes", "--no-pretty", "--hide-error-context", str(snippet)],
             cwd, env)
    output = r.stdout + r.stderr
    print(output)
    errors = {(int(m.group(1)), m.group(2)) for m in re.finditer(
        r"^.*snippet\.py:(\d+): error: .*\[([a-z-]+)\]$", output, re.MULTILINE)}
    return r.returncode, output, errors


GOOD = """\
    from typing import Any, Dict, Tuple, Union

    import numpy as np
    import numpy.typing as npt
    from typing_extensions import assert_type

    import fastln
    from fastln import _lib
    from fastln.rnn import _engine

    A = npt.NDArray[Any]
    x = np.ones((4, 8), np.float32)
    w = np.ones(8, np.float32)
    flag = bool(x.size)

    assert_type(fastln.layer_norm(x), A)
    assert_type(fastln.layer_norm([[1.0, 2.0]], [1.0, 1.0], None, axis=(0, 1), eps=1e-3), A)
    assert_type(fastln.layer_norm(x, w, w, eps=np.float32(1e-5), out=x), A)
    assert_type(fastln.layer_norm(x, return_stats=True), Tuple[A, A, A])
    assert_type(fastln.layer_norm(x, return_stats=False), A)
    assert_type(fastln.layer_norm(x, return_stats=flag), Union[A, Tuple[A, A, A]])
    y, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    assert_type(fastln.layer_norm_backward(x, x, mean, rstd, w, axis=-1, out=None),
                Tuple[A, A, A])
    assert_type(fastln.rms_norm(x, w, eps=1e-6), A)
    y, rstd = fastln.rms_norm(x, return_stats=True)
    assert_type(fastln.rms_norm_backward(x, x, rstd), Tuple[A, A])
    assert_type(fastln.add_layer_norm(x, x, w, w), Tuple[A, A])
    assert_type(fastln.add_layer_norm(x, x, out=(x, None)), Tuple[A, A])
    assert_type(fastln.add_layer_norm(x, x, return_stats=True), Tuple[A, A, A, A])
    isa: str = fastln.get_isa()
    openmp: bool = fastln.has_openmp()
    ok: bool = _lib.isa_supported("avx2")
    n: int = _lib.get_num_threads() + _lib.get_requested_threads()
    _lib.set_num_threads(n)
    cells: Dict[str, int] = _engine.CELLS
    size: int = _engine.cache_size("lstm", 5, 2, 8) + _engine.work_size("gru", 5, 2, 8)
"""

# each line marked `# E: code` must get that mypy error, and no other line any
BAD = """\
    from typing import Any

    import numpy as np
    import numpy.typing as npt

    import fastln
    from fastln import _lib

    x = np.ones((4, 8), np.float32)
    fastln.layer_norm(x, eps="a")  # E: call-overload
    fastln.layer_norm(x, x, x, x)  # E: call-overload
    fastln.rms_norm(x, epsilon=1e-6)  # E: call-overload
    fastln.add_layer_norm(x, x, out=[x])  # E: call-overload
    fastln.layer_norm_backward(x, x)  # E: call-arg
    fastln.rms_norm_backward(x, x, x, axis="last")  # E: arg-type
    y, mean = fastln.layer_norm(x, return_stats=True)  # E: misc
    z: npt.NDArray[Any] = fastln.rms_norm(x, return_stats=True)  # E: assignment
    s: str = fastln.has_openmp()  # E: assignment
    _lib.set_num_threads("4")  # E: arg-type
"""


def test_mypy_accepts_correct_use(tmp_path, cache_dir, require_mypy):
    rc, output, errors = _mypy(GOOD, tmp_path, cache_dir)
    assert rc == 0 and not errors, output


def test_mypy_rejects_wrong_use(tmp_path, cache_dir, require_mypy):
    rc, output, errors = _mypy(BAD, tmp_path, cache_dir)
    expected = {(i, m.group(1)) for i, line in enumerate(textwrap.dedent(BAD).splitlines(), 1)
                for m in [re.search(r"# E: ([a-z-]+)$", line)] if m}
    assert len(expected) == 10
    assert rc == 1, output
    assert errors == expected, output


def test_installed_package_is_typed():
    """A regular install ships the stubs and the marker (setup.py's package_data)."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI an installed fastln may predate the checkout")
    dist = _installed_dist()
    if dist is None:
        pytest.skip("fastln is not installed (the checkout is used in place)")
    files = {str(f).replace(os.sep, "/") for f in dist.files or ()}
    if "fastln/__init__.py" not in files:
        pytest.skip("fastln is installed in editable mode (the checkout's files are used)")
    assert {f"fastln/{name}.pyi" for name in COMPILED} | {"fastln/py.typed"} <= files, \
        sorted(files)


# A user's script over the public API (functions, layers, an RNN model,
# threads, the cache, the references): mypy --strict accepts it, and the
# types it infers are the documented ones (assert_type).
USER_SCRIPT = """\
    from typing import Any, Dict, Tuple

    import numpy as np
    import numpy.typing as npt
    from typing_extensions import assert_type

    import fastln
    import fastln.reference
    import fastln.rnn_reference
    from fastln.rnn import LNGRU, LNLSTM, LSTM, RNN

    A = npt.NDArray[Any]
    F64 = npt.NDArray[np.float64]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    b = np.zeros(64, np.float32)

    # functions
    y: A = fastln.layer_norm(x, w, b)
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(np.ones_like(y), x, mean, rstd, w)
    y, rstd = fastln.rms_norm(x, w, return_stats=True)
    dx, dw = fastln.rms_norm_backward(np.ones_like(y), x, rstd, w)
    y, s = fastln.add_layer_norm(x, x, w, b)
    y, s, mean, rstd = fastln.add_layer_norm(x, x, w, b, return_stats=True)

    # layers
    ln = fastln.LayerNorm(64, eps=1e-6, dtype=np.float32)
    assert_type(ln(x), A)
    assert_type(ln.backward(np.ones_like(x)), A)
    grads: Dict[str, A] = ln.grads
    weight = ln.weight
    if weight is not None:
        weight += 0.1 * grads["weight"]
    rms = fastln.RMSNorm((64,), elementwise_affine=False)
    assert_type(rms.forward(x), A)
    assert_type(rms.backward(x), A)
    assert_type(fastln.LayerNorm.from_torch(object()), fastln.LayerNorm)
    state: Dict[str, A] = rms.state_dict()
    rms.load_state_dict(state)
    shape: Tuple[int, ...] = ln.normalized_shape

    # recurrent networks, through the lazily loaded submodule too
    lstm = fastln.rnn.LNLSTM(input_size=8, hidden_size=16, num_layers=2, seed=0)
    assert_type(lstm, LNLSTM)
    xs = np.ones((5, 3, 8), np.float32)
    out, (h, c) = lstm.forward(xs)
    assert_type(lstm.forward(xs, (h, c), lengths=[5, 4, 3]), Tuple[A, Tuple[A, A]])
    dxs, (dh0, dc0) = lstm.backward(np.ones_like(out), (None, c))
    assert_type(dh0, A)
    h_t, (h, c) = lstm.step(xs[0], (h, c))
    gru = LNGRU(8, 16, batch_first=True)
    assert_type(gru(xs), Tuple[A, A])
    assert_type(gru.backward(np.ones((5, 3, 16), np.float32)), Tuple[A, A])
    assert_type(fastln.rnn.LNRNN(8, 16, nonlinearity="relu").step(xs[0]), Tuple[A, A])
    assert_type(LSTM.from_torch(object()), LSTM)
    assert_type(RNN(8, 16).forward(xs)[1], A)
    params: Dict[str, A] = lstm.params
    lstm.load_state_dict(lstm.state_dict())

    # threads, the cache, instruction sets
    with fastln.threads(1):
        n: int = fastln.get_num_threads()
    fastln.set_num_threads(None)
    info = fastln.cache_info()
    hits: int = info.hits + info.blocks
    fastln.set_cache_limit(0)
    fastln.empty_cache()
    isas: list[str] = fastln.supported_isas()

    # references
    assert_type(fastln.reference.layer_norm(x), F64)
    assert_type(fastln.reference.rms_norm(x, return_stats=True), Tuple[F64, F64])
    assert_type(fastln.reference.layer_norm_backward(x, x, mean, rstd), Tuple[F64, F64, F64])
    yr, (hr, cr) = fastln.rnn_reference.lnlstm_forward(lstm.params, xs, num_layers=2)
    assert_type(yr, F64)
"""

# the same script's mistakes, each marked with the error mypy must report
USER_SCRIPT_BAD = """\
    from typing import Any, Tuple

    import numpy as np

    import fastln
    from fastln.rnn import LNGRU, LNLSTM

    x = np.ones((4, 8), np.float32)
    ln = fastln.LayerNorm(8)
    ln.forward(x, x)  # E: call-arg
    ln.backward()  # E: call-arg
    fastln.RMSNorm(8, bias=False)  # E: call-arg
    h: Tuple[Any, Any] = LNGRU(8, 4).forward(x)[1]  # E: assignment
    LNGRU(8, 4).forward(x, cache=None)  # E: arg-type
    y2, state = LNLSTM(8, 4).forward(x)
    state.shape  # E: attr-defined
    fastln.set_num_threads("2")  # E: arg-type
    fastln.rnn.LNLSTM(8, 4, seed="zero")  # E: arg-type
    fastln.rnn.NoSuchModel  # E: attr-defined
    fastln.no_such_module  # E: attr-defined
"""


def test_mypy_accepts_a_user_script(tmp_path, cache_dir, require_mypy):
    rc, output, errors = _mypy(USER_SCRIPT, tmp_path, cache_dir)
    assert rc == 0 and not errors, output


def test_mypy_rejects_a_user_scripts_mistakes(tmp_path, cache_dir, require_mypy):
    rc, output, errors = _mypy(USER_SCRIPT_BAD, tmp_path, cache_dir)
    expected = {(i, m.group(1))
                for i, line in enumerate(textwrap.dedent(USER_SCRIPT_BAD).splitlines(), 1)
                for m in [re.search(r"# E: ([a-z-]+)$", line)] if m}
    assert len(expected) == 10
    assert rc == 1, output
    assert errors == expected, output
