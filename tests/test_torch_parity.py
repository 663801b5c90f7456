"""Parity with torch.nn.functional.layer_norm / rms_norm, forward and autograd backward."""
import warnings

import numpy as np
import pytest

import fastln

from _util import F32, F64, FLOAT_DTYPES, assert_close

# (x shape, number of trailing normalized dims)
CASES = [((1, 768), 1), ((32, 768), 1), ((5, 7, 64), 2), ((5, 7, 64), 1), ((3, 4099), 1),
         ((37, 200), 1)]


def _axis(k):
    return -1 if k == 1 else tuple(range(-k, 0))


def _tensor(torch, a, grad=False):
    t = torch.from_numpy(np.ascontiguousarray(a)).clone()
    return t.requires_grad_(grad)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,k", CASES, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layer_norm_forward_backward(torch, dtype, shape, k, affine, rng):
    F = torch.nn.functional
    nshape = shape[len(shape) - k:]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = (1 + 0.5 * rng.standard_normal(nshape)).astype(dtype) if affine else None
    b = rng.standard_normal(nshape).astype(dtype) if affine else None
    eps = 1e-5
    xt = _tensor(torch, x, True)
    wt = _tensor(torch, w, True) if affine else None
    bt = _tensor(torch, b, True) if affine else None
    yt = F.layer_norm(xt, nshape, wt, bt, eps)
    yt.backward(_tensor(torch, dy))

    axis = _axis(k)
    y, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, eps=eps, return_stats=True)
    assert y.dtype == dtype
    assert_close(y, yt.detach().numpy(), dtype, err_msg="y")
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    assert_close(dx, xt.grad.numpy(), dtype, err_msg="dx")
    if affine:
        assert_close(dw, wt.grad.numpy(), dtype, err_msg="dweight")
        assert_close(db, bt.grad.numpy(), dtype, err_msg="dbias")
    else:
        # dweight/dbias are still returned: the grads torch gives an affine LN of ones/zeros
        wt1 = torch.ones(nshape, dtype=xt.dtype, requires_grad=True)
        bt1 = torch.zeros(nshape, dtype=xt.dtype, requires_grad=True)
        F.layer_norm(_tensor(torch, x), nshape, wt1, bt1, eps).backward(_tensor(torch, dy))
        assert_close(dw, wt1.grad.numpy(), dtype, err_msg="dweight")
        assert_close(db, bt1.grad.numpy(), dtype, err_msg="dbias")


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,k", CASES, ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_forward_backward(torch, dtype, shape, k, affine, rng):
    F = torch.nn.functional
    nshape = shape[len(shape) - k:]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = (1 + 0.5 * rng.standard_normal(nshape)).astype(dtype) if affine else None
    eps = 1e-6
    xt = _tensor(torch, x, True)
    wt = _tensor(torch, w, True) if affine else None
    yt = F.rms_norm(xt, nshape, wt, eps)
    yt.backward(_tensor(torch, dy))

    axis = _axis(k)
    y, rstd = fastln.rms_norm(x, w, axis=axis, eps=eps, return_stats=True)
    assert y.dtype == dtype
    assert_close(y, yt.detach().numpy(), dtype, err_msg="y")
    dx, dw = fastln.rms_norm_backward(dy, x, rstd, w, axis=axis)
    assert_close(dx, xt.grad.numpy(), dtype, err_msg="dx")
    if affine:
        assert_close(dw, wt.grad.numpy(), dtype, err_msg="dweight")


def test_layer_norm_backward_streamed_mid_rows_matches_torch(torch, rng):
    """The streamed float32 backward of rows of 129-256 elements (dx of 9 MiB;
    on AVX-512 the grouped row kernel) against torch's autograd."""
    F = torch.nn.functional
    N, H = (9 << 20) // (4 * 251) + 37, 251
    x = rng.standard_normal((N, H)).astype(F32)
    dy = rng.standard_normal((N, H)).astype(F32)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    xt, wt, bt = (_tensor(torch, a, True) for a in (x, w, b))
    F.layer_norm(xt, (H,), wt, bt, 1e-5).backward(_tensor(torch, dy))
    _, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    assert_close(dx, xt.grad.numpy(), F32, err_msg="dx")
    assert_close(dw, wt.grad.numpy(), F32, err_msg="dweight")
    assert_close(db, bt.grad.numpy(), F32, err_msg="dbias")


@pytest.mark.parametrize("H", [64, 320])
def test_streamed_rows_from_registers_match_torch(torch, rng, H):
    """Streamed float32 rows of whole vectors written from registers (simd.h's ntw
    writer: the sixteen-row forwards and backwards at H = 64, RMSNorm's long rows at 320),
    into NumPy arrays of their own (which start 16 bytes into a cache line), against torch's
    forward and autograd."""
    F = torch.nn.functional
    N = (17 << 20) // (4 * H) + 37                   # 17 MiB: streamed forward and backward
    x = rng.standard_normal((N, H)).astype(F32)
    dy = rng.standard_normal((N, H)).astype(F32)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    xt, wt, bt = (_tensor(torch, a, True) for a in (x, w, b))
    yt = F.layer_norm(xt, (H,), wt, bt, 1e-5)
    yt.backward(_tensor(torch, dy))
    y, mean, rstd = fastln.layer_norm(x, w, b, out=np.empty_like(x), return_stats=True)
    assert_close(y, yt.detach().numpy(), F32, err_msg="y")
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, out=np.empty_like(x))
    assert_close(dx, xt.grad.numpy(), F32, err_msg="dx")
    assert_close(dw, wt.grad.numpy(), F32, err_msg="dweight")
    assert_close(db, bt.grad.numpy(), F32, err_msg="dbias")
    xt, wt = (_tensor(torch, a, True) for a in (x, w))
    rt = F.rms_norm(xt, (H,), wt, 1e-6)
    rt.backward(_tensor(torch, dy))
    r, rr = fastln.rms_norm(x, w, out=np.empty_like(x), return_stats=True)
    assert_close(r, rt.detach().numpy(), F32, err_msg="rms y")
    dx, dw = fastln.rms_norm_backward(dy, x, rr, w, out=np.empty_like(x))
    assert_close(dx, xt.grad.numpy(), F32, err_msg="rms dx")
    assert_close(dw, wt.grad.numpy(), F32, err_msg="rms dweight")


@pytest.mark.parametrize("H", [64, 256])
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_streamed_half_rows_match_torch(torch, rng, name, H):
    """Streamed 16-bit rows of an even number of vectors (the sixteen-row forwards narrow
    two vectors at a time into simd.h's ntw writer), into NumPy arrays of their own
    (16 bytes into a cache line), against torch's LayerNorm and RMSNorm on the same 16-bit
    tensor: within one unit in the last place of the 16-bit type."""
    if name == "bfloat16":
        dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
        tt = torch.bfloat16
    else:
        dt, tt = np.dtype(np.float16), torch.float16
    F = torch.nn.functional
    N = (17 << 20) // (2 * H) + 37                   # 17 MiB of 16-bit values: streamed
    x = (rng.standard_normal((N, H)) * 2 + 0.5).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    xt = torch.from_numpy(x.view(np.int16)).view(tt)
    wt, bt = torch.from_numpy(w), torch.from_numpy(b)
    ulp = float(torch.finfo(tt).eps)

    def check(got, want, what):
        want = want.float().numpy()
        np.testing.assert_allclose(got.astype(F32), want, rtol=ulp, atol=ulp, err_msg=what)

    check(fastln.layer_norm(x, w, b, out=np.empty_like(x)), F.layer_norm(xt, (H,), wt, bt, 1e-5),
          "y")
    with warnings.catch_warnings():    # a float weight: torch's unfused path, which warns
        warnings.simplefilter("ignore")
        want = F.rms_norm(xt, (H,), wt, 1e-6)
    check(fastln.rms_norm(x, w, out=np.empty_like(x)), want, "rms y")


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("name,H", [("float32", 16), ("float32", 64), ("float32", 256),
                                    ("float16", 64), ("bfloat16", 256), ("float32", 1024),
                                    ("bfloat16", 1024)],
                         ids=str)
def test_rows_streamed_from_4_or_8_mib_match_torch(torch, rng, restore_threads, nt, name, H):
    """Short rows of 5 MiB out, which stream from 4 MiB on AVX-512 in 16-bit storage, and
    in float32 on one thread (src_c/runtime/policy.h, FASTLN_STREAM_SHORT_L3; test_short_rows
    checks them against their unstreamed halves), and longer rows (float32 and bfloat16,
    H = 1024), 9 MiB out, which stream from 8 MiB on one thread (FASTLN_STREAM_1T_L3),
    against torch: LayerNorm, RMSNorm and add + LayerNorm (its s and its y, the LayerNorm of
    x + residual added in float) on the same tensors, on 1 and 2 threads.
    float32 as assert_close; 16-bit within one unit in the last place of the type."""
    F = torch.nn.functional
    if name == "bfloat16":
        dt, tt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16), torch.bfloat16
    else:
        dt, tt = np.dtype(name), getattr(torch, name)
    fastln.set_num_threads(nt)
    N = ((5 if dt.itemsize * H <= 512 else 9) << 20) // (dt.itemsize * H) + 3
    x = (rng.standard_normal((N, H)) * 2 + 0.5).astype(dt)
    res = rng.standard_normal((N, H)).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    if dt == F32:
        xt, rt = torch.from_numpy(x), torch.from_numpy(res)
    else:
        xt, rt = (torch.from_numpy(a.view(np.int16)).view(tt) for a in (x, res))
    wt, bt = torch.from_numpy(w), torch.from_numpy(b)

    def check(got, want, what):
        want = want.to(tt).float().numpy()
        if dt == F32:
            assert_close(got, want, F32, err_msg=what)
        else:
            ulp = float(torch.finfo(tt).eps)
            np.testing.assert_allclose(got.astype(F32), want, rtol=ulp, atol=ulp, err_msg=what)

    check(fastln.layer_norm(x, w, b), F.layer_norm(xt.float(), (H,), wt, bt, 1e-5), "y")
    check(fastln.rms_norm(x, w), F.rms_norm(xt.float(), (H,), wt, 1e-6), "rms y")
    y, s = fastln.add_layer_norm(x, res, w, b)
    st = xt.float() + rt.float()
    check(s, st, "add s")
    check(y, F.layer_norm(st, (H,), wt, bt, 1e-5), "add y")


@pytest.mark.parametrize("N,H", [(16, 768), (37, 16), (37, 100), (37, 128), (37, 200)],
                         ids=repr)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_add_layer_norm_matches_torch(torch, dtype, N, H, rng):
    """Long rows, and short ones (sixteen at a time on AVX-512, a partial group last)."""
    F = torch.nn.functional
    x = rng.standard_normal((N, H)).astype(dtype)
    r = rng.standard_normal((N, H)).astype(dtype)
    w = (1 + rng.standard_normal(H)).astype(dtype)
    b = rng.standard_normal(H).astype(dtype)
    st = _tensor(torch, x) + _tensor(torch, r)
    yt = F.layer_norm(st, (H,), _tensor(torch, w), _tensor(torch, b), 1e-5)
    y, s = fastln.add_layer_norm(x, r, w, b)
    np.testing.assert_array_equal(s, st.numpy())
    assert_close(y, yt.numpy(), dtype)


def test_stats_match_torch_native_layer_norm(torch, rng):
    x = (rng.standard_normal((32, 768)) * 3 + 1).astype(F32)
    _, mean_t, rstd_t = torch.native_layer_norm(_tensor(torch, x), (768,), None, None, 1e-5)
    _, mean, rstd = fastln.layer_norm(x, return_stats=True)
    assert_close(mean, mean_t.numpy().reshape(-1), F32)
    assert_close(rstd, rstd_t.numpy().reshape(-1), F32)


def test_large_offset_vs_torch_float64(torch, rng):
    """float32 fastln at mean 1e4 is within 1e-5 of torch run in float64 on the same input."""
    x = (rng.standard_normal((64, 1024)) + 1e4).astype(F32)
    yt = torch.nn.functional.layer_norm(_tensor(torch, x.astype(F64)), (1024,), eps=1e-5)
    y = fastln.layer_norm(x)
    assert np.max(np.abs(y.astype(F64) - yt.numpy())) <= 1e-5


@pytest.mark.parametrize("H", [16, 48, 64, 128])
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_short_half_backward_matches_torch(torch, rng, name, H):
    """The 16-bit backward of short rows (converted in registers, sixteen rows at a time on
    AVX-512; streamed past 8 MiB) against torch's autograd on the same values in float32:
    dx within one unit in the last place of the 16-bit type (of the largest |dx|), dweight
    and dbias in float32."""
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16" else \
        np.dtype(np.float16)
    N = (9 << 20) // (2 * H) + 37                    # 9 MiB of 16-bit values: streamed
    x = (rng.standard_normal((N, H)) * 2 + 0.5).astype(dt)
    dy = rng.standard_normal((N, H)).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(F32)
    b = rng.standard_normal(H).astype(F32)
    _, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    xt = torch.from_numpy(x.astype(F32)).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    bt = torch.from_numpy(b).requires_grad_()
    torch.nn.functional.layer_norm(xt, (H,), wt, bt, 1e-5).backward(
        torch.from_numpy(dy.astype(F32)))
    want = xt.grad.numpy()
    ulp = float(np.finfo(np.float16).eps) if name == "float16" else 2.0 ** -7
    assert dx.dtype == dt
    np.testing.assert_allclose(dx.astype(F32), want, rtol=ulp, atol=ulp * np.abs(want).max())
    # dweight, dbias: sums over N rows; fastln and torch each within float32's summation
    # bound of the float64 sums
    x64, g64 = x.astype(np.float64), dy.astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    for got, t, terms in ((dw, wt, g64 * xhat), (db, bt, g64)):
        bound = 1e-5 * np.abs(terms).sum(0) + 1e-6
        for v in (got, t.grad.numpy()):
            assert np.all(np.abs(v - terms.sum(0)) <= bound)
