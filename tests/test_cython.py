"""The Cython interface: ``cimport fastln.kernels`` and ``fastln.get_include()``.

A small extension module, written as a user would write one, is compiled
here (Cython and the system C compiler) against the fastln under test, with
``fastln.get_include()`` as its only include directory of fastln's. It calls
the kernels of fastln/kernels.pxd inside ``with nogil:`` blocks (Cython
refuses to compile a call that needs the GIL there), and:

* it, and the example module of docs/guide/cython.md (built with the
  guide's setup.py and the guide's command), match fastln's Python API
  bitwise: LayerNorm and RMSNorm in
  float32 and float64, LayerNorm's backward, the fused residual add,
  channels first, and float16 storage;
* it shares fastln's state instead of holding a copy: a thread count or an
  instruction-set path set on one side reads back on the other, and the
  built module neither defines nor needs any ``fastln_*`` C symbol;
* the error codes come back as fastln.h documents them.

The installed package ships what the build needs: kernels.pxd, the private
declarations it cimports, and the two headers.
"""
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fastln

from _util import declared_functions, package_parent

EXTENSION = r'''
# cython: language_level=3, boundscheck=False, wraparound=False
cimport fastln.kernels as fk
from libc.stdint cimport int64_t, uint16_t

OK, ENOMEM, EINVAL = fk.FASTLN_OK, fk.FASTLN_ENOMEM, fk.FASTLN_EINVAL


def layer_norm_f32(const float[:, ::1] x, const float[::1] w, const float[::1] b,
                   float[:, ::1] y, float[::1] mean, float[::1] rstd, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_f32(&y[0, 0], &mean[0], &rstd[0], &x[0, 0], &w[0], &b[0],
                                      x.shape[0], x.shape[1], eps)
    return rc


def layer_norm_f64(const double[:, ::1] x, double[:, ::1] y, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_f64(&y[0, 0], NULL, NULL, &x[0, 0], NULL, NULL,
                                      x.shape[0], x.shape[1], eps)
    return rc


def layer_norm_backward_f64(const double[:, ::1] dy, const double[:, ::1] x,
                            const double[::1] mean, const double[::1] rstd,
                            const double[::1] w, double[:, ::1] dx, double[::1] dw,
                            double[::1] db):
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_backward_f64(&dx[0, 0], &dw[0], &db[0], &dy[0, 0], &x[0, 0],
                                               &mean[0], &rstd[0], &w[0], x.shape[0],
                                               x.shape[1])
    return rc


def rms_norm_f32(const float[:, ::1] x, const float[::1] w, float[:, ::1] y, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_rms_norm_f32(&y[0, 0], NULL, &x[0, 0], &w[0], x.shape[0], x.shape[1],
                                    eps)
    return rc


def add_layer_norm_f32(const float[:, ::1] x, const float[:, ::1] res, float[:, ::1] y,
                       float[:, ::1] s, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_add_layer_norm_f32(&y[0, 0], &s[0, 0], NULL, NULL, &x[0, 0], &res[0, 0],
                                          NULL, NULL, x.shape[0], x.shape[1], eps)
    return rc


def layer_norm_channels_f32(const float[:, :, ::1] x, float[:, :, ::1] y, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_channels_f32(&y[0, 0, 0], NULL, NULL, &x[0, 0, 0], NULL,
                                               NULL, x.shape[0], x.shape[1], x.shape[2], eps)
    return rc


def layer_norm_f16(const uint16_t[:, ::1] x, uint16_t[:, ::1] y, double eps):
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_half(fk.FASTLN_F16, &y[0, 0], NULL, NULL, &x[0, 0], NULL,
                                       NULL, x.shape[0], x.shape[1], eps)
    return rc


def layer_norm_sizes(int64_t n, int64_t h):
    """The return code for sizes n, h (no data: for the invalid sizes)."""
    cdef float one = 0
    cdef int rc
    with nogil:
        rc = fk.fastln_layer_norm_f32(&one, NULL, NULL, &one, NULL, NULL, n, h, 1e-5)
    return rc


def set_num_threads(int n):
    with nogil:
        fk.fastln_set_num_threads(n)


def get_requested_threads():
    cdef int n
    with nogil:
        n = fk.fastln_get_requested_threads()
    return n


def get_isa():
    return fk.fastln_get_isa().decode()


def set_isa(str name):
    return fk.fastln_set_isa(name.encode())
'''

SETUP = '''
import fastln
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("fastln_user", ["fastln_user.pyx"], include_dirs=[fastln.get_include()])],
    quiet=True))
'''
GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "docs", "guide", "cython.md")


def _guide_blocks(fence):
    """The blocks of docs/guide/cython.md fenced with ```fence."""
    with open(GUIDE, encoding="utf-8") as f:
        return re.findall(r"^```" + re.escape(fence) + r"\n(.*?)^```", f.read(),
                          re.DOTALL | re.MULTILINE)


def _guide_module():
    """The ```cython block of docs/guide/cython.md: the module rows.pyx."""
    blocks = _guide_blocks("cython")
    assert len(blocks) == 1, "docs/guide/cython.md shows one Cython module"
    return blocks[0]


def _guide_build():
    """The guide's setup.py (its code block that calls cythonize) and the command
    of its console block that builds it, as an argv run by this Python."""
    setups = [b for b in _guide_blocks("{code-block} python") if "cythonize(" in b]
    assert len(setups) == 1, "docs/guide/cython.md shows one setup.py"
    commands = [line[2:].split() for b in _guide_blocks("console") for line in b.splitlines()
                if line.startswith("$ ") and "setup.py" in line]
    assert len(commands) == 1, "docs/guide/cython.md shows one command that builds it"
    assert commands[0][0] == "python", commands[0]
    return setups[0], [sys.executable] + commands[0][1:]


def _ci_or_skip(reason):
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The folder holding the two extension modules, built once per run: the
    guide's example (rows), by the guide's setup.py and command, and the test's
    own (fastln_user), the same way."""
    if importlib.util.find_spec("Cython") is None:
        _ci_or_skip("Cython is not installed (the [test] extra installs it)")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        _ci_or_skip("no C compiler")
    folder = tmp_path_factory.mktemp("cython_user")
    setup, command = _guide_build()
    (folder / "rows.pyx").write_text(_guide_module())
    (folder / "setup.py").write_text(setup)
    (folder / "fastln_user.pyx").write_text(EXTENSION)
    (folder / "setup_user.py").write_text(SETUP)
    env = dict(os.environ, PYTHONPATH=package_parent())
    for argv in (command, [arg.replace("setup.py", "setup_user.py") for arg in command]):
        run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert list(folder.glob("rows.*.so")) or list(folder.glob("rows.*.pyd")), \
        sorted(os.listdir(folder))
    return folder


def _load(folder, name):
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def ext(built):
    """The test's extension module."""
    yield _load(built, "fastln_user")
    sys.modules.pop("fastln_user", None)


def test_the_guides_example_matches_layer_norm_bitwise(built):
    rows = _load(built, "rows")
    try:
        rng = _rng()
        x = rng.standard_normal((7, 300)).astype(np.float32)
        w, b = rng.standard_normal((2, 300)).astype(np.float32)
        y = np.empty_like(x)
        rows.layer_norm_rows(x, w, b, y)
        np.testing.assert_array_equal(y, fastln.layer_norm(x, w, b), strict=True)
        rows.layer_norm_rows(x[:0], w, b, y[:0])   # no rows
        with pytest.raises(ValueError, match="shapes differ"):
            rows.layer_norm_rows(x, w[:5], b, y)
    finally:
        sys.modules.pop("rows", None)


def _rng():
    return np.random.default_rng(7)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 64), (33, 1000)])
def test_layer_norm_f32_matches_the_python_api_bitwise(ext, shape):
    rng = _rng()
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    y = np.empty_like(x)
    mean = np.empty(shape[0], np.float32)
    rstd = np.empty(shape[0], np.float32)
    assert ext.layer_norm_f32(x, w, b, y, mean, rstd, 1e-5) == ext.OK
    want, want_mean, want_rstd = fastln.layer_norm(x, w, b, eps=1e-5, return_stats=True)
    np.testing.assert_array_equal(y, want, strict=True)
    np.testing.assert_array_equal(mean, want_mean, strict=True)
    np.testing.assert_array_equal(rstd, want_rstd, strict=True)


def test_float64_layer_norm_and_backward_match_bitwise(ext):
    rng = _rng()
    x = rng.standard_normal((9, 130))
    w = rng.standard_normal(130)
    dy = rng.standard_normal((9, 130))
    y = np.empty_like(x)
    assert ext.layer_norm_f64(x, y, 1e-6) == ext.OK
    np.testing.assert_array_equal(y, fastln.layer_norm(x, eps=1e-6), strict=True)

    _, mean, rstd = fastln.layer_norm(x, w, eps=1e-6, return_stats=True)
    dx, dw, db = np.empty_like(x), np.empty(130), np.empty(130)
    assert ext.layer_norm_backward_f64(dy, x, mean, rstd, w, dx, dw, db) == ext.OK
    want = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    for got, expected in zip((dx, dw, db), want):
        np.testing.assert_array_equal(got, expected, strict=True)


def test_rms_norm_and_the_fused_add_match_bitwise(ext):
    rng = _rng()
    x = rng.standard_normal((17, 96)).astype(np.float32)
    res = rng.standard_normal((17, 96)).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    y = np.empty_like(x)
    assert ext.rms_norm_f32(x, w, y, 1e-6) == ext.OK
    np.testing.assert_array_equal(y, fastln.rms_norm(x, w, eps=1e-6), strict=True)

    y, s = np.empty_like(x), np.empty_like(x)
    assert ext.add_layer_norm_f32(x, res, y, s, 1e-5) == ext.OK
    want_y, want_s = fastln.add_layer_norm(x, res, eps=1e-5)
    np.testing.assert_array_equal(y, want_y, strict=True)
    np.testing.assert_array_equal(s, want_s, strict=True)


def test_channels_first_and_float16_match_bitwise(ext):
    rng = _rng()
    x = rng.standard_normal((2, 24, 35)).astype(np.float32)
    y = np.empty_like(x)
    assert ext.layer_norm_channels_f32(x, y, 1e-5) == ext.OK
    np.testing.assert_array_equal(y, fastln.layer_norm(x, axis=1), strict=True)

    h = rng.standard_normal((6, 50)).astype(np.float16)
    out = np.empty_like(h)
    assert ext.layer_norm_f16(h.view(np.uint16), out.view(np.uint16), 1e-5) == ext.OK
    np.testing.assert_array_equal(out, fastln.layer_norm(h), strict=True)


def test_error_codes_come_back_as_the_header_says(ext):
    assert (ext.OK, ext.ENOMEM, ext.EINVAL) == (0, 1, 2)
    assert ext.layer_norm_sizes(1, 0) == ext.EINVAL   # H < 1
    assert ext.layer_norm_sizes(-1, 1) == ext.EINVAL  # N < 0
    assert ext.layer_norm_sizes(0, 1) == ext.OK       # no rows: nothing to do


def test_the_extension_shares_fastlns_thread_count(ext):
    before = fastln._lib.get_requested_threads()
    try:
        fastln.set_num_threads(1)
        assert ext.get_requested_threads() == 1
        ext.set_num_threads(3)
        assert fastln._lib.get_requested_threads() == 3
        if fastln.has_openmp():
            assert fastln.get_num_threads() == 3
    finally:
        fastln._lib.set_num_threads(before)


def test_the_extension_shares_fastlns_isa_path(ext):
    before = fastln.get_isa()
    assert ext.get_isa() == before
    try:
        assert ext.set_isa("generic") == 0
        assert fastln.get_isa() == "generic"
        assert ext.set_isa("no-such-path") == -1
    finally:
        fastln._lib._set_isa(before)
    assert ext.get_isa() == before


def test_the_extension_holds_no_copy_of_the_kernels(ext):
    """The built module defines no fastln_* C symbol and needs none from a
    library: its calls go to the functions of the loaded fastln._lib."""
    nm = shutil.which("nm")
    if nm is None:
        _ci_or_skip("nm (binutils) is not installed")
    run = subprocess.run([nm, "-D", ext.__file__], capture_output=True, text=True, check=True)
    symbols = [line.split()[-1] for line in run.stdout.splitlines() if line.split()]
    assert symbols, run.stdout
    assert not [s for s in symbols if s.startswith("fastln_")]


def _installed_copy():
    """The installed distribution (one with a RECORD, as pip writes it) whose
    fastln/__init__.py equals the one under test, or None."""
    with open(fastln.__file__, "rb") as f:
        ours = f.read()
    for dist in importlib.metadata.distributions(name="fastln"):
        if dist.read_text("RECORD") is None:   # the checkout's egg-info, say
            continue
        init = dist.locate_file("fastln/__init__.py")
        if os.path.isfile(init):
            with open(init, "rb") as f:
                if f.read() == ours:
                    return dist
    return None


def test_the_installed_package_ships_the_declarations_and_headers():
    """What ``pip install`` puts in site-packages: kernels.pxd, the private
    .pxd files it cimports, and the two headers that fastln.get_include()
    names. Skipped where no installed fastln comes from the same sources as
    the one under test (an in-place build), unless CI is set."""
    dist = _installed_copy()
    if dist is None:
        _ci_or_skip("no installed fastln of these sources")
    names = {f.as_posix() for f in dist.files}
    for needed in ("fastln/kernels.pxd", "fastln/_lib.pxd", "fastln/_ndarray.pxd",
                   "fastln/include/fastln.h", "fastln/include/fastln_rnn.h"):
        assert needed in names, needed
        assert os.path.isfile(dist.locate_file(needed)), needed
    assert os.path.samefile(fastln.get_include(),
                            os.path.join(package_parent(), "fastln", "include"))


def test_kernels_pxd_declares_every_function_of_fastln_h():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    header = declared_functions(os.path.join(root, "src_c", "api", "fastln.h"))
    with open(os.path.join(root, "fastln", "kernels.pxd"), encoding="utf-8") as f:
        declared = set(re.findall(r"\b(fastln_\w+)\b", f.read().split("cimport (", 1)[1]))
    assert len(header) > 30
    assert declared == header
