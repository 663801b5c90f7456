"""fastln.add_layer_norm (s = x + residual; y = layer_norm(s)) against the reference."""
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


def check(x, residual, weight=None, bias=None, axis=-1, eps=1e-5):
    xa, ra = np.asarray(x), np.asarray(residual)
    in_dtype = xa.dtype
    rdt, sdt = result_dtype(in_dtype), stats_dtype(in_dtype)
    y, s, mean, rstd = fastln.add_layer_norm(x, residual, weight, bias, axis=axis, eps=eps,
                                             return_stats=True)
    for a in (y, s, mean, rstd):
        assert isinstance(a, np.ndarray)
    assert y.dtype == s.dtype == rdt and y.shape == s.shape == xa.shape
    assert mean.dtype == rstd.dtype == sdt
    assert mean.shape == rstd.shape == stats_shape(xa.shape, axis)
    # s is x + residual rounded once to the result dtype.
    s_exact = xa.astype(F64) + ra.astype(F64)
    if rdt == np.dtype(F16):
        assert_close(s, s_exact, F16)
    else:
        np.testing.assert_array_equal(s, s_exact.astype(rdt))
    ry, rs, rmean, rrstd = ref.add_layer_norm(xa.astype(F64), ra.astype(F64),
                                              as_f64(weight, rdt), as_f64(bias, rdt),
                                              axis=axis, eps=eps, return_stats=True)
    assert_close(y, ry, in_dtype, err_msg="y")
    st = F32 if sdt == np.dtype(F32) else F64
    assert_close(mean, rmean, st, err_msg="mean")
    assert_close(rstd, rrstd, st, err_msg="rstd")
    # without stats: the same y and s
    y2, s2 = fastln.add_layer_norm(x, residual, weight, bias, axis=axis, eps=eps)
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(s2, s)
    # y is layer_norm of the returned s
    if rdt != np.dtype(F16):
        assert_close(y, ref.layer_norm(s.astype(F64), as_f64(weight, rdt), as_f64(bias, rdt),
                                       axis=axis, eps=eps), in_dtype)
    return y, s, mean, rstd


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(isa, dtype, H, N, rng):
    x = randn(rng, (N, H), dtype, loc=0.3, scale=2.0)
    r = randn(rng, (N, H), dtype, loc=-0.1)
    for kind in AFFINE:
        check(x, r, *params(rng, (H,), dtype, kind))


@pytest.mark.parametrize("shape", [(2048, 768), (300, 4099)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_parallel_sized(isa, dtype, shape, rng):
    x = randn(rng, shape, dtype, scale=3.0)
    r = randn(rng, shape, dtype)
    check(x, r, *params(rng, shape[-1:], dtype, "both"))


def test_default_eps(rng):
    x = randn(rng, (6, 64), F64, scale=2e-3)
    r = randn(rng, (6, 64), F64, scale=2e-3)
    y, s = fastln.add_layer_norm(x, r)
    np.testing.assert_allclose(y, ref.layer_norm(x + r, eps=1e-5), rtol=1e-12, atol=1e-12)
    assert not np.allclose(y, ref.layer_norm(x + r, eps=1e-6), rtol=1e-3)


AXES = [-1, 0, 1, (1, 2), (2, 1), (0, 2), (2, 0), (0, 1, 2), np.int64(-2)]


@pytest.mark.parametrize("axis", AXES, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_axis_forms(isa, dtype, axis, rng):
    shape = (4, 5, 6)
    x, r = randn(rng, shape, dtype), randn(rng, shape, dtype)
    check(x, r, axis=axis)
    check(x, r, *params(rng, normalized_shape(shape, axis), dtype, "both"), axis=axis)


@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("rlayout", list(LAYOUTS))
@pytest.mark.parametrize("xlayout", list(LAYOUTS))
def test_layouts(xlayout, rlayout, axis, rng):
    shape = (6, 5, 33)
    x, r = randn(rng, shape, F32), randn(rng, shape, F32)
    w, b = params(rng, normalized_shape(shape, axis), F32, "both")
    y, s, mean, rstd = check(relayout(x, xlayout), relayout(r, rlayout), w, b, axis=axis)
    y0, s0 = fastln.add_layer_norm(x, r, w, b, axis=axis)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(s, s0)


def test_lists(rng):
    x, r = randn(rng, (3, 8), F64), randn(rng, (3, 8), F64)
    y, s, _, _ = check(x.tolist(), r.tolist())
    assert y.dtype == F64


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_int_and_bool_promote_to_float64(dtype, rng):
    x, r = randn(rng, (6, 17), dtype), randn(rng, (6, 17), dtype)
    y, s, mean, rstd = check(x, r)
    assert y.dtype == s.dtype == F64


@pytest.mark.parametrize("H", [7, 768, 1037])
def test_float16(isa, H, rng):
    x, r = randn(rng, (9, H), F16), randn(rng, (9, H), F16, loc=1.0)
    y, s, mean, rstd = check(x, r, *params(rng, (H,), F32, "both"))
    assert y.dtype == s.dtype == F16 and mean.dtype == F32


@pytest.mark.parametrize("kind", ["y_C", "y_F", "y_sliced", "tuple", "tuple_strided",
                                  "y_is_x", "y_is_residual", "x_and_residual"])
@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out(dtype, axis, kind, rng):
    shape = (5, 6, 40)
    x0, r0 = randn(rng, shape, dtype), randn(rng, shape, dtype)
    w, b = params(rng, normalized_shape(shape, axis), dtype, "both")
    ey, es = fastln.add_layer_norm(x0, r0, w, b, axis=axis)
    x, r = x0.copy(), r0.copy()
    s_out = None
    if kind == "y_C":
        out = y_out = np.empty(shape, dtype)
    elif kind == "y_F":
        out = y_out = np.empty(shape, dtype, order="F")
    elif kind == "y_sliced":
        out = y_out = relayout(np.zeros(shape, dtype), "sliced")
    elif kind == "tuple":
        y_out, s_out = np.empty(shape, dtype), np.empty(shape, dtype)
        out = (y_out, s_out)
    elif kind == "tuple_strided":
        y_out = relayout(np.zeros(shape, dtype), "negstride")
        s_out = np.empty(shape, dtype, order="F")
        out = (y_out, s_out)
    elif kind == "y_is_x":
        out = y_out = x
    elif kind == "y_is_residual":
        out = y_out = r
    else:                                         # the pre-norm transformer pattern
        y_out, s_out = x, r
        out = (x, r)
    y, s = fastln.add_layer_norm(x, r, w, b, axis=axis, out=out)
    assert y is y_out
    if s_out is not None:
        assert s is s_out
    np.testing.assert_array_equal(y, ey)
    np.testing.assert_array_equal(s, es)
    # with return_stats as well
    x, r = x0.copy(), r0.copy()
    if kind == "y_is_x":
        out = y_out = x
    elif kind == "y_is_residual":
        out = y_out = r
    elif kind == "x_and_residual":
        y_out, s_out = x, r
        out = (x, r)
    y, s, mean, rstd = fastln.add_layer_norm(x, r, w, b, axis=axis, out=out, return_stats=True)
    assert y is y_out
    np.testing.assert_array_equal(y, ey)
    np.testing.assert_array_equal(s, es)


def test_in_place_large(isa, rng):
    x0, r0 = randn(rng, (1500, 1000), F32), randn(rng, (1500, 1000), F32)
    w, b = params(rng, (1000,), F32, "both")
    ey, es = fastln.add_layer_norm(x0, r0, w, b)
    x, r = x0.copy(), r0.copy()
    fastln.add_layer_norm(x, r, w, b, out=(x, r))
    np.testing.assert_array_equal(x, ey)
    np.testing.assert_array_equal(r, es)


@pytest.mark.parametrize("shape,axis", [((0, 8), -1), ((3, 0, 8), -1), ((8, 0), 0)], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty_rows(dtype, shape, axis):
    x = np.zeros(shape, dtype)
    y, s, mean, rstd = fastln.add_layer_norm(x, x, axis=axis, return_stats=True)
    assert y.shape == s.shape == shape and y.dtype == s.dtype == dtype
    assert mean.shape == rstd.shape == stats_shape(shape, axis)


@pytest.mark.parametrize("H", [7, 1024, 1037])
def test_large_offset_float32(isa, H, rng):
    x = randn(rng, (256, H), F32, loc=1e4)
    r = randn(rng, (256, H), F32, loc=-20.0, scale=0.5)
    y, s = fastln.add_layer_norm(x, r)
    np.testing.assert_array_equal(s, x + r)
    err = np.max(np.abs(y.astype(F64) - ref.layer_norm(s.astype(F64))))
    assert err <= 1e-5, err


@pytest.mark.parametrize("H", [64, 1024, 4099])
def test_outlier_first_element_float32(isa, H, rng):
    """s rows whose first element lies far from the rest (see test_layer_norm)."""
    s = outlier_rows(rng, H, F32)
    x = randn(rng, s.shape, F32, scale=0.1)
    r = s - x                                     # x + r == s up to rounding
    y, s_ = fastln.add_layer_norm(x, r)
    assert_close(y, ref.layer_norm(s_.astype(F64)), F32, scale=1.0)


@pytest.mark.parametrize("H", [1, 7, 768, 1037])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_constant_sum_returns_bias_exactly(isa, dtype, H, rng):
    x = randn(rng, (5, H), dtype)
    r = (np.array([0.1, -3.0, 1e4, 2.5, 0.0], dtype)[:, None] - x).astype(dtype)
    s_expect = x + r
    const = np.ptp(s_expect, axis=1) == 0
    w = (1 + rng.standard_normal(H)).astype(dtype)
    b = (0.5 + rng.random(H)).astype(dtype)
    y, s = fastln.add_layer_norm(x, r, w, b)
    assert const.any()
    np.testing.assert_array_equal(y[const], np.broadcast_to(b, y[const].shape))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_inf_stay_in_their_row(isa, dtype, rng):
    x, r = randn(rng, (9, 300), dtype), randn(rng, (9, 300), dtype)
    x[2, 5] = np.nan
    r[4, 7] = np.inf
    x[6, 0], r[6, 0] = np.inf, -np.inf            # inf - inf = nan in s
    bad = [2, 4, 6]
    good = [i for i in range(9) if i not in bad]
    y, s, mean, rstd = fastln.add_layer_norm(x, r, return_stats=True)
    for i in bad:
        assert not np.isfinite(y[i]).all()
    assert np.isfinite(y[good]).all() and np.isfinite(s[good]).all()
    assert_close(y[good], ref.layer_norm(x[good].astype(F64) + r[good]), dtype)


_BIG_REF = {}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_streaming_sized(isa, dtype):
    """y and s past the streaming-store threshold (32 MiB of both), incl. out=(x, residual)."""
    x, r, w, b = big_inputs(dtype)
    if dtype not in _BIG_REF:
        _BIG_REF[dtype] = ref.add_layer_norm(x, r, w, b, return_stats=True)
    ry, rs, rmean, rrstd = _BIG_REF[dtype]
    y, s, mean, rstd = fastln.add_layer_norm(x, r, w, b, return_stats=True)
    np.testing.assert_array_equal(s, x + r)
    assert_close(y, ry, dtype)
    assert_close(mean, rmean, dtype)
    assert_close(rstd, rrstd, dtype)
    xi, ri = x.copy(), r.copy()
    yi, si = fastln.add_layer_norm(xi, ri, w, b, out=(xi, ri))
    assert yi is xi and si is ri
    np.testing.assert_array_equal(xi, y)
    np.testing.assert_array_equal(ri, s)


@pytest.mark.parametrize("H", [200, 1024])
def test_odd_rows_in_place(isa, H):
    """Long rows (past 128) that take the one-row fallbacks, among normal ones:
    with s written over x or y over the residual the results are those of the
    plain call, and each row's are those of the row alone. (The float kernel
    stores s as it first sums a row and reads s back after, so once s is over
    x, x + residual must not be read again.)"""
    rng = np.random.default_rng(H)
    x, r = randn(rng, (40, H), F32), randn(rng, (40, H), F32)
    x[3] *= 1e17          # variance past 1e30
    x[5], r[5] = 2.5, 0   # constant
    x[9] *= 1e-18         # variance below 1e-30
    r[9] *= 1e-18
    x[12, 0] = np.inf
    x[20, -1] = np.nan
    x[21] = 1e37          # sums overflow float
    x[30, :16] += 1e3     # a head far from the row's mean: the centred sweep
    w, b = params(rng, (H,), F32, "both")
    with np.errstate(all="ignore"):
        want = fastln.add_layer_norm(x, r, w, b, return_stats=True)
        for swap in (False, True):
            xi, ri = x.copy(), r.copy()
            out = (ri, xi) if swap else (xi, ri)
            got = fastln.add_layer_norm(xi, ri, w, b, out=out, return_stats=True)
            for g, e in zip(got, want):
                np.testing.assert_array_equal(g, e)
        for n in range(len(x)):
            got = fastln.add_layer_norm(x[n:n + 1], r[n:n + 1], w, b, return_stats=True)
            for g, e in zip(got, want):
                np.testing.assert_array_equal(g, e[n:n + 1], err_msg=f"row {n}")
    for n in (3, 9, 21, 30):
        for g, e in zip(want, ref.add_layer_norm(x[n:n + 1], r[n:n + 1], w, b,
                                                 return_stats=True)):
            np.testing.assert_allclose(g[n:n + 1], e, rtol=2e-5, atol=2e-5)
