"""Short rows: the AVX-512 float32 kernels normalize sixteen rows at once
(src_c/norm/avx512/rows16_*.c; the forwards, add + LayerNorm included, up to H = 256,
the backwards up to 128; the LayerNorm and RMSNorm forwards take rows of up
to 16, and unstreamed rows of 17-32, as two groups of sixteen). Checked on
every ISA path against the float64 reference, at group tails and odd H; and
since a group short of sixteen rows repeats its last row, each row's result
must not depend on its neighbours: a row computed inside a batch equals the
same row computed alone, bitwise, also next to rows that take the one-row
fallback (huge, tiny, constant, inf, NaN)."""
import ml_dtypes
import numpy as np
import pytest

import fastln
from fastln import reference as ref

F32 = np.float32

HS = [1, 5, 15, 16, 17, 31, 48, 64, 100, 127, 128, 129, 144, 200, 255, 256, 257]
NS = [1, 15, 16, 17, 33, 200]


def _data(N, H, seed=0):
    rng = np.random.default_rng(seed + 1000 * H + N)
    x = (rng.standard_normal((N, H)) * 2 + 3).astype(F32)
    return x, rng.standard_normal((N, H)).astype(F32), \
        (1 + 0.3 * rng.standard_normal(H)).astype(F32), rng.standard_normal(H).astype(F32)


def _close(got, want, scale=None):
    want = np.asarray(want, np.float64)
    s = max(1.0, float(np.abs(want).max())) if scale is None else scale
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5 * s)


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("H", HS)
def test_short_rows_against_reference(isa, N, H):
    x, dy, w, b = _data(N, H)
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    ry, rmean, rrstd = ref.layer_norm(x, w, b, return_stats=True)
    _close(y, ry)
    _close(mean, rmean)
    _close(rstd, rrstd)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    rdx, rdw, rdb = ref.layer_norm_backward(dy, x, rmean, rrstd, w)
    # dx = rstd * (dy*w - mean(dy*w) - ...): rounding of dy*w, scaled by rstd
    # (316 at H = 1, where x - mean is 0 and eps alone sets rstd)
    _close(dx, rdx, max(1.0, float(np.abs(rdx).max()), float(rrstd.max() * np.abs(dy * w).max())))
    _close(dw, rdw)
    _close(db, rdb)
    y2, r2 = fastln.rms_norm(x, w, return_stats=True)
    ry2, rr2 = ref.rms_norm(x, w, return_stats=True)
    _close(y2, ry2)
    _close(r2, rr2)
    dx2, dw2 = fastln.rms_norm_backward(dy, x, r2, w)
    rdx2, rdw2 = ref.rms_norm_backward(dy, x, rr2, w)
    _close(dx2, rdx2)
    _close(dw2, rdw2)
    got = fastln.add_layer_norm(x, dy, w, b, return_stats=True)
    for g, e in zip(got, ref.add_layer_norm(x, dy, w, b, return_stats=True)):
        _close(g, e)


def _odd_rows(H):
    """Normal rows with, among them, rows that take the one-row fallback."""
    x, dy, w, b = _data(40, H, seed=7)
    x[3] *= 1e17          # variance past 1e30: the double fallback
    x[5] = 2.5            # constant: variance 0
    x[9] *= 1e-18         # variance below 1e-30
    x[12, 0] = np.inf
    x[20, -1] = np.nan
    x[21] = 1e37          # sums overflow float
    dy[30] *= 1e30        # backward sums past FLT_MAX
    return x, dy, w, b


@pytest.mark.parametrize("H", [1, 16, 17, 64, 128, 137, 200, 256])
def test_each_row_as_if_alone(isa, H):
    x, dy, w, b = _odd_rows(H)
    with np.errstate(all="ignore"):
        y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
        dx, _, _ = fastln.layer_norm_backward(dy, x, mean, rstd, w)
        ry, rr = fastln.rms_norm(x, w, return_stats=True)
        rdx, _ = fastln.rms_norm_backward(dy, x, rr, w)
        add = fastln.add_layer_norm(x, dy, w, b, return_stats=True)
        for n in range(len(x)):
            add1 = fastln.add_layer_norm(x[n:n + 1], dy[n:n + 1], w, b, return_stats=True)
            for name, g, e in zip(("y", "s", "mean", "rstd"), add, add1):
                np.testing.assert_array_equal(g[n:n + 1], e, err_msg=f"add {name} of row {n}")
            y1, m1, r1 = fastln.layer_norm(x[n:n + 1], w, b, return_stats=True)
            np.testing.assert_array_equal(y[n:n + 1], y1, err_msg=f"y of row {n}")
            np.testing.assert_array_equal(mean[n:n + 1], m1, err_msg=f"mean of row {n}")
            np.testing.assert_array_equal(rstd[n:n + 1], r1, err_msg=f"rstd of row {n}")
            d1, _, _ = fastln.layer_norm_backward(dy[n:n + 1], x[n:n + 1], m1, r1, w)
            np.testing.assert_array_equal(dx[n:n + 1], d1, err_msg=f"dx of row {n}")
            y2, r2 = fastln.rms_norm(x[n:n + 1], w, return_stats=True)
            np.testing.assert_array_equal(ry[n:n + 1], y2, err_msg=f"rms y of row {n}")
            d2, _ = fastln.rms_norm_backward(dy[n:n + 1], x[n:n + 1], r2, w)
            np.testing.assert_array_equal(rdx[n:n + 1], d2, err_msg=f"rms dx of row {n}")
    # and the fallback rows are right, not merely consistent
    for n in (3, 9, 21):
        _close(y[n], ref.layer_norm(x[n:n + 1], w, b)[0])
        _close(ry[n], ref.rms_norm(x[n:n + 1], w)[0])
    for n in (3, 9, 21, 30):   # add + LayerNorm: s = x + dy, row 30 of variance past 1e30
        for g, e in zip(add, ref.add_layer_norm(x[n:n + 1], dy[n:n + 1], w, b,
                                                return_stats=True)):
            _close(g[n:n + 1], e)
    assert np.all(y[5] == b)
    _close(ry[5], ref.rms_norm(x[5:6], w)[0])
    assert np.isnan(y[12]).all() and np.isnan(y[20]).all()
    assert np.isnan(ry[20]).all()      # (an inf makes the rest of its RMSNorm row 0)


def test_streamed_short_rows_equal_unstreamed(restore_threads):
    """Past the streaming threshold (16 MiB forward on AVX-512 on 2 threads, 4 MiB for the
    backward of these rows) the rows go through staging blocks and non-temporal stores: the
    same values as unstreamed calls."""
    fastln.set_num_threads(2)         # (on one thread, these forwards stream from 4 MiB)
    N, H = (1 << 19) + 5, 32          # 64 MiB of float32
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, H), dtype=F32)
    w = rng.standard_normal(H, dtype=F32)
    b = rng.standard_normal(H, dtype=F32)
    res = rng.standard_normal((N, H), dtype=F32)
    y, mean, rstd = fastln.layer_norm(x, w, None, return_stats=True)
    yr, rr = fastln.rms_norm(x, w, return_stats=True)
    ya_, sa_, ma_, ra_ = fastln.add_layer_norm(x, res, w, b, return_stats=True)
    cut = np.linspace(0, N, 7).astype(int)   # parts of 11 MB: below the threshold
    for a, z in zip(cut[:-1], cut[1:]):
        got, ma, ra = fastln.layer_norm(x[a:z], w, None, return_stats=True)
        np.testing.assert_array_equal(y[a:z], got)
        np.testing.assert_array_equal(rstd[a:z], ra)
        got, ra = fastln.rms_norm(x[a:z], w, return_stats=True)
        np.testing.assert_array_equal(yr[a:z], got)
        np.testing.assert_array_equal(rr[a:z], ra)
        got = fastln.add_layer_norm(x[a:z], res[a:z], w, b, return_stats=True)
        for g, e in zip(got, (ya_, sa_, ma_, ra_)):
            np.testing.assert_array_equal(e[a:z], g)
    dy = rng.standard_normal((N, H), dtype=F32)
    dx, _, _ = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    part = 30_000                     # 3.8 MB: not streamed (4 MiB is)
    for a in (0, 400_000):
        da, _, _ = fastln.layer_norm_backward(dy[a:a + part], x[a:a + part],
                                              mean[a:a + part], rstd[a:a + part], w)
        np.testing.assert_array_equal(dx[a:a + part], da)
    mid = (5 << 20) // (4 * H)        # dx of 5 MiB: streamed on AVX-512, 8 MiB elsewhere
    da, _, _ = fastln.layer_norm_backward(dy[:mid], x[:mid], mean[:mid], rstd[:mid], w)
    np.testing.assert_array_equal(dx[:mid], da)


@pytest.mark.parametrize("H", [200, 256])
def test_mid_rows_equal_at_any_size(restore_threads, H):
    """Rows of 129-256 go sixteen at a time in the forwards: streamed past 16
    MiB, y prefetched for writing where a thread's rows pass 4 MiB (not
    streamed), neither in small calls. All give the same values, on 1 and 2
    threads."""
    N = (36 << 20) // (4 * H) + 5     # 36 MiB of float32
    x, res, w, b = _data(N, H, seed=5)
    for nt in (1, 2):
        fastln.set_num_threads(nt)
        y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
        yr, rr = fastln.rms_norm(x, w, return_stats=True)
        add = fastln.add_layer_norm(x, res, w, b, return_stats=True)
        for rows in ((12 << 20) // (4 * H), 1000):   # 12 MiB and 1000 rows: not streamed
            for a in (0, N - rows):
                z = a + rows
                ga, ma, ra = fastln.layer_norm(x[a:z], w, b, return_stats=True)
                np.testing.assert_array_equal(y[a:z], ga)
                np.testing.assert_array_equal(mean[a:z], ma)
                np.testing.assert_array_equal(rstd[a:z], ra)
                ga, ra = fastln.rms_norm(x[a:z], w, return_stats=True)
                np.testing.assert_array_equal(yr[a:z], ga)
                np.testing.assert_array_equal(rr[a:z], ra)
                for g, e in zip(fastln.add_layer_norm(x[a:z], res[a:z], w, b,
                                                      return_stats=True), add):
                    np.testing.assert_array_equal(e[a:z], g)
    _close(y[:64], ref.layer_norm(x[:64], w, b))
    _close(yr[-64:], ref.rms_norm(x[-64:], w))


@pytest.mark.parametrize("H", [64, 128, 320])
def test_streamed_rows_at_any_alignment(restore_threads, H):
    """Streamed rows of 4 or more whole vectors (H = 64, 80, ... on AVX-512; for RMSNorm's
    forward up to 1024, for the others up to the sixteen-row kernels' 256 and 128) are
    written from registers by a writer that joins the end of each vector with the start of
    the next into whole 64-byte lines, with ordinary stores for the partial lines at the two
    ends of each thread's rows (the LayerNorm forward's rows of 320 go through a staging
    row). At starts all over a line
    (every one at H = 64), on 1 to 3 threads and in place, every output equals that of calls
    on parts below the streaming thresholds, bitwise, with rows that take the one-row
    fallback (a group then goes through its staging block) among them; the floats on either
    side of the output stay as they were."""
    N = (17 << 20) // (4 * H) + 7          # 17 MiB of float32: streamed forward and backward
    x, res, w, b = _data(N, H, seed=11)
    x[5] *= 1e30                           # float statistics overflow: the one-row fallback
    x[N // 2, 3] = np.inf
    x[N - 2, 0] = np.nan
    dy = _data(N, H, seed=12)[1]
    y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    want = {"ln": y, "rms": fastln.rms_norm(x, w), "add": fastln.add_layer_norm(x, res, w, b),
            "bwd": fastln.layer_norm_backward(dy, x, mean, rstd, w)[0]}
    rr = fastln.rms_norm(x, w, return_stats=True)[1]
    want["rbwd"] = fastln.rms_norm_backward(dy, x, rr, w)[0]
    cut = np.linspace(0, N, 5).astype(int)         # parts of 4.3 MiB: not streamed
    parts = {k: [] for k in want}
    for a, z in zip(cut[:-1], cut[1:]):
        parts["ln"].append(fastln.layer_norm(x[a:z], w, b))
        parts["rms"].append(fastln.rms_norm(x[a:z], w))
        parts["add"].append(fastln.add_layer_norm(x[a:z], res[a:z], w, b))
        parts["bwd"].append(fastln.layer_norm_backward(dy[a:z], x[a:z], mean[a:z], rstd[a:z],
                                                       w)[0])
        parts["rbwd"].append(fastln.rms_norm_backward(dy[a:z], x[a:z], rr[a:z], w)[0])
    for k, p in parts.items():     # the streamed calls above against the parts
        if k == "add":
            for i in range(2):
                assert np.array_equal(want[k][i], np.concatenate([q[i] for q in p]),
                                      equal_nan=True), (k, i)
        else:
            assert np.array_equal(want[k], np.concatenate(p), equal_nan=True), k
    for sl in (slice(0, 64), slice(N - 64, N)):   # and against the float64 references
        _close(want["ln"][sl], ref.layer_norm(x[sl], w, b))
        _close(want["rms"][sl], ref.rms_norm(x[sl], w))
        for g, e in zip(want["add"], ref.add_layer_norm(x[sl], res[sl], w, b)):
            _close(g[sl], e)
        _close(want["bwd"][sl], ref.layer_norm_backward(dy[sl], x[sl], mean[sl], rstd[sl], w)[0])
        _close(want["rbwd"][sl], ref.rms_norm_backward(dy[sl], x[sl], rr[sl], w)[0])

    buf = np.empty(N * H + 32, F32)
    buf2 = np.empty(N * H + 32, F32)

    def at(a, off, fill=None):
        """a view of N rows starting off floats into a (filled with fill)"""
        if fill is not None:
            a[:] = fill
        return a[off:off + N * H].reshape(N, H)

    def untouched(a, off):
        return (a[:off] == -7).all() and (a[off + N * H:] == -7).all()

    offsets = range(16) if H == 64 else (0, 1, 4, 15)
    for nt in (1, 2, 3):
        fastln.set_num_threads(nt)
        for off in offsets if nt == 2 else (0, 4):
            got = {"ln": fastln.layer_norm(x, w, b, out=at(buf, off, -7)),
                   "rms": fastln.rms_norm(x, w, out=at(buf2, off, -7))}
            for k, g in got.items():
                assert np.array_equal(g, want[k], equal_nan=True), (k, nt, off)
            assert untouched(buf, off) and untouched(buf2, off), (nt, off)
            ya, sa = fastln.add_layer_norm(x, res, w, b, out=(at(buf, off, -7),
                                                              at(buf2, off, -7)))
            assert np.array_equal(ya, want["add"][0], equal_nan=True), ("add", nt, off)
            assert np.array_equal(sa, want["add"][1], equal_nan=True), ("add s", nt, off)
            assert untouched(buf, off) and untouched(buf2, off), (nt, off)
            dx = fastln.layer_norm_backward(dy, x, mean, rstd, w, out=at(buf, off, -7))[0]
            assert np.array_equal(dx, want["bwd"], equal_nan=True), ("bwd", nt, off)
            assert untouched(buf, off), (nt, off)
            dx = fastln.rms_norm_backward(dy, x, rr, w, out=at(buf, off, -7))[0]
            assert np.array_equal(dx, want["rbwd"], equal_nan=True), ("rbwd", nt, off)
            # in place: y over x, dx over dy
            xi = at(buf, off, -7)
            xi[:] = x
            assert np.array_equal(fastln.layer_norm(xi, w, b, out=xi), want["ln"],
                                  equal_nan=True), ("ln in place", nt, off)
            gi = at(buf2, off, -7)
            gi[:] = dy
            dx = fastln.layer_norm_backward(gi, x, mean, rstd, w, out=gi)[0]
            assert np.array_equal(dx, want["bwd"], equal_nan=True), ("bwd in place", nt, off)
            assert untouched(buf, off) and untouched(buf2, off), (nt, off)


@pytest.mark.parametrize("dt", [F32, np.float16, np.dtype(ml_dtypes.bfloat16)], ids=str)
@pytest.mark.parametrize("H", [16, 17, 64, 128])
@pytest.mark.parametrize("N", [5, 16, 37])
def test_short_backward_in_place_and_group_tails(isa, dt, H, N):
    """The sixteen-row backward reads a group's rows one after another; a last
    group of fewer than sixteen goes through copies (src_c/norm/avx512/rows16_bwd.c,
    group_rows16), its dx staged. Over x or dy in place, and with rows ahead
    and behind that must stay untouched, dx, dweight and dbias equal the
    out-of-place ones bitwise; and they are close to the float64 reference."""
    x, dy, w, _ = _data(N, H)
    x, dy = x.astype(dt), dy.astype(dt)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    _, rr = fastln.rms_norm(x, w, return_stats=True)
    want = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    rwant = fastln.rms_norm_backward(dy, x, rr, w)
    assert want[0].dtype == dt and rwant[0].dtype == dt
    rdx = ref.layer_norm_backward(dy.astype(np.float64), x.astype(np.float64), mean, rstd,
                                  w.astype(np.float64))[0]
    tol = 2e-5 if dt == F32 else 2e-2
    np.testing.assert_allclose(want[0].astype(np.float64), rdx, rtol=tol,
                               atol=tol * max(1.0, float(np.abs(rdx).max())))
    for over in ("x", "dy"):
        buf = np.full((N + 2, H), -7, dt)
        view = buf[1:N + 1]
        view[:] = x if over == "x" else dy
        xa, ga = (view, dy) if over == "x" else (x, view)
        got = fastln.layer_norm_backward(ga, xa, mean, rstd, w, out=view)
        assert got[0] is view
        for g, e in zip(got, want):
            np.testing.assert_array_equal(g, e, err_msg=f"LayerNorm, dx over {over}")
        view[:] = x if over == "x" else dy
        got = fastln.rms_norm_backward(ga, xa, rr, w, out=view)
        for g, e in zip(got, rwant):
            np.testing.assert_array_equal(g, e, err_msg=f"RMSNorm, dx over {over}")
        assert (buf[0] == -7).all() and (buf[N + 1] == -7).all()


@pytest.mark.parametrize("dt", [F32, np.dtype(ml_dtypes.bfloat16)], ids=str)
@pytest.mark.parametrize("H", [16, 17, 64, 128])
def test_short_backward_overflowing_rows(isa, dt, H):
    """Rows whose backward sums overflow float take the one-row scalars in
    double (src_c/norm/avx512/rows16_bwd.c, bwd_group16 walks the bits of those rows):
    two in one group of sixteen, and the last row of a group of five, whose
    spare rows repeat it. Each such row's dx equals the row computed alone,
    bitwise, and every row is close to the float64 reference, for LayerNorm
    and RMSNorm."""
    N, big = 37, (2, 9, 36)
    x, dy, w, _ = _data(N, H)
    x[list(big)] *= 1e19                   # g * x about 1e39: past float in every product
    dy[list(big)] *= 1e20
    x, dy = x.astype(dt), dy.astype(dt)
    x64, dy64, w64 = x.astype(np.float64), dy.astype(np.float64), w.astype(np.float64)
    _, mean, rstd = fastln.layer_norm(x, w, return_stats=True)
    _, rr = fastln.rms_norm(x, w, return_stats=True)
    dx = fastln.layer_norm_backward(dy, x, mean, rstd, w)[0]
    rdx = fastln.rms_norm_backward(dy, x, rr, w)[0]
    want = ref.layer_norm_backward(dy64, x64, mean, rstd, w64)[0]
    rwant = ref.rms_norm_backward(dy64, x64, rr, w64)[0]
    tol = 2e-5 if dt == F32 else 2e-2
    for got, exp in ((dx, want), (rdx, rwant)):
        for n in range(N):
            s = max(1.0, float(np.abs(exp[n]).max()))
            np.testing.assert_allclose(got[n].astype(np.float64), exp[n], rtol=tol,
                                       atol=tol * s, err_msg=f"row {n}")
    for n in big:
        sl = slice(n, n + 1)
        one = fastln.layer_norm_backward(dy[sl], x[sl], mean[sl], rstd[sl], w)[0]
        np.testing.assert_array_equal(dx[sl], one, err_msg=f"LayerNorm dx of row {n}")
        one = fastln.rms_norm_backward(dy[sl], x[sl], rr[sl], w)[0]
        np.testing.assert_array_equal(rdx[sl], one, err_msg=f"RMSNorm dx of row {n}")


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("dt,H", [(F32, 16), (F32, 64), (F32, 128), (F32, 256),
                                  (np.float16, 64), (np.dtype(ml_dtypes.bfloat16), 256)],
                         ids=str)
def test_short_rows_stream_from_4_mib(restore_threads, nt, dt, H):
    """The AVX-512 LayerNorm and RMSNorm forwards of rows of up to 512 bytes stream
    from 4 MiB out in 16-bit storage, and in float32 on one thread (add + LayerNorm: 8 MiB
    of s and y; src_c/runtime/policy.h, FASTLN_STREAM_SHORT_L3); longer rows from 8 MiB on
    one thread (test below) and from 16 MiB on two (add + LayerNorm 32). A call of 5 MiB
    out equals its two halves (2.5 MiB, never streamed), bitwise, and the float64
    reference on its first and last rows."""
    _check_stream_split(nt, dt, H, 5)


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("dt,H", [(F32, 320), (F32, 1024), (F32, 4096), (np.float16, 1024),
                                  (np.dtype(ml_dtypes.bfloat16), 320),
                                  (np.dtype(ml_dtypes.bfloat16), 4096)], ids=str)
def test_long_rows_stream_from_8_mib_on_one_thread(restore_threads, nt, dt, H):
    """Rows longer than 512 bytes, float32 or 16-bit, stream from 8 MiB out on one thread
    on AVX-512 (add + LayerNorm: 16 MiB of s and y; src_c/runtime/policy.h,
    FASTLN_STREAM_1T_L3), from 16 MiB on two. A call of 9 MiB out equals its halves
    (4.5 MiB, not streamed), bitwise, and the float64 reference on its first and last
    rows."""
    _check_stream_split(nt, dt, H, 9)


def _check_stream_split(nt, dt, H, mib):
    """LayerNorm, RMSNorm and add + LayerNorm of rows of H on nt threads, mib MiB out
    (and 3 rows), against the same calls on the two halves of the rows (bitwise) and
    the float64 reference on the first and last 32 rows."""
    fastln.set_num_threads(nt)
    dt = np.dtype(dt)
    N = (mib << 20) // (dt.itemsize * H) + 3
    x, _, w, b = _data(N, H, seed=4)
    x = x.astype(dt)
    half = N // 2
    res = _data(N, H, seed=5)[0].astype(dt)
    tol = 2e-5 if dt == F32 else 1e-2
    for f, args in ((fastln.layer_norm, (x, w, b)), (fastln.rms_norm, (x, w)),
                    (fastln.add_layer_norm, (x, res, w, b))):
        out = f(*args)
        outs = out if isinstance(out, tuple) else (out,)
        lo = f(*(a[:half] if a.ndim == 2 else a for a in args))
        hi = f(*(a[half:] if a.ndim == 2 else a for a in args))
        for k, o in enumerate(outs):
            parts = np.concatenate([lo[k], hi[k]] if isinstance(lo, tuple) else [lo, hi])
            np.testing.assert_array_equal(o, parts, err_msg=f"{f.__name__} output {k}")
        r = getattr(ref, f.__name__)
        for sl in (slice(0, 32), slice(N - 32, N)):
            want = r(*(a[sl].astype(np.float64) if a.ndim == 2 else a for a in args))
            for o, e in zip(outs, want if isinstance(want, tuple) else (want,)):
                np.testing.assert_allclose(o[sl].astype(np.float64), e, rtol=tol,
                                           atol=tol * max(1.0, float(np.abs(e).max())))
