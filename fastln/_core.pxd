# The C-level interface of fastln._core for fastln's other extension modules
# (fastln.rnn._engine): the types of the recurrent engine's header, the
# engine's entry points and the array helpers. The kernels are compiled into
# fastln._core alone, and the other modules call them through these
# functions, so that the process holds one copy of the kernels' state: the
# thread count, the instruction-set path and the cache of large outputs.
from libc.stdint cimport int64_t
cimport numpy as cnp

cdef extern from "fastln_rnn.h" nogil:
    ctypedef void (*fastln_sgemm_fn)(char *, char *, int *, int *, int *, float *, float *,
                                     int *, float *, int *, float *, float *, int *)
    ctypedef void (*fastln_dgemm_fn)(char *, char *, int *, int *, int *, double *, double *,
                                     int *, double *, int *, double *, double *, int *)
    ctypedef struct fastln_rnn_args:
        int cell
        int64_t steps, batch, input, hidden
        double eps
        const void *params[10]
        const int64_t *lengths
        void *h
        void *c
        void *dh
        void *dc
        const void *x
        void *y
        void *cache
        const void *dy
        void *dx
        void *grads[10]
        void *work
        int (*interrupt)(void *ctx) noexcept
        void *interrupt_ctx
        int reverse
        int64_t ldy
        int wtype
        const void *packed
        int transposed
    ctypedef struct fastln_rnn_step_args:
        const fastln_rnn_args *layers
        int64_t num_layers, batch, table_rows
        const int64_t *rows
        void *h
        void *c
        const void *h_in
        const void *c_in
        const void *x
        void *y
    int FASTLN_EINTR
    int FASTLN_RNN_W_BF16
    int FASTLN_RNN_W_IH_T
    int FASTLN_RNN_W_HH_T

# the engine's entry points (src_c/fastln_rnn.h), as the header names them less "fastln_"
cdef int64_t rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden) noexcept nogil
cdef int rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input, int64_t hidden,
                  const void *w_ih, const void *w_hh) noexcept nogil
cdef int64_t rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil
cdef int64_t rnn_work_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil
cdef int rnn_forward_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward2_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward2_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward2_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward2_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_step_f32(const fastln_rnn_step_args *s) noexcept nogil
cdef int rnn_step_f64(const fastln_rnn_step_args *s) noexcept nogil
cdef void rnn_set_blas(fastln_sgemm_fn sgemm, fastln_dgemm_fn dgemm) noexcept nogil
cdef const char *rnn_bf16_products() noexcept nogil
# dst (n bfloat16 bits) = src (n float32), rounded to nearest even
cdef void to_bf16(void *dst, const void *src, int64_t n) noexcept nogil

cdef inline bint _fast(object a, int tn) noexcept:
    """a is an aligned, C-contiguous, native-order ndarray of type number tn."""
    return (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == tn
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))

cdef inline int _float_type(object x) noexcept:
    """NPY_FLOAT or NPY_DOUBLE when x takes the fast path (any rank >= 1), else -1."""
    if type(x) is not cnp.ndarray or cnp.PyArray_NDIM(<cnp.ndarray>x) < 1:
        return -1
    cdef int tn = cnp.PyArray_TYPE(<cnp.ndarray>x)
    if (tn == cnp.NPY_FLOAT or tn == cnp.NPY_DOUBLE) and _fast(x, tn):
        return tn
    return -1

cdef inline void *_ptr(object a) noexcept:
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)

cdef inline int _check(int rc) except -1:
    if rc == 1:
        raise MemoryError("fastln: could not allocate scratch memory")
    if rc != 0:
        raise ValueError("fastln: invalid sizes")
    return 0

cdef inline int _arr(object a, int tn, int64_t n, bint writable, str what) except -1:
    if not (_fast(a, tn) and cnp.PyArray_SIZE(<cnp.ndarray>a) == n
            and (not writable or cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))):
        raise ValueError("internal: bad array for " + what)
    return 0
