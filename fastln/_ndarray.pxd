# Checks and pointers of NumPy arrays for fastln's extension modules (fastln._core,
# fastln.rnn._engine): inline functions only, so no module of this name is imported.
# They live apart from fastln/_core.pxd so that code cimporting the kernels
# (fastln/kernels.pxd) needs no NumPy headers.
cimport numpy as cnp
from libc.stdint cimport int64_t


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
