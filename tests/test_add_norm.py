"""The fused residual ops against their float64 references and against themselves.

fastln.add_layer_norm / add_rms_norm (s = (x + residual) + input_bias, y the
norm of s) and add_layer_norm_backward / add_rms_norm_backward (dsum = the
norm's dx + ds, with dweight, dbias, dinput_bias and a broadcast residual's
gradient), in float32, float64, float16 and bfloat16 storage:

1. Against fastln.reference (float64) on every ISA path: H = 1, short rows
   (H <= 256), long rows (1031, 4099); N = 0, 1, 5; weight, bias and
   input_bias on and off; ds on and off.
2. Exactness: s is bitwise the sum formed in the compute dtype, (x +
   residual) + input_bias (float32 for the 16-bit types, then rounded once);
   y and the statistics are bitwise what layer_norm / rms_norm return for
   that sum (for 16-bit storage: for the float32 sum, y then rounded once),
   on every ISA path.
3. Residuals that broadcast over batch axes: (H,), (S, H), (1, S, H),
   (1, 1, H), and (B, 1, H), which does not repeat with a period of rows;
   axes that are not last, and tuples of axes, with every broadcast form of
   the batch axes.
4. Bitwise the same results on 1, 2 and 3 threads, forward and backward
   (dweight, dbias, dinput_bias, dresidual included).
5. out=: y's buffer, (y, s) tuples, (None, s), in place out=(x, residual),
   strided buffers; the backward's out=dy and out=ds.
6. NaN and inf reach only their own rows; rows around 1e4 with a small
   spread keep float32's precision.
7. Float64 central differences of a scalar loss through the reference
   forward: dsum, dweight, dbias, dinput_bias and a broadcast residual's
   gradient.
8. PyTorch autograd of the composites F.layer_norm(x + r + b) and
   F.rms_norm(x + r) with a broadcast r and an incoming gradient of the sum.
9. Bad input: a TypeError or ValueError naming the argument.

Tolerances (relative, and absolute scaled by the largest magnitude of the
expected value, or for sums over rows by the sum of the magnitudes of the
terms): float64 1e-12, float32 1e-5 (2e-5 absolute), float16 outputs 2e-3
(4e-3), bfloat16 outputs 8e-3 (1.6e-2): a few roundings of the storage type.
Statistics, dweight, dbias and dinput_bias of the 16-bit types are float32.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import named, norm_axes, normalized_shape, stats_shape

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [F32, F64, F16, BF16]
HALF = (F16, BF16)
KINDS = ["ln", "rms"]
EPS = {"ln": 1e-5, "rms": 1e-6}
TOL = {F64: (1e-12, 1e-12), F32: (1e-5, 2e-5), F16: (2e-3, 4e-3), BF16: (8e-3, 1.6e-2)}


def dt_id(d):
    return np.dtype(d).name


def kernel_dtype(dtype):
    """The compute dtype of a storage dtype (mean, rstd, dweight, ... come in it)."""
    return F64 if np.dtype(dtype) == F64 else F32


# ---- helpers ------------------------------------------------------------------

def randn(rng, shape, dtype, loc=0.0, scale=1.0):
    return (loc + scale * rng.standard_normal(shape)).astype(dtype)


def bits(a):
    """The bytes of a (NaN payloads and signed zeros included)."""
    return np.ascontiguousarray(a).tobytes()


def assert_bitwise(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        (what, got.shape, want.shape, got.dtype, want.dtype)
    if bits(got) != bits(want):
        diff = np.abs(got.astype(F64) - want.astype(F64))
        raise AssertionError(f"{what} differs bitwise (max abs difference {np.nanmax(diff)})")


def close(got, want, dtype, what, scale=None):
    """|got - want| <= atol * scale + rtol * |want| with dtype's (rtol, atol);
    scale defaults to max(1, max |want|)."""
    got, want = np.asarray(got, F64), np.asarray(want, F64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    rtol, atol = TOL[np.dtype(dtype)]
    if scale is None:
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def in_layout(v, shape, axis):
    """A vector of the normalized shape (axes in the order of axis) as an array
    that broadcasts against x's shape, as input_bias is added."""
    axes = norm_axes(axis, len(shape))
    batch = tuple(n for i, n in enumerate(shape) if i not in axes)
    moved = np.broadcast_to(np.asarray(v), batch + tuple(shape[a] for a in axes))
    return np.moveaxis(moved, range(len(shape) - len(axes), len(shape)), axes)


def f64(a):
    return None if a is None else np.asarray(a).astype(F64)


def fwd(kind, x, r, w=None, b=None, bi=None, axis=-1, eps=None, **kw):
    """fastln's forward with stats: (y, s, mean or None, rstd)."""
    eps = EPS[kind] if eps is None else eps
    if kind == "ln":
        return fastln.add_layer_norm(x, r, w, b, input_bias=bi, axis=axis, eps=eps,
                                     return_stats=True, **kw)
    y, s, rstd = fastln.add_rms_norm(x, r, w, input_bias=bi, axis=axis, eps=eps,
                                     return_stats=True, **kw)
    return y, s, None, rstd


def ref_fwd(kind, x, r, w=None, b=None, bi=None, axis=-1, eps=None):
    eps = EPS[kind] if eps is None else eps
    if kind == "ln":
        return ref.add_layer_norm(f64(x), f64(r), f64(w), f64(b), input_bias=f64(bi),
                                  axis=axis, eps=eps, return_stats=True)
    y, s, rstd = ref.add_rms_norm(f64(x), f64(r), f64(w), input_bias=f64(bi), axis=axis,
                                  eps=eps, return_stats=True)
    return y, s, None, rstd


def norm(kind, x, w=None, b=None, axis=-1, eps=None):
    """fastln's plain norm with stats: (y, mean or None, rstd)."""
    eps = EPS[kind] if eps is None else eps
    if kind == "ln":
        return fastln.layer_norm(x, w, b, axis=axis, eps=eps, return_stats=True)
    y, rstd = fastln.rms_norm(x, w, axis=axis, eps=eps, return_stats=True)
    return y, None, rstd


def bwd(kind, dy, s, mean, rstd, w=None, **kw):
    """fastln's backward as a dict of named results."""
    if kind == "ln":
        res = fastln.add_layer_norm_backward(dy, s, mean, rstd, w, **kw)
        names = ["dsum", "dweight", "dbias"]
    else:
        res = fastln.add_rms_norm_backward(dy, s, rstd, w, **kw)
        names = ["dsum", "dweight"]
    return named_grads(res, names, kw)


def ref_bwd(kind, dy, s, mean, rstd, w=None, ds=None, **kw):
    if kind == "ln":
        res = ref.add_layer_norm_backward(f64(dy), f64(s), f64(mean), f64(rstd), f64(w),
                                          ds=f64(ds), **kw)
        names = ["dsum", "dweight", "dbias"]
    else:
        res = ref.add_rms_norm_backward(f64(dy), f64(s), f64(rstd), f64(w), ds=f64(ds), **kw)
        names = ["dsum", "dweight"]
    return named_grads(res, names, kw)


def named_grads(res, names, kw):
    if kw.get("input_bias_grad"):
        names = names + ["dinput_bias"]
    if kw.get("residual_shape") is not None:
        names = names + ["dresidual"]
    assert isinstance(res, tuple) and len(res) == len(names), (len(res), names)
    return dict(zip(names, res))


def expected_sum(x, r, bi, axis):
    """s as fastln forms it: (x + residual) + input_bias in the compute dtype,
    and that rounded to the storage dtype."""
    kt = kernel_dtype(x.dtype)
    s = x.astype(kt) + np.broadcast_to(r, x.shape).astype(kt)
    if bi is not None:
        s = s + in_layout(np.asarray(bi).astype(kt), x.shape, axis)
    return s, s.astype(x.dtype)


def check_forward(kind, x, r, w=None, b=None, bi=None, axis=-1, eps=None):
    """fastln's forward: exact against layer_norm / rms_norm of the sum, close to
    the float64 reference. Returns (y, s, mean, rstd)."""
    dtype = x.dtype
    y, s, mean, rstd = fwd(kind, x, r, w, b, bi, axis, eps)
    kt = kernel_dtype(dtype)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    assert rstd.dtype == kt and rstd.shape == stats_shape(x.shape, axis)
    s_compute, s_want = expected_sum(x, r, bi, axis)
    assert_bitwise(s, s_want, "s")
    # y and the stats are the plain norm's, of the sum before it is rounded,
    # taken over C-contiguous rows (the layout the fused kernels normalize in;
    # layer_norm's channels-first kernel for one axis that is not last rounds
    # differently)
    axes = norm_axes(axis, x.ndim)
    trailing = tuple(range(x.ndim - len(axes), x.ndim))
    ny, nmean, nrstd = norm(kind, np.ascontiguousarray(np.moveaxis(s_compute, axes, trailing)),
                            w, b, trailing, eps)
    assert_bitwise(y, np.moveaxis(ny, trailing, axes).astype(dtype), "y against the norm of s")
    if dtype not in HALF:   # as documented: y is layer_norm / rms_norm of the s returned
        assert_bitwise(y, norm(kind, s, w, b, axis, eps)[0], "y against the norm of s")
    assert_bitwise(rstd, nrstd, "rstd against the norm of s")
    if kind == "ln":
        assert_bitwise(mean, nmean, "mean against the norm of s")
    # against the float64 reference of the exact sum
    ry, rs, rmean, rrstd = ref_fwd(kind, x, r, w, b, bi, axis, eps)
    close(s, rs, dtype, "s")
    close(y, ry, dtype, "y")
    close(rstd, rrstd, kt, "rstd", scale=1.0)
    if kind == "ln":
        close(mean, rmean, kt, "mean")
    # without stats: the same y and s
    if kind == "ln":
        y2, s2 = fastln.add_layer_norm(x, r, w, b, input_bias=bi, axis=axis,
                                       eps=EPS[kind] if eps is None else eps)
    else:
        y2, s2 = fastln.add_rms_norm(x, r, w, input_bias=bi, axis=axis,
                                     eps=EPS[kind] if eps is None else eps)
    assert_bitwise(y2, y, "y without stats")
    assert_bitwise(s2, s, "s without stats")
    return y, s, mean, rstd


def reduce_to(a, shape):
    """a summed over the axes along which an array of shape broadcasts to a's shape."""
    a = np.asarray(a, F64)
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead)))
    keep = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(axis=keep, keepdims=True).reshape(shape)


def column_scale(terms, shape):
    """max(1, the largest sum of |terms| that one element of a reduction to shape adds)."""
    a = np.abs(np.asarray(terms, F64))
    return max(1.0, float(np.max(reduce_to(a, tuple(shape))))) if a.size else 1.0


def rows_of(a, axis):
    """a with the normalized axes moved last (in the order of axis), as (M, *nshape)."""
    axes = norm_axes(axis, a.ndim)
    moved = np.moveaxis(np.asarray(a, F64), axes, range(a.ndim - len(axes), a.ndim))
    return moved.reshape(-1, *moved.shape[a.ndim - len(axes):])


def xhat_rows(s, mean, rstd, axis):
    """The normalized sum (s - mean) * rstd (mean 0 for RMSNorm), as rows_of gives it."""
    r = rows_of(s, axis)
    ex = (slice(None),) + (None,) * (r.ndim - 1)
    m = 0.0 if mean is None else np.asarray(mean, F64).reshape(-1)[ex]
    return (r - m) * np.asarray(rstd, F64).reshape(-1)[ex]


def check_backward(kind, s, mean, rstd, w, axis, dy, ds=None, residual_shape=None):
    """fastln's backward against the reference on the same s and statistics."""
    dtype = s.dtype
    kt = kernel_dtype(dtype)
    kw = dict(ds=ds, axis=axis, input_bias_grad=True, residual_shape=residual_shape)
    got = bwd(kind, dy, s, mean, rstd, w, **kw)
    want = ref_bwd(kind, dy, s, mean, rstd, w, **kw)
    nshape = normalized_shape(s.shape, axis)
    assert got["dsum"].dtype == dtype and got["dsum"].shape == s.shape
    # dx = rstd * (terms of w * dy): its rounding scales with those (rstd is
    # 1 / sqrt(eps) where a row is constant, H = 1 among them)
    wdy = np.abs(f64(dy)) * (1.0 if w is None else np.abs(in_layout(f64(w), s.shape, axis)))
    rstd_b = np.expand_dims(f64(rstd), tuple(sorted(norm_axes(axis, s.ndim))))
    mag = np.abs(want["dsum"]) + rstd_b * wdy
    close(got["dsum"], want["dsum"], dtype, "dsum",
          scale=max(1.0, float(np.max(mag, initial=0.0))))
    # column sums over the batch axes, scaled by the sums of the terms' magnitudes
    g = rows_of(dy, axis)
    scales = {"dweight": column_scale(g * xhat_rows(s, mean, rstd, axis), nshape),
              "dbias": column_scale(g, nshape),
              "dinput_bias": column_scale(rows_of(mag, axis), nshape)}
    for name in ("dweight", "dbias", "dinput_bias"):
        if name in got:
            assert got[name].dtype == kt and got[name].shape == nshape, name
            close(got[name], want[name], kt, name, scale=scales[name])
    if residual_shape is not None:
        dres = got["dresidual"]
        assert dres.shape == tuple(residual_shape) and dres.dtype == dtype
        close(dres, want["dresidual"], dtype, "dresidual",
              scale=column_scale(mag, residual_shape))
    return got


# ---- 1. against the reference, on every ISA path ----------------------------------

@pytest.mark.parametrize("N", [0, 1, 5])
@pytest.mark.parametrize("H", [1, 7, 64, 256, 1031, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference(isa, kind, dtype, H, N):
    rng = np.random.default_rng(1000 * H + N)
    kt = kernel_dtype(dtype)
    x = randn(rng, (N, H), dtype, 0.3, 2.0)
    r = randn(rng, (N, H), dtype, -0.1)
    dy, ds = randn(rng, (N, H), dtype), randn(rng, (N, H), dtype)
    for affine, with_bi in itertools.product((False, True), (False, True)):
        w = randn(rng, (H,), kt, 1.0, 0.5) if affine else None
        b = randn(rng, (H,), kt, 0.0, 0.5) if affine and kind == "ln" else None
        bi = randn(rng, (H,), kt, 0.2, 0.5) if with_bi else None
        y, s, mean, rstd = check_forward(kind, x, r, w, b, bi)
        for g in (None, ds):
            got = check_backward(kind, s, mean, rstd, w, -1, dy, ds=g, residual_shape=(N, H))
            assert got["dresidual"] is got["dsum"]
    if N == 0:
        got = bwd(kind, dy, s, mean, rstd, None, input_bias_grad=True)
        assert not np.any(got["dweight"]) and not np.any(got["dinput_bias"])


# ---- 3. broadcast residuals and axes -------------------------------------------------

RESIDUAL_FORMS = {"H": lambda B, S, H: (H,), "SH": lambda B, S, H: (S, H),
                  "1SH": lambda B, S, H: (1, S, H), "11H": lambda B, S, H: (1, 1, H),
                  "B1H": lambda B, S, H: (B, 1, H), "BSH": lambda B, S, H: (B, S, H)}


@pytest.mark.parametrize("H", [8, 300])
@pytest.mark.parametrize("form", list(RESIDUAL_FORMS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_broadcast_residual(isa, kind, dtype, form, H):
    rng = np.random.default_rng(H)
    kt = kernel_dtype(dtype)
    B, S = 3, 5
    x = randn(rng, (B, S, H), dtype, 0.3, 2.0)
    r = randn(rng, RESIDUAL_FORMS[form](B, S, H), dtype, -0.2)
    w, b, bi = randn(rng, (H,), kt, 1.0, 0.5), randn(rng, (H,), kt), randn(rng, (H,), kt)
    for with_bi in (False, True):
        y, s, mean, rstd = check_forward(kind, x, r, w, b if kind == "ln" else None,
                                         bi if with_bi else None)
        dy, ds = randn(rng, x.shape, dtype), randn(rng, x.shape, dtype)
        got = check_backward(kind, s, mean, rstd, w, -1, dy, ds=ds, residual_shape=r.shape)
        if r.shape == x.shape:
            assert got["dresidual"] is got["dsum"]


def broadcast_forms(shape, axis):
    """Every residual shape that broadcasts to shape over its batch axes only
    (1 on a subset of them), and the same without leading 1s."""
    axes = norm_axes(axis, len(shape))
    batch = [i for i in range(len(shape)) if i not in axes]
    forms = []
    for k in range(len(batch) + 1):
        for ones in itertools.combinations(batch, k):
            form = tuple(1 if i in ones else n for i, n in enumerate(shape))
            forms.append(form)
            lead = 0
            while lead < len(form) and form[lead] == 1:
                lead += 1
            if lead:
                forms.append(form[lead:])
    return forms


@pytest.mark.parametrize("axis", [0, 1, -1, (1, 2), (2, 1), (0, 2), (2, 0)], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_axes(kind, dtype, axis):
    rng = np.random.default_rng(7)
    kt = kernel_dtype(dtype)
    shape = (4, 5, 6)
    nshape = normalized_shape(shape, axis)
    x = randn(rng, shape, dtype, 0.3, 2.0)
    w, b, bi = randn(rng, nshape, kt, 1.0, 0.5), randn(rng, nshape, kt), randn(rng, nshape, kt)
    dy, ds = randn(rng, shape, dtype), randn(rng, shape, dtype)
    for rshape in broadcast_forms(shape, axis):
        r = randn(rng, rshape, dtype)
        y, s, mean, rstd = check_forward(kind, x, r, w, b if kind == "ln" else None, bi, axis)
        check_backward(kind, s, mean, rstd, w, axis, dy, ds=ds, residual_shape=rshape)


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_dtypes(kind):
    """float16 with float32 computes and returns float32; an integer residual
    with float32 gives float64 (np.result_type of each alone)."""
    rng = np.random.default_rng(11)
    x16 = randn(rng, (4, 40), F16)
    r32 = randn(rng, (40,), F32)
    y, s, _, _ = fwd(kind, x16, r32)
    assert y.dtype == s.dtype == F32
    assert_bitwise(s, x16.astype(F32) + r32, "s")
    ri = rng.integers(-3, 4, (4, 40)).astype(np.int32)
    y, s, _, rstd = fwd(kind, r32.reshape(1, 40).repeat(4, 0), ri)
    assert y.dtype == s.dtype == rstd.dtype == F64
    close(y, ref_fwd(kind, r32.reshape(1, 40).repeat(4, 0), ri)[0], F64, "y")


# ---- 4. threads ----------------------------------------------------------------------

def all_results(kind, x, r, w, b, bi, dy, ds):
    y, s, mean, rstd = fwd(kind, x, r, w, b, bi)
    out = {"y": y, "s": s, "rstd": rstd}
    if mean is not None:
        out["mean"] = mean
    g = bwd(kind, dy, s, mean, rstd, w, ds=ds, input_bias_grad=True, residual_shape=r.shape)
    out.update(g)
    return out


@pytest.mark.parametrize("rform", ["SH", "B1H", "BSH"])
@pytest.mark.parametrize("BSH", [(4, 256, 256), (2, 160, 1031)], ids=str)
@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_bitwise_same_on_1_2_3_threads(kind, dtype, BSH, rform, restore_threads):
    rng = np.random.default_rng(sum(BSH))
    kt = kernel_dtype(dtype)
    B, S, H = BSH
    x = randn(rng, BSH, dtype, 0.5, 2.0)
    r = randn(rng, RESIDUAL_FORMS[rform](B, S, H), dtype)
    w, b, bi = randn(rng, (H,), kt, 1.0, 0.5), randn(rng, (H,), kt), randn(rng, (H,), kt)
    dy, ds = randn(rng, BSH, dtype), randn(rng, BSH, dtype)
    results = {}
    for n in (1, 2, 3):
        with fastln.threads(n):
            if fastln.has_openmp():
                assert fastln.get_num_threads() == n
            results[n] = all_results(kind, x, r, w, b if kind == "ln" else None, bi, dy, ds)
    for n in (2, 3):
        for name, a in results[1].items():
            assert_bitwise(results[n][name], a, f"{name} on {n} threads")
    assert np.abs(results[1]["dweight"]).max() > 1   # not trivially zero


# ---- 5. out= ---------------------------------------------------------------------------

OUT_KINDS = ["y", "y_strided", "tuple", "tuple_s_only", "tuple_strided", "in_place",
             "in_place_swapped"]


@pytest.mark.parametrize("out_kind", OUT_KINDS)
@pytest.mark.parametrize("axis", [-1, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", [F32, F64, F16], ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_out(kind, dtype, axis, out_kind):
    rng = np.random.default_rng(5)
    kt = kernel_dtype(dtype)
    shape = (5, 6, 40)
    nshape = normalized_shape(shape, axis)
    x0, r0 = randn(rng, shape, dtype, 0.3, 2.0), randn(rng, shape, dtype)
    w, bi = randn(rng, nshape, kt, 1.0, 0.5), randn(rng, nshape, kt)
    want_y, want_s, _, _ = fwd(kind, x0, r0, w, bi=bi, axis=axis)
    x, r = x0.copy(), r0.copy()

    def strided():
        return np.zeros(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]

    if out_kind == "y":
        out = y_out = np.empty(shape, dtype)
        s_out = None
    elif out_kind == "y_strided":
        out = y_out = strided()
        s_out = None
    elif out_kind == "tuple":
        y_out, s_out = np.empty(shape, dtype), np.empty(shape, dtype)
        out = (y_out, s_out)
    elif out_kind == "tuple_s_only":
        y_out, s_out = None, np.empty(shape, dtype)
        out = (None, s_out)
    elif out_kind == "tuple_strided":
        y_out, s_out = strided(), np.empty(shape, dtype, order="F")
        out = (y_out, s_out)
    elif out_kind == "in_place":
        y_out, s_out = x, r
        out = (x, r)
    else:
        y_out, s_out = r, x
        out = (r, x)
    if kind == "ln":
        y, s = fastln.add_layer_norm(x, r, w, input_bias=bi, axis=axis, out=out)
    else:
        y, s = fastln.add_rms_norm(x, r, w, input_bias=bi, axis=axis, out=out)
    if y_out is not None:
        assert y is y_out
    if s_out is not None:
        assert s is s_out
    assert_bitwise(np.ascontiguousarray(y), want_y, "y")
    assert_bitwise(np.ascontiguousarray(s), want_s, "s")


@pytest.mark.parametrize("kind", KINDS)
def test_out_with_broadcast_residual(kind):
    """out=(x, None) with a residual that broadcasts: x becomes y."""
    rng = np.random.default_rng(6)
    x0, r = randn(rng, (3, 4, 33), F32), randn(rng, (4, 33), F32)
    want_y, want_s, _, _ = fwd(kind, x0, r)
    x = x0.copy()
    y, s = (fastln.add_layer_norm if kind == "ln" else fastln.add_rms_norm)(x, r, out=(x, None))
    assert y is x
    assert_bitwise(y, want_y, "y")
    assert_bitwise(s, want_s, "s")


@pytest.mark.parametrize("target", ["dy", "ds", "fresh"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_backward_out(kind, dtype, target):
    rng = np.random.default_rng(8)
    x, r = randn(rng, (6, 50), dtype), randn(rng, (6, 50), dtype)
    y, s, mean, rstd = fwd(kind, x, r)
    dy, ds = randn(rng, x.shape, dtype), randn(rng, x.shape, dtype)
    want = bwd(kind, dy, s, mean, rstd, ds=ds, input_bias_grad=True)
    dy2, ds2 = dy.copy(), ds.copy()
    out = {"dy": dy2, "ds": ds2, "fresh": np.empty(x.shape, dtype)}[target]
    got = bwd(kind, dy2, s, mean, rstd, ds=ds2, out=out, input_bias_grad=True)
    assert got["dsum"] is out
    for name in want:
        assert_bitwise(got[name], want[name], name)


# ---- 6. non-finite values, large offsets --------------------------------------------

@pytest.mark.parametrize("H", [7, 300])
@pytest.mark.parametrize("kind", KINDS)
def test_nonfinite_stay_in_their_rows(isa, kind, H):
    rng = np.random.default_rng(9)
    B, S = 2, 6
    x0 = randn(rng, (B, S, H), F32)
    r0 = randn(rng, (S, H), F32)         # residual row j reaches rows (b, j)
    x, r = x0.copy(), r0.copy()
    x[0, 1, 2] = np.nan
    x[1, 3, 0] = np.inf
    x[1, 4, H - 1] = -np.inf
    r[5, H // 2] = np.nan
    bad = np.zeros((B, S), bool)
    bad[0, 1] = bad[1, 3] = bad[1, 4] = bad[:, 5] = True
    y, s, mean, rstd = fwd(kind, x, r)
    y0, s0, mean0, rstd0 = fwd(kind, x0, r0)
    for name, a, a0 in (("y", y, y0), ("s", s, s0)):
        assert_bitwise(a[~bad], a0[~bad], name + " of the finite rows")
        assert not np.isfinite(a[bad]).all(axis=-1).any(), name
    assert_bitwise(rstd[~bad], rstd0[~bad], "rstd of the finite rows")
    # s is finite except where an input was not
    assert np.array_equal(np.isfinite(s), np.isfinite(x) & np.isfinite(np.broadcast_to(r, x.shape)))
    dy = randn(rng, x.shape, F32)
    g = bwd(kind, dy, s, mean, rstd, ds=dy)
    g0 = bwd(kind, dy, s0, mean0, rstd0, ds=dy)
    assert_bitwise(g["dsum"][~bad], g0["dsum"][~bad], "dsum of the finite rows")
    assert not np.isfinite(g["dsum"][bad]).all(axis=-1).any()


@pytest.mark.parametrize("H", [7, 256, 1031, 4099])
@pytest.mark.parametrize("dtype", [F32, F64], ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_large_offsets(isa, kind, dtype, H):
    """Rows around 1e4 with a spread of 0.5: y against the float64 norm of the
    returned s (the rounding of s itself is the storage's: in float32 at 1e4
    about 5e-4). The statistics accumulate in double, so float32 rows keep
    their usual 1e-5; float64 rows are bounded by the mean's own rounding to
    float64, a few eps * offset / spread."""
    rng = np.random.default_rng(H)
    offset, spread = 1e4, 0.5
    x = randn(rng, (5, H), dtype, offset, spread)
    r = randn(rng, (H,), dtype, 0.0, 0.1)
    y, s, mean, rstd = fwd(kind, x, r)
    s64 = s.astype(F64)
    if kind == "ln":
        ry, rmean, rrstd = ref.layer_norm(s64, eps=EPS[kind], return_stats=True)
        np.testing.assert_allclose(mean, rmean, rtol=TOL[dtype][0], err_msg="mean")
    else:
        ry, rrstd = ref.rms_norm(s64, eps=EPS[kind], return_stats=True)
    floor = 8 * np.finfo(F64).eps * offset / spread if dtype == F64 else 0.0
    np.testing.assert_allclose(y, ry, rtol=TOL[dtype][0],
                               atol=max(TOL[dtype][1] * np.abs(ry).max(), floor), err_msg="y")
    np.testing.assert_allclose(rstd, rrstd, rtol=TOL[dtype][0], err_msg="rstd")
    dy, ds = randn(rng, x.shape, dtype), randn(rng, x.shape, dtype)
    got = bwd(kind, dy, s, mean, rstd, ds=ds)
    want = ref_bwd(kind, dy, s, mean, rstd, ds=ds)
    np.testing.assert_allclose(got["dsum"], want["dsum"], rtol=TOL[dtype][0],
                               atol=max(TOL[dtype][1] * np.abs(want["dsum"]).max(),
                                        floor * float(np.max(rstd))), err_msg="dsum")
    close(got["dweight"], want["dweight"], dtype, "dweight",
          scale=column_scale(dy.astype(F64) * xhat_rows(s, mean, rstd, -1), (H,)))


# ---- 7. finite differences -------------------------------------------------------------

def fd_grad(f, a, h=1e-6):
    """Central differences of the scalar f with respect to every entry of a (in place)."""
    g = np.empty_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + h
        fp = f()
        a[i] = old - h
        fm = f()
        a[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


@pytest.mark.parametrize("case", ["last", "axes"])
@pytest.mark.parametrize("kind", KINDS)
def test_finite_differences(kind, case):
    rng = np.random.default_rng(12)
    if case == "last":
        shape, axis, rshape = (2, 3, 5), -1, (3, 5)
    else:
        shape, axis, rshape = (4, 3, 5), (0, 2), (4, 1, 5)
    nshape = normalized_shape(shape, axis)
    p = {"x": rng.standard_normal(shape) + 0.5, "r": rng.standard_normal(rshape),
         "bi": 0.3 * rng.standard_normal(nshape), "w": 1 + 0.5 * rng.standard_normal(nshape),
         "b": 0.5 * rng.standard_normal(nshape)}
    if kind == "rms":
        del p["b"]
    dy, ds = rng.standard_normal(shape), rng.standard_normal(shape)

    def loss():
        y, s, _, _ = ref_fwd(kind, p["x"], p["r"], p["w"], p.get("b"), p["bi"], axis)
        return float(np.sum(dy * y) + np.sum(ds * s))

    fd = {name: fd_grad(loss, a) for name, a in p.items()}
    y, s, mean, rstd = fwd(kind, p["x"], p["r"], p["w"], p.get("b"), p["bi"], axis)
    kw = dict(ds=ds, axis=axis, input_bias_grad=True, residual_shape=rshape)
    for source, g in (("fastln", bwd(kind, dy, s, mean, rstd, p["w"], **kw)),
                      ("reference", ref_bwd(kind, dy, s, mean, rstd, p["w"], **kw))):
        pairs = {"x": "dsum", "r": "dresidual", "bi": "dinput_bias", "w": "dweight",
                 "b": "dbias"}
        for name, grad in pairs.items():
            if name in p:
                np.testing.assert_allclose(g[grad], fd[name], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{source} {grad}")


# ---- 8. PyTorch autograd ---------------------------------------------------------------

@pytest.mark.parametrize("with_bi", [False, True])
@pytest.mark.parametrize("dtype", [F32, F64], ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_torch_autograd(kind, dtype, with_bi, torch):
    """F.layer_norm(x + r + b) / F.rms_norm(x + r + b), r of shape (S, H), with a
    loss sum(y * dy) + sum(s * ds): every gradient against fastln's backward."""
    F = torch.nn.functional
    rng = np.random.default_rng(13)
    B, S, H = 3, 4, 48
    eps = EPS[kind]
    a = {"x": randn(rng, (B, S, H), dtype, 0.3, 2.0), "r": randn(rng, (S, H), dtype),
         "w": randn(rng, (H,), dtype, 1.0, 0.5), "b": randn(rng, (H,), dtype)}
    if with_bi:
        a["bi"] = randn(rng, (H,), dtype)
    dy, ds = randn(rng, (B, S, H), dtype), randn(rng, (B, S, H), dtype)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in a.items()}
    st = t["x"] + t["r"] + t["bi"] if with_bi else t["x"] + t["r"]
    if kind == "ln":
        yt = F.layer_norm(st, (H,), t["w"], t["b"], eps)
    else:
        yt = F.rms_norm(st, (H,), t["w"], eps)
        del t["b"]
    ((yt * torch.tensor(dy)).sum() + (st * torch.tensor(ds)).sum()).backward()
    y, s, mean, rstd = fwd(kind, a["x"], a["r"], a["w"], a["b"] if kind == "ln" else None,
                           a.get("bi"))
    close(y, yt.detach().numpy(), dtype, "y")
    close(s, st.detach().numpy(), dtype, "s")
    g = bwd(kind, dy, s, mean, rstd, a["w"], ds=ds, input_bias_grad=with_bi,
            residual_shape=a["r"].shape)
    pairs = {"x": "dsum", "r": "dresidual", "w": "dweight", "b": "dbias", "bi": "dinput_bias"}
    for name, tensor in t.items():
        close(g[pairs[name]], tensor.grad.numpy(), dtype, pairs[name])


# ---- 9. bad input -------------------------------------------------------------------------

def _bad_cases():
    x = np.ones((2, 3, 8), np.float32)
    s, m, rs = x, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    ALN, ARMS = fastln.add_layer_norm, fastln.add_rms_norm
    BLN, BRMS = fastln.add_layer_norm_backward, fastln.add_rms_norm_backward
    return {
        "residual_wrong_size": (lambda: ALN(x, np.ones((2, 3, 7), np.float32)),
                                ValueError, "residual"),
        "residual_too_many_dims": (lambda: ARMS(x, np.ones((2, 2, 3, 8), np.float32)),
                                   ValueError, "residual"),
        "residual_not_broadcasting": (lambda: ALN(x, np.ones((4, 8), np.float32)),
                                      ValueError, "residual"),
        "residual_over_normalized_axis": (lambda: ALN(x, np.ones((2, 3, 1), np.float32)),
                                          ValueError, "residual"),
        "residual_over_normalized_axes": (
            lambda: ARMS(x, np.ones((2, 1, 8), np.float32), axis=(1, 2)), ValueError,
            "residual"),
        "residual_over_normalized_axis0": (
            lambda: ALN(x, np.ones((1, 3, 8), np.float32), axis=0), ValueError, "residual"),
        "residual_dtype": (lambda: ALN(x, np.ones((3, 8), complex)), TypeError, "residual"),
        "residual_strings": (lambda: ARMS(x, "abc"), TypeError, "residual"),
        "input_bias_size": (lambda: ALN(x, x, input_bias=np.ones(7, np.float32)),
                            ValueError, "input_bias"),
        "input_bias_rows": (lambda: ARMS(x, x, input_bias=np.ones((3, 8), np.float32)),
                            ValueError, "input_bias"),
        "input_bias_axes": (lambda: ALN(x, x, input_bias=np.ones((8, 3), np.float32),
                                        axis=(1, 2)), ValueError, "input_bias"),
        "input_bias_dtype": (lambda: ARMS(x, x, input_bias=np.ones(8, complex)),
                             TypeError, "input_bias"),
        "ds_shape": (lambda: BLN(x, s, m, rs, ds=np.ones((2, 3, 7), np.float32)),
                     ValueError, "ds"),
        "ds_broadcast": (lambda: BRMS(x, s, rs, ds=np.ones(8, np.float32)), ValueError, "ds"),
        "ds_dtype": (lambda: BRMS(x, s, rs, ds=np.ones(x.shape, complex)), TypeError, "ds"),
        "residual_shape_floats": (lambda: BLN(x, s, m, rs, residual_shape=(3.0, 8.0)),
                                  TypeError, "residual_shape"),
        "residual_shape_int": (lambda: BRMS(x, s, rs, residual_shape=8),
                               TypeError, "residual_shape"),
        "residual_shape_str": (lambda: BRMS(x, s, rs, residual_shape="38"),
                               TypeError, "residual_shape"),
        "residual_shape_not_broadcasting": (lambda: BLN(x, s, m, rs, residual_shape=(7,)),
                                            ValueError, "residual_shape"),
        "residual_shape_over_normalized": (lambda: BRMS(x, s, rs, residual_shape=(3, 1)),
                                           ValueError, "residual_shape"),
        "residual_shape_too_long": (lambda: BLN(x, s, m, rs, residual_shape=(1, 2, 3, 8)),
                                    ValueError, "residual_shape"),
        "out_dtype": (lambda: ALN(x, x, out=np.empty(x.shape, np.float64)), TypeError, "out"),
        "out_s_dtype": (lambda: ARMS(x, x, out=(None, np.empty(x.shape, np.float16))),
                        TypeError, "out"),
        "out_shape": (lambda: ALN(x, x, out=np.empty((2, 3, 9), np.float32)),
                      ValueError, "out"),
        "out_list": (lambda: ARMS(x, x, out=[np.empty_like(x), np.empty_like(x)]),
                     TypeError, "out"),
        "out_overlap": (lambda: ALN(x, x, out=(np.empty_like(x),) * 2), ValueError, "out"),
        "backward_out_dtype": (lambda: BLN(x, s, m, rs, out=np.empty(x.shape, np.float64)),
                               TypeError, "out"),
        "backward_out_dtype_rms": (lambda: BRMS(x, s, rs, out=np.empty(x.shape, np.float16)),
                                   TypeError, "out"),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    call, exc, name = BAD[case]
    with pytest.raises(exc, match=named(name)):
        call()


# ---- 10. y against the norm of s, as the README states it ------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("kind", KINDS)
def test_y_is_the_norm_of_s_or_of_its_float32_sum(isa, kind, dtype):
    """float32/float64: y is bitwise layer_norm(s) (rms_norm(s)). float16 and
    bfloat16: y is bitwise the norm of the float32 sum, rounded once; s is
    that sum rounded."""
    rng = np.random.default_rng(17)
    norm = fastln.layer_norm if kind == "ln" else fastln.rms_norm
    for B, S, H in [(2, 3, 1), (3, 5, 64), (2, 7, 100), (1, 4, 1030)]:
        x, r = randn(rng, (B, S, H), dtype, 0.5, 3.0), randn(rng, (S, H), dtype)
        w, bi = randn(rng, (H,), F32, 1.0, 0.5), randn(rng, (H,), F32)
        b = randn(rng, (H,), F32) if kind == "ln" else None
        y, s, _, _ = fwd(kind, x, r, w, b, bi.astype(dtype))
        args = (w, b) if kind == "ln" else (w,)
        if dtype in HALF:
            s32 = (x.astype(F32) + r.astype(F32)) + bi.astype(dtype).astype(F32)
            assert np.array_equal(s, s32.astype(dtype))
            assert np.array_equal(y, norm(s32, *args, eps=EPS[kind]).astype(dtype))
        else:
            assert np.array_equal(y, norm(s, *[a.astype(dtype) for a in args], eps=EPS[kind]))
