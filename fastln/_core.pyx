# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""Thin Cython layer over the C kernels in src_c/.

The public functions here are re-exported by :mod:`fastln`:
:func:`layer_norm`, :func:`layer_norm_backward`, :func:`rms_norm`,
:func:`rms_norm_backward`, :func:`add_layer_norm`, :func:`get_isa` and
:func:`has_openmp`.

Each normalization function takes a fast path for the common case
(C-contiguous, aligned, native float32/float64, normalized over the last
axis), calls one C function with the GIL released, and otherwise hands over
to fastln._api, which canonicalizes the arguments (axes, layouts, dtypes,
out=) and raises the errors. No math lives here.
"""
from libc.stdint cimport int64_t, uint16_t
from libc.string cimport memset
from cpython.pycapsule cimport PyCapsule_New
cimport numpy as cnp
import numpy as np

from fastln._ndarray cimport _arr, _check, _fast, _float_type, _ptr

cnp.import_array()

from fastln import _api

cdef extern from "internal.h" nogil:
    void fastln_parallel_copy(void *dst, const void *src, int64_t nbytes, int nt_stores)
    void fastln_set_default_threads(int n)
    int fastln_half_convert(int kind, int widen, void *dst, const void *src, int64_t n)

cdef extern from "policy.h" nogil:
    ctypedef struct fastln_caches:
        double l1, l2, l3
        int l3_shared
    ctypedef struct fastln_plan:
        int threads, stream
        double stream_bytes
        int64_t row_block
        double bwd_hot_bytes, pf_range_bytes
    int FASTLN_CALL_FWD, FASTLN_CALL_ADD, FASTLN_CALL_BWD
    int FASTLN_PATH_GENERIC, FASTLN_PATH_AVX2, FASTLN_PATH_AVX512
    const fastln_caches *fastln_caches_get()
    void fastln_caches_set(const fastln_caches *c)
    int fastln_caches_detect(fastln_caches *c, int use_sysconf, const char *sysfs_root,
                             int use_cpuid)
    double fastln_parse_bytes(const char *s)
    double fastln_l3_usable(const fastln_caches *c)
    fastln_plan fastln_policy(int kind, int64_t N, int64_t H, int elsize, int path,
                              int threads, const fastln_caches *c)

cdef extern from "math.h" nogil:
    bint isfinite(double)

cdef extern from "pool.h" nogil:
    size_t FASTLN_POOL_MIN_BYTES
    ctypedef struct fastln_pool_stats:
        size_t limit, bytes, blocks, hits, misses
    void fastln_pool_set_limit(size_t nbytes)
    void fastln_pool_release()
    void fastln_pool_get_stats(fastln_pool_stats *s)

# NumPy's allocator interface (NEP 49) over the cache of pool.h: large
# outputs are allocated through it, so that a loop of allocating calls reuses
# the pages of the outputs it dropped. (Declared in C: NumPy's struct holds
# its name as an array, which its .pxd gives as a pointer.)
cdef extern from *:
    """
    #include "pool.h"
    static void *fastln_np_malloc(void *ctx, size_t n)
    {
        (void)ctx;
        return fastln_pool_alloc(n);
    }
    static void *fastln_np_calloc(void *ctx, size_t nelem, size_t elsize)
    {
        (void)ctx;
        return elsize && nelem > SIZE_MAX / elsize ? NULL : fastln_pool_calloc(nelem * elsize);
    }
    static void *fastln_np_realloc(void *ctx, void *p, size_t n)
    {
        (void)ctx;
        return fastln_pool_realloc(p, n);
    }
    static void fastln_np_free(void *ctx, void *p, size_t n)
    {
        (void)ctx;
        (void)n;
        fastln_pool_free(p);
    }
    static PyDataMem_Handler fastln_np_handler = {
        "fastln_pool", 1,
        {NULL, fastln_np_malloc, fastln_np_calloc, fastln_np_realloc, fastln_np_free}};
    """
    cnp.PyDataMem_Handler fastln_np_handler

cdef object _POOL_HANDLER = PyCapsule_New(<void *>&fastln_np_handler, "mem_handler", NULL)
cdef object _NUMPY_HANDLER = cnp.PyDataMem_GetHandler()   # NumPy's default allocator


# ---- fast-path predicates -------------------------------------------------

# 16-bit storage types the kernels read and write directly: type number -> kind;
# _rows_ok returns _HALF_BASE + kind for them (type numbers are far below)
cdef enum:
    _HALF_BASE = 1 << 20
_HALF = {cnp.NPY_FLOAT16: FASTLN_F16}
try:
    import ml_dtypes as _ml_dtypes
    _HALF[_ml_dtypes.bfloat16(0).dtype.num] = FASTLN_BF16
except ImportError:  # pragma: no cover
    pass



cdef inline int _kernel_code(object x, int *tn, int *vt) noexcept:
    """The code _ln and the like take for x on the fast path: x's type number
    (float32/64), or _HALF_BASE + kind for float16/bfloat16; -1 when x takes
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
    return _HALF_BASE + <int>kind

cdef inline bint _fast_vec(object p, int tn, cnp.npy_intp H) noexcept:
    """p is None, or a fast 1-D array of H elements."""
    return p is None or (_fast(p, tn) and cnp.PyArray_NDIM(<cnp.ndarray>p) == 1
                         and cnp.PyArray_DIM(<cnp.ndarray>p, 0) == H)

cdef inline bint _same_shape(cnp.ndarray a, cnp.ndarray b, int nd) noexcept:
    """The first nd dimensions of a and b agree, and b has exactly nd."""
    if cnp.PyArray_NDIM(b) != nd:
        return False
    for i in range(nd):
        if cnp.PyArray_DIM(a, i) != cnp.PyArray_DIM(b, i):
            return False
    return True

cdef inline bint _fast_out(object out, cnp.ndarray x, int tn, object others=()) noexcept:
    """out is None, or a writable fast array of x's shape that is x itself or
    does not overlap it, and overlaps none of the (fast or None) others."""
    if out is None:
        return True
    if not (_fast(out, tn) and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out)
            and _same_shape(x, <cnp.ndarray>out, cnp.PyArray_NDIM(x))):
        return False
    if _overlap_partly(<cnp.ndarray>out, x):
        return False
    for a in others:
        if a is not None and _overlap_any(<cnp.ndarray>out, <cnp.ndarray>a):
            return False
    return True

cdef inline bint _fast_add_out(object o, cnp.ndarray x, object res, int tn, object w,
                               object b) noexcept:
    """An output of add_layer_norm's fast path: None, or a fast out of x's shape
    that is x or the residual itself or overlaps neither, nor weight or bias."""
    return o is None or (_fast_out(o, x, tn, (w, b))
                         and not _overlap_partly(<cnp.ndarray>o, <cnp.ndarray>res))

cdef inline bint _overlap_any(cnp.ndarray a, cnp.ndarray b) noexcept:
    """Contiguous a and b share any byte."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    return pa < pb + cnp.PyArray_NBYTES(b) and pb < pa + cnp.PyArray_NBYTES(a)

cdef inline bint _overlap_partly(cnp.ndarray a, cnp.ndarray b) noexcept:
    """Contiguous a and b share memory without being the same buffer."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    if pa == pb and cnp.PyArray_NBYTES(a) == cnp.PyArray_NBYTES(b):
        return False
    return pa < pb + cnp.PyArray_NBYTES(b) and pb < pa + cnp.PyArray_NBYTES(a)

cdef inline bint _fast_eps(object eps) noexcept:
    return type(eps) is float and isfinite(<double>eps) and <double>eps >= 0.0

cdef inline bint _last_axis(object axis, int nd):
    return type(axis) is int and (axis == -1 or axis == nd - 1)

cdef inline cnp.ndarray _empty_like(cnp.ndarray x, int nd, int tn):
    """An uninitialized array with the first nd dimensions of x; one of x's
    size, type and at least FASTLN_POOL_MIN_BYTES comes from the cache of
    large outputs (unless NumPy's allocator was replaced)."""
    if (nd == cnp.PyArray_NDIM(x) and tn == cnp.PyArray_TYPE(x)
            and <size_t>cnp.PyArray_NBYTES(x) >= FASTLN_POOL_MIN_BYTES):
        return _cached_empty(nd, cnp.PyArray_DIMS(x), tn)
    return cnp.PyArray_EMPTY(nd, cnp.PyArray_DIMS(x), tn, 0)

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

def _empty_rows(int64_t N, int64_t H, dtype):
    """``np.empty((N, H), dtype)`` (a native dtype); from the cache of large
    outputs where it takes FASTLN_POOL_MIN_BYTES or more (the results of
    fastln._api)."""
    cdef cnp.npy_intp dims[2]
    dims[0] = N
    dims[1] = H
    dtype = np.dtype(dtype)
    if <size_t>(N * H * dtype.itemsize) < FASTLN_POOL_MIN_BYTES:
        return cnp.PyArray_EMPTY(2, dims, dtype.num, 0)
    return _cached_empty(2, dims, dtype.num)



# ---- row kernels on canonical arrays ---------------------------------------
# Used by the fast paths below and by fastln._api. Every argument is a
# C-contiguous array of one float type: x, y, dy, dx, s of N*H elements, mean
# and rstd of N, weight, bias, dweight, dbias of H. The callers establish
# this; the _*_rows wrappers re-check it (_rows_ok) so that no caller can make
# a kernel read or write past a buffer.

cdef int _rows_ok(x, outs, opt_outs, rows, stats, vecs) except -1:
    """x: 2-D (N, H), H >= 1, float32/64, or float16/bfloat16 (16-bit storage,
    float32 math); outs: writable, not None; opt_outs: writable where not None;
    rows, stats, vecs (None where optional): N*H elements of x's type, and N
    and H elements of x's type (float32 for 16-bit storage). Returns x's type
    number, or _HALF_BASE + the kind (FASTLN_F16, FASTLN_BF16) for 16-bit storage."""
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
    return _HALF_BASE + kind if kind else tn


cdef int _ln(int tn, y, mean, rstd, x, w, b, int64_t N, int64_t H, double eps) except -1:
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
        if tn >= _HALF_BASE:
            rc = fastln_layer_norm_half(tn - _HALF_BASE, <uint16_t *>py, <float *>pm, <float *>pr,
                                        <uint16_t *>px, <float *>pw, <float *>pb, N, H, eps)
        elif tn == cnp.NPY_FLOAT:
            rc = fastln_layer_norm_f32(<float *>py, <float *>pm, <float *>pr, <float *>px,
                                       <float *>pw, <float *>pb, N, H, eps)
        else:
            rc = fastln_layer_norm_f64(<double *>py, <double *>pm, <double *>pr, <double *>px,
                                       <double *>pw, <double *>pb, N, H, eps)
    return _check(rc)


cdef int _ln_bwd(int tn, dx, dw, db, dy, x, mean, rstd, w, int64_t N, int64_t H) except -1:
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
        if tn >= _HALF_BASE:
            rc = fastln_layer_norm_backward_half(tn - _HALF_BASE, <uint16_t *>pdx, <float *>pdw,
                                                 <float *>pdb, <uint16_t *>pdy, <uint16_t *>px,
                                                 <float *>pm, <float *>pr, <float *>pw, N, H)
        elif tn == cnp.NPY_FLOAT:
            rc = fastln_layer_norm_backward_f32(<float *>pdx, <float *>pdw, <float *>pdb,
                                                <float *>pdy, <float *>px, <float *>pm,
                                                <float *>pr, <float *>pw, N, H)
        else:
            rc = fastln_layer_norm_backward_f64(<double *>pdx, <double *>pdw, <double *>pdb,
                                                <double *>pdy, <double *>px, <double *>pm,
                                                <double *>pr, <double *>pw, N, H)
    return _check(rc)


cdef int _add_norm(int tn, int rms, y, s, mean, rstd, x, res, int64_t R, bi, w, b,
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
        if tn >= _HALF_BASE:
            rc = fastln_add_norm_half(tn - _HALF_BASE, rms, <uint16_t *>py, <uint16_t *>ps,
                                      <float *>pm, <float *>pr, <uint16_t *>px,
                                      <uint16_t *>pres, R, <float *>pbi, <float *>pw,
                                      <float *>pb, N, H, eps)
        elif tn == cnp.NPY_FLOAT:
            rc = fastln_add_norm_f32(rms, <float *>py, <float *>ps, <float *>pm, <float *>pr,
                                     <float *>px, <float *>pres, R, <float *>pbi, <float *>pw,
                                     <float *>pb, N, H, eps)
        else:
            rc = fastln_add_norm_f64(rms, <double *>py, <double *>ps, <double *>pm,
                                     <double *>pr, <double *>px, <double *>pres, R,
                                     <double *>pbi, <double *>pw, <double *>pb, N, H, eps)
    return _check(rc)


cdef int _add_bwd(int tn, int rms, dx, dw, db, di, dy, x, ds, mean, rstd, w, int64_t N,
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
        if tn == cnp.NPY_FLOAT:
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


cdef int _rms(int tn, y, rstd, x, w, int64_t N, int64_t H, double eps) except -1:
    cdef int rc
    cdef void *py = _ptr(y)
    cdef void *pr = _ptr(rstd)
    cdef void *px = _ptr(x)
    cdef void *pw = _ptr(w)
    if N == 0:
        return 0
    with nogil:
        if tn >= _HALF_BASE:
            rc = fastln_rms_norm_half(tn - _HALF_BASE, <uint16_t *>py, <float *>pr, <uint16_t *>px,
                                      <float *>pw, N, H, eps)
        elif tn == cnp.NPY_FLOAT:
            rc = fastln_rms_norm_f32(<float *>py, <float *>pr, <float *>px, <float *>pw,
                                     N, H, eps)
        else:
            rc = fastln_rms_norm_f64(<double *>py, <double *>pr, <double *>px, <double *>pw,
                                     N, H, eps)
    return _check(rc)


cdef int _rms_bwd(int tn, dx, dw, dy, x, rstd, w, int64_t N, int64_t H) except -1:
    cdef int rc
    cdef void *pdx = _ptr(dx)
    cdef void *pdw = _ptr(dw)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pr = _ptr(rstd)
    cdef void *pw = _ptr(w)
    with nogil:
        if tn >= _HALF_BASE:
            rc = fastln_rms_norm_backward_half(tn - _HALF_BASE, <uint16_t *>pdx, <float *>pdw,
                                               <uint16_t *>pdy, <uint16_t *>px, <float *>pr,
                                               <float *>pw, N, H)
        elif tn == cnp.NPY_FLOAT:
            rc = fastln_rms_norm_backward_f32(<float *>pdx, <float *>pdw, <float *>pdy,
                                              <float *>px, <float *>pr, <float *>pw, N, H)
        else:
            rc = fastln_rms_norm_backward_f64(<double *>pdx, <double *>pdw, <double *>pdy,
                                              <double *>px, <double *>pr, <double *>pw,
                                              N, H)
    return _check(rc)


def _layer_norm_rows(x, w, b, double eps, y, mean, rstd):
    """layer_norm on canonical (N, H) arrays; see the section comment."""
    cdef int tn = _rows_ok(x, (y,), (mean, rstd), (y,), (mean, rstd), (w, b))
    _ln(tn, y, mean, rstd, x, w, b, cnp.PyArray_DIM(<cnp.ndarray>x, 0),
        cnp.PyArray_DIM(<cnp.ndarray>x, 1), eps)


def _layer_norm_backward_rows(dy, x, mean, rstd, w, dx, dw, db):
    if mean is None or rstd is None or dy is None:
        raise ValueError("internal: dy, mean and rstd are required")
    cdef int tn = _rows_ok(x, (dx, dw, db), (), (dy, dx), (mean, rstd), (w, dw, db))
    _ln_bwd(tn, dx, dw, db, dy, x, mean, rstd, w, cnp.PyArray_DIM(<cnp.ndarray>x, 0),
            cnp.PyArray_DIM(<cnp.ndarray>x, 1))


def _add_norm_rows(bint rms, x, res, bi, w, b, double eps, y, s, mean, rstd):
    """add_layer_norm (add_rms_norm with rms) on canonical arrays; res holds R
    rows of H, R >= 1 dividing N (row n adds res row n % R)."""
    cdef int tn = _rows_ok(x, (y, s), (mean, rstd), (y, s), (mean, rstd), (bi, w, b))
    cdef int64_t N = cnp.PyArray_DIM(<cnp.ndarray>x, 0), H = cnp.PyArray_DIM(<cnp.ndarray>x, 1)
    if not (res is not None and _fast(res, cnp.PyArray_TYPE(<cnp.ndarray>x))
            and cnp.PyArray_SIZE(<cnp.ndarray>res) % H == 0):
        raise ValueError("internal: bad residual array")
    cdef int64_t R = cnp.PyArray_SIZE(<cnp.ndarray>res) // H
    if N > 0 and (R < 1 or N % R != 0):
        raise ValueError("internal: the residual's rows must divide x's")
    _add_norm(tn, rms, y, s, mean, rstd, x, res, R, bi, w, b, N, H, eps)


def _add_norm_backward_rows(bint rms, dy, x, ds, mean, rstd, w, dx, dw, db, di):
    """The fused add's backward on canonical float32/float64 arrays (db, mean
    None with rms); ds and di may be None."""
    if rstd is None or dy is None or (not rms and (mean is None or db is None)):
        raise ValueError("internal: dy, rstd (and for LayerNorm mean, db) are required")
    cdef int tn = _rows_ok(x, (dx, dw), (db, di), (dy, dx, ds), (mean, rstd), (w, dw, db, di))
    if tn >= _HALF_BASE:
        raise ValueError("internal: the fused backward takes float32 or float64 rows")
    _add_bwd(tn, rms, dx, dw, db, di, dy, x, ds, mean, rstd, w,
             cnp.PyArray_DIM(<cnp.ndarray>x, 0), cnp.PyArray_DIM(<cnp.ndarray>x, 1))


def _rms_norm_rows(x, w, double eps, y, rstd):
    cdef int tn = _rows_ok(x, (y,), (rstd,), (y,), (rstd,), (w,))
    _rms(tn, y, rstd, x, w, cnp.PyArray_DIM(<cnp.ndarray>x, 0),
         cnp.PyArray_DIM(<cnp.ndarray>x, 1), eps)


def _rms_norm_backward_rows(dy, x, rstd, w, dx, dw):
    if rstd is None or dy is None:
        raise ValueError("internal: dy and rstd are required")
    cdef int tn = _rows_ok(x, (dx, dw), (), (dy, dx), (rstd,), (w, dw))
    _rms_bwd(tn, dx, dw, dy, x, rstd, w, cnp.PyArray_DIM(<cnp.ndarray>x, 0),
             cnp.PyArray_DIM(<cnp.ndarray>x, 1))


# ---- public functions: fast path, else fastln._api -------------------------

cdef inline int _check_flag(object v, str name) except -1:
    """TypeError unless v is True or False (NumPy's bools too): a flag is not
    read from a truthy value such as "yes" or 1."""
    if v is True or v is False or isinstance(v, np.bool_):
        return 0
    raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, out=None,
               return_stats=False):
    """Layer normalization (Ba, Kiros & Hinton, 2016) over ``axis``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, with the mean and the
    (biased) variance of each sample taken over the normalized axes.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D, in any layout (strided, Fortran-order, read-only
        and byte-swapped arrays and lists are accepted). float32 and float64
        keep their dtype; float16 and bfloat16 compute in float32 and return
        their own dtype; integers and bool compute in float64 and return
        float64. A CPU torch tensor is read as an array and the result is a
        NumPy array (fastln has no autograd): one that requires grad raises
        TypeError (pass ``x.detach()``).
    weight, bias : array_like, optional
        Gain and bias with the normalized shape (the sizes of ``axis``, in the
        order given), of a real dtype; cast to the compute dtype. None means
        1 and 0.
    axis : int or tuple of int, default -1
        The normalized axes; negative values count from the end. The other
        (batch) axes are independent samples.
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    out : ndarray or torch.Tensor, optional
        Where to write y: a plain ndarray of x's shape and y's dtype,
        writable, in any layout. May be ``x`` itself (in place). A CPU torch
        tensor (not requiring grad) is written through the ndarray that
        shares its memory (``out.numpy()``), and that ndarray is returned.
        Input that is not C-contiguous rows of the compute dtype is copied a
        block of rows at a time (a few MiB), so with ``out`` nothing is
        allocated that grows with x (statistics aside).
    return_stats : bool, default False
        Also return the statistics ``mean`` and ``rstd`` that
        :func:`layer_norm_backward` takes.

    Returns
    -------
    y : ndarray
        x's shape, in the dtype given above; ``out`` itself when given (for a
        torch tensor, the ndarray sharing its memory).
    mean, rstd : ndarray
        Only with ``return_stats=True``: each sample's mean and
        ``1 / sqrt(var + eps)``, of x's shape without the normalized axes, in
        the compute dtype (float32 for float16, bfloat16 and float32 input;
        float64 for float64, integer and bool input).

    Raises
    ------
    TypeError
        x, weight or bias of a dtype that is not a real number type (complex,
        object, str, ...); eps not a real number (or a bool); axis not an int
        or a tuple of ints; ``out`` not a plain ndarray or a CPU torch
        tensor, a tensor that requires grad, or of another dtype than y's;
        return_stats not a bool.
    ValueError
        x 0-d, or of size 0 along a normalized axis; an axis out of range or
        repeated; weight or bias not of the normalized shape; eps negative or
        not finite; ``out`` of another shape than x's, or read-only.

    Notes
    -----
    C-contiguous, aligned, native-order float32/float64 input normalized over
    the last axis (with weight, bias and out of the same dtype and layout)
    takes the fast path without a copy. The variance is centered (two passes
    over each row); a NaN or inf stays in its row (see the README's guarantees).
    An x without samples (a batch axis of size 0) gives empty results.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [2., 4., 6.]], np.float32)
    >>> np.round(fastln.layer_norm(x), 4)
    array([[-1.2247,  0.    ,  1.2247],
           [-1.2247,  0.    ,  1.2247]], dtype=float32)
    >>> y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    >>> mean
    array([2., 4.], dtype=float32)

    Several axes, with a gain of their shape; integer input gives float64:

    >>> x3 = np.arange(24).reshape(2, 3, 4)
    >>> y3 = fastln.layer_norm(x3, np.ones((3, 4)), axis=(1, 2))
    >>> y3.shape, y3.dtype
    ((2, 3, 4), dtype('float64'))

    In place:

    >>> fastln.layer_norm(x, out=x) is x
    True
    """
    _check_flag(return_stats, "return_stats")
    cdef int tn, vt
    cdef int code = _kernel_code(x, &tn, &vt)
    cdef cnp.ndarray xa, y
    cdef int nd
    cdef cnp.npy_intp H
    if code >= 0:
        xa = <cnp.ndarray>x
        nd = cnp.PyArray_NDIM(xa)
        H = cnp.PyArray_DIM(xa, nd - 1)
        if (H > 0 and _last_axis(axis, nd) and _fast_eps(eps) and _fast_vec(weight, vt, H)
                and _fast_vec(bias, vt, H) and (out is None or _fast_out(out, xa, tn, (weight, bias)))):
            y = _empty_like(xa, nd, tn) if out is None else <cnp.ndarray>out
            if not return_stats:
                _ln(code, y, None, None, xa, weight, bias, cnp.PyArray_SIZE(xa) // H, H, eps)
                return y
            mean = _empty_like(xa, nd - 1, vt)
            rstd = _empty_like(xa, nd - 1, vt)
            _ln(code, y, mean, rstd, xa, weight, bias, cnp.PyArray_SIZE(xa) // H, H, eps)
            return y, mean, rstd
    return _api.layer_norm(x, weight, bias, axis, eps, out, return_stats)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1, out=None):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    With ``xhat = (x - mean) * rstd`` and ``g = dy * weight``, per sample::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dweight = sum over samples of dy * xhat;   dbias = sum of dy

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape; any real dtype
        (cast to the compute dtype of x).
    x : array_like
        The input of the forward call; its dtype sets the compute and result
        dtypes as in :func:`layer_norm`. Torch tensors as in :func:`layer_norm`.
    mean, rstd : array_like
        The statistics ``layer_norm(..., return_stats=True)`` returned: x's
        shape without the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The forward's normalized axes.
    out : ndarray or torch.Tensor, optional
        Where to write dx: a plain ndarray of x's shape and dx's dtype,
        writable. May be ``dy`` itself. A CPU torch tensor as in
        :func:`layer_norm`.

    Returns
    -------
    dx : ndarray
        x's shape; x's dtype for float input, float64 for integers and bool
        (``out`` itself when given; for a torch tensor, the ndarray sharing
        its memory).
    dweight, dbias : ndarray
        The normalized shape, in the compute dtype (float32 for float16,
        bfloat16 and float32 x; else float64). Always returned: without
        ``weight`` they are the gradients of a unit gain and a zero bias.

    Raises
    ------
    TypeError
        dy, x, mean, rstd or weight of a dtype that is not a real number
        type; a bad ``axis`` type; ``out`` not a plain ndarray or of the
        wrong dtype.
    ValueError
        dy not of x's shape; mean or rstd not of x's shape without the
        normalized axes; weight not of the normalized shape; a bad axis or a
        normalized size of 0; ``out`` of the wrong shape or read-only.

    Notes
    -----
    The kernel uses ``mean + mean(x - mean)`` as the row mean, which repairs
    the rounding of a float32 mean next to a large offset. dweight and dbias
    are summed in a fixed order: bitwise the same for any thread count.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [2., 4., 6.]])
    >>> y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    >>> dx, dweight, dbias = fastln.layer_norm_backward(np.ones_like(x), x, mean, rstd)
    >>> np.allclose(dx, 0)      # a uniform dy does not reach x through the mean
    True
    >>> dbias
    array([2., 2., 2.])
    >>> np.round(dweight, 4)
    array([-2.4495,  0.    ,  2.4495])
    """
    cdef int tn = _float_type(x)
    cdef cnp.ndarray xa, dx, dw, db
    cdef int nd
    cdef cnp.npy_intp H
    if tn >= 0:
        xa = <cnp.ndarray>x
        nd = cnp.PyArray_NDIM(xa)
        H = cnp.PyArray_DIM(xa, nd - 1)
        if (H > 0 and _last_axis(axis, nd) and _fast(dy, tn) and _same_shape(xa, dy, nd)
                and _fast(mean, tn) and _same_shape(xa, mean, nd - 1)
                and _fast(rstd, tn) and _same_shape(xa, rstd, nd - 1)
                and _fast_vec(weight, tn, H) and (out is None or _fast_out(out, xa, tn, (mean, rstd, weight)))
                and not (out is not None and _overlap_partly(<cnp.ndarray>out, dy))):
            dx = _empty_like(xa, nd, tn) if out is None else <cnp.ndarray>out
            dw = cnp.PyArray_EMPTY(1, &H, tn, 0)
            db = cnp.PyArray_EMPTY(1, &H, tn, 0)
            _ln_bwd(tn, dx, dw, db, dy, xa, mean, rstd, weight, cnp.PyArray_SIZE(xa) // H, H)
            return dx, dw, db
    return _api.layer_norm_backward(dy, x, mean, rstd, weight, axis, out)


@_api.hide_bias
def rms_norm(x, weight=None, *bias, axis=-1, eps=1e-6, out=None, return_stats=False):
    """RMS normalization over ``axis``: ``y = x / sqrt(mean(x**2) + eps) * weight``.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D, any layout; dtypes as in :func:`layer_norm`
        (float32/float64 kept; float16 and bfloat16 computed in float32 and
        returned in their dtype; integers and bool give float64). Torch
        tensors as in :func:`layer_norm`.
    weight : array_like, optional
        Gain of the normalized shape (the sizes of ``axis``, in the order
        given); None means 1.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square; finite and >= 0.
    out : ndarray or torch.Tensor, optional
        Where to write y: a plain ndarray of x's shape and y's dtype,
        writable. May be ``x`` itself. A CPU torch tensor, and the memory
        used, as in :func:`layer_norm`.
    return_stats : bool, default False
        Also return ``rstd``, which :func:`rms_norm_backward` takes.

    Returns
    -------
    y : ndarray
        x's shape and dtype as above (``out`` itself when given; for a torch
        tensor, the ndarray sharing its memory).
    rstd : ndarray
        Only with ``return_stats=True``: ``1 / sqrt(mean(x**2) + eps)`` of
        each sample, x's shape without the normalized axes, in the compute
        dtype (float32 or float64).

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm` (weight in place of weight and bias).
    TypeError
        A third positional argument: RMSNorm has no bias, and the message
        names :func:`layer_norm`, which takes one.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[3., 4.]], np.float32)
    >>> np.round(fastln.rms_norm(x, eps=0.0), 4)
    array([[0.8485, 1.1314]], dtype=float32)
    >>> y, rstd = fastln.rms_norm(x, np.full(2, 2., np.float32), return_stats=True)
    >>> rstd.shape
    (1,)
    """
    if bias:
        _api.no_bias(rms_norm, bias)
    _check_flag(return_stats, "return_stats")
    cdef int tn, vt
    cdef int code = _kernel_code(x, &tn, &vt)
    cdef cnp.ndarray xa, y
    cdef int nd
    cdef cnp.npy_intp H
    if code >= 0:
        xa = <cnp.ndarray>x
        nd = cnp.PyArray_NDIM(xa)
        H = cnp.PyArray_DIM(xa, nd - 1)
        if (H > 0 and _last_axis(axis, nd) and _fast_eps(eps) and _fast_vec(weight, vt, H)
                and (out is None or _fast_out(out, xa, tn, (weight,)))):
            y = _empty_like(xa, nd, tn) if out is None else <cnp.ndarray>out
            if not return_stats:
                _rms(code, y, None, xa, weight, cnp.PyArray_SIZE(xa) // H, H, eps)
                return y
            rstd = _empty_like(xa, nd - 1, vt)
            _rms(code, y, rstd, xa, weight, cnp.PyArray_SIZE(xa) // H, H, eps)
            return y, rstd
    return _api.rms_norm(x, weight, axis, eps, out, return_stats)


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1, out=None):
    """Gradients of :func:`rms_norm`: ``(dx, dweight)``.

    With ``xhat = x * rstd`` and ``g = dy * weight``, per sample:
    ``dx = rstd * (g - xhat * mean(g * xhat))``, ``dweight`` = the sum over
    samples of ``dy * xhat``.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape (any real dtype).
    x : array_like
        The input of the forward call; its dtype sets the compute and result
        dtypes as in :func:`rms_norm`. Torch tensors as in :func:`layer_norm`.
    rstd : array_like
        What ``rms_norm(..., return_stats=True)`` returned: x's shape without
        the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The forward's normalized axes.
    out : ndarray or torch.Tensor, optional
        Where to write dx: a plain ndarray of x's shape and dx's dtype,
        writable. May be ``dy`` itself. A CPU torch tensor as in
        :func:`layer_norm`.

    Returns
    -------
    dx : ndarray
        x's shape; x's dtype for float input, float64 for integers and bool.
    dweight : ndarray
        The normalized shape, in the compute dtype (float32 or float64);
        returned also without ``weight``.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm_backward` (rstd in place of mean and rstd).

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[3., 4.]])
    >>> y, rstd = fastln.rms_norm(x, eps=0.0, return_stats=True)
    >>> dx, dweight = fastln.rms_norm_backward(np.ones_like(x), x, rstd)
    >>> dx.shape, dweight.shape
    ((1, 2), (2,))
    >>> np.allclose(dweight, y[0])
    True
    """
    cdef int tn = _float_type(x)
    cdef cnp.ndarray xa, dx, dw
    cdef int nd
    cdef cnp.npy_intp H
    if tn >= 0:
        xa = <cnp.ndarray>x
        nd = cnp.PyArray_NDIM(xa)
        H = cnp.PyArray_DIM(xa, nd - 1)
        if (H > 0 and _last_axis(axis, nd) and _fast(dy, tn) and _same_shape(xa, dy, nd)
                and _fast(rstd, tn) and _same_shape(xa, rstd, nd - 1)
                and _fast_vec(weight, tn, H) and (out is None or _fast_out(out, xa, tn, (rstd, weight)))
                and not (out is not None and _overlap_partly(<cnp.ndarray>out, dy))):
            dx = _empty_like(xa, nd, tn) if out is None else <cnp.ndarray>out
            dw = cnp.PyArray_EMPTY(1, &H, tn, 0)
            _rms_bwd(tn, dx, dw, dy, xa, rstd, weight, cnp.PyArray_SIZE(xa) // H, H)
            return dx, dw
    return _api.rms_norm_backward(dy, x, rstd, weight, axis, out)


cdef object _add_fast(bint rms, x, residual, input_bias, weight, bias, axis, eps, out,
                      bint return_stats):
    """The fast path of add_layer_norm (add_rms_norm with rms): C-contiguous
    float32/float64 x and residual of one shape, over the last axis, no input
    bias, fast outputs; its result, or None where it does not apply."""
    cdef int tn = _float_type(x)
    cdef cnp.ndarray xa, y, s
    cdef int nd
    cdef cnp.npy_intp H, N
    y_out = s_out = None
    if out is None or type(out) is cnp.ndarray:
        y_out = out
    elif type(out) is tuple and len(out) == 2:
        y_out, s_out = out
    else:
        return None
    if tn < 0 or input_bias is not None:
        return None
    xa = <cnp.ndarray>x
    nd = cnp.PyArray_NDIM(xa)
    H = cnp.PyArray_DIM(xa, nd - 1)
    if not (H > 0 and _last_axis(axis, nd) and _fast(residual, tn)
            and _same_shape(xa, residual, nd) and _fast_eps(eps)
            and _fast_vec(weight, tn, H) and _fast_vec(bias, tn, H)
            and _fast_add_out(y_out, xa, residual, tn, weight, bias)
            and _fast_add_out(s_out, xa, residual, tn, weight, bias)
            and (y_out is None or s_out is None
                 or not _overlap_any(<cnp.ndarray>y_out, <cnp.ndarray>s_out))):
        return None
    N = cnp.PyArray_SIZE(xa) // H
    y = _empty_like(xa, nd, tn) if y_out is None else <cnp.ndarray>y_out
    s = _empty_like(xa, nd, tn) if s_out is None else <cnp.ndarray>s_out
    if not return_stats:
        _add_norm(tn, rms, y, s, None, None, xa, residual, N, None, weight, bias, N, H, eps)
        return y, s
    mean = None if rms else _empty_like(xa, nd - 1, tn)
    rstd = _empty_like(xa, nd - 1, tn)
    _add_norm(tn, rms, y, s, mean, rstd, xa, residual, N, None, weight, bias, N, H, eps)
    return (y, s, rstd) if rms else (y, s, mean, rstd)


def add_layer_norm(x, residual, weight=None, bias=None, *, input_bias=None, axis=-1, eps=1e-5,
                   out=None, return_stats=False):
    """Fused residual add and layer norm: ``s = x + residual (+ input_bias)``, ``y = layer_norm(s)``.

    One pass over memory: s is written and normalized while it is in cache,
    and y is bitwise ``layer_norm(s)`` (in float16 and bfloat16, y is the
    norm of the float32 sum, and s that sum rounded once). This is ONNX Runtime's
    SkipLayerNormalization (x its input, residual its skip, input_bias its
    bias), and the post-norm residual block of a transformer.

    Parameters
    ----------
    x, residual : array_like
        The two summands. residual has x's shape, or broadcasts to it over
        the batch (non-normalized) axes only, as a skip of shape (S, H)
        against x of (B, S, H) does. Each takes the dtype rules of
        :func:`layer_norm`; where they differ, the sum is computed in the
        promotion of their compute dtypes, and y and s take
        ``np.result_type`` of the dtypes each alone would give (float16 with
        float32 gives float32; float32 with an integer array gives float64).
        Torch tensors as in :func:`layer_norm`.
    weight, bias : array_like, optional
        Gain and bias of the normalized shape; None means 1 and 0.
    input_bias : array_like, optional
        A vector of the normalized shape added into s, as
        ``(x + residual) + input_bias``: the bias of the dense layer that
        produced x.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    out : ndarray or tuple, optional
        y's buffer, or a tuple ``(y_out, s_out)`` (either may be None). Each
        must be a writable plain ndarray of x's shape and the result dtype,
        or a CPU torch tensor (written and returned as in :func:`layer_norm`);
        the two must not overlap each other, but may be ``x`` and
        ``residual`` (``out=(x, residual)`` works in place). With both given,
        nothing is allocated that grows with x (statistics aside).
    return_stats : bool, default False
        Also return the ``mean`` and ``rstd`` of s, as :func:`layer_norm`.

    Returns
    -------
    y : ndarray
        ``layer_norm(s)``.
    s : ndarray
        ``x + residual``, of x's shape, in y's dtype.
    mean, rstd : ndarray
        Only with ``return_stats=True``: s's statistics, of x's shape without
        the normalized axes, in the compute dtype.

    Raises
    ------
    TypeError
        As :func:`layer_norm`, for residual too; ``out`` neither an ndarray
        nor a 2-tuple.
    ValueError
        As :func:`layer_norm`; residual not broadcasting to x's shape over
        the batch axes; input_bias not of the normalized shape; y_out and
        s_out overlapping each other.

    See Also
    --------
    add_layer_norm_backward : its gradients.
    add_rms_norm : the same with RMSNorm.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.]])
    >>> residual = np.array([[0., 2., 4.]])
    >>> y, s = fastln.add_layer_norm(x, residual)
    >>> s
    array([[1., 4., 7.]])
    >>> np.array_equal(y, fastln.layer_norm(s))
    True
    >>> y, s = fastln.add_layer_norm(x, residual, input_bias=[1., 1., 1.])
    >>> s
    array([[2., 5., 8.]])
    """
    _check_flag(return_stats, "return_stats")
    r = _add_fast(False, x, residual, input_bias, weight, bias, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _api.add_norm(False, x, residual, input_bias, weight, bias, axis, eps, out,
                         return_stats)


@_api.hide_bias
def add_rms_norm(x, residual, weight=None, *bias, input_bias=None, axis=-1, eps=1e-6, out=None,
                 return_stats=False):
    """Fused residual add and RMS norm: ``s = x + residual (+ input_bias)``, ``y = rms_norm(s)``.

    One pass over memory, as :func:`add_layer_norm`: y is bitwise
    ``rms_norm(s)`` (in float16 and bfloat16, the norm of the float32 sum).
    This is ONNX Runtime's SkipSimplifiedLayerNormalization,
    the pre-norm residual block of Llama-style models: s is the residual
    stream that goes on, y the normalized input of the next layer.

    Parameters
    ----------
    x, residual : array_like
        The two summands, as in :func:`add_layer_norm`: residual has x's
        shape or broadcasts to it over the batch axes. float16 and bfloat16
        (ml_dtypes) storage as in :func:`layer_norm`.
    weight : array_like, optional
        Gain of the normalized shape; None means 1.
    input_bias : array_like, optional
        A vector of the normalized shape added into s, as
        ``(x + residual) + input_bias``.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square; finite and >= 0.
    out : ndarray or tuple, optional
        y's buffer, or a tuple ``(y_out, s_out)``, as in
        :func:`add_layer_norm`.
    return_stats : bool, default False
        Also return ``rstd``, the reciprocal root mean square of s.

    Returns
    -------
    y : ndarray
        ``rms_norm(s)``.
    s : ndarray
        ``x + residual (+ input_bias)``, of x's shape, in y's dtype.
    rstd : ndarray
        Only with ``return_stats=True``: of x's shape without the normalized
        axes, in the compute dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`add_layer_norm`.
    TypeError
        A fourth positional argument: RMSNorm has no bias, and the message
        names :func:`add_layer_norm`, which takes one.

    See Also
    --------
    add_rms_norm_backward : its gradients.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [4., 5., 6.]], np.float32)
    >>> y, s = fastln.add_rms_norm(x, np.ones(3, np.float32))   # one residual row for both
    >>> s
    array([[2., 3., 4.],
           [5., 6., 7.]], dtype=float32)
    >>> np.array_equal(y, fastln.rms_norm(s))
    True
    """
    if bias:
        _api.no_bias(add_rms_norm, bias)
    _check_flag(return_stats, "return_stats")
    r = _add_fast(True, x, residual, input_bias, weight, None, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _api.add_norm(True, x, residual, input_bias, weight, None, axis, eps, out,
                         return_stats)


def add_layer_norm_backward(dy, s, mean, rstd, weight=None, *, ds=None, axis=-1, out=None,
                            input_bias_grad=False, residual_shape=None):
    """The gradients of :func:`add_layer_norm`, in one sweep.

    With ``y, s, mean, rstd = add_layer_norm(x, residual, weight, bias,
    input_bias=..., return_stats=True)`` and a loss L, given ``dy = dL/dy``
    (and ``ds``, a gradient of L that reaches s by another way, such as the
    residual stream of a pre-norm block), the gradient of the sum is
    ``dsum = layer_norm_backward(dy, s, mean, rstd, weight)[0] + ds``, and it
    is the gradient of x and of the residual. Deterministic: bitwise the same
    on any thread count.

    Parameters
    ----------
    dy : array_like
        Gradient of y, of s's shape.
    s, mean, rstd : array_like
        The sum and its statistics, as add_layer_norm returned them.
    weight : array_like, optional
        The gain the forward used; None means 1.
    ds : array_like, optional
        An incoming gradient of s, of s's shape, added into dsum.
    axis : int or tuple of int, default -1
        The normalized axes, as in the forward.
    out : ndarray or torch.Tensor, optional
        dsum's buffer: a writable ndarray of s's shape and dsum's dtype, or a
        CPU torch tensor (written and returned as in :func:`layer_norm`). It
        may be dy or ds (in place).
    input_bias_grad : bool, default False
        Also return the gradient of ``input_bias``: dsum summed over the
        batch axes, reduced as dweight is.
    residual_shape : tuple of int, optional
        The shape of a residual that broadcast in the forward: also return
        its gradient, dsum summed over the broadcast axes. (dsum itself when
        it is s's shape.)

    Returns
    -------
    dsum : ndarray
        Gradient of x and of a residual of x's shape: s's shape and dtype
        (float16 and bfloat16 are computed in float32 and rounded once).
    dweight, dbias : ndarray
        Gradients of weight and bias, of the normalized shape.
    dinput_bias : ndarray
        Only with ``input_bias_grad=True``.
    dresidual : ndarray
        Only with ``residual_shape``: of that shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm_backward`, for ds too; input_bias_grad not a
        bool; residual_shape not broadcasting to s's shape over its batch
        axes.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> rng = np.random.default_rng(0)
    >>> x, r = rng.standard_normal((2, 4, 8)), rng.standard_normal((4, 8))
    >>> y, s, mean, rstd = fastln.add_layer_norm(x, r, return_stats=True)
    >>> dy, ds = rng.standard_normal(y.shape), rng.standard_normal(y.shape)
    >>> dsum, dw, db, dr = fastln.add_layer_norm_backward(
    ...     dy, s, mean, rstd, ds=ds, residual_shape=r.shape)
    >>> dx, _, _ = fastln.layer_norm_backward(dy, s, mean, rstd)
    >>> np.allclose(dsum, dx + ds), np.allclose(dr, dsum.sum(axis=0))
    (True, True)
    """
    _check_flag(input_bias_grad, "input_bias_grad")
    return _api.add_norm_backward(False, dy, s, mean, rstd, weight, ds, axis, out,
                                  input_bias_grad, residual_shape)


def add_rms_norm_backward(dy, s, rstd, weight=None, *, ds=None, axis=-1, out=None,
                          input_bias_grad=False, residual_shape=None):
    """The gradients of :func:`add_rms_norm`, in one sweep.

    ``dsum = rms_norm_backward(dy, s, rstd, weight)[0] + ds``, the gradient
    of x and of the residual, as :func:`add_layer_norm_backward` describes.

    Parameters
    ----------
    dy : array_like
        Gradient of y, of s's shape.
    s, rstd : array_like
        The sum and its rstd, as add_rms_norm returned them.
    weight : array_like, optional
        The gain the forward used; None means 1.
    ds : array_like, optional
        An incoming gradient of s, added into dsum.
    axis : int or tuple of int, default -1
        The normalized axes, as in the forward.
    out : ndarray or torch.Tensor, optional
        dsum's buffer, as in :func:`add_layer_norm_backward`.
    input_bias_grad : bool, default False
        Also return the gradient of ``input_bias``.
    residual_shape : tuple of int, optional
        Also return the gradient of a residual of this (broadcast) shape.

    Returns
    -------
    dsum : ndarray
        Gradient of x and of a residual of x's shape.
    dweight : ndarray
        Gradient of weight, of the normalized shape.
    dinput_bias : ndarray
        Only with ``input_bias_grad=True``.
    dresidual : ndarray
        Only with ``residual_shape``.

    Raises
    ------
    TypeError, ValueError
        As :func:`add_layer_norm_backward`.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> rng = np.random.default_rng(0)
    >>> x, r = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    >>> y, s, rstd = fastln.add_rms_norm(x, r, return_stats=True)
    >>> dy = rng.standard_normal(y.shape)
    >>> dsum, dw, dbi = fastln.add_rms_norm_backward(dy, s, rstd, input_bias_grad=True)
    >>> np.allclose(dbi, dsum.sum(axis=0))
    True
    """
    _check_flag(input_bias_grad, "input_bias_grad")
    return _api.add_norm_backward(True, dy, s, None, rstd, weight, ds, axis, out,
                                  input_bias_grad, residual_shape)


# ---- threads and instruction sets ------------------------------------------

def get_num_threads():
    """Threads a large call uses now (see :func:`fastln.get_num_threads`).

    Returns
    -------
    int
    """
    return fastln_get_num_threads()

def set_num_threads(int n):
    """Sets the thread count unchecked; 0 means the default (see fastln._threads).

    The public, checked version is :func:`fastln.set_num_threads`.

    Parameters
    ----------
    n : int
    """
    fastln_set_num_threads(n)

def get_requested_threads():
    """The last count given to set_num_threads, or 0 for the default.

    Returns
    -------
    int
    """
    return fastln_get_requested_threads()

def has_openmp():
    """Whether this build of fastln has OpenMP (else every call is serial).

    Returns
    -------
    bool
        False where the build found no OpenMP, or ``FASTLN_NO_OPENMP=1`` was
        set at build time.

    Examples
    --------
    >>> import fastln
    >>> isinstance(fastln.has_openmp(), bool)
    True
    """
    return bool(fastln_has_openmp())

def get_isa():
    """The instruction-set path in use: "avx512", "avx2" or "generic".

    The fastest path the CPU supports is chosen at import, unless the
    environment variable ``FASTLN_ISA`` names another supported one.

    Returns
    -------
    str

    Examples
    --------
    >>> import fastln
    >>> fastln.get_isa() in fastln.supported_isas()
    True
    """
    return fastln_get_isa().decode()

def isa_supported(name):
    """Whether this CPU can run the named instruction-set path.

    Parameters
    ----------
    name : str
        "avx512", "avx2" or "generic"; another name gives False.

    Returns
    -------
    bool
    """
    return bool(fastln_isa_supported(str(name).encode()))

def _set_isa(name):
    """Forces an instruction-set path (for tests and benchmarks); not to be
    called while other threads run kernels."""
    if fastln_set_isa(str(name).encode()) != 0:
        raise ValueError(f"isa {name!r} is not supported on this CPU")


# ---- the run-time policy (src_c/policy.h) ---------------------------------

_CACHE_ENV = ("FASTLN_L1_BYTES", "FASTLN_L2_BYTES", "FASTLN_L3_BYTES")
_CALL_KINDS = {"forward": FASTLN_CALL_FWD, "add": FASTLN_CALL_ADD, "backward": FASTLN_CALL_BWD}
_PATHS = {"generic": FASTLN_PATH_GENERIC, "avx2": FASTLN_PATH_AVX2,
          "avx512": FASTLN_PATH_AVX512}

def _set_default_threads(int n):
    """Sets the thread count used where none is set and OpenMP's is unchanged
    since load (fastln._threads sets it at import); 0: OpenMP's default."""
    fastln_set_default_threads(n)

def _parse_bytes(s):
    """The bytes a size gives ("33554432", "48K", " 32MiB ", "1g", "0"), or
    None where s is not one: fastln_parse_bytes (src_c/policy.h) reads it,
    the one parser of FASTLN_CACHE_LIMIT and the FASTLN_L*_BYTES variables."""
    if not isinstance(s, str) or "\0" in s:
        return None
    cdef double v = fastln_parse_bytes(s.encode())
    return int(v) if v >= 0 else None

def _parse_cache_bytes(s):
    """The bytes a FASTLN_L*_BYTES value gives, or None where it is not a
    size of at least 1 byte (those the C core ignores)."""
    v = _parse_bytes(s)
    return v if v else None

cdef dict _caches_dict(const fastln_caches *c):
    return dict(l1=int(c.l1), l2=int(c.l2), l3=int(c.l3), l3_shared=bool(c.l3_shared),
                l3_usable=int(fastln_l3_usable(c)))

def _cache_sizes():
    """The cache sizes in use (bytes): l1, l2, l3, l3_shared (the L3 is a
    virtual machine host's) and l3_usable (the L3 calls count on)."""
    return _caches_dict(fastln_caches_get())

def _set_cache_sizes(l1=None, l2=None, l3=None, l3_shared=False):
    """Replaces the cache sizes in use (tests, measurements); with no
    argument, detects them again from the environment and the machine. Not
    to be called while other threads run kernels."""
    cdef fastln_caches c
    if l1 is None and l2 is None and l3 is None:
        fastln_caches_set(NULL)
        return
    c = fastln_caches_get()[0]
    if l1 is not None:
        c.l1 = l1
    if l2 is not None:
        c.l2 = l2
    if l3 is not None:
        c.l3 = l3
    c.l3_shared = bool(l3_shared)
    fastln_caches_set(&c)

def _detect_caches(sysfs_root=None, bint use_sysconf=False, bint use_cpuid=False):
    """Cache sizes detected without the environment from the sources asked for
    (sysfs_root: a directory of index*/{level,type,size}); levels none of
    them gives fall back to 32 KiB, 1 MiB, 32 MiB. Returns the dict of
    _cache_sizes plus fallback: the levels (1, 2, 3) that fell back."""
    cdef fastln_caches c
    cdef bytes root = None if sysfs_root is None else str(sysfs_root).encode()
    cdef int fell = fastln_caches_detect(&c, use_sysconf, NULL if root is None else <char *>root,
                                         use_cpuid)
    d = _caches_dict(&c)
    d["fallback"] = [lv for lv in (1, 2, 3) if fell & (1 << (lv - 1))]
    return d

def _policy(str kind, int64_t N, int64_t H, int itemsize, str isa, int nthreads,
            l1, l2, l3, bint l3_shared=False):
    """The plan of fastln_policy for a call: kind "forward" (LayerNorm,
    RMSNorm), "add" (add + LayerNorm) or "backward"; N rows of H elements of
    itemsize bytes (2, 4, 8); isa "avx512", "avx2" or "generic"; nthreads
    requested; cache sizes in bytes. Returns a dict of the plan's fields."""
    if kind not in _CALL_KINDS:
        raise ValueError(f"kind must be one of {sorted(_CALL_KINDS)}, got {kind!r}")
    if isa not in _PATHS:
        raise ValueError(f"isa must be one of {sorted(_PATHS)}, got {isa!r}")
    if itemsize not in (2, 4, 8):
        raise ValueError(f"itemsize must be 2, 4 or 8, got {itemsize}")
    cdef fastln_caches c
    c.l1, c.l2, c.l3, c.l3_shared = l1, l2, l3, l3_shared
    cdef fastln_plan p = fastln_policy(_CALL_KINDS[kind], N, H, itemsize, _PATHS[isa],
                                       nthreads, &c)
    return dict(threads=p.threads, stream=bool(p.stream), stream_bytes=p.stream_bytes,
                row_block=p.row_block, bwd_hot_bytes=p.bwd_hot_bytes,
                pf_range_bytes=p.pf_range_bytes)

def _invalid_cache_env(environ):
    """The FASTLN_L*_BYTES variables of environ whose values are not sizes
    (they are ignored), as (name, value) pairs."""
    return [(k, environ[k]) for k in _CACHE_ENV
            if k in environ and _parse_cache_bytes(environ[k]) is None]


# ---- the cache of large outputs (src_c/pool.h) -----------------------------

def _cache_set_limit(size_t nbytes):
    """Sets the cache's limit in bytes, unchecked (0: keep nothing); the
    public, checked version is :func:`fastln.set_cache_limit`."""
    fastln_pool_set_limit(nbytes)

def _cache_release():
    """Releases the kept blocks (see :func:`fastln.empty_cache`)."""
    fastln_pool_release()

def _cache_stats():
    """(limit, bytes, blocks, hits, misses) of the cache (see
    :func:`fastln.cache_info`)."""
    cdef fastln_pool_stats s
    fastln_pool_get_stats(&s)
    return s.limit, s.bytes, s.blocks, s.hits, s.misses


def _parallel_copy(dst, src, bint nt=False):
    """dst[...] = src for two C-contiguous arrays of the same size in bytes, on
    the threads a kernel would use: the bandwidth ceiling for benchmarks.
    With nt, by non-temporal stores (as the kernels write large outputs)."""
    if not (_fast(dst, cnp.PyArray_TYPE(<cnp.ndarray>dst)) and _fast(src, cnp.PyArray_TYPE(<cnp.ndarray>src))
            and cnp.PyArray_NBYTES(<cnp.ndarray>dst) == cnp.PyArray_NBYTES(<cnp.ndarray>src)
            and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>dst)):
        raise ValueError("dst and src must be C-contiguous arrays of the same size, dst writable")
    cdef void *d = cnp.PyArray_DATA(<cnp.ndarray>dst)
    cdef void *s = cnp.PyArray_DATA(<cnp.ndarray>src)
    cdef int64_t n = cnp.PyArray_NBYTES(<cnp.ndarray>src)
    with nogil:
        fastln_parallel_copy(d, s, n, nt)


def _half_convert(src, dst):
    """dst[...] = src between float32 and a 16-bit type: float16, or bfloat16
    as its bits (uint16). A float32 src is rounded to nearest even (NaN stays
    NaN), a 16-bit src widened exactly. Both C-contiguous and aligned, of
    native byte order, with the same number of elements; dst writable."""
    if not (isinstance(src, cnp.ndarray) and isinstance(dst, cnp.ndarray)):
        raise TypeError("src and dst must be NumPy arrays")
    cdef int ts = cnp.PyArray_TYPE(<cnp.ndarray>src), td = cnp.PyArray_TYPE(<cnp.ndarray>dst)
    cdef int half = td if ts == cnp.NPY_FLOAT32 else ts
    cdef bint widen = td == cnp.NPY_FLOAT32
    if not ((ts == cnp.NPY_FLOAT32) != widen
            and half in (cnp.NPY_UINT16, cnp.NPY_FLOAT16)):
        raise TypeError(f"src and dst must be float32 and float16 or uint16 (bfloat16 bits), "
                        f"either way round, got {src.dtype} and {dst.dtype}")
    if not (_fast(src, ts) and _fast(dst, td) and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>dst)
            and cnp.PyArray_SIZE(<cnp.ndarray>src) == cnp.PyArray_SIZE(<cnp.ndarray>dst)):
        raise ValueError("src and dst must be C-contiguous arrays of the same size, dst writable")
    cdef int kind = FASTLN_F16 if half == cnp.NPY_FLOAT16 else FASTLN_BF16
    cdef void *d = cnp.PyArray_DATA(<cnp.ndarray>dst)
    cdef const void *s = cnp.PyArray_DATA(<cnp.ndarray>src)
    cdef int64_t n = cnp.PyArray_SIZE(<cnp.ndarray>src)
    with nogil:
        fastln_half_convert(kind, widen, d, s, n)


# ---- fastln.h's functions, exported to other modules' Cython (fastln/_core.pxd) ----
# Each forwards to the C function of the same name; fastln/kernels.pxd
# re-exports them, and the code above calls them too.

cdef int fastln_layer_norm_f32(float *y, float *mean, float *rstd, const float *x,
                               const float *weight, const float *bias, int64_t N, int64_t H,
                               double eps) noexcept nogil:
    return _c_layer_norm_f32(y, mean, rstd, x, weight, bias, N, H, eps)

cdef int fastln_layer_norm_f64(double *y, double *mean, double *rstd, const double *x,
                               const double *weight, const double *bias, int64_t N, int64_t H,
                               double eps) noexcept nogil:
    return _c_layer_norm_f64(y, mean, rstd, x, weight, bias, N, H, eps)

cdef int fastln_layer_norm_backward_f32(float *dx, float *dweight, float *dbias, const float *dy,
                                        const float *x, const float *mean, const float *rstd,
                                        const float *weight, int64_t N, int64_t H) noexcept nogil:
    return _c_layer_norm_backward_f32(dx, dweight, dbias, dy, x, mean, rstd, weight, N, H)

cdef int fastln_layer_norm_backward_f64(double *dx, double *dweight, double *dbias,
                                        const double *dy, const double *x, const double *mean,
                                        const double *rstd, const double *weight, int64_t N,
                                        int64_t H) noexcept nogil:
    return _c_layer_norm_backward_f64(dx, dweight, dbias, dy, x, mean, rstd, weight, N, H)

cdef int fastln_add_layer_norm_f32(float *y, float *s, float *mean, float *rstd, const float *x,
                                   const float *residual, const float *weight, const float *bias,
                                   int64_t N, int64_t H, double eps) noexcept nogil:
    return _c_add_layer_norm_f32(y, s, mean, rstd, x, residual, weight, bias, N, H, eps)

cdef int fastln_add_layer_norm_f64(double *y, double *s, double *mean, double *rstd,
                                   const double *x, const double *residual, const double *weight,
                                   const double *bias, int64_t N, int64_t H,
                                   double eps) noexcept nogil:
    return _c_add_layer_norm_f64(y, s, mean, rstd, x, residual, weight, bias, N, H, eps)

cdef int fastln_add_norm_f32(int rms, float *y, float *s, float *mean, float *rstd, const float *x,
                             const float *residual, int64_t R, const float *input_bias,
                             const float *weight, const float *bias, int64_t N, int64_t H,
                             double eps) noexcept nogil:
    return _c_add_norm_f32(rms, y, s, mean, rstd, x, residual, R, input_bias, weight, bias, N, H,
                           eps)

cdef int fastln_add_norm_f64(int rms, double *y, double *s, double *mean, double *rstd,
                             const double *x, const double *residual, int64_t R,
                             const double *input_bias, const double *weight, const double *bias,
                             int64_t N, int64_t H, double eps) noexcept nogil:
    return _c_add_norm_f64(rms, y, s, mean, rstd, x, residual, R, input_bias, weight, bias, N, H,
                           eps)

cdef int fastln_add_norm_backward_f32(int rms, float *dsum, float *dweight, float *dbias,
                                      float *dinput_bias, const float *dy, const float *s,
                                      const float *ds, const float *mean, const float *rstd,
                                      const float *weight, int64_t N, int64_t H) noexcept nogil:
    return _c_add_norm_backward_f32(rms, dsum, dweight, dbias, dinput_bias, dy, s, ds, mean, rstd,
                                    weight, N, H)

cdef int fastln_add_norm_backward_f64(int rms, double *dsum, double *dweight, double *dbias,
                                      double *dinput_bias, const double *dy, const double *s,
                                      const double *ds, const double *mean, const double *rstd,
                                      const double *weight, int64_t N, int64_t H) noexcept nogil:
    return _c_add_norm_backward_f64(rms, dsum, dweight, dbias, dinput_bias, dy, s, ds, mean, rstd,
                                    weight, N, H)

cdef int fastln_rms_norm_f32(float *y, float *rstd, const float *x, const float *weight, int64_t N,
                             int64_t H, double eps) noexcept nogil:
    return _c_rms_norm_f32(y, rstd, x, weight, N, H, eps)

cdef int fastln_rms_norm_f64(double *y, double *rstd, const double *x, const double *weight,
                             int64_t N, int64_t H, double eps) noexcept nogil:
    return _c_rms_norm_f64(y, rstd, x, weight, N, H, eps)

cdef int fastln_layer_norm_channels_f32(float *y, float *mean, float *rstd, const float *x,
                                        const float *weight, const float *bias, int64_t N,
                                        int64_t C, int64_t S, double eps) noexcept nogil:
    return _c_layer_norm_channels_f32(y, mean, rstd, x, weight, bias, N, C, S, eps)

cdef int fastln_layer_norm_channels_f64(double *y, double *mean, double *rstd, const double *x,
                                        const double *weight, const double *bias, int64_t N,
                                        int64_t C, int64_t S, double eps) noexcept nogil:
    return _c_layer_norm_channels_f64(y, mean, rstd, x, weight, bias, N, C, S, eps)

cdef int fastln_layer_norm_channels_backward_f32(float *dx, float *dweight, float *dbias,
                                                 const float *dy, const float *x, const float *mean,
                                                 const float *rstd, const float *weight, int64_t N,
                                                 int64_t C, int64_t S) noexcept nogil:
    return _c_layer_norm_channels_backward_f32(dx, dweight, dbias, dy, x, mean, rstd, weight, N, C,
                                               S)

cdef int fastln_layer_norm_channels_backward_f64(double *dx, double *dweight, double *dbias,
                                                 const double *dy, const double *x,
                                                 const double *mean, const double *rstd,
                                                 const double *weight, int64_t N, int64_t C,
                                                 int64_t S) noexcept nogil:
    return _c_layer_norm_channels_backward_f64(dx, dweight, dbias, dy, x, mean, rstd, weight, N, C,
                                               S)

cdef int fastln_rms_norm_channels_f32(float *y, float *rstd, const float *x, const float *weight,
                                      int64_t N, int64_t C, int64_t S, double eps) noexcept nogil:
    return _c_rms_norm_channels_f32(y, rstd, x, weight, N, C, S, eps)

cdef int fastln_rms_norm_channels_f64(double *y, double *rstd, const double *x,
                                      const double *weight, int64_t N, int64_t C, int64_t S,
                                      double eps) noexcept nogil:
    return _c_rms_norm_channels_f64(y, rstd, x, weight, N, C, S, eps)

cdef int fastln_rms_norm_channels_backward_f32(float *dx, float *dweight, const float *dy,
                                               const float *x, const float *rstd,
                                               const float *weight, int64_t N, int64_t C,
                                               int64_t S) noexcept nogil:
    return _c_rms_norm_channels_backward_f32(dx, dweight, dy, x, rstd, weight, N, C, S)

cdef int fastln_rms_norm_channels_backward_f64(double *dx, double *dweight, const double *dy,
                                               const double *x, const double *rstd,
                                               const double *weight, int64_t N, int64_t C,
                                               int64_t S) noexcept nogil:
    return _c_rms_norm_channels_backward_f64(dx, dweight, dy, x, rstd, weight, N, C, S)

cdef int fastln_rms_norm_backward_f32(float *dx, float *dweight, const float *dy, const float *x,
                                      const float *rstd, const float *weight, int64_t N,
                                      int64_t H) noexcept nogil:
    return _c_rms_norm_backward_f32(dx, dweight, dy, x, rstd, weight, N, H)

cdef int fastln_rms_norm_backward_f64(double *dx, double *dweight, const double *dy,
                                      const double *x, const double *rstd, const double *weight,
                                      int64_t N, int64_t H) noexcept nogil:
    return _c_rms_norm_backward_f64(dx, dweight, dy, x, rstd, weight, N, H)

cdef void fastln_set_num_threads(int n) noexcept nogil:
    _c_set_num_threads(n)

cdef int fastln_get_requested_threads() noexcept nogil:
    return _c_get_requested_threads()

cdef int fastln_get_num_threads() noexcept nogil:
    return _c_get_num_threads()

cdef int fastln_has_openmp() noexcept nogil:
    return _c_has_openmp()

cdef const char *fastln_get_isa() noexcept nogil:
    return _c_get_isa()

cdef int fastln_set_isa(const char *name) noexcept nogil:
    return _c_set_isa(name)

cdef int fastln_isa_supported(const char *name) noexcept nogil:
    return _c_isa_supported(name)

cdef int fastln_layer_norm_half(int kind, uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                                const float *weight, const float *bias, int64_t N, int64_t H,
                                double eps) noexcept nogil:
    return _c_layer_norm_half(kind, y, mean, rstd, x, weight, bias, N, H, eps)

cdef int fastln_layer_norm_backward_half(int kind, uint16_t *dx, float *dweight, float *dbias,
                                         const uint16_t *dy, const uint16_t *x, const float *mean,
                                         const float *rstd, const float *weight, int64_t N,
                                         int64_t H) noexcept nogil:
    return _c_layer_norm_backward_half(kind, dx, dweight, dbias, dy, x, mean, rstd, weight, N, H)

cdef int fastln_add_layer_norm_half(int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                                    const uint16_t *x, const uint16_t *residual,
                                    const float *weight, const float *bias, int64_t N, int64_t H,
                                    double eps) noexcept nogil:
    return _c_add_layer_norm_half(kind, y, s, mean, rstd, x, residual, weight, bias, N, H, eps)

cdef int fastln_add_norm_half(int kind, int rms, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                              const uint16_t *x, const uint16_t *residual, int64_t R,
                              const float *input_bias, const float *weight, const float *bias,
                              int64_t N, int64_t H, double eps) noexcept nogil:
    return _c_add_norm_half(kind, rms, y, s, mean, rstd, x, residual, R, input_bias, weight, bias,
                            N, H, eps)

cdef int fastln_rms_norm_half(int kind, uint16_t *y, float *rstd, const uint16_t *x,
                              const float *weight, int64_t N, int64_t H, double eps) noexcept nogil:
    return _c_rms_norm_half(kind, y, rstd, x, weight, N, H, eps)

cdef int fastln_rms_norm_backward_half(int kind, uint16_t *dx, float *dweight, const uint16_t *dy,
                                       const uint16_t *x, const float *rstd, const float *weight,
                                       int64_t N, int64_t H) noexcept nogil:
    return _c_rms_norm_backward_half(kind, dx, dweight, dy, x, rstd, weight, N, H)


# ---- the recurrent engine's entry points (fastln/_core.pxd) ----------------
# fastln.rnn._engine binds the engine; it calls the C functions through these.

cdef extern from "fastln_rnn.h" nogil:
    int64_t fastln_rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden)
    int fastln_rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input,
                        int64_t hidden, const void *w_ih, const void *w_hh)
    int64_t fastln_rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H)
    int64_t fastln_rnn_work_size(int cell, int64_t T, int64_t B, int64_t H)
    int fastln_rnn_forward_f32(const fastln_rnn_args *a)
    int fastln_rnn_forward_f64(const fastln_rnn_args *a)
    int fastln_rnn_backward_f32(const fastln_rnn_args *a)
    int fastln_rnn_backward_f64(const fastln_rnn_args *a)
    int fastln_rnn_forward2_f32(const fastln_rnn_args *a)
    int fastln_rnn_forward2_f64(const fastln_rnn_args *a)
    int fastln_rnn_backward2_f32(const fastln_rnn_args *a)
    int fastln_rnn_backward2_f64(const fastln_rnn_args *a)
    int fastln_rnn_step_f32(const fastln_rnn_step_args *s)
    int fastln_rnn_step_f64(const fastln_rnn_step_args *s)
    const char *fastln_rnn_bf16_products()
    const char *fastln_rnn_int8_products()

cdef int64_t rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden) noexcept nogil:
    return fastln_rnn_packed_size(cell, wtype, input, hidden)

cdef int rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input, int64_t hidden,
                  const void *w_ih, const void *w_hh) noexcept nogil:
    return fastln_rnn_pack(out, size, cell, wtype, input, hidden, w_ih, w_hh)

cdef int64_t rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil:
    return fastln_rnn_cache_size(cell, T, B, H)

cdef int64_t rnn_work_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil:
    return fastln_rnn_work_size(cell, T, B, H)

cdef int rnn_forward_f32(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_forward_f32(a)

cdef int rnn_forward_f64(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_forward_f64(a)

cdef int rnn_backward_f32(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_backward_f32(a)

cdef int rnn_backward_f64(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_backward_f64(a)

cdef int rnn_forward2_f32(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_forward2_f32(a)

cdef int rnn_forward2_f64(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_forward2_f64(a)

cdef int rnn_backward2_f32(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_backward2_f32(a)

cdef int rnn_backward2_f64(const fastln_rnn_args *a) noexcept nogil:
    return fastln_rnn_backward2_f64(a)

cdef int rnn_step_f32(const fastln_rnn_step_args *s) noexcept nogil:
    return fastln_rnn_step_f32(s)

cdef int rnn_step_f64(const fastln_rnn_step_args *s) noexcept nogil:
    return fastln_rnn_step_f64(s)

cdef const char *rnn_bf16_products() noexcept nogil:
    return fastln_rnn_bf16_products()

cdef const char *rnn_int8_products() noexcept nogil:
    return fastln_rnn_int8_products()

cdef void to_bf16(void *dst, const void *src, int64_t n) noexcept nogil:
    fastln_half_convert(FASTLN_BF16, 0, dst, src, n)


# ---- channels first (fastln.h) ----------------------------------------------

def _norm_channels(x, w, b, double eps, y, mean, rstd, int64_t N, int64_t C, int64_t S,
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


def _norm_channels_backward(dy, x, mean, rstd, w, dx, dw, db, int64_t N, int64_t C, int64_t S):
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


# The cache sizes are read once, at import; invalid overrides are ignored.
import os as _os
import warnings as _warnings

def _warn_invalid_cache_env():
    for name, value in _invalid_cache_env(_os.environ):
        _warnings.warn(f"{name}={value!r} is not a size in bytes of at least 1 (such as "
                       f"33554432, 48K or 32MiB); the detected size is used", RuntimeWarning,
                       stacklevel=3)

fastln_caches_get()
_warn_invalid_cache_env()
