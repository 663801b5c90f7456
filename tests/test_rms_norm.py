"""fastln.rms_norm against the float64 NumPy reference (fastln.reference)."""
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import (
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
    randn,
    relayout,
    result_dtype,
    stats_dtype,
    stats_shape,
)

HS = [1, 2, 7, 64, 768, 4099]
ROWS = [0, 1, 5]


def weight_for(rng, nshape, dtype):
    return (1.0 + 0.5 * rng.standard_normal(nshape)).astype(dtype)


def check(x, weight=None, axis=-1, eps=1e-6, in_dtype=None):
    xa = np.asarray(x)
    in_dtype = xa.dtype if in_dtype is None else np.dtype(in_dtype)
    rdt, sdt = result_dtype(in_dtype), stats_dtype(in_dtype)
    y, rstd = fastln.rms_norm(x, weight, axis=axis, eps=eps, return_stats=True)
    ry, rrstd = ref.rms_norm(xa.astype(F64), as_f64(weight, rdt), axis=axis, eps=eps,
                             return_stats=True)
    assert isinstance(y, np.ndarray) and isinstance(rstd, np.ndarray)
    assert y.dtype == rdt and y.shape == xa.shape
    assert rstd.dtype == sdt and rstd.shape == stats_shape(xa.shape, axis)
    assert_close(y, ry, in_dtype, err_msg="y")
    assert_close(rstd, rrstd, F32 if sdt == np.dtype(F32) else F64, err_msg="rstd")
    y2 = fastln.rms_norm(x, weight, axis=axis, eps=eps)
    assert isinstance(y2, np.ndarray)
    np.testing.assert_array_equal(y2, y)
    return y, rstd


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(isa, dtype, H, N, rng):
    x = randn(rng, (N, H), dtype, loc=0.3, scale=2.0)
    check(x)
    check(x, weight_for(rng, (H,), dtype))


@pytest.mark.parametrize("shape", [(2048, 768), (300, 4099), (4096, 33)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_parallel_sized(isa, dtype, shape, rng):
    x = randn(rng, shape, dtype, loc=-1.0, scale=3.0)
    check(x, weight_for(rng, shape[-1:], dtype))


def test_defaults_are_last_axis_and_eps_1e_6(rng):
    x = randn(rng, (6, 64), F64, scale=1e-3)      # mean(x^2) ~ 1e-6: eps matters
    y = fastln.rms_norm(x)
    np.testing.assert_allclose(y, ref.rms_norm(x, axis=-1, eps=1e-6), rtol=1e-12, atol=1e-12)
    assert not np.allclose(y, ref.rms_norm(x, eps=1e-5), rtol=1e-3)
    np.testing.assert_array_equal(y, fastln.rms_norm(x, axis=-1, eps=1e-6))


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-3, 0.5, 10.0])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_eps(dtype, eps, rng):
    x = randn(rng, (7, 96), dtype, scale=0.05)
    check(x, weight_for(rng, (96,), dtype), eps=eps)


AXES_3D = [-1, 2, 1, -2, 0, np.int64(-3), (1, 2), (-2, -1), (2, 1), (0, 2), (2, 0), (0, 1),
           (1, 0), (0, 1, 2), (2, 0, 1)]


@pytest.mark.parametrize("axis", AXES_3D, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_axis_forms(isa, dtype, axis, rng):
    shape = (4, 5, 6)
    x = randn(rng, shape, dtype, loc=1.0)
    check(x, axis=axis)
    check(x, weight_for(rng, normalized_shape(shape, axis), dtype), axis=axis)


def test_one_dim_and_4d(rng):
    x = randn(rng, (33,), F32)
    y, rstd = check(x)
    assert rstd.shape == ()
    x = randn(rng, (2, 3, 4, 5), F64)
    check(x, weight_for(rng, (5, 3), F64), axis=(3, 1))


@pytest.mark.parametrize("axis", [-1, 0, (0, 2), (2, 1)], ids=repr)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts(dtype, layout, axis, rng):
    shape = (6, 5, 33)
    x = randn(rng, shape, dtype, loc=0.5)
    w = weight_for(rng, normalized_shape(shape, axis), dtype)
    y, rstd = check(relayout(x, layout), relayout(w, layout), axis=axis)
    y0, rstd0 = fastln.rms_norm(x, w, axis=axis, return_stats=True)
    if axis == 0:
        # C-ordered x over a leading axis takes the channels-first kernel, the other
        # layouts the row kernels: the same values to rounding, not bitwise
        tight = dict(rtol=4e-6, atol=4e-6) if dtype == F32 else dict(rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(y, y0, **tight)
        np.testing.assert_allclose(rstd, rstd0, **tight)
        return
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(rstd, rstd0)


def test_lists_and_broadcast(rng):
    x = randn(rng, (4, 10), F64)
    w = weight_for(rng, (10,), F64)
    y, _ = check(x.tolist(), w.tolist())
    assert y.dtype == F64
    xb = np.broadcast_to(randn(rng, (50,), F32), (8, 50))
    y, _ = check(xb)
    np.testing.assert_array_equal(y, np.broadcast_to(y[0], y.shape))


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint8, np.bool_])
def test_int_and_bool_promote_to_float64(dtype, rng):
    x = randn(rng, (6, 17), dtype)
    y, rstd = check(x, weight_for(rng, (17,), F32))
    assert y.dtype == F64 and rstd.dtype == F64


@pytest.mark.parametrize("H", [1, 7, 64, 768, 1037])
def test_float16(isa, H, rng):
    x = randn(rng, (9, H), F16, loc=0.5, scale=2.0)
    y, rstd = check(x, weight_for(rng, (H,), F32))
    assert y.dtype == F16 and rstd.dtype == F32


@pytest.mark.parametrize("kind", ["C", "F", "sliced", "inplace", "inplace_F"])
@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out(dtype, axis, kind, rng):
    shape = (5, 6, 40)
    x = randn(rng, shape, dtype)
    w = weight_for(rng, normalized_shape(shape, axis), dtype)
    expect = fastln.rms_norm(x, w, axis=axis)
    if kind in ("C", "F", "sliced"):
        out = out_like(kind, shape, dtype)
    elif kind == "inplace":
        out = x
    else:
        x = out = np.asfortranarray(x)
    y, rstd = fastln.rms_norm(x, w, axis=axis, out=out, return_stats=True)
    assert y is out
    np.testing.assert_array_equal(out, expect)
    assert rstd.shape == stats_shape(shape, axis)


@pytest.mark.parametrize("shape,axis", [((0, 8), -1), ((3, 0, 8), -1), ((8, 0), 0),
                                        ((2, 0, 3), (0, 2))], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [F16])
def test_empty_rows(dtype, shape, axis):
    x = np.zeros(shape, dtype)
    y, rstd = fastln.rms_norm(x, np.ones(normalized_shape(shape, axis), dtype), axis=axis,
                              return_stats=True)
    assert y.shape == shape and y.dtype == result_dtype(dtype)
    assert rstd.shape == stats_shape(shape, axis) and rstd.dtype == stats_dtype(dtype)


@pytest.mark.parametrize("H", [1, 7, 768, 1037])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_zero_row_gives_zero(isa, dtype, H, rng):
    x = randn(rng, (4, H), dtype)
    x[1] = 0
    y, rstd = fastln.rms_norm(x, weight_for(rng, (H,), dtype), return_stats=True)
    np.testing.assert_array_equal(y[1], np.zeros(H, dtype))
    np.testing.assert_allclose(rstd[1], 1 / np.sqrt(1e-6), rtol=1e-6)
    assert np.isfinite(y).all()


@pytest.mark.parametrize("loc,scale,eps", [(1e4, 1.0, 1e-6), (-1e4, 10.0, 1e-6),
                                           (1e-4, 1e-4, 0.0), (0.0, 1e15, 1e-6)], ids=repr)
@pytest.mark.parametrize("H", [7, 1024, 1037])
def test_offsets_and_scales_float32(isa, H, loc, scale, eps, rng):
    x = randn(rng, (64, H), F32, loc=loc, scale=scale)
    w = weight_for(rng, (H,), F32)
    y = fastln.rms_norm(x, w, eps=eps)
    assert_close(y, ref.rms_norm(x.astype(F64), w, eps=eps), F32)


@pytest.mark.parametrize("H", [7, 768])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_inf_stay_in_their_row(isa, dtype, H, rng):
    N = 9
    x = randn(rng, (N, H), dtype)
    x[2, 1], x[4, 3], x[6, 0] = np.nan, np.inf, -np.inf
    bad = [2, 4, 6]
    good = [r for r in range(N) if r not in bad]
    w = weight_for(rng, (H,), dtype)
    y, rstd = fastln.rms_norm(x, w, return_stats=True)
    for r in bad:
        assert not np.isfinite(y[r]).all(), r
    assert np.isfinite(y[good]).all() and np.isfinite(rstd[good]).all()
    ry, rr = ref.rms_norm(x[good].astype(F64), w, return_stats=True)
    assert_close(y[good], ry, dtype)
    assert_close(rstd[good], rr, dtype)


_BIG_REF = {}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_streaming_sized(isa, dtype):
    """Outputs larger than the streaming-store threshold (32 MiB), incl. in place."""
    x, _, w, _ = big_inputs(dtype)
    if dtype not in _BIG_REF:
        _BIG_REF[dtype] = ref.rms_norm(x, w, return_stats=True)
    ry, rrstd = _BIG_REF[dtype]
    y, rstd = fastln.rms_norm(x, w, return_stats=True)
    assert_close(y, ry, dtype)
    assert_close(rstd, rrstd, dtype)
    xi = x.copy()
    assert fastln.rms_norm(xi, w, out=xi) is xi
    np.testing.assert_array_equal(xi, y)
