"""fastln.dask: dask arrays, block by block, locally and on a 2-process LocalCluster.

Skipped where dask is missing -- unless the CI environment variable is set
(CI installs dask), where a missing dask is a failure.
"""
import warnings

import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import F16, F32, F64, as_f64, assert_close, named, require, result_dtype, run_python

dask = require("dask")
da = require("dask.array")
import fastln.dask as fd  # noqa: E402  (after the skip: it needs dask)

FUNCS = {"layer_norm": (fastln.layer_norm, ref.layer_norm),
         "rms_norm": (fastln.rms_norm, ref.rms_norm)}

# (shape, chunks, axis): rows chunked, the normalized axes whole in each block
CASES = [
    ((100, 64), (30, 64), -1),
    ((12, 10, 16), (5, 10, 16), (1, 2)),
    ((12, 10, 16), (5, 3, 16), -1),          # two chunked batch axes
    ((6, 20, 8), (6, 7, 8), (2, 0)),         # axes in a non-sorted order, rows in the middle
]


def _run(name, x, w, b, axis):
    """fastln.dask.<name> with (w, b) as that function takes them."""
    f = getattr(fd, name)
    return f(x, w, b, axis=axis) if name == "layer_norm" else f(x, w, axis=axis)


def _check(name, x, w, b, axis, chunks):
    """y: lazy, x's chunks, fastln's dtype; equal to fastln on x, close to the reference."""
    fast, slow = FUNCS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", fd.RechunkWarning)    # whole rows: no rechunk
        y = _run(name, x, w, b, axis)
    assert isinstance(y, da.Array)
    assert y.chunks == chunks
    xn, yn = dask.compute(x, y)
    rdt = result_dtype(xn.dtype)
    assert y.dtype == yn.dtype == rdt and yn.shape == xn.shape
    args = (w, b) if name == "layer_norm" else (w,)
    np.testing.assert_array_equal(yn, fast(xn, *args, axis=axis))   # bitwise: same kernel per row
    want = slow(xn.astype(F64), *(as_f64(a, rdt) for a in args), axis=axis)
    assert_close(yn, want, xn.dtype)
    return yn


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("shape,chunks,axis", CASES)
@pytest.mark.parametrize("affine", [False, True])
def test_matches_fastln_and_reference(name, dtype, shape, chunks, axis, affine, rng):
    xn = (0.5 + 2 * rng.standard_normal(shape)).astype(dtype)
    x = da.from_array(xn, chunks=chunks)
    assert x.npartitions > 1
    w = b = None
    if affine:
        nshape = tuple(shape[a] for a in ((axis,) if np.isscalar(axis) else axis))
        w = (1 + 0.5 * rng.standard_normal(nshape)).astype(dtype)
        b = (0.5 * rng.standard_normal(nshape)).astype(dtype)
    _check(name, x, w, b, axis, x.chunks)


def test_int_input_gives_float64(rng):
    x = da.from_array(rng.integers(-5, 6, (20, 9)).astype(np.int32), chunks=(7, 9))
    assert _check("layer_norm", x, None, None, -1, ((7, 7, 6), (9,))).dtype == F64


def test_bfloat16_keeps_its_dtype(rng):
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    xn = rng.standard_normal((12, 32)).astype(bf16)
    x = da.from_array(xn, chunks=(5, 32))
    for name, (fast, _) in FUNCS.items():
        y = getattr(fd, name)(x)
        assert y.dtype == bf16
        yn = y.compute()
        assert yn.dtype == bf16
        np.testing.assert_array_equal(yn.astype(F32), fast(xn).astype(F32))


def test_dask_weight_and_list_bias(rng):
    x = da.from_array(rng.standard_normal((30, 12)), chunks=(10, 12))
    wn = 1 + rng.standard_normal(12)
    w = da.from_array(wn, chunks=5)                 # itself chunked; computed eagerly
    b = list(rng.standard_normal(12))
    y = fd.layer_norm(x, w, b)
    np.testing.assert_array_equal(y.compute(), fastln.layer_norm(x.compute(), wn, b))


def test_eps_is_passed(rng):
    x = da.from_array(3e-3 * rng.standard_normal((8, 64)), chunks=(4, 64))
    xn = x.compute()
    np.testing.assert_array_equal(fd.layer_norm(x, eps=0.5).compute(),
                                  fastln.layer_norm(xn, eps=0.5))
    assert not np.allclose(fd.layer_norm(x).compute(), fastln.layer_norm(xn, eps=0.5))
    np.testing.assert_array_equal(fd.rms_norm(x).compute(), fastln.rms_norm(xn, eps=1e-6))


# ------------------------------------------------------------------ rechunk

@pytest.mark.parametrize("name", FUNCS)
def test_split_row_is_rechunked_with_a_warning(name, rng):
    x = da.from_array(rng.standard_normal((40, 64)).astype(F32), chunks=(10, 16))
    with pytest.warns(fd.RechunkWarning, match=r"normalized axis \(1,\)") as rec:
        y = _run(name, x, None, None, -1)
    assert rec[0].filename == __file__               # points at the caller
    assert issubclass(fd.RechunkWarning, UserWarning)
    assert y.chunks == ((10,) * 4, (64,))            # rows keep their chunks
    np.testing.assert_array_equal(y.compute(), FUNCS[name][0](x.compute()))


def test_rechunk_of_several_axes(rng):
    xn = rng.standard_normal((6, 10, 8))
    x = da.from_array(xn, chunks=(2, 5, 3))
    w = rng.standard_normal((8, 10))
    with pytest.warns(fd.RechunkWarning, match=r"\(2, 1\)"):
        y = fd.layer_norm(x, w, axis=(2, 1))
    assert y.chunks == ((2, 2, 2), (10,), (8,))
    np.testing.assert_array_equal(y.compute(), fastln.layer_norm(xn, w, axis=(2, 1)))


def test_rechunk_shrinks_rows_past_the_chunk_size(rng):
    xn = rng.standard_normal((1000, 256))
    x = da.from_array(xn, chunks=(1000, 32))          # whole rows would be one 2 MB block
    with dask.config.set({"array.chunk-size": "64KiB"}):
        with pytest.warns(fd.RechunkWarning):
            y = fd.rms_norm(x)
    assert y.chunks[1] == (256,)
    assert len(y.chunks[0]) > 1 and max(y.chunks[0]) * 256 * 8 <= 64 * 1024
    np.testing.assert_array_equal(y.compute(), fastln.rms_norm(xn))


# ------------------------------------------------------------------ edges and errors

@pytest.mark.parametrize("shape,chunks,axis", [((0, 32), (3, 32), -1),
                                               ((4, 0, 8), (2, 3, 8), -1),
                                               ((0, 3, 5), (2, 3, 5), (1, 2))])
def test_no_rows(shape, chunks, axis):
    x = da.zeros(shape, dtype=F32, chunks=chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fd.RechunkWarning)
        ys = fd.layer_norm(x, axis=axis), fd.rms_norm(x, axis=axis)
    for y in ys:
        yn = y.compute()
        assert y.dtype == yn.dtype == F32 and yn.shape == shape


@pytest.mark.parametrize("x", [np.ones((4, 8)), [[1.0, 2.0]], 3.0])
def test_not_a_dask_array(x):
    for f, hint in ((fd.layer_norm, "fastln.layer_norm"), (fd.rms_norm, "fastln.rms_norm")):
        with pytest.raises(TypeError, match=named("x")) as e:
            f(x)
        assert hint in str(e.value)


def test_bad_arguments_raise_eagerly():
    x = da.ones((10, 8), chunks=(5, 8))
    for kwargs, exc, arg in [
        (dict(weight=np.ones(7)), ValueError, "weight"),
        (dict(weight=da.ones(7)), ValueError, "weight"),
        (dict(weight=np.ones((8, 1))), ValueError, "weight"),
        (dict(bias=np.ones(9)), ValueError, "bias"),
        (dict(axis=2), ValueError, "axis"),
        (dict(axis=(1, -1)), ValueError, "axis"),
        (dict(axis=1.5), TypeError, "axis"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(eps="1e-5"), TypeError, "eps"),
    ]:
        with pytest.raises(exc, match=named(arg)):
            fd.layer_norm(x, **kwargs)
    with pytest.raises(ValueError, match=named("weight")):
        fd.rms_norm(x, np.ones(3))
    with pytest.raises(ValueError, match=named("x")):
        fd.layer_norm(da.ones((4, 0), chunks=2))
    with pytest.raises(ValueError, match=named("x")):
        fd.rms_norm(da.ones(()))
    with pytest.raises(TypeError, match=named("x")):
        fd.layer_norm(da.ones((4, 4), dtype=complex))


def test_import_fastln_does_not_import_dask():
    p = run_python("import sys, fastln; assert 'dask' not in sys.modules, 'dask imported'")
    assert p.returncode == 0, p.stderr


def test_missing_dask_says_how_to_install():
    p = run_python("import sys; sys.modules['dask'] = None\n"
                   "try:\n    import fastln.dask\nexcept ImportError as e:\n    print(e)")
    assert p.returncode == 0, p.stderr
    assert 'pip install "fastln[dask]"' in p.stdout, p.stdout


# ------------------------------------------------------------------ dask.distributed



@pytest.mark.parametrize("name", FUNCS)
def test_local_cluster_of_two_workers(dask_client, name):
    assert len(dask_client.scheduler_info()["workers"]) == 2
    x = da.random.default_rng(7).standard_normal((4000, 256), chunks=(1000, 256), dtype=F32)
    w, b = np.linspace(0.5, 1.5, 256, dtype=F32), np.full(256, 0.25, F32)
    y = _run(name, x, w, b, -1)
    y = dask_client.persist(y)
    require("distributed").wait(y)
    owners = dask_client.who_has(y)                        # block key -> workers holding it
    assert len(owners) == 4
    assert len({ws[0] for ws in owners.values()}) == 2, owners   # both workers ran blocks
    xn, yn = dask_client.compute([x, y], sync=True)
    fast, slow = FUNCS[name]
    args = (w, b) if name == "layer_norm" else (w,)
    assert yn.dtype == F32
    np.testing.assert_array_equal(yn, fast(xn, *args))
    assert_close(yn, slow(xn.astype(F64), *(as_f64(a, F32) for a in args)), F32)
