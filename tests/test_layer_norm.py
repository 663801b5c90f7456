"""fastln.layer_norm against the float64 NumPy reference (fastln.reference)."""
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import (
    AFFINE,
    F16,
    F32,
    F64,
    FLOAT_DTYPES,
    LAYOUTS,
    as_f64,
    assert_close,
    big_inputs,
    normalized_shape,
    out_like,
    outlier_rows,
    params,
    randn,
    relayout,
    result_dtype,
    stats_dtype,
    stats_shape,
)

HS = [1, 2, 7, 64, 768, 4099]
ROWS = [0, 1, 5]


def check(x, weight=None, bias=None, axis=-1, eps=1e-5, in_dtype=None, **tol):
    """Run fastln.layer_norm (with and without stats) and compare to the reference.

    ``in_dtype`` is the dtype the kernel sees (np.asarray(x).dtype by default).
    Returns (y, mean, rstd) from fastln.
    """
    xa = np.asarray(x)
    in_dtype = xa.dtype if in_dtype is None else np.dtype(in_dtype)
    rdt, sdt = result_dtype(in_dtype), stats_dtype(in_dtype)
    y, mean, rstd = fastln.layer_norm(x, weight, bias, axis=axis, eps=eps, return_stats=True)
    ry, rmean, rrstd = ref.layer_norm(xa.astype(F64), as_f64(weight, rdt), as_f64(bias, rdt),
                                      axis=axis, eps=eps, return_stats=True)
    for a in (y, mean, rstd):
        assert isinstance(a, np.ndarray)
    assert y.dtype == rdt and y.shape == xa.shape
    assert mean.dtype == sdt and rstd.dtype == sdt
    assert mean.shape == rstd.shape == stats_shape(xa.shape, axis)
    assert_close(y, ry, in_dtype, err_msg="y", **tol)
    stats_dt = F32 if sdt == np.dtype(F32) else F64
    assert_close(mean, rmean, stats_dt, err_msg="mean")
    assert_close(rstd, rrstd, stats_dt, err_msg="rstd")
    # The same y whether or not the statistics are asked for.
    y2 = fastln.layer_norm(x, weight, bias, axis=axis, eps=eps)
    assert isinstance(y2, np.ndarray)
    np.testing.assert_array_equal(y2, y)
    return y, mean, rstd


# ---------------------------------------------------------------- core grid

@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(isa, dtype, H, N, rng):
    x = randn(rng, (N, H), dtype, loc=0.3, scale=2.0)
    for kind in AFFINE:
        w, b = params(rng, (H,), dtype, kind)
        check(x, w, b)


@pytest.mark.parametrize("shape", [(2048, 768), (300, 4099), (4096, 33)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_parallel_sized(isa, dtype, shape, rng):
    x = randn(rng, shape, dtype, loc=-1.0, scale=3.0)
    w, b = params(rng, shape[-1:], dtype, "both")
    check(x, w, b)
    check(x)


def test_defaults_are_last_axis_and_eps_1e_5(rng):
    # std 3e-3 -> var ~1e-5, so eps changes the result by ~40%.
    x = randn(rng, (6, 64), F64, scale=3e-3)
    y = fastln.layer_norm(x)
    np.testing.assert_allclose(y, ref.layer_norm(x, axis=-1, eps=1e-5), rtol=1e-12, atol=1e-12)
    assert not np.allclose(y, ref.layer_norm(x, eps=1e-6), rtol=1e-3)
    np.testing.assert_array_equal(y, fastln.layer_norm(x, axis=-1, eps=1e-5))


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-3, 0.5, 10.0])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_eps(dtype, eps, rng):
    x = randn(rng, (7, 96), dtype, scale=0.05)
    w, b = params(rng, (96,), dtype, "both")
    check(x, w, b, eps=eps)


@pytest.mark.parametrize("ndim_shape", [(37,), (3, 4, 5, 6)])
def test_other_ranks(ndim_shape, rng):
    x = randn(rng, ndim_shape, F64)
    check(x)
    check(x, *params(rng, ndim_shape[-1:], F64, "both"))
    if len(ndim_shape) == 1:
        y, mean, rstd = fastln.layer_norm(x, return_stats=True)
        assert mean.shape == () and rstd.shape == ()


# ---------------------------------------------------------------- axes

AXES_3D = [-1, 2, 1, -2, 0, -3, np.int64(-1), (2,), (np.int64(0),), (1, 2), (-2, -1), (2, 1),
           (-1, -2), (0, 2), (2, 0), (0, -1), (0, 1), (1, 0), (0, 1, 2), (2, 0, 1), (-1, 0, 1)]


@pytest.mark.parametrize("axis", AXES_3D, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_axis_forms(isa, dtype, axis, rng):
    shape = (4, 5, 6)
    x = randn(rng, shape, dtype, loc=1.0)
    nshape = normalized_shape(shape, axis)
    check(x, axis=axis)
    w, b = params(rng, nshape, dtype, "both")
    y, mean, rstd = check(x, w, b, axis=axis)
    assert mean.shape == stats_shape(shape, axis)


@pytest.mark.parametrize("axis", [(1, 3), (3, 1), (0, 2, 3), (-1, 1), (0, 3), (3, 0, 2)], ids=repr)
def test_axis_forms_4d(axis, rng):
    shape = (2, 3, 4, 5)
    x = randn(rng, shape, F32)
    w, b = params(rng, normalized_shape(shape, axis), F32, "both")
    check(x, w, b, axis=axis)


def test_axis_order_matters_for_weight(rng):
    """weight's axes follow the order given in `axis`."""
    x = randn(rng, (3, 4, 5), F64)
    w = randn(rng, (5, 3), F64)                   # axis (2, 0): shape (5, 3)
    y = fastln.layer_norm(x, w, axis=(2, 0))
    np.testing.assert_allclose(y, ref.layer_norm(x, w, axis=(2, 0)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, fastln.layer_norm(x, w.T, axis=(0, 2)), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- layouts

@pytest.mark.parametrize("axis", [-1, 0, (0, 2), (2, 1)], ids=repr)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts(dtype, layout, axis, rng):
    shape = (6, 5, 33)
    x = randn(rng, shape, dtype, loc=0.5)
    nshape = normalized_shape(shape, axis)
    w, b = params(rng, nshape, dtype, "both")
    xl = relayout(x, layout)
    y, mean, rstd = check(xl, relayout(w, layout), relayout(b, layout), axis=axis)
    y0, mean0, rstd0 = fastln.layer_norm(x, w, b, axis=axis, return_stats=True)
    if axis == 0:
        # C-ordered x over a leading axis takes the channels-first kernel, the other
        # layouts the row kernels: the same values to rounding, not bitwise
        tight = dict(rtol=4e-6, atol=4e-6) if dtype == F32 else dict(rtol=1e-13, atol=1e-13)
        for got, want in ((y, y0), (mean, mean0), (rstd, rstd0)):
            np.testing.assert_allclose(got, want, **tight)
        return
    np.testing.assert_array_equal(y, y0)          # layout does not change results
    np.testing.assert_array_equal(mean, mean0)
    np.testing.assert_array_equal(rstd, rstd0)


def test_readonly_everything(rng):
    x = relayout(randn(rng, (9, 40), F32), "readonly")
    w, b = (relayout(p, "readonly") for p in params(rng, (40,), F32, "both"))
    check(x, w, b)


def test_list_inputs(rng):
    x = randn(rng, (4, 10), F64)
    w, b = params(rng, (10,), F64, "both")
    y, mean, rstd = check(x.tolist(), w.tolist(), b.tolist())
    assert y.dtype == F64
    np.testing.assert_array_equal(y, fastln.layer_norm(x, w, b))
    # a flat list of ints
    y = fastln.layer_norm([1, 2, 3, 4])
    assert y.dtype == F64
    np.testing.assert_allclose(y, ref.layer_norm(np.array([1.0, 2, 3, 4])), atol=1e-12)


def test_broadcast_view_input(rng):
    row = randn(rng, (50,), F32)
    x = np.broadcast_to(row, (8, 50))             # stride 0 over rows, read-only
    y = check(x)[0]
    np.testing.assert_array_equal(y, np.broadcast_to(y[0], y.shape))


def test_byteswapped_input(rng):
    x = randn(rng, (5, 30), F32)
    xs = x.astype(x.dtype.newbyteorder())
    y = fastln.layer_norm(xs)
    assert y.dtype.kind == "f" and y.dtype.itemsize == 4
    np.testing.assert_array_equal(y, fastln.layer_norm(x))


def test_input_not_modified_and_output_fresh(rng):
    x = randn(rng, (8, 64), F32)
    w, b = params(rng, (64,), F32, "both")
    copies = [a.copy() for a in (x, w, b)]
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    for a, c in zip((x, w, b), copies):
        np.testing.assert_array_equal(a, c)
    assert not np.shares_memory(y, x)
    assert y.flags.writeable


# ---------------------------------------------------------------- dtypes

@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_])
def test_int_and_bool_promote_to_float64(dtype, rng):
    x = randn(rng, (6, 17), dtype)
    y, mean, rstd = check(x)
    assert y.dtype == F64 and mean.dtype == F64
    w, b = params(rng, (17,), F32, "both")       # float32 params are cast to float64
    y = check(x, w, b)[0]
    assert y.dtype == F64


@pytest.mark.parametrize("H", [1, 7, 64, 768, 1037])
def test_float16(isa, H, rng):
    x = randn(rng, (9, H), F16, loc=0.5, scale=2.0)
    w, b = params(rng, (H,), F32, "both")        # cast to float16 by fastln
    y, mean, rstd = check(x, w, b)
    assert y.dtype == F16 and mean.dtype == F32 and rstd.dtype == F32
    check(x)
    out = np.empty((9, H), F16)
    assert fastln.layer_norm(x, w, b, out=out) is out
    np.testing.assert_array_equal(out, y)


def test_weight_cast_to_x_dtype(rng):
    x32 = randn(rng, (5, 20), F32)
    w64 = 1 + randn(rng, (20,), F64)
    b64 = randn(rng, (20,), F64)
    y = fastln.layer_norm(x32, w64, b64)
    assert y.dtype == F32
    np.testing.assert_array_equal(y, fastln.layer_norm(x32, w64.astype(F32), b64.astype(F32)))
    x64 = x32.astype(F64)
    y = fastln.layer_norm(x64, w64.astype(F32), b64.astype(F32))
    assert y.dtype == F64
    np.testing.assert_allclose(y, ref.layer_norm(x64, w64.astype(F32), b64.astype(F32)),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- out=

@pytest.mark.parametrize("axis", [-1, 0, (0, 2)], ids=repr)
@pytest.mark.parametrize("kind", ["C", "F", "sliced", "negstride"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out(dtype, kind, axis, rng):
    shape = (5, 6, 40)
    x = randn(rng, shape, dtype)
    w, b = params(rng, normalized_shape(shape, axis), dtype, "both")
    expect = fastln.layer_norm(x, w, b, axis=axis)
    out = out_like(kind, shape, dtype)
    got = fastln.layer_norm(x, w, b, axis=axis, out=out)
    assert got is out
    np.testing.assert_array_equal(out, expect)
    out2 = out_like(kind, shape, dtype)
    y, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, out=out2, return_stats=True)
    assert y is out2
    np.testing.assert_array_equal(out2, expect)
    assert mean.shape == stats_shape(shape, axis)


@pytest.mark.parametrize("layout", ["C", "F", "negstride", "sliced"])
@pytest.mark.parametrize("axis", [-1, 0, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_in_place(dtype, axis, layout, rng):
    shape = (4, 7, 300)
    x0 = randn(rng, shape, dtype, loc=2.0)
    w, b = params(rng, normalized_shape(shape, axis), dtype, "both")
    expect = fastln.layer_norm(x0, w, b, axis=axis)
    x = relayout(x0, layout)
    got = fastln.layer_norm(x, w, b, axis=axis, out=x)
    assert got is x
    if axis == 0 and layout != "C":   # the row kernels against the channels-first one
        tight = dict(rtol=4e-6, atol=4e-6) if dtype == F32 else dict(rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(x, expect, **tight)
        return
    np.testing.assert_array_equal(x, expect)


def test_in_place_large(isa, rng):
    x0 = randn(rng, (1500, 1000), F32, loc=3.0)
    w, b = params(rng, (1000,), F32, "both")
    expect = fastln.layer_norm(x0, w, b)
    x = x0.copy()
    fastln.layer_norm(x, w, b, out=x)
    np.testing.assert_array_equal(x, expect)


# ---------------------------------------------------------------- empties

@pytest.mark.parametrize("shape,axis", [
    ((0, 8), -1), ((0, 768), -1), ((3, 0, 8), -1), ((0, 5), 1), ((8, 0), 0),
    ((2, 0, 3), (0, 2)), ((0,) * 1 + (4, 4), (1, 2)),
], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [F16])
def test_empty_rows(dtype, shape, axis):
    x = np.zeros(shape, dtype)
    nshape = normalized_shape(shape, axis)
    w, b = np.ones(nshape, dtype), np.zeros(nshape, dtype)
    y, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, return_stats=True)
    assert y.shape == shape and y.dtype == result_dtype(dtype)
    assert mean.shape == rstd.shape == stats_shape(shape, axis)
    assert mean.dtype == rstd.dtype == stats_dtype(dtype)
    assert fastln.layer_norm(x, axis=axis).shape == shape
    out = np.empty(shape, dtype)
    assert fastln.layer_norm(x, axis=axis, out=out) is out


# ---------------------------------------------------------------- numerics

@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("H", [7, 768])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_inf_stay_in_their_row(isa, dtype, H, axis, rng):
    N = 9
    x = randn(rng, (N, H), dtype)
    bad = {2: np.nan, 4: np.inf, 6: -np.inf}
    for r, v in bad.items():
        x[r, (3 * r) % H] = v
    if H > 1:
        x[7, 0], x[7, H - 1] = np.inf, -np.inf
    bad_rows = sorted(list(bad) + ([7] if H > 1 else []))
    good = [r for r in range(N) if r not in bad_rows]
    w, b = params(rng, (H,), dtype, "both")
    xs = x if axis == -1 else np.ascontiguousarray(x.T)   # rows become columns
    y, mean, rstd = fastln.layer_norm(xs, w, b, axis=axis, return_stats=True)
    if axis == 0:
        y = y.T
    for r in bad_rows:
        assert not np.isfinite(y[r]).all(), r
        assert not (np.isfinite(mean[r]) and np.isfinite(rstd[r])), r
    assert np.isfinite(y[good]).all()
    assert np.isfinite(mean[good]).all() and np.isfinite(rstd[good]).all()
    ry, rm, rr = ref.layer_norm(x[good].astype(F64), w, b, return_stats=True)
    assert_close(y[good], ry, dtype)
    assert_close(mean[good], rm, dtype)
    assert_close(rstd[good], rr, dtype)


@pytest.mark.parametrize("loc", [1e4, -1e4])
@pytest.mark.parametrize("H", [1024, 7, 1037])
def test_large_offset_float32(isa, H, loc, rng):
    """Rows with mean 1e4 and std 1: max |y - ref| <= 1e-5 (ref from the same float32 x)."""
    x = randn(rng, (256, H), F32, loc=loc, scale=1.0)
    y = fastln.layer_norm(x)
    r = ref.layer_norm(x.astype(F64))
    err = np.max(np.abs(y.astype(F64) - r))
    assert err <= 1e-5, err
    # with an affine transform of O(1)
    w, b = params(rng, (H,), F32, "both")
    y = fastln.layer_norm(x, w, b)
    err = np.max(np.abs(y.astype(F64) - ref.layer_norm(x.astype(F64), w, b)))
    assert err <= 2e-5, err


@pytest.mark.parametrize("k", [0.0, 3.0, 3.87, 3.95, 6.0, 30.0])
def test_large_offset_first_element_k_sigma_out(isa, k, rng):
    """The 1e-5 bound at mean 1e4, std 1, H=1024 also holds when x[0] sits k std from the mean
    (the hard case for a variance computed around a shift of x[0])."""
    H = 1024
    z = rng.standard_normal((512, H))
    z = (z - z.mean(axis=1, keepdims=True)) / z.std(axis=1, keepdims=True)
    z[:, 0] = k
    x = (z + 1e4).astype(F32)
    err = np.max(np.abs(fastln.layer_norm(x).astype(F64) - ref.layer_norm(x.astype(F64))))
    assert err <= 1e-5, err
    x0 = z.astype(F32)                            # and without the offset
    y, mean, rstd = fastln.layer_norm(x0, return_stats=True)
    ry, rmean, rrstd = ref.layer_norm(x0.astype(F64), return_stats=True)
    assert_close(y, ry, F32, scale=1.0)
    assert_close(rstd, rrstd, F32, scale=1.0)


@pytest.mark.parametrize("H", [300, 4099, 16384])
def test_far_head_takes_the_centred_sweep(isa, H, rng):
    """Rows longer than 256 take a one-sweep variance around the mean of their
    first 16 values. Where those lie far from the row's mean (here 1e3 above a
    row of std 1), the kernels sum the centred squares in a second sweep (else
    the cancellation costs about 1e-3 at H=16384): the 1e-5 bound holds, and
    rows with a near head in the same call stay exact to it too."""
    z = rng.standard_normal((16, H))
    z[::2, :16] += 1e3
    x = z.astype(F32)
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    ry, rmean, rrstd = ref.layer_norm(x.astype(F64), return_stats=True)
    assert_close(y, ry, F32, scale=1.0, err_msg="y")
    assert_close(rstd, rrstd, F32, err_msg="rstd")
    # mean = shift + (mean - shift), the second term rounded at the scale of the head's 1e3
    assert_close(mean, rmean, F32, scale=1e3, err_msg="mean")
    err = np.max(np.abs(y.astype(F64) - ry))
    assert err <= 1e-5, err


def test_large_offset_float64(isa, rng):
    x = randn(rng, (64, 1024), F64, loc=1e4, scale=1.0)
    y = fastln.layer_norm(x)
    err = np.max(np.abs(y - ref.layer_norm(x)))
    assert err <= 1e-10, err


@pytest.mark.parametrize("H", [64, 1024, 4099])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_outlier_first_element(isa, dtype, H, rng):
    x = outlier_rows(rng, H, dtype)
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    ry, rmean, rrstd = ref.layer_norm(x.astype(F64), return_stats=True)
    assert_close(y, ry, dtype, scale=1.0, err_msg="y")
    assert_close(rstd, rrstd, dtype, scale=1.0, err_msg="rstd")
    assert_close(mean, rmean, dtype, err_msg="mean")


CONSTANTS = [0.0, 1.0, 0.1, -7.77, 1e4 + 0.3, -3.3e-5, 1e30, 123456.789]


@pytest.mark.parametrize("H", [1, 2, 7, 64, 768, 1037])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_constant_row_returns_bias_exactly(isa, dtype, H, rng):
    c = np.array(CONSTANTS, dtype)
    x = np.repeat(c[:, None], H, axis=1)
    w = (1 + rng.standard_normal(H)).astype(dtype)
    b = (0.25 + rng.random(H)).astype(dtype)       # nonzero
    y = fastln.layer_norm(x, w, b)
    expect = np.broadcast_to(b, x.shape)
    bits = np.uint32 if dtype == F32 else np.uint64
    np.testing.assert_array_equal(y.view(bits), np.ascontiguousarray(expect).view(bits))
    y = fastln.layer_norm(x, w)                     # no bias: exactly zero
    np.testing.assert_array_equal(y, np.zeros_like(y))
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    np.testing.assert_array_equal(y, np.zeros_like(y))
    np.testing.assert_allclose(mean, c, rtol=1e-6 if dtype == F32 else 1e-14)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)


def test_constant_row_among_others(rng):
    x = randn(rng, (5, 100), F32)
    x[2] = 0.7
    b = randn(rng, (100,), F32)
    y = fastln.layer_norm(x, None, b)
    np.testing.assert_array_equal(y[2], b)
    assert_close(y, ref.layer_norm(x, None, b), F32)


_BIG_REF = {}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_streaming_sized(isa, dtype):
    """Outputs larger than the streaming-store threshold (32 MiB), incl. in place."""
    x, _, w, b = big_inputs(dtype)
    if dtype not in _BIG_REF:
        _BIG_REF[dtype] = ref.layer_norm(x, w, b, return_stats=True)
    ry, rmean, rrstd = _BIG_REF[dtype]
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    assert_close(y, ry, dtype)
    assert_close(mean, rmean, dtype)
    assert_close(rstd, rrstd, dtype)
    xi = x.copy()
    assert fastln.layer_norm(xi, w, b, out=xi) is xi
    np.testing.assert_array_equal(xi, y)
