"""Hazards found in review: small thread stacks, out= sharing memory with other
arguments, thread-count state, the private row wrappers, extreme magnitudes."""
import threading

import numpy as np
import pytest

import fastln
from fastln import _rows
from fastln import reference as ref


def test_backward_on_a_thread_with_a_small_stack():
    x = np.random.default_rng(0).random((64, 768)).astype(np.float32)
    _, m, r = fastln.layer_norm(x, return_stats=True)
    result = {}

    def work():
        result["dx"] = fastln.layer_norm_backward(np.ones_like(x), x, m, r)[0]
        result["y"] = fastln.add_layer_norm(x, x)[0]

    old = threading.stack_size(128 << 10)
    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    want = ref.layer_norm_backward(np.ones_like(x), x, m, r)[0]
    np.testing.assert_allclose(result["dx"], want, atol=2e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_overlapping_weight(dtype):
    buf = (np.random.default_rng(1).standard_normal((4, 8)) + 2).astype(dtype)
    x0, w0 = buf.copy(), buf[0].copy()
    y = fastln.layer_norm(buf, buf[0], buf[1], out=buf)
    assert y is buf
    np.testing.assert_allclose(y, ref.layer_norm(x0, w0, x0[1]), atol=1e-5)


def test_out_overlapping_rstd_in_backward():
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    _, m, r = fastln.layer_norm(x, return_stats=True)
    o = np.zeros((8, 8))
    o[0] = r
    dx = fastln.layer_norm_backward(dy, x, m, o[0], out=o)[0]
    np.testing.assert_allclose(dx, ref.layer_norm_backward(dy, x, m, r)[0], atol=1e-12)
    o = np.zeros((8, 8))
    o[0] = r
    dx = fastln.rms_norm_backward(dy, x, o[0], out=o)[0]
    np.testing.assert_allclose(dx, ref.rms_norm_backward(dy, x, r)[0], atol=1e-12)


def test_add_layer_norm_overlapping_outputs_raise():
    rng = np.random.default_rng(3)
    x, r = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    buf = np.zeros((5, 8))
    with pytest.raises(ValueError, match="out"):
        fastln.add_layer_norm(x, r, out=(buf[1:], buf[:-1]))


def test_threads_inside_threadpool_limits_leave_no_trace():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not fastln.has_openmp():
        pytest.skip("built without OpenMP")
    before = fastln.get_num_threads()
    with threadpoolctl.threadpool_limits(1, "openmp"):
        with fastln.threads(2):
            assert fastln.get_num_threads() == 1
    with fastln.threads(2):
        assert fastln.get_num_threads() == 2
    assert fastln.get_num_threads() == before


def test_private_row_wrappers_check_their_arguments():
    x = np.ones((4, 8), np.float32)
    ro = np.frombuffer(bytes(128), np.float32).reshape(4, 8)
    bad = [
        lambda: _rows.norm_rows(False, x, None, None, 1e-5, None, None, None),
        lambda: _rows.norm_rows(False, [[1.0, 2.0]], None, None, 1e-5, None, None, None),
        lambda: _rows.norm_rows(False, x, None, None, 1e-5, ro, None, None),
        lambda: _rows.norm_rows(False, x, None, None, 1e-5, np.empty((4, 7), np.float32),
                                None, None),
        lambda: _rows.norm_rows(True, x, None, x[0], 1e-5, x.copy(), None, None),
        lambda: _rows.norm_backward_rows(False, x, x, None, np.ones(4, np.float32), None,
                                         x.copy(), np.ones(8, np.float32), None),
        lambda: _rows.norm_backward_rows(True, x, x, None, None, None, x.copy(),
                                         np.ones(8, np.float32), None),
    ]
    for call in bad:
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("row", [
    [1e20, -1e20, 0, 5e19],       # float32 squares overflow
    [3e38, -3e38, 1, 2],          # x - x[0] overflows
    [1e-30, -1e-30, 2e-30, 5e-31],  # float32 squares underflow
])
def test_float32_extreme_magnitudes(isa, row):
    # six rows: a group of four and a rest of two, the hazard in each
    x = np.array([row, [1.0, 2.0, 3.0, 4.0], row, [5, 6, 7, 9], [1, 1, 1, 2], row], np.float32)
    for eps in (0.0, 1e-5):
        np.testing.assert_allclose(fastln.layer_norm(x, eps=eps), ref.layer_norm(x, eps=eps),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fastln.rms_norm(x, eps=eps), ref.rms_norm(x, eps=eps),
                                   rtol=1e-5, atol=1e-6)


def test_constant_and_zero_rows_stay_exact(isa):
    x = np.zeros((3, 64), np.float32)
    x[1] = 7.25
    b = np.random.default_rng(4).standard_normal(64).astype(np.float32)
    np.testing.assert_array_equal(fastln.layer_norm(x, None, b), np.broadcast_to(b, x.shape))
    np.testing.assert_array_equal(fastln.rms_norm(x[[0]]), np.zeros((1, 64), np.float32))


@pytest.mark.parametrize("eps", ["1e-5", True, None])
def test_eps_must_be_a_real_number(eps):
    with pytest.raises(TypeError, match="eps"):
        fastln.layer_norm(np.ones((2, 3)), eps=eps)


def test_huge_axis_is_a_clean_error(capfd):
    with pytest.raises(ValueError, match="axis"):
        fastln.layer_norm(np.ones((2, 3)), axis=2 ** 70)
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_streaming_size(isa, dtype):
    """dx of 8 MiB or more is written with streaming stores; odd H exercises
    the unaligned head and tail of each row."""
    rng = np.random.default_rng(5)
    shape = (2100, 1030) if dtype == np.float32 else (1050, 1030)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = (1 + 0.3 * rng.standard_normal(shape[1])).astype(dtype)
    _, m, r = fastln.layer_norm(x, w, return_stats=True)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    got, want = fastln.layer_norm_backward(dy, x, m, r, w), ref.layer_norm_backward(dy, x, m, r, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, atol=tol * max(1.0, np.abs(e).max()))
    got, want = fastln.rms_norm_backward(dy, x, r, w), ref.rms_norm_backward(dy, x, r, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, atol=tol * max(1.0, np.abs(e).max()))


@pytest.mark.parametrize("H", [129, 251, 256])
def test_backward_streaming_mid_rows(isa, H):
    """Streamed float32 backward of rows of 129-256 elements (LayerNorm takes
    the grouped row kernel there, RMSNorm the one-row sweep): against the
    reference, and bitwise the same on 1 and 2 threads."""
    rng = np.random.default_rng(H)
    shape = ((9 << 20) // (4 * H) + 37, H)   # dx of 9 MiB: streaming stores
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    w = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    _, m, r = fastln.layer_norm(x, w, return_stats=True)
    want = ref.layer_norm_backward(dy, x, m, r, w)
    runs = []
    for threads in (1, 2):
        with fastln.threads(threads):
            runs.append(fastln.layer_norm_backward(dy, x, m, r, w))
    for g, e in zip(runs[0], want):
        np.testing.assert_allclose(g, e, atol=2e-5 * max(1.0, np.abs(e).max()))
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()
    got, want = fastln.rms_norm_backward(dy, x, r, w), ref.rms_norm_backward(dy, x, r, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, atol=2e-5 * max(1.0, np.abs(e).max()))


@pytest.mark.parametrize("H", [257, 777, 1024])
def test_streamed_long_rows_staged(isa, H):
    """Streamed float32 rows of 257-1024 elements go through an L1 staging row
    on AVX-512 (the forwards; the backward below 1024): the same bits as calls
    too small to stream, on 1 and 2 threads, in place too."""
    rng = np.random.default_rng(H)
    N = (17 << 20) // (4 * H) + 3            # outputs of 17 MiB: streamed
    x = rng.standard_normal((N, H)).astype(np.float32) * 3 + 1
    dy = rng.standard_normal((N, H)).astype(np.float32)
    w = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32)
    small = (4 << 20) // (4 * H)             # dx of 4 MiB: not streamed, not hot
    for threads in (1, 2):
        with fastln.threads(threads):
            y, m, r = fastln.layer_norm(x, w, b, return_stats=True)
            ry, rr = fastln.rms_norm(x, w, return_stats=True)
            dx = fastln.layer_norm_backward(dy, x, m, r, w)[0]
            rdx = fastln.rms_norm_backward(dy, x, rr, w)[0]
            for a in (0, N - small):
                z = a + small
                ya, ma, ra = fastln.layer_norm(x[a:z], w, b, return_stats=True)
                assert ya.tobytes() == y[a:z].tobytes()
                assert ra.tobytes() == r[a:z].tobytes()
                rya, rra = fastln.rms_norm(x[a:z], w, return_stats=True)
                assert rya.tobytes() == ry[a:z].tobytes()
                da = fastln.layer_norm_backward(dy[a:z], x[a:z], ma, ra, w)[0]
                assert da.tobytes() == dx[a:z].tobytes()
                da = fastln.rms_norm_backward(dy[a:z], x[a:z], rra, w)[0]
                assert da.tobytes() == rdx[a:z].tobytes()
    np.testing.assert_allclose(y[-50:], ref.layer_norm(x[-50:], w, b), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ry[:50], ref.rms_norm(x[:50], w), atol=2e-5, rtol=1e-5)
    want = ref.layer_norm_backward(dy[:50], x[:50], m[:50], r[:50], w)[0]
    np.testing.assert_allclose(dx[:50], want, atol=2e-5 * max(1.0, np.abs(want).max()))
    xi = x.copy()
    assert fastln.layer_norm(xi, w, b, out=xi) is xi
    assert xi.tobytes() == y.tobytes()
    dyi = dy.copy()
    assert fastln.layer_norm_backward(dyi, x, m, r, w, out=dyi)[0] is dyi
    assert dyi.tobytes() == dx.tobytes()


def _child_layer_norm(x, q):
    q.put((fastln.get_num_threads(), fastln.layer_norm(x).tobytes()))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_forked_child_after_openmp_use_does_not_hang():
    """libgomp's pool does not survive fork: a child must run serially, not hang."""
    import multiprocessing as mp
    x = np.random.default_rng(6).random((4096, 256)).astype(np.float32)
    with fastln.threads(2):
        y = fastln.layer_norm(x)          # the parent starts its OpenMP pool
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child_layer_norm, args=(x, q))
        p.start()
        try:
            nthreads, yc = q.get(timeout=60)   # before join: the child flushes its queue
        except Exception:
            nthreads = yc = None
        p.join(10)
        hung = p.is_alive()
        if hung:
            p.kill()
    assert not hung and yc is not None, "forked child hung in an OpenMP region"
    assert p.exitcode == 0
    assert nthreads == 1
    assert yc == y.tobytes()


@pytest.mark.parametrize("nt", [False, True], ids=["memcpy", "non-temporal"])
@pytest.mark.parametrize("nbytes, offset", [(0, 0), (3, 1), (63, 5), (4096 + 17, 3),
                                            (3 << 20, 0), ((3 << 20) + 7, 9)])
def test_parallel_copy(restore_threads, nt, nbytes, offset):
    """The benchmarks' copy ceiling copies every byte, at odd sizes and
    misaligned starts, on 1 and 2 threads, and checks its arguments."""
    src = np.frombuffer(np.random.default_rng(nbytes).bytes(nbytes + offset), np.uint8)[offset:]
    for n in (1, 2):
        fastln.set_num_threads(n)
        buf = np.zeros(nbytes + offset, np.uint8)
        dst = buf[offset:]
        fastln._lib._parallel_copy(dst, src, nt=nt)
        assert np.array_equal(dst, src)
        assert not buf[:offset].any()
    with pytest.raises(ValueError):
        fastln._lib._parallel_copy(np.zeros(nbytes + 1, np.uint8), src, nt=nt)
