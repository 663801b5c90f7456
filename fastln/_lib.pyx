# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""fastln's C core: the kernels of src_c/ are compiled into this extension alone.

It holds the kernels' state (the thread count, the instruction-set path, the
run-time policy's cache sizes, the cache of large outputs), and lets Python
and other extensions reach it:

- threads and instruction sets (:func:`get_num_threads`, :func:`get_isa`,
  :func:`has_openmp`, ...), re-exported by :mod:`fastln`;
- the run-time policy and the cache of large outputs, for fastln._threads,
  fastln._memory, tests and benchmarks;
- NumPy's allocator (NEP 49) over that cache, with which fastln._rows
  allocates large outputs;
- every function of fastln.h and the recurrent engine's entry points, as C
  functions that other extensions cimport (fastln/_lib.pxd): fastln._rows,
  fastln.rnn._engine, and users' Cython through fastln/kernels.pxd. The
  process thus holds one copy of the state.

It imports no other module of fastln.
"""
from libc.stdint cimport int64_t, uint16_t
from cpython.pycapsule cimport PyCapsule_New
cimport numpy as cnp

from fastln._ndarray cimport _fast

cnp.import_array()

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

# What fastln._rows allocates large outputs with: this allocator, NumPy's
# default one (captured at import, to tell it from one a user installed), and
# the size from which outputs come from the cache
_POOL_HANDLER = PyCapsule_New(<void *>&fastln_np_handler, "mem_handler", NULL)
_NUMPY_HANDLER = cnp.PyDataMem_GetHandler()
_POOL_MIN_BYTES = FASTLN_POOL_MIN_BYTES


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


# ---- the run-time policy (src_c/runtime/policy.h) ---------------------------------

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
    None where s is not one: fastln_parse_bytes (src_c/runtime/policy.h) reads it,
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


# ---- the cache of large outputs (src_c/runtime/pool.h) -----------------------------

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


# ---- fastln.h's functions, exported to other modules' Cython (fastln/_lib.pxd) ----
# Each forwards to the C function of the same name; fastln._rows calls them,
# and fastln/kernels.pxd re-exports them.

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


# ---- the recurrent engine's entry points (fastln/_lib.pxd) ----------------
# fastln.rnn._engine binds the engine; it calls the C functions through these.

cdef extern from "fastln_rnn.h" nogil:
    int64_t fastln_rnn_packed_size_proj(int cell, int wtype, int64_t input, int64_t hidden,
                                        int64_t proj)
    int fastln_rnn_pack_proj(void *out, int64_t size, int cell, int wtype, int64_t input,
                             int64_t hidden, int64_t proj, const void *w_ih, const void *w_hh,
                             const void *w_hr)
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

cdef int64_t rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden,
                             int64_t proj) noexcept nogil:
    return fastln_rnn_packed_size_proj(cell, wtype, input, hidden, proj)

cdef int rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input, int64_t hidden,
                  int64_t proj, const void *w_ih, const void *w_hh,
                  const void *w_hr) noexcept nogil:
    return fastln_rnn_pack_proj(out, size, cell, wtype, input, hidden, proj, w_ih, w_hh, w_hr)

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
