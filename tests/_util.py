"""Shared helpers for the fastln test suite (imported by the test modules).

Kept out of conftest.py so that tests can import them by name; conftest.py
puts this directory on sys.path.
"""
import argparse
import contextlib
import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

F16, F32, F64 = np.float16, np.float32, np.float64
FLOAT_DTYPES = [F32, F64]


def require(module):
    """module, imported; a skip where it is missing, but a failure under CI,
    which installs every optional peer."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def require_program(name, *places):
    """The path of the program name (on PATH or at one of places); a skip
    where it is missing, but a failure under CI, which installs Debian's."""
    import shutil
    path = shutil.which(name) or next((p for p in places if os.access(p, os.X_OK)), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: CI installs Debian's")
        pytest.skip(f"{name} is not installed")
    return path


def named(arg):
    """Regex for ``pytest.raises(match=...)``: ``arg`` appears as a whole word."""
    return r"(?<![A-Za-z0-9_])" + re.escape(arg) + r"(?![A-Za-z0-9_])"


def result_dtype(dtype):
    """dtype of y/dx for an input of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(F16), np.dtype(F32), np.dtype(F64)):
        return dtype
    return np.dtype(F64)              # int, uint, bool


def stats_dtype(dtype):
    dtype = np.dtype(dtype)
    return np.dtype(F32) if dtype in (np.dtype(F16), np.dtype(F32)) else np.dtype(F64)


def norm_axes(axis, ndim):
    axes = (axis,) if np.isscalar(axis) else tuple(axis)
    return tuple(int(a) % ndim for a in axes)


def normalized_shape(shape, axis):
    """Shape of weight/bias: the normalized axes in the order given in ``axis``."""
    return tuple(shape[a] for a in norm_axes(axis, len(shape)))


def stats_shape(shape, axis):
    """Shape of mean/rstd: ``shape`` with the normalized axes removed."""
    axes = norm_axes(axis, len(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def base_tol(dtype):
    """(rtol, atol) for outputs of magnitude O(1) in ``dtype``'s result type."""
    dt = result_dtype(dtype)
    if dt == np.dtype(F64):
        return 1e-12, 1e-12
    if dt == np.dtype(F32):
        return 1e-5, 2e-5
    return 2e-3, 4e-3                 # float16 output


def assert_close(got, want, dtype, scale=None, err_msg="", rtol=None, atol=None):
    """Compare ``got`` to the float64 ``want`` with tolerances of ``dtype``.

    The absolute tolerance is scaled by ``scale`` (default: max(1, max|want|)),
    so the check is relative to the magnitude of the result.
    """
    got = np.asarray(got)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape, err_msg)
    r, a = base_tol(dtype)
    if scale is None:
        top = float(np.max(np.abs(want))) if want.size else 0.0
        if not np.isfinite(top):             # inf or NaN in want: its largest finite value
            finite = want[np.isfinite(want)]
            top = float(np.max(np.abs(finite))) if finite.size else 0.0
        scale = max(1.0, top)
    rtol = r if rtol is None else rtol
    atol = (a if atol is None else atol) * scale
    if _all_within(got, want, rtol, atol):
        return
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol,
                               err_msg=err_msg)


def _all_within(got, want, rtol, atol, chunk=1 << 15):
    """assert_allclose's own test, |got - want| <= atol + rtol * |want| everywhere, in
    slices whose temporaries stay in cache. False where any difference is NaN (NaN or
    inf in either), which assert_allclose then judges."""
    g, w = got.reshape(-1), want.reshape(-1)
    for i in range(0, w.size, chunk):
        wi = w[i:i + chunk]
        if not np.all(np.abs(g[i:i + chunk].astype(np.float64) - wi) <= atol + rtol * np.abs(wi)):
            return False
    return True


def randn(rng, shape, dtype=F32, loc=0.0, scale=1.0):
    """Random normal array of ``dtype`` (values exactly representable in it)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -5
        return rng.integers(lo, 6, size=shape).astype(dtype)
    return (loc + scale * rng.standard_normal(shape)).astype(dtype)


def params(rng, nshape, dtype, kind):
    """(weight, bias) for ``kind`` in 'none', 'weight', 'bias', 'both'."""
    w = b = None
    if kind in ("weight", "both"):
        w = (1.0 + 0.5 * rng.standard_normal(nshape)).astype(dtype)
    if kind in ("bias", "both"):
        b = (0.5 * rng.standard_normal(nshape)).astype(dtype)
    return w, b


AFFINE = ["none", "weight", "bias", "both"]


def as_f64(a, dtype):
    """What the kernel sees: ``a`` cast to ``dtype`` and then read as float64."""
    if a is None:
        return None
    return np.asarray(a).astype(dtype).astype(np.float64)


# ---- layouts: same values, different memory layout ----------------------

def _sliced(x):
    big = np.zeros(tuple(2 * n + 1 for n in x.shape), dtype=x.dtype)
    view = big[tuple(slice(1, None, 2) for _ in x.shape)]
    view[...] = x
    return view


def _negstride(x):
    return np.flip(np.flip(x).copy())


def _readonly(x):
    x = x.copy()
    x.setflags(write=False)
    return x


LAYOUTS = {
    "C": np.ascontiguousarray,
    "F": np.asfortranarray,
    "negstride": _negstride,
    "sliced": _sliced,
    "readonly": _readonly,
}


def relayout(x, kind):
    y = LAYOUTS[kind](np.asarray(x))
    assert np.array_equal(y, x)
    if kind == "negstride" and y.size > 1:
        assert any(s < 0 for s in y.strides)
    if kind == "sliced" and y.size > 1:
        assert not y.flags.c_contiguous and not y.flags.f_contiguous
    return y


# ---- inputs big enough for the non-temporal ("streaming") store path -------
# Outputs of >= 32 MiB (16 MiB in the AVX-512 float32 LayerNorm and RMSNorm
# forwards; add + LayerNorm: s and y together) are written with streaming
# stores; these shapes are above that (odd H, so rows start unaligned).
STREAM_SHAPES = {np.dtype(F32): (12300, 1031), np.dtype(F64): (6200, 1031)}

_BIG = {}


def big_inputs(dtype):
    """Cached (x, r, w, b) of a streaming-sized shape for ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype not in _BIG:
        rng = np.random.default_rng(99)
        shape = STREAM_SHAPES[dtype]
        x = (rng.standard_normal(shape, dtype=np.float32) * 2 + 0.5).astype(dtype)
        r = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        w = (1 + 0.5 * rng.standard_normal(shape[-1])).astype(dtype)
        b = rng.standard_normal(shape[-1]).astype(dtype)
        _BIG[dtype] = (x, r, w, b)
    return _BIG[dtype]


def outlier_rows(rng, H, dtype):
    """Rows whose first element lies far from the rest, e.g. sqrt(H) std away.

    A variance computed in one pass around a shift of x[0] cancels badly here;
    a centred (two-pass) variance does not.
    """
    x = randn(rng, (5, H), dtype)
    x[0, 0] = np.sqrt(H)
    x[1, 0] = 1e4
    x[2, 0] = -300.0
    x[3] += 1e3
    x[3, 0] = 0.0
    x[4] = x[4] * 1e-3 + 50.0
    x[4, 0] = 0.0
    return x


def package_parent():
    """The directory holding the fastln package under test (source tree or site-packages)."""
    import fastln
    return os.path.dirname(os.path.dirname(os.path.abspath(fastln.__file__)))


@contextlib.contextmanager
def started_ahead(request, test, run, cases):
    """Calls run(value) for each (id, value) in cases whose id is that of a
    parametrization of the test function named test that the session
    selected, two at a time in threads of this process: each call's child
    processes run beside the other's and beside the tests before that one.
    Yields {id: Future}; the test pops its own. Not under pytest-xdist,
    whose workers would each start them all (the dict is then empty)."""
    from concurrent.futures import ThreadPoolExecutor
    selected = {item.callspec.id for item in request.session.items
                if getattr(item, "originalname", None) == test}
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {}
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        futures = {id_: pool.submit(run, value) for id_, value in cases if id_ in selected}
    try:
        yield futures
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_python(code, env=None):
    """Runs ``python -c code`` importing the same fastln; returns the CompletedProcess."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=package_parent(),
                          capture_output=True, text=True, timeout=120)


def out_like(kind, shape, dtype):
    """A fresh out= buffer of ``shape``: "C", "F", "sliced" or "negstride" layout."""
    if kind == "C":
        return np.empty(shape, dtype)
    if kind == "F":
        return np.empty(shape, dtype, order="F")
    if kind in ("sliced", "negstride"):
        return relayout(np.zeros(shape, dtype), kind)
    raise AssertionError(kind)


# ---- background C builds (tests/test_c.py, tests/test_cross.py) ----

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_build(cmd, outdir, name):
    """Starts the compiler command cmd (sources and flags; "-o outdir/name -lm"
    is added) in the background, from the repository root; returns
    (process, executable path, log path)."""
    exe, log = os.path.join(outdir, name), os.path.join(outdir, name + ".log")
    with open(log, "w") as f:
        proc = subprocess.Popen([*cmd, "-o", exe, "-lm"], cwd=REPO_ROOT, stdout=f,
                                stderr=subprocess.STDOUT)
    return proc, exe, log


def wait_build(started, timeout):
    """(returncode, compiler output, executable) of a start_build entry; the
    compiler is killed past timeout seconds."""
    proc, exe, log = started
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with open(log) as f:
        return proc.returncode, f.read(), exe


def kill_builds(started):
    """Kills the builds of {name: start_build entry} still running."""
    for proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_every_option_shows_its_default(parser):
    """Every option of an argparse parser has help that ends in its default."""
    assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    options = re.split(r"\n(?:options|optional arguments):", parser.format_help())[1]
    for action in parser._actions:
        if "-h" in action.option_strings or not action.option_strings:
            continue
        assert action.help, action.option_strings
        start = re.search(r"\n  " + re.escape(action.option_strings[0]) + r"\b", options)
        block = options[start.end():]
        nxt = re.search(r"\n  -", block)
        block = block[:nxt.start()] if nxt else block
        assert "(default:" in block, (action.option_strings, block)


def declared_functions(*headers):
    """The names of the functions that the C headers declare (src_c/api/fastln.h's
    style: one declaration a line start, the return type first)."""
    names = set()
    for header in headers:
        with open(header, encoding="utf-8") as f:
            names |= set(re.findall(r"^[a-z].*?[ *](fastln_\w+)\(", f.read(), re.MULTILINE))
    return names
