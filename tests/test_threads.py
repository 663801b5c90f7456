"""Threads: bitwise determinism across thread counts, thread-count control,
threadpoolctl / OMP_NUM_THREADS compatibility and concurrent calls."""
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastln

from _util import F32, F64, FLOAT_DTYPES, big_inputs, require, run_python

SHAPES = [(4096, 256), (3000, 1000)]
THREAD_COUNTS = (1, 2, 3, 8)

_DATA = {}


def data(dtype, shape):
    key = (np.dtype(dtype).str, shape)
    if key not in _DATA:
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
        H = shape[-1]
        _DATA[key] = dict(
            x=(rng.standard_normal(shape) * 2 + 0.5).astype(dtype),
            r=rng.standard_normal(shape).astype(dtype),
            dy=rng.standard_normal(shape).astype(dtype),
            w=(1 + 0.5 * rng.standard_normal(H)).astype(dtype),
            b=rng.standard_normal(H).astype(dtype),
        )
    return _DATA[key]


def all_outputs(d):
    x, r, dy, w, b = d["x"], d["r"], d["dy"], d["w"], d["b"]
    out = {}
    out["ln.y"], out["ln.mean"], out["ln.rstd"] = fastln.layer_norm(x, w, b, return_stats=True)
    out["lnb.dx"], out["lnb.dweight"], out["lnb.dbias"] = fastln.layer_norm_backward(
        dy, x, out["ln.mean"], out["ln.rstd"], w)
    _, mean, rstd = fastln.layer_norm(x, return_stats=True)
    out["lnb0.dx"], out["lnb0.dweight"], out["lnb0.dbias"] = fastln.layer_norm_backward(
        dy, x, mean, rstd)
    out["rms.y"], out["rms.rstd"] = fastln.rms_norm(x, w, return_stats=True)
    out["rmsb.dx"], out["rmsb.dweight"] = fastln.rms_norm_backward(dy, x, out["rms.rstd"], w)
    (out["add.y"], out["add.s"], out["add.mean"],
     out["add.rstd"]) = fastln.add_layer_norm(x, r, w, b, return_stats=True)
    # normalized axis first: rows are columns of the array
    xt, dyt = x.T, dy.T
    out["lnT.y"], mT, rT = fastln.layer_norm(xt, w, b, axis=0, return_stats=True)
    out["lnbT.dx"], out["lnbT.dweight"], out["lnbT.dbias"] = fastln.layer_norm_backward(
        dyt, xt, mT, rT, w, axis=0)
    return out


def assert_bitwise(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), (
        "%s differs bitwise (max abs diff %g)" % (what, np.max(np.abs(a.astype(F64) - b))))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bitwise_identical_for_1_2_3_8_threads(isa, dtype, shape, restore_threads):
    d = data(dtype, shape)
    results = {}
    for n in THREAD_COUNTS:
        with fastln.threads(n):
            if fastln.has_openmp():
                assert fastln.get_num_threads() == n
            results[n] = all_outputs(d)
    for n in THREAD_COUNTS[1:]:
        for k in results[1]:
            assert_bitwise(results[n][k], results[1][k], "%s with %d threads" % (k, n))
    # sanity: the results are not trivial
    dw = results[1]["lnb.dweight"]
    assert np.isfinite(dw).all() and np.abs(dw).max() > 1


def test_float16_deterministic(restore_threads):
    d = data(F32, (4096, 256))
    x, dy, w = d["x"].astype(np.float16), d["dy"].astype(np.float16), d["w"]
    res = []
    for n in THREAD_COUNTS:
        with fastln.threads(n):
            y, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
            res.append((y, mean, rstd) + tuple(fastln.layer_norm_backward(dy, x, mean, rstd, w)))
    for other in res[1:]:
        for a, b in zip(res[0], other):
            assert_bitwise(a, b, "float16")


def test_streaming_sized_deterministic(restore_threads):
    """The streaming-store path (outputs >= 32 MiB) is thread-count independent too."""
    x, r, w, b = big_inputs(F32)
    res = []
    for n in THREAD_COUNTS:
        with fastln.threads(n):
            res.append(tuple(fastln.layer_norm(x, w, b, return_stats=True))
                       + tuple(fastln.add_layer_norm(x, r, w, b)) + (fastln.rms_norm(x, w),))
    for other in res[1:]:
        for a, b_ in zip(res[0], other):
            assert_bitwise(a, b_, "streaming-sized output")


# ---------------------------------------------------------------- thread-count control

def test_set_and_get(restore_threads):
    if not fastln.has_openmp():
        pytest.skip("built without OpenMP")
    fastln.set_num_threads(1)
    assert fastln.get_num_threads() == 1
    fastln.set_num_threads(2)
    assert fastln.get_num_threads() == 2


def test_get_num_threads_is_positive_int():
    n = fastln.get_num_threads()
    assert isinstance(n, int) and n >= 1
    assert isinstance(fastln.has_openmp(), bool)


@pytest.mark.skipif(not fastln.has_openmp(), reason="built without OpenMP")
def test_threads_context_manager_restores(restore_threads):
    fastln.set_num_threads(1)
    with fastln.threads(2):
        assert fastln.get_num_threads() == 2
        with fastln.threads(1):
            assert fastln.get_num_threads() == 1
        assert fastln.get_num_threads() == 2
    assert fastln.get_num_threads() == 1
    with pytest.raises(KeyError):
        with fastln.threads(2):
            assert fastln.get_num_threads() == 2
            raise KeyError("boom")
    assert fastln.get_num_threads() == 1
    fastln.set_num_threads(2)
    with fastln.threads(1):
        assert fastln.get_num_threads() == 1
    assert fastln.get_num_threads() == 2


@pytest.mark.skipif(not fastln.has_openmp(), reason="built without OpenMP")
def test_threadpoolctl_sees_fastlns_openmp():
    """threadpool_info() lists the OpenMP runtime fastln's module is linked to;
    its num_threads is OpenMP's limit, fastln's default count (set_num_threads
    is fastln's own and is not written into OpenMP), and a threadpool_limits
    on it shows there and caps fastln."""
    require("threadpoolctl")
    code = ("import fastln, json, threadpoolctl as t; a = t.threadpool_info(); "
            "n = fastln.get_num_threads()\n"
            "with t.threadpool_limits(1, 'openmp'): b = t.threadpool_info(); "
            "m = fastln.get_num_threads()\n"
            "print(json.dumps([a, n, b, m]))")
    before, n, inside, m = json.loads(_run_python(code))   # a fresh process: no torch beside it
    omp = [d for d in before if d["user_api"] == "openmp"]
    assert len(omp) == 1 and omp[0]["prefix"] == "libgomp", before
    assert omp[0]["num_threads"] == n
    assert [d["num_threads"] for d in inside if d["user_api"] == "openmp"] == [1]
    assert m == 1


def test_threadpoolctl_limits_openmp(restore_threads):
    threadpoolctl = require("threadpoolctl")
    if not fastln.has_openmp():
        pytest.skip("built without OpenMP")
    fastln.set_num_threads(2)
    before = fastln.get_num_threads()
    d = data(F32, (4096, 256))
    expect = fastln.layer_norm(d["x"], d["w"], d["b"])
    with threadpoolctl.threadpool_limits(1, "openmp"):
        assert fastln.get_num_threads() == 1
        np.testing.assert_array_equal(fastln.layer_norm(d["x"], d["w"], d["b"]), expect)
    assert fastln.get_num_threads() == before


def _run_python(code, **env_extra):
    proc = run_python(code, env=dict(os.environ, **env_extra))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_omp_num_threads_1_in_subprocess():
    out = _run_python("import fastln; print(fastln.get_num_threads())", OMP_NUM_THREADS="1")
    assert out == "1"


@pytest.mark.skipif(not fastln.has_openmp(), reason="built without OpenMP")
def test_omp_num_threads_2_in_subprocess():
    out = _run_python("import fastln; print(fastln.get_num_threads())", OMP_NUM_THREADS="2")
    assert out == "2"


# ---------------------------------------------------------------- concurrency

def test_concurrent_calls_match_serial(restore_threads):
    rng = np.random.default_rng(7)
    tasks = []
    for i, shape in enumerate([(1, 768), (32, 768), (700, 1000), (3000, 64), (5, 7, 64),
                               (257, 4099), (2, 3), (1500, 512)]):
        dtype = F32 if i % 2 == 0 else F64
        x = rng.standard_normal(shape).astype(dtype)
        r = rng.standard_normal(shape).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        w = (1 + rng.standard_normal(shape[-1])).astype(dtype)
        b = rng.standard_normal(shape[-1]).astype(dtype)

        def ln(x=x, w=w, b=b, dy=dy):
            y, m, s = fastln.layer_norm(x, w, b, return_stats=True)
            return (y, m, s) + tuple(fastln.layer_norm_backward(dy, x, m, s, w))

        def rms(x=x, w=w, dy=dy):
            y, s = fastln.rms_norm(x, w, return_stats=True)
            return (y, s) + tuple(fastln.rms_norm_backward(dy, x, s, w))

        def add(x=x, r=r, w=w, b=b):
            return fastln.add_layer_norm(x, r, w, b, return_stats=True)

        tasks += [ln, rms, add]
    serial = [t() for t in tasks]
    order = list(range(len(tasks))) * 4
    rng.shuffle(order)
    with ThreadPoolExecutor(max_workers=8) as ex:
        futures = [(i, ex.submit(tasks[i])) for i in order]
        for i, f in futures:
            for a, b in zip(f.result(timeout=120), serial[i]):
                assert_bitwise(a, b, "task %d" % i)
