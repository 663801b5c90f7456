"""Backward kernels: against the float64 reference and against finite differences."""
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
    normalized_shape,
    out_like,
    randn,
    relayout,
    require,
    result_dtype,
)

HS = [1, 2, 7, 64, 768, 4099]
ROWS = [0, 1, 5]


def ln_check(dy, x, weight=None, axis=-1, mean=None, rstd=None, in_dtype=None):
    """fastln.layer_norm_backward vs reference.layer_norm_backward with the same stats."""
    xa = np.asarray(x)
    in_dtype = xa.dtype if in_dtype is None else np.dtype(in_dtype)
    rdt = result_dtype(in_dtype)
    if mean is None:
        _, mean, rstd = fastln.layer_norm(x, weight, axis=axis, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, weight, axis=axis)
    rdx, rdw, rdb = ref.layer_norm_backward(np.asarray(dy).astype(F64), xa.astype(F64), mean, rstd,
                                            as_f64(weight, rdt), axis=axis)
    nshape = normalized_shape(xa.shape, axis)
    assert isinstance(dx, np.ndarray) and dx.dtype == rdt and dx.shape == xa.shape
    for g in (dw, db):
        assert isinstance(g, np.ndarray) and g.shape == nshape
        if rdt != np.dtype(F16):
            assert g.dtype == rdt
    assert_close(dx, rdx, in_dtype, err_msg="dx", scale=dx_scale(dy, weight, rstd, rdx))
    red = F32 if rdt == np.dtype(F16) else in_dtype    # reductions are float32 or better
    assert_close(dw, rdw, red, err_msg="dweight")
    assert_close(db, rdb, red, err_msg="dbias")
    return dx, dw, db


def rms_check(dy, x, weight=None, axis=-1, rstd=None, in_dtype=None):
    xa = np.asarray(x)
    in_dtype = xa.dtype if in_dtype is None else np.dtype(in_dtype)
    rdt = result_dtype(in_dtype)
    if rstd is None:
        _, rstd = fastln.rms_norm(x, weight, axis=axis, return_stats=True)
    dx, dw = fastln.rms_norm_backward(dy, x, rstd, weight, axis=axis)
    rdx, rdw = ref.rms_norm_backward(np.asarray(dy).astype(F64), xa.astype(F64), rstd,
                                     as_f64(weight, rdt), axis=axis)
    assert isinstance(dx, np.ndarray) and dx.dtype == rdt and dx.shape == xa.shape
    assert isinstance(dw, np.ndarray) and dw.shape == normalized_shape(xa.shape, axis)
    if rdt != np.dtype(F16):
        assert dw.dtype == rdt
    assert_close(dx, rdx, in_dtype, err_msg="dx", scale=dx_scale(dy, weight, rstd, rdx))
    assert_close(dw, rdw, F32 if rdt == np.dtype(F16) else in_dtype, err_msg="dweight")
    return dx, dw


def dx_scale(dy, weight, rstd, rdx):
    """Magnitude of the terms dx is computed from (rstd*|dy*weight|): the error of dx is
    relative to it, and dx itself can cancel to ~0 (e.g. H=1 or 2, where dx == 0)."""
    g = np.abs(np.asarray(dy, F64))
    if weight is not None:
        g = g * np.max(np.abs(np.asarray(weight, F64)))
    r = np.abs(np.asarray(rstd, F64))
    gmax = float(g.max()) if g.size else 0.0
    rmax = float(r.max()) if r.size else 0.0
    return max(1.0, float(np.abs(rdx).max()) if rdx.size else 0.0, gmax * rmax)


def weight_for(rng, nshape, dtype):
    return (1.0 + 0.5 * rng.standard_normal(nshape)).astype(dtype)


# ---------------------------------------------------------------- reference grid

@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layer_norm_backward_matches_reference(isa, dtype, H, N, rng):
    x = randn(rng, (N, H), dtype, loc=0.5, scale=2.0)
    dy = randn(rng, (N, H), dtype)
    ln_check(dy, x)
    ln_check(dy, x, weight_for(rng, (H,), dtype))


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_backward_matches_reference(isa, dtype, H, N, rng):
    x = randn(rng, (N, H), dtype, loc=0.5, scale=2.0)
    dy = randn(rng, (N, H), dtype)
    rms_check(dy, x)
    rms_check(dy, x, weight_for(rng, (H,), dtype))


@pytest.mark.parametrize("shape", [(2048, 768), (300, 4099), (4096, 33)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_parallel_sized(isa, dtype, shape, rng):
    x = randn(rng, shape, dtype, loc=-1.0, scale=3.0)
    dy = randn(rng, shape, dtype)
    w = weight_for(rng, shape[-1:], dtype)
    ln_check(dy, x, w)
    rms_check(dy, x, w)


def test_empty_rows_give_zero_grads():
    for dtype in FLOAT_DTYPES:
        x = np.zeros((0, 8), dtype)
        _, mean, rstd = fastln.layer_norm(x, return_stats=True)
        dx, dw, db = fastln.layer_norm_backward(x, x, mean, rstd, np.ones(8, dtype))
        assert dx.shape == (0, 8) and dw.shape == db.shape == (8,)
        np.testing.assert_array_equal(dw, 0)
        np.testing.assert_array_equal(db, 0)
        _, rstd = fastln.rms_norm(x, return_stats=True)
        dx, dw = fastln.rms_norm_backward(x, x, rstd)
        assert dx.shape == (0, 8) and dw.shape == (8,)
        np.testing.assert_array_equal(dw, 0)
        x = np.zeros((3, 0, 4), dtype)
        _, mean, rstd = fastln.layer_norm(x, axis=(0, 2), return_stats=True)
        dx, dw, db = fastln.layer_norm_backward(x, x, mean, rstd, axis=(0, 2))
        assert dx.shape == (3, 0, 4) and dw.shape == db.shape == (3, 4)
        np.testing.assert_array_equal(db, 0)


AXES_3D = [-1, 1, 0, (1, 2), (2, 1), (0, 2), (2, 0), (0, 1, 2), (1, 0, 2)]


@pytest.mark.parametrize("axis", AXES_3D, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_axis_forms(isa, dtype, axis, rng):
    shape = (4, 5, 6)
    x, dy = randn(rng, shape, dtype, loc=1.0), randn(rng, shape, dtype)
    w = weight_for(rng, normalized_shape(shape, axis), dtype)
    ln_check(dy, x, axis=axis)
    ln_check(dy, x, w, axis=axis)
    rms_check(dy, x, axis=axis)
    rms_check(dy, x, w, axis=axis)


@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("layout", list(LAYOUTS) + ["list"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts(dtype, layout, axis, rng):
    shape = (6, 5, 33)
    x, dy = randn(rng, shape, dtype, loc=0.5), randn(rng, shape, dtype)
    w = weight_for(rng, normalized_shape(shape, axis), dtype)
    _, mean, rstd = fastln.layer_norm(x, w, axis=axis, return_stats=True)
    e_ln = fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    _, rrstd = fastln.rms_norm(x, w, axis=axis, return_stats=True)
    e_rms = fastln.rms_norm_backward(dy, x, rrstd, w, axis=axis)
    if layout == "list":
        # everything as nested lists (so float64)
        lx, ldy, lw = x.tolist(), dy.tolist(), w.tolist()
        lmean, lrstd, lrrstd = mean.tolist(), rstd.tolist(), rrstd.tolist()
    else:
        lx, ldy, lw = (relayout(a, layout) for a in (x, dy, w))
        lmean, lrstd, lrrstd = (relayout(a, layout) for a in (mean, rstd, rrstd))
    got = ln_check(ldy, lx, lw, axis=axis, mean=lmean, rstd=lrstd)
    if layout != "list":
        for g, e in zip(got, e_ln):
            np.testing.assert_array_equal(g, e)
    got = rms_check(ldy, lx, lw, axis=axis, rstd=lrrstd)
    if layout != "list":
        for g, e in zip(got, e_rms):
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_int_inputs_promote_to_float64(dtype, rng):
    x = randn(rng, (5, 9), dtype)
    dy = randn(rng, (5, 9), dtype)
    _, mean, rstd = fastln.layer_norm(x, return_stats=True)
    dx, dw, db = ln_check(dy, x, mean=mean, rstd=rstd)
    assert dx.dtype == dw.dtype == F64
    _, rstd = fastln.rms_norm(x, return_stats=True)
    dx, dw = rms_check(dy, x, rstd=rstd)
    assert dx.dtype == F64


@pytest.mark.parametrize("H", [7, 768, 1037])
def test_float16(isa, H, rng):
    x = randn(rng, (9, H), F16, loc=0.5)
    dy = randn(rng, (9, H), F16)
    w = weight_for(rng, (H,), F32)
    dx, dw, db = ln_check(dy, x, w)
    assert dx.dtype == F16
    dx, dw = rms_check(dy, x, w)
    assert dx.dtype == F16


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(require("ml_dtypes").bfloat16)
    return np.dtype(name)


@pytest.mark.parametrize("form", ["rows", "add", "channels"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_one_element_rows_give_dx_exactly_zero(isa, dtype, form, rng):
    """LayerNorm over an axis of length 1 gives y = bias whatever x is, so dx
    is exactly 0 on every path, thread count and row count, with any weight
    and dy: a fused dy * weight - mean(dy * weight) would leave dy * weight's
    rounding error times rstd (~1e-5 in float32). dweight and dbias are the
    float64 reference's. rows: the row backward; add: the fused add's;
    channels: (N, 1, S) over axis 1, the channels-first entry."""
    dt = _dtype(dtype)
    pdt = F64 if dt == np.dtype(F64) else F32
    red = pdt if dt == np.dtype(F64) else F32   # reductions are float32 or better
    w = np.array([-1.7], pdt)
    for nt in (1, 2, 3):
        for N in (1, 3, 17, 64, 1000):
            shape = (N, 1, 5) if form == "channels" else (N, 1)
            axis = 1 if form == "channels" else -1
            x = randn(rng, shape, dt, loc=0.5, scale=3.0)
            dy = randn(rng, shape, dt, scale=2.5)
            with fastln.threads(nt):
                if form == "add":
                    _, s, mean, rstd = fastln.add_layer_norm(x, x, w, return_stats=True)
                    dx, dw, db = fastln.add_layer_norm_backward(dy, s, mean, rstd, w)
                    x = s
                else:
                    _, mean, rstd = fastln.layer_norm(x, w, axis=axis, return_stats=True)
                    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
            where = f"{form} {dtype} N={N} on {nt} threads"
            assert dx.dtype == dt and dx.shape == shape
            assert np.count_nonzero(dx) == 0, f"{where}: dx {dx.ravel()[:4]}"
            _, rdw, rdb = ref.layer_norm_backward(dy.astype(F64), x.astype(F64), mean, rstd,
                                                  w.astype(F64), axis=axis)
            assert_close(dw, rdw, red, err_msg=f"{where}: dweight")
            assert_close(db, rdb, red, err_msg=f"{where}: dbias")


@pytest.mark.parametrize("kind", ["C", "F", "sliced", "dy", "x"])
@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out(dtype, axis, kind, rng):
    shape = (5, 6, 40)
    x0, dy0 = randn(rng, shape, dtype), randn(rng, shape, dtype)
    w = weight_for(rng, normalized_shape(shape, axis), dtype)
    _, mean, rstd = fastln.layer_norm(x0, w, axis=axis, return_stats=True)
    _, rrstd = fastln.rms_norm(x0, w, axis=axis, return_stats=True)
    e_ln = fastln.layer_norm_backward(dy0, x0, mean, rstd, w, axis=axis)
    e_rms = fastln.rms_norm_backward(dy0, x0, rrstd, w, axis=axis)

    def make():
        x, dy = x0.copy(), dy0.copy()
        if kind in ("C", "F", "sliced"):
            out = out_like(kind, shape, dtype)
        else:
            out = dy if kind == "dy" else x
        return x, dy, out

    x, dy, out = make()
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, out=out)
    assert dx is out
    for g, e in zip((dx, dw, db), e_ln):
        np.testing.assert_array_equal(g, e)
    x, dy, out = make()
    dx, dw = fastln.rms_norm_backward(dy, x, rrstd, w, axis=axis, out=out)
    assert dx is out
    for g, e in zip((dx, dw), e_rms):
        np.testing.assert_array_equal(g, e)


def test_out_in_place_large(isa, rng):
    x, dy = randn(rng, (1500, 1000), F32), randn(rng, (1500, 1000), F32)
    w = weight_for(rng, (1000,), F32)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    e = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, out=dy)
    assert dx is dy
    for g, ee in zip((dx, dw, db), e):
        np.testing.assert_array_equal(g, ee)


# ---------------------------------------------------------------- mean repair / numerics

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_row_mean_is_repaired(isa, dtype, rng):
    """The row mean used is mean + mean(x - mean): a stale saved mean is corrected."""
    x = randn(rng, (6, 300), dtype, loc=0.5)
    dy = randn(rng, (6, 300), dtype)
    w = weight_for(rng, (300,), dtype)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    bad_mean = (mean + np.array([0.05, -0.05, 0.02, 0.0, 0.1, -0.01])).astype(mean.dtype)
    dx, dw, db = ln_check(dy, x, w, mean=bad_mean, rstd=rstd)
    good = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    for g, e in zip((dx, dw, db), good):
        assert_close(g, e, dtype)


@pytest.mark.parametrize("H", [7, 1024, 1037])
def test_large_offset_float32(isa, H, rng):
    x = randn(rng, (256, H), F32, loc=1e4)
    dy = randn(rng, (256, H), F32)
    w = weight_for(rng, (H,), F32)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    # against the exact gradient (float64 stats of the same float32 x)
    _, m64, r64 = ref.layer_norm(x.astype(F64), w, return_stats=True)
    rdx, rdw, rdb = ref.layer_norm_backward(dy.astype(F64), x.astype(F64), m64, r64, w)
    assert_close(dx, rdx, F32, atol=5e-5, scale=1.0)
    assert_close(dw, rdw, F32, rtol=1e-4, atol=1e-4)
    assert_close(db, rdb, F32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_in_one_row_of_dy(isa, dtype, rng):
    x, dy = randn(rng, (9, 300), dtype), randn(rng, (9, 300), dtype)
    dy[3, 10] = np.nan
    dy[5, 0] = np.inf
    good = [i for i in range(9) if i not in (3, 5)]
    _, mean, rstd = fastln.layer_norm(x, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd)
    assert not np.isfinite(dx[3]).all() and not np.isfinite(dx[5]).all()
    assert np.isfinite(dx[good]).all()
    rdx, _, _ = ref.layer_norm_backward(dy[good], x[good], mean[good], rstd[good])
    assert_close(dx[good], rdx, dtype)
    _, rstd = fastln.rms_norm(x, return_stats=True)
    dx, dw = fastln.rms_norm_backward(dy, x, rstd)
    assert not np.isfinite(dx[3]).all() and np.isfinite(dx[good]).all()
    rdx, _ = ref.rms_norm_backward(dy[good], x[good], rstd[good])
    assert_close(dx[good], rdx, dtype)


@pytest.mark.parametrize("H", [16, 64, 100])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_zero_dy_signs_match_generic_path(isa, dtype, H, rng):
    """dy = 0 with a negative weight: g = dy * weight is -0 in every lane, so a
    row sum begun at its first value, not at 0, would be -0 and flip the sign
    of some zeros of dx. Every path gives the generic path's bits."""
    x = randn(rng, (48, H), dtype)
    w = (-1.0 - rng.random(H)).astype(dtype)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    dy = np.zeros_like(x)
    dy[1::3] = -0.0
    got = fastln.layer_norm_backward(dy, x, mean, rstd, w)[0]
    fastln._lib._set_isa("generic")
    try:
        want = fastln.layer_norm_backward(dy, x, mean, rstd, w)[0]
    finally:
        fastln._lib._set_isa(isa)
    assert np.signbit(want).any() and not np.signbit(want).all()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("H", [64, 100, 128, 300, 1037])
def test_past_the_cache_size(isa, H, rng):
    """Backwards whose x, dy and dx take more than 2 MiB sweep each row once,
    together with the next row's sums (AVX-512, float32, H > 128; rows of up
    to 128 go sixteen at a time, with prefetches): rows with
    NaN and inf, a row whose float sums overflow (the double fallback), no
    weight, RMSNorm, and dx written over x."""
    N = -(-256000 // H)                          # 3 * N * H * 4 bytes > 2 MiB at every H
    x, dy = randn(rng, (N, H), F32, loc=0.5), randn(rng, (N, H), F32)
    x[7] *= 1e18                                 # sum(dy * (x - mean)) ~ 1e39: past float
    dy[7] *= 1e19
    dy[11, 5], dy[12, 0] = np.nan, np.inf
    bad, good = [11, 12], [i for i in range(N) if i not in (7, 11, 12)]
    for w in (None, weight_for(rng, (H,), F32)):
        _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
        dx = fastln.layer_norm_backward(dy, x, mean, rstd, w)[0]
        assert not np.isfinite(dx[bad]).all(axis=1).any() and np.isfinite(dx[good]).all()
        rdx = ref.layer_norm_backward(dy[7:8].astype(F64), x[7:8].astype(F64), mean[7:8],
                                      rstd[7:8], as_f64(w, F32))[0]
        assert_close(dx[7:8], rdx, F32, scale=np.abs(rdx).max())
        ln_check(dy[good], x[good], w)
        rms_check(dy[good], x[good], w)
        want = fastln.layer_norm_backward(dy, x, mean, rstd, w)
        xc = x.copy()
        got = fastln.layer_norm_backward(dy, xc, mean, rstd, w, out=xc)
        assert got[0] is xc
        for g, e in zip(got, want):
            np.testing.assert_array_equal(g, e)


# ---------------------------------------------------------------- finite differences

FD_CASES = [((3, 5), -1), ((3, 5), 0), ((2, 3, 4), (0, 2)), ((2, 3, 4), (2, 0)), ((4,), 0)]
STEP = 1e-6


def num_grad(f, a):
    """Central differences of the scalar f() with respect to every element of a (in place)."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + STEP
        fp = f()
        a[i] = old - STEP
        fm = f()
        a[i] = old
        g[i] = (fp - fm) / (2 * STEP)
    return g


def fd_close(analytic, numeric, what):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=what)


@pytest.mark.parametrize("shape,axis", FD_CASES, ids=repr)
def test_layer_norm_finite_differences(shape, axis, rng):
    x = rng.standard_normal(shape) * 1.5 + 0.3
    nshape = normalized_shape(shape, axis)
    w = 1 + 0.5 * rng.standard_normal(nshape)
    b = rng.standard_normal(nshape)
    c = rng.standard_normal(shape)                 # loss = sum(y * c), so dy = c

    def loss():
        return float(np.sum(fastln.layer_norm(x, w, b, axis=axis) * c))

    _, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(c, x, mean, rstd, w, axis=axis)
    assert np.abs(dx).max() > 1e-3                 # a non-trivial gradient
    fd_close(dx, num_grad(loss, x), "dx")
    fd_close(dw, num_grad(loss, w), "dweight")
    fd_close(db, num_grad(loss, b), "dbias")

    def loss_plain():
        return float(np.sum(fastln.layer_norm(x, axis=axis) * c))

    _, mean, rstd = fastln.layer_norm(x, axis=axis, return_stats=True)
    dx, _, _ = fastln.layer_norm_backward(c, x, mean, rstd, axis=axis)
    fd_close(dx, num_grad(loss_plain, x), "dx without weight")


@pytest.mark.parametrize("shape,axis", FD_CASES, ids=repr)
def test_rms_norm_finite_differences(shape, axis, rng):
    x = rng.standard_normal(shape) * 1.5 + 0.3
    w = 1 + 0.5 * rng.standard_normal(normalized_shape(shape, axis))
    c = rng.standard_normal(shape)

    def loss():
        return float(np.sum(fastln.rms_norm(x, w, axis=axis) * c))

    _, rstd = fastln.rms_norm(x, w, axis=axis, return_stats=True)
    dx, dw = fastln.rms_norm_backward(c, x, rstd, w, axis=axis)
    assert np.abs(dx).max() > 1e-3
    fd_close(dx, num_grad(loss, x), "dx")
    fd_close(dw, num_grad(loss, w), "dweight")


@pytest.mark.parametrize("shape,axis", FD_CASES, ids=repr)
def test_add_layer_norm_finite_differences(shape, axis, rng):
    """loss = sum(y*c) + sum(s*d): d loss/dx = d loss/dresidual = LN-backward(c) + d."""
    x = rng.standard_normal(shape)
    r = rng.standard_normal(shape) + 0.2
    nshape = normalized_shape(shape, axis)
    w = 1 + 0.5 * rng.standard_normal(nshape)
    b = rng.standard_normal(nshape)
    c, d = rng.standard_normal(shape), rng.standard_normal(shape)

    def loss():
        y, s = fastln.add_layer_norm(x, r, w, b, axis=axis)
        return float(np.sum(y * c) + np.sum(s * d))

    y, s, mean, rstd = fastln.add_layer_norm(x, r, w, b, axis=axis, return_stats=True)
    ds, dw, db = fastln.layer_norm_backward(c, s, mean, rstd, w, axis=axis)
    grad = ds + d
    fd_close(grad, num_grad(loss, x), "dx")
    fd_close(grad, num_grad(loss, r), "dresidual")
    fd_close(dw, num_grad(loss, w), "dweight")
    fd_close(db, num_grad(loss, b), "dbias")
