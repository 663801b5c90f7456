"""float16 and bfloat16 storage: the kernels read and write 16-bit values and
compute in float32 (src_c/norm/half.h, and the AVX-512 kernels of src_c/norm/avx512/).

The float32 kernels on the widened input, rounded to nearest even by NumPy
(float16) or ml_dtypes (bfloat16), are the yardstick: every result must equal
them bitwise, on every ISA path (AVX-512 and F16C conversions, the integer
bfloat16 rounding, the portable C of the generic path), also for outputs that
are subnormal, infinite or NaN in the 16-bit type, at any thread count and
when large outputs are streamed."""
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import F16, F32

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = [np.dtype(F16), BF16]
IDS = ["f16", "bf16"]


def _same(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    g, w = got.view(np.uint16), want.view(np.uint16)
    if np.array_equal(g, w):            # the same bits: NaNs included, nothing more to check
        return
    nan = np.isnan(want.astype(F32))
    assert np.array_equal(np.isnan(got.astype(F32)), nan), what
    np.testing.assert_array_equal(g[~nan], w[~nan], err_msg=what)


def _inputs(dt, N, H, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((N, H)) * 3 + 1).astype(dt)
    dy = rng.standard_normal((N, H)).astype(dt)
    res = rng.standard_normal((N, H)).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    return x, dy, res, w, b


def _all_results(x, dy, res, w, b):
    """Every output of the five functions (x, dy, res in one dtype)."""
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    ry, rr = fastln.rms_norm(x, w, return_stats=True)
    rdx, rdw = fastln.rms_norm_backward(dy, x, rr, w)
    ay, s, am, ar = fastln.add_layer_norm(x, res, w, b, return_stats=True)
    return dict(y=y, mean=mean, rstd=rstd, dx=dx, dw=dw, db=db, ry=ry, rr=rr, rdx=rdx, rdw=rdw,
                ay=ay, s=s, am=am, ar=ar)


def _check_all(x, dy, res, w, b):
    dt = x.dtype
    got = _all_results(x, dy, res, w, b)
    want = _all_results(x.astype(F32), dy.astype(F32), res.astype(F32), w, b)
    for k, v in want.items():
        if v.shape == x.shape:          # a 16-bit result: float32's, rounded once
            with np.errstate(over="ignore"):
                _same(got[k], v.astype(dt), k)
        else:                           # stats and parameter gradients: float32
            assert got[k].dtype == F32, k
            np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("dt", HALVES, ids=IDS)
@pytest.mark.parametrize("N, H", [(1, 1), (7, 5), (33, 16), (40, 100), (33, 200), (17, 256),
                                  (5, 768), (300, 64), (3, 9000), (1037, 48), (700, 128),
                                  (2000, 16)])
def test_equals_float32_rounded(isa, dt, N, H):
    _check_all(*_inputs(dt, N, H))


@pytest.mark.parametrize("H", [40, 300])
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_special_values(isa, dt, H):
    """Subnormal, overflowing and NaN outputs round as NumPy/ml_dtypes round: in rows of
    40 (sixteen or thirty-two rows at a time on AVX-512) and of 300 (one row at a time,
    whose bfloat16 stores on AVX512-BF16 store a row with a subnormal again). Subnormal
    y, s and dx, in every lane of a row or in some."""
    x, dy, res, w, b = _inputs(dt, 50, H, seed=1)
    info = np.finfo(F16) if dt == F16 else ml_dtypes.finfo(dt)
    tiny = float(info.smallest_normal)
    w_small = (np.linspace(0.01, 3, H) * tiny).astype(F32)          # subnormal outputs
    w_big = np.full(H, float(info.max) / 2, F32)                     # outputs overflow to inf
    some = np.arange(H) % 7 == 3                                     # subnormal in a few lanes
    w_some, b_some = np.where(some, w_small, w), np.where(some, 0.5 * w_small, b).astype(F32)
    x[3, 5] = np.nan
    x[7, :] = np.inf * (1 - 2 * (np.arange(H) % 2))
    x[9, :] = 0
    x[25, :] = 0                       # the 16-bit forwards' second sixteen rows of 32
    x[41, 2] = np.nan                  # and their second group
    for weight, bias in ((w, b), (w_small, b), (w_small, 0.5 * w_small), (w_some, b_some),
                         (w_big, b)):
        _check_all(x, dy, res, weight, bias)
    # s = x + res subnormal: inputs of a few units of the smallest normal
    xt = (x.astype(F32) * (4 * tiny)).astype(dt)
    rt = (res.astype(F32) * (-3 * tiny)).astype(dt)
    _check_all(xt, dy, rt, w, b)


@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_any_thread_count(restore_threads, dt):
    x, dy, res, w, b = _inputs(dt, 3000, 96, seed=2)
    results = []
    for n in (1, 2, 3):
        fastln.set_num_threads(n)
        results.append(_all_results(x, dy, res, w, b))
    for other in results[1:]:
        for k in results[0]:
            np.testing.assert_array_equal(results[0][k].view(np.uint8), other[k].view(np.uint8),
                                          err_msg=k)


STREAMED_HS = [64, 200, 768, 1037]


@pytest.fixture(scope="module")
def streamed_pool():
    """x, dy and res of test_streamed_outputs: flat arrays of 2**25 values and a few
    rows more, made once per dtype (making them is most of the test's time); each H
    takes its rows from their start."""
    pools = {}
    size = max(((1 << 25) // H + 3) * H for H in STREAMED_HS)

    def get(dt):
        if dt not in pools:
            rng = np.random.default_rng(3)
            pools[dt] = [(rng.standard_normal(size, dtype=F32) * scale + shift).astype(dt)
                         for scale, shift in ((3, 1), (1, 0), (1, 0))]
        return pools[dt]

    yield get
    pools.clear()


@pytest.mark.parametrize("H", STREAMED_HS)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_streamed_outputs(streamed_pool, dt, H):
    """Outputs past the streaming thresholds (forward 16 MiB on AVX-512, else 32;
    backward 8 MiB); with H = 1037 the rows start at every alignment of the 64-byte
    stores, H = 200 takes the sixteen-row forwards on AVX-512 and H = 64 the sixteen-row
    backward (converted in registers)."""
    N = (1 << 25) // H + 3             # over 32 MiB of 16-bit values (add: s and y)
    x, dy, res = (a[:N * H].reshape(N, H) for a in streamed_pool(dt))
    rng = np.random.default_rng(H)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    dx, _, _ = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    ry, rr = fastln.rms_norm(x, w, return_stats=True)
    ay, s = fastln.add_layer_norm(x, res, w, b)
    for a, z in ((0, 5000), (N - 5000, N)):   # small calls: not streamed
        ya, ma, ra = fastln.layer_norm(x[a:z], w, b, return_stats=True)
        _same(y[a:z], ya, "y")
        np.testing.assert_array_equal(rstd[a:z], ra)
        da, _, _ = fastln.layer_norm_backward(dy[a:z], x[a:z], ma, ra, w)
        _same(dx[a:z], da, "dx")
        rya, rra = fastln.rms_norm(x[a:z], w, return_stats=True)
        _same(ry[a:z], rya, "rms y")
        np.testing.assert_array_equal(rr[a:z], rra)
        aya, sa = fastln.add_layer_norm(x[a:z], res[a:z], w, b)
        _same(ay[a:z], aya, "add y")
        _same(s[a:z], sa, "add s")


@pytest.mark.parametrize("H", [32, 64, 256])
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_streamed_rows_at_any_alignment(restore_threads, dt, H):
    """Streamed LayerNorm, RMSNorm and add + LayerNorm rows of an even number of vectors
    (AVX-512: H = 32, 64, ... 256; streamed from 4 MiB out, add + LayerNorm 8 MiB of y and
    s, src_c/runtime/policy.h) are narrowed two vectors at a time and written by the
    writer of whole 64-byte lines (src_c/isa/simd.h, ntw; add + LayerNorm: one for y,
    one for s), with ordinary stores for the partial lines at the two ends of each
    thread's rows; outputs that start at an odd 2-byte step take plain stores. At starts
    all over a line (every one at H = 64), on 1 to 3 threads and in place, with rows that
    take the one-row fallback (a constant row, inf, NaN), the outputs are float32's on the
    widened input, rounded, bitwise (that yardstick within one unit in the last place of the
    float64 references on the first and last 64 rows), and the values on either side stay as
    they were."""
    N = (5 << 20) // (2 * H) + 7           # 5 MiB out (add + LayerNorm: 10): streamed
    x, _, res, w, b = _inputs(dt, N, H, seed=5)
    x[5] = 1                               # variance 0: the one-row fallback
    res[5] = 0
    x[N // 2, 3] = np.inf
    x[N - 2, 0] = np.nan
    xf, rf = x.astype(F32), res.astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = {"ln": fastln.layer_norm(xf, w, b).astype(dt),
                "rms": fastln.rms_norm(xf, w).astype(dt)}
        want["add"], want["add s"] = (a.astype(dt) for a in fastln.add_layer_norm(xf, rf, w, b))
    ulp = float(ml_dtypes.finfo(dt).eps)
    for sl in (slice(0, 64), slice(N - 64, N)):    # the yardstick against the float64 references
        x64, r64 = xf[sl].astype(np.float64), rf[sl].astype(np.float64)
        with np.errstate(invalid="ignore"):
            refs = {"ln": ref.layer_norm(x64, w, b),
                    "rms": ref.rms_norm(x64, w)}
            refs["add"], refs["add s"] = ref.add_layer_norm(x64, r64, w, b)
        for k, e in refs.items():
            scale = max(1.0, float(np.nanmax(np.abs(e[np.isfinite(e)]))))
            np.testing.assert_allclose(want[k][sl].astype(np.float64), e, rtol=ulp,
                                       atol=ulp * scale, equal_nan=True, err_msg=k)
    bufs = np.empty((2, N * H + 64), dt)
    fill = np.array(-7, dt)

    def at(off, i=0):
        bufs[i] = fill
        return bufs[i, off:off + N * H].reshape(N, H)

    def untouched(off):
        return (bufs[:, :off] == fill).all() and (bufs[:, off + N * H:] == fill).all()

    for nt in (1, 2, 3):
        fastln.set_num_threads(nt)
        for off in (range(32) if H == 64 else (0, 1, 8, 31)) if nt == 2 else (0, 8, 9):
            at(off, 1)
            _same(fastln.layer_norm(x, w, b, out=at(off)), want["ln"], ("ln", nt, off))
            assert untouched(off), ("ln", nt, off)
            _same(fastln.rms_norm(x, w, out=at(off)), want["rms"], ("rms", nt, off))
            assert untouched(off), ("rms", nt, off)
            ay, s = fastln.add_layer_norm(x, res, w, b, out=(at(off), at(off, 1)))
            _same(ay, want["add"], ("add", nt, off))
            _same(s, want["add s"], ("add s", nt, off))
            assert untouched(off), ("add", nt, off)
        xi, ri = at(8), at(8, 1)            # in place
        xi[:] = x
        _same(fastln.layer_norm(xi, w, b, out=xi), want["ln"], ("ln in place", nt))
        xi[:] = x
        _same(fastln.rms_norm(xi, w, out=xi), want["rms"], ("rms in place", nt))
        xi[:] = x
        ri[:] = res
        ay, s = fastln.add_layer_norm(xi, ri, w, b, out=(xi, ri))
        _same(ay, want["add"], ("add in place", nt))
        _same(s, want["add s"], ("add s in place", nt))


@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_out_and_layouts(dt):
    x, dy, res, w, b = _inputs(dt, 12, 32, seed=4)
    want = fastln.layer_norm(x, w, b)
    out = np.empty_like(x)
    assert fastln.layer_norm(x, w, b, out=out) is out
    _same(out, want, "out=")
    xc = x.copy()
    fastln.layer_norm(xc, w, b, out=xc)                       # in place
    _same(xc, want, "in place")
    _same(fastln.layer_norm(np.asfortranarray(x), w, b), want, "Fortran order")
    w16 = w.astype(dt)                                        # a 16-bit weight is widened
    _same(fastln.layer_norm(x.T, w16, b, axis=0).T, fastln.layer_norm(x, w16.astype(F32), b),
          "axis 0, 16-bit weight")
    # a float32 dy next to a 16-bit x takes the float32 path: dx is still x's dtype
    _, m, r = fastln.layer_norm(x, w, b, return_stats=True)
    dx, _, _ = fastln.layer_norm_backward(dy.astype(F32), x, m, r, w)
    assert dx.dtype == dt


def test_half_convert_rounds_as_numpy(isa):
    """fastln's float32 <-> float16 converter (the general path's blocks use
    it) gives NumPy's bits: nearest even, subnormals, overflow to inf, inf,
    and NaN kept NaN; widening is exact."""
    from fastln import _lib

    rng = np.random.default_rng(9)
    f = (rng.standard_normal(5003) * 2.0 ** rng.integers(-30, 20, 5003)).astype(np.float32)
    f[:8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 65519.0, 65520.0, 2.0 ** -25]
    f[8:12] = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2.0 ** -24 * 1.5, -2.0 ** -24 * 0.5],
                       np.float32)   # ties to even, subnormal ties
    got = np.empty(f.shape, np.float16)
    _lib._half_convert(f, got)
    with np.errstate(over="ignore"):
        want = f.astype(np.float16)
    finite = ~np.isnan(f)
    assert np.array_equal(got[finite].view(np.uint16), want[finite].view(np.uint16))
    assert np.isnan(got[~finite]).all()
    back = np.empty(f.shape, np.float32)
    _lib._half_convert(want, back)
    assert np.array_equal(back[finite].view(np.uint32),
                          want[finite].astype(np.float32).view(np.uint32))
