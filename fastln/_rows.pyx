# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""The kernels on canonical arrays, and the outputs they write.

A canonical array is C-contiguous, aligned and of native byte order, of one
float type: float32 or float64, or float16/bfloat16 storage (float32 math,
float32 statistics and parameters). The kernels take rows, (N, H) with
statistics of N and parameters of H, or channels first, (N, C, S). Each call
releases the GIL and makes one call of a C function of fastln._lib.

The fast paths of fastln._norms and fastln._add_norms call the cdef functions
(fastln/_rows.pxd) on arrays they have checked. The general path
(fastln._general) calls the Python functions, which check their arguments
again (ValueError "internal: ..."), so that no caller can make a kernel read
or write past a buffer.

Outputs of FASTLN_POOL_MIN_BYTES or more come from the cache of large outputs,
through fastln._lib's allocator. Imports fastln._lib and fastln._dtypes.
"""
from libc.stdint cimport int64_t, uint16_t
cimport numpy as cnp
import numpy as np

from fastln._lib cimport (
    FASTLN_BF16, FASTLN_F16, fastln_add_norm_backward_f32, fastln_add_norm_backward_f64,
    fastln_add_norm_f32, fastln_add_norm_f64, fastln_add_norm_half,
    fastln_layer_norm_backward_f32, fastln_layer_norm_backward_f64,
    fastln_layer_norm_backward_half, fastln_layer_norm_channels_backward_f32,
    fastln_layer_norm_channels_backward_f64, fastln_layer_norm_channels_f32,
    fastln_layer_norm_channels_f64, fastln_layer_norm_f32, fastln_layer_norm_f64,
    fastln_layer_norm_half, fastln_rms_norm_backward_f32, fastln_rms_norm_backward_f64,
    fastln_rms_norm_backward_half, fastln_rms_norm_channels_f32, fastln_rms_norm_channels_f64,
    fastln_rms_norm_f32, fastln_rms_norm_f64, fastln_rms_norm_half)
from fastln._ndarray cimport _arr, _check, _fast, _float_type, _ptr

cnp.import_array()

from fastln import _dtypes, _lib


# ---- the kernels' codes ------------------------------------------------------

# 16-bit storage types the kernels read and write directly: type number -> kind
_HALF = {cnp.NPY_FLOAT16: FASTLN_F16}
if _dtypes.BFLOAT16 is not None:
    _HALF[_dtypes.BFLOAT16.num] = FASTLN_BF16


cdef int kernel_code(object x, int *tn, int *vt) noexcept:
    """The code the kernels take for x on a fast path: x's type number
    (float32/64), or HALF_BASE + kind for float16/bfloat16; -1 when x takes
    the general path. tn: x's type number; vt: that of weight, bias and the
    stats (float32 for 16-bit storage)."""
    tn[0] = vt[0] = _float_type(x)
    if tn[0] >= 0:
        return tn[0]
    if type(x) is not cnp.ndarray or cnp.PyArray_NDIM(<cnp.ndarray>x) < 1:
        return -1
    tn[0] = cnp.PyArray_TYPE(<cnp.ndarray>x)
    vt[0] = cnp.NPY_FLOAT
    kind = _HALF.get(tn[0])
    if kind is None or not _fast(x, tn[0]):
        return -1
    return HALF_BASE + <int>kind


# ---- outputs -----------------------------------------------------------------

cdef object _POOL_HANDLER = _lib._POOL_HANDLER
cdef object _NUMPY_HANDLER = _lib._NUMPY_HANDLER
cdef size_t _POOL_MIN_BYTES = _lib._POOL_MIN_BYTES


cdef object _cache_on():
    """Makes the cache's allocator NumPy's in this thread (context), where
    NumPy's default one is in use, and returns the one to restore; else
    returns None (an allocator someone else set is left to do its work)."""
    old = cnp.PyDataMem_GetHandler()
    if old is not _NUMPY_HANDLER:
        return None
    cnp.PyDataMem_SetHandler(_POOL_HANDLER)
    return old

cdef cnp.ndarray _cached_empty(int nd, cnp.npy_intp *dims, int tn):
    """PyArray_EMPTY through the cache's allocator (see _cache_on)."""
    old = _cache_on()
    try:
        return cnp.PyArray_EMPTY(nd, dims, tn, 0)
    finally:
        if old is not None:
            cnp.PyDataMem_SetHandler(old)

cdef cnp.ndarray empty_like(cnp.ndarray x, int nd, int tn):
    """An uninitialized array with the first nd dimensions of x; one of x's
    size, type and at least FASTLN_POOL_MIN_BYTES comes from the cache of
    large outputs (unless NumPy's allocator was replaced)."""
    if (nd == cnp.PyArray_NDIM(x) and tn == cnp.PyArray_TYPE(x)
            and <size_t>cnp.PyArray_NBYTES(x) >= _POOL_MIN_BYTES):
        return _cached_empty(nd, cnp.PyArray_DIMS(x), tn)
    return cnp.PyArray_EMPTY(nd, cnp.PyArray_DIMS(x), tn, 0)

def empty_rows(int64_t N, int64_t H, dtype):
    """``np.empty((N, H), dtype)`` (a native dtype); from the cache of large
    outputs where it takes FASTLN_POOL_MIN_BYTES or more (the results of
    fastln._general)."""
    cdef cnp.npy_intp dims[2]
    dims[0] = N
    dims[1] = H
    dtype = np.dtype(dtype)
    if <size_t>(N * H * dtype.itemsize) < _POOL_MIN_BYTES:
        return cnp.PyArray_EMPTY(2, dims, dtype.num, 0)
    return _cached_empty(2, dims, dtype.num)


# ---- row kernels -------------------------------------------------------------
# Every argument is a canonical array: x, y, dy, dx, s of N*H elements, mean
# and rstd of N, weight, bias, dweight, dbias of H. The callers establish this;
# the Python functions below re-check it (_rows_ok). code: what kernel_code
# returns; None stands for an optional array left out.

cdef int _rows_ok(x, outs, opt_outs, rows, stats, vecs) except -1:
    """x: 2-D (N, H), H >= 1, float32/64, or float16/bfloat16 (16-bit storage,
    float32 math); outs: writable, not None; opt_outs: writable where not None;
    rows, stats, vecs (None where optional): N*H elements of x's type, and N
    and H elements of x's type (float32 for 16-bit storage). Returns x's code."""
    cdef int tn = _float_type(x), kind = 0
    if tn < 0 and type(x) is cnp.ndarray and _fast(x, cnp.PyArray_TYPE(<cnp.ndarray>x)):
        kind = _HALF.get(cnp.PyArray_TYPE(<cnp.ndarray>x), 0)
    if not ((tn >= 0 or kind) and cnp.PyArray_NDIM(<cnp.ndarray>x) == 2
            and cnp.PyArray_DIM(<cnp.ndarray>x, 1) >= 1):
        raise ValueError("internal: x must be a C-contiguous 2-D float array with H >= 1")
    tn = cnp.PyArray_TYPE(<cnp.ndarray>x)
    cdef int st = cnp.NPY_FLOAT if kind else tn   # stats and vectors
    cdef int64_t N = cnp.PyArray_DIM(<cnp.ndarray>x, 0), H = cnp.PyArray_DIM(<cnp.ndarray>x, 1)
    for a in outs:
        if a is None:
            raise ValueError("internal: a required output is missing")
    for a in tuple(outs) + tuple(opt_outs):
        if a is not None and not (type(a) is cnp.ndarray
                                  and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a)):
            raise ValueError("internal: outputs must be writable arrays")
    for a in rows:
        if a is not None and not (_fast(a, tn) and cnp.PyArray_SIZE(<cnp.ndarray>a) == N * H):
            raise ValueError("internal: bad row array")
    for a in stats:
        if a is not None and not (_fast(a, st) and cnp.PyArray_SIZE(<cnp.ndarray>a) == N):
            raise ValueError("internal: bad stats array")
    for a in vecs:
        if a is not None and not (_fast(a, st) and cnp.PyArray_SIZE(<cnp.ndarray>a) == H):
            raise ValueError("internal: bad parameter array")
    return HALF_BASE + kind if kind else tn


cdef int ln_fwd(int code, y, mean, rstd, x, w, b, int64_t N, int64_t H, double eps) except -1:
    cdef int rc
    cdef void *py = _ptr(y)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *px = _ptr(x)
    cdef void *pw = _ptr(w)
    cdef void *pb = _ptr(b)
    if N == 0:
        return 0
    with nogil:
        if code >= HALF_BASE:
            rc = fastln_layer_norm_half(code - HALF_BASE, <uint16_t *>py, <float *>pm,
                                        <float *>pr, <uint16_t *>px, <float *>pw, <float *>pb,
                                        N, H, eps)
        elif code == cnp.NPY_FLOAT:
            rc = fastln_layer_norm_f32(<float *>py, <float *>pm, <float *>pr, <float *>px,
                                       <float *>pw, <float *>pb, N, H, eps)
        else:
            rc = fastln_layer_norm_f64(<double *>py, <double *>pm, <double *>pr, <double *>px,
                                       <double *>pw, <double *>pb, N, H, eps)
    return _check(rc)


cdef int ln_bwd(int code, dx, dw, db, dy, x, mean, rstd, w, int64_t N, int64_t H) except -1:
    cdef int rc
    cdef void *pdx = _ptr(dx)
    cdef void *pdw = _ptr(dw)
    cdef void *pdb = _ptr(db)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    with nogil:
        if code >= HALF_BASE:
            rc = fastln_layer_norm_backward_half(code - HALF_BASE, <uint16_t *>pdx, <float *>pdw,
                                                 <float *>pdb, <uint16_t *>pdy, <uint16_t *>px,
                                                 <float *>pm, <float *>pr, <float *>pw, N, H)
        elif code == cnp.NPY_FLOAT:
            rc = fastln_layer_norm_backward_f32(<float *>pdx, <float *>pdw, <float *>pdb,
                                                <float *>pdy, <float *>px, <float *>pm,
                                                <float *>pr, <float *>pw, N, H)
        else:
            rc = fastln_layer_norm_backward_f64(<double *>pdx, <double *>pdw, <double *>pdb,
                                                <double *>pdy, <double *>px, <double *>pm,
                                                <double *>pr, <double *>pw, N, H)
    return _check(rc)


cdef int add_fwd(int code, int rms, y, s, mean, rstd, x, res, int64_t R, bi, w, b,
                 int64_t N, int64_t H, double eps) except -1:
    cdef int rc
    cdef void *py = _ptr(y)
    cdef void *ps = _ptr(s)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *px = _ptr(x)
    cdef void *pres = _ptr(res)
    cdef void *pbi = _ptr(bi)
    cdef void *pw = _ptr(w)
    cdef void *pb = _ptr(b)
    if N == 0:
        return 0
    with nogil:
        if code >= HALF_BASE:
            rc = fastln_add_norm_half(code - HALF_BASE, rms, <uint16_t *>py, <uint16_t *>ps,
                                      <float *>pm, <float *>pr, <uint16_t *>px,
                                      <uint16_t *>pres, R, <float *>pbi, <float *>pw,
                                      <float *>pb, N, H, eps)
        elif code == cnp.NPY_FLOAT:
            rc = fastln_add_norm_f32(rms, <float *>py, <float *>ps, <float *>pm, <float *>pr,
                                     <float *>px, <float *>pres, R, <float *>pbi, <float *>pw,
                                     <float *>pb, N, H, eps)
        else:
            rc = fastln_add_norm_f64(rms, <double *>py, <double *>ps, <double *>pm,
                                     <double *>pr, <double *>px, <double *>pres, R,
                                     <double *>pbi, <double *>pw, <double *>pb, N, H, eps)
    return _check(rc)


cdef int _add_bwd(int code, int rms, dx, dw, db, di, dy, x, ds, mean, rstd, w, int64_t N,
                  int64_t H) except -1:
    cdef int rc
    cdef void *pdx = _ptr(dx)
    cdef void *pdw = _ptr(dw)
    cdef void *pdb = _ptr(db)
    cdef void *pdi = _ptr(di)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pds = _ptr(ds)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    with nogil:
        if code == cnp.NPY_FLOAT:
            rc = fastln_add_norm_backward_f32(rms, <float *>pdx, <float *>pdw, <float *>pdb,
                                              <float *>pdi, <float *>pdy, <float *>px,
                                              <float *>pds, <float *>pm, <float *>pr,
                                              <float *>pw, N, H)
        else:
            rc = fastln_add_norm_backward_f64(rms, <double *>pdx, <double *>pdw, <double *>pdb,
                                              <double *>pdi, <double *>pdy, <double *>px,
                                              <double *>pds, <double *>pm, <double *>pr,
                                              <double *>pw, N, H)
    return _check(rc)


cdef int rms_fwd(int code, y, rstd, x, w, int64_t N, int64_t H, double eps) except -1:
    cdef int rc
    cdef void *py = _ptr(y)
    cdef void *pr = _ptr(rstd)
    cdef void *px = _ptr(x)
    cdef void *pw = _ptr(w)
    if N == 0:
        return 0
    with nogil:
        if code >= HALF_BASE:
            rc = fastln_rms_norm_half(code - HALF_BASE, <uint16_t *>py, <float *>pr,
                                      <uint16_t *>px, <float *>pw, N, H, eps)
        elif code == cnp.NPY_FLOAT:
            rc = fastln_rms_norm_f32(<float *>py, <float *>pr, <float *>px, <float *>pw,
                                     N, H, eps)
        else:
            rc = fastln_rms_norm_f64(<double *>py, <double *>pr, <double *>px, <double *>pw,
                                     N, H, eps)
    return _check(rc)


cdef int rms_bwd(int code, dx, dw, dy, x, rstd, w, int64_t N, int64_t H) except -1:
    cdef int rc
    cdef void *pdx = _ptr(dx)
    cdef void *pdw = _ptr(dw)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    with nogil:
        if code >= HALF_BASE:
            rc = fastln_rms_norm_backward_half(code - HALF_BASE, <uint16_t *>pdx, <float *>pdw,
                                               <uint16_t *>pdy, <uint16_t *>px, <float *>pr,
                                               <float *>pw, N, H)
        elif code == cnp.NPY_FLOAT:
            rc = fastln_rms_norm_backward_f32(<float *>pdx, <float *>pdw, <float *>pdy,
                                              <float *>px, <float *>pr, <float *>pw, N, H)
        else:
            rc = fastln_rms_norm_backward_f64(<double *>pdx, <double *>pdw, <double *>pdy,
                                              <double *>px, <double *>pr, <double *>pw,
                                              N, H)
    return _check(rc)


# ---- the row kernels for fastln._general, their arguments checked ------------

def norm_rows(bint rms, x, w, b, double eps, y, mean, rstd):
    """layer_norm (rms_norm with rms: b and mean None) on canonical (N, H) rows."""
    if rms and (b is not None or mean is not None):
        raise ValueError("internal: RMSNorm takes no bias and gives no mean")
    cdef int code = _rows_ok(x, (y,), (mean, rstd), (y,), (mean, rstd), (w, b))
    cdef int64_t N = cnp.PyArray_DIM(<cnp.ndarray>x, 0), H = cnp.PyArray_DIM(<cnp.ndarray>x, 1)
    if rms:
        rms_fwd(code, y, rstd, x, w, N, H, eps)
    else:
        ln_fwd(code, y, mean, rstd, x, w, b, N, H, eps)


def norm_backward_rows(bint rms, dy, x, mean, rstd, w, dx, dw, db):
    """layer_norm_backward (rms_norm_backward with rms: mean and db None) on
    canonical (N, H) rows."""
    if rstd is None or dy is None or (mean is None) != rms or (db is None) != rms:
        raise ValueError("internal: dy and rstd are required, and for LayerNorm mean and db")
    cdef int code = _rows_ok(x, (dx, dw), (db,), (dy, dx), (mean, rstd), (w, dw, db))
    cdef int64_t N = cnp.PyArray_DIM(<cnp.ndarray>x, 0), H = cnp.PyArray_DIM(<cnp.ndarray>x, 1)
    if rms:
        rms_bwd(code, dx, dw, dy, x, rstd, w, N, H)
    else:
        ln_bwd(code, dx, dw, db, dy, x, mean, rstd, w, N, H)


def add_norm_rows(bint rms, x, res, bi, w, b, double eps, y, s, mean, rstd):
    """add_layer_norm (add_rms_norm with rms) on canonical arrays; res holds R
    rows of H, R >= 1 dividing N (row n adds res row n % R)."""
    cdef int code = _rows_ok(x, (y, s), (mean, rstd), (y, s), (mean, rstd), (bi, w, b))
    cdef int64_t N = cnp.PyArray_DIM(<cnp.ndarray>x, 0), H = cnp.PyArray_DIM(<cnp.ndarray>x, 1)
    if not (res is not None and _fast(res, cnp.PyArray_TYPE(<cnp.ndarray>x))
            and cnp.PyArray_SIZE(<cnp.ndarray>res) % H == 0):
        raise ValueError("internal: bad residual array")
    cdef int64_t R = cnp.PyArray_SIZE(<cnp.ndarray>res) // H
    if N > 0 and (R < 1 or N % R != 0):
        raise ValueError("internal: the residual's rows must divide x's")
    add_fwd(code, rms, y, s, mean, rstd, x, res, R, bi, w, b, N, H, eps)


def add_norm_backward_rows(bint rms, dy, x, ds, mean, rstd, w, dx, dw, db, di):
    """The fused add's backward on canonical float32/float64 arrays (db, mean
    None with rms); ds and di may be None."""
    if rstd is None or dy is None or (not rms and (mean is None or db is None)):
        raise ValueError("internal: dy, rstd (and for LayerNorm mean, db) are required")
    cdef int code = _rows_ok(x, (dx, dw), (db, di), (dy, dx, ds), (mean, rstd), (w, dw, db, di))
    if code >= HALF_BASE:
        raise ValueError("internal: the fused backward takes float32 or float64 rows")
    _add_bwd(code, rms, dx, dw, db, di, dy, x, ds, mean, rstd, w,
             cnp.PyArray_DIM(<cnp.ndarray>x, 0), cnp.PyArray_DIM(<cnp.ndarray>x, 1))


# ---- channels first (fastln.h) -----------------------------------------------

def norm_channels(x, w, b, double eps, y, mean, rstd, int64_t N, int64_t C, int64_t S,
                  bint rms):
    """layer_norm (or rms_norm: rms, b and mean None) over C of contiguous (N, C, S)
    arrays x, y of one float type; mean, rstd (N, S) or None; w, b (C) or None."""
    cdef int tn = _float_type(x)
    if tn < 0 or N < 0 or C < 1 or S < 1:
        raise ValueError("internal: bad x or sizes")
    _arr(x, tn, N * C * S, False, "x")
    _arr(y, tn, N * C * S, True, "y")
    for a in (mean, rstd):
        if a is not None:
            _arr(a, tn, N * S, True, "stats")
    for a in (w, b):
        if a is not None:
            _arr(a, tn, C, False, "weight")
    cdef void *px = _ptr(x)
    cdef void *py = _ptr(y)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    cdef void *pb = _ptr(b)
    cdef int rc
    with nogil:
        if tn == cnp.NPY_FLOAT:
            if rms:
                rc = fastln_rms_norm_channels_f32(<float *>py, <float *>pr, <float *>px,
                                                  <float *>pw, N, C, S, eps)
            else:
                rc = fastln_layer_norm_channels_f32(<float *>py, <float *>pm, <float *>pr,
                                                    <float *>px, <float *>pw, <float *>pb,
                                                    N, C, S, eps)
        else:
            if rms:
                rc = fastln_rms_norm_channels_f64(<double *>py, <double *>pr, <double *>px,
                                                  <double *>pw, N, C, S, eps)
            else:
                rc = fastln_layer_norm_channels_f64(<double *>py, <double *>pm, <double *>pr,
                                                    <double *>px, <double *>pw, <double *>pb,
                                                    N, C, S, eps)
    return _check(rc)


def norm_channels_backward(dy, x, mean, rstd, w, dx, dw, db, int64_t N, int64_t C, int64_t S):
    """layer_norm_backward (rms_norm_backward where mean and db are None) over C
    of contiguous (N, C, S) arrays dy, x, dx of one float type; mean, rstd
    (N, S); w (C) or None; dw, db (C)."""
    cdef int tn = _float_type(x)
    if tn < 0 or N < 0 or C < 1 or S < 1 or rstd is None or (mean is None) != (db is None):
        raise ValueError("internal: bad x, stats or sizes")
    _arr(x, tn, N * C * S, False, "x")
    _arr(dy, tn, N * C * S, False, "dy")
    _arr(dx, tn, N * C * S, True, "dx")
    for a in (mean, rstd):
        if a is not None:
            _arr(a, tn, N * S, False, "stats")
    for a in (dw, db):
        if a is not None:
            _arr(a, tn, C, True, "dweight")
    if w is not None:
        _arr(w, tn, C, False, "weight")
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pdx = _ptr(dx)
    cdef void *pm = _ptr(mean)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    cdef void *pdw = _ptr(dw)
    cdef void *pdb = _ptr(db)
    cdef int rc
    with nogil:
        if tn == cnp.NPY_FLOAT:
            rc = fastln_layer_norm_channels_backward_f32(<float *>pdx, <float *>pdw,
                                                         <float *>pdb, <float *>pdy,
                                                         <float *>px, <float *>pm, <float *>pr,
                                                         <float *>pw, N, C, S)
        else:
            rc = fastln_layer_norm_channels_backward_f64(<double *>pdx, <double *>pdw,
                                                         <double *>pdb, <double *>pdy,
                                                         <double *>px, <double *>pm,
                                                         <double *>pr, <double *>pw, N, C, S)
    return _check(rc)
